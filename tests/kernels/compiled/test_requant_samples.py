"""``qckpt convert`` requantizations of the shipped samples on the numpy and the compiled kernel
paths: every output file byte-identical, the error reports identical (every figure, bit for bit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from converter import api
from converter.kernels import compiled
from converter.runtime import run_options

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the fast extra (numba) is not installed")

SAMPLES = Path(__file__).resolve().parents[3] / "sample_checkpoints"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _same_report(a: dict, b: dict) -> None:
    a, b = dict(a), dict(b)
    assert a.pop("destination") != b.pop("destination")
    assert a == b


def _both(tmp_path: Path, src: Path, monkeypatch, fused: bool, **kw) -> None:
    """Convert on both paths and compare; ``fused``: the source's codes are decoded inside the kernel
    (else numpy decodes them and the kernel quantizes)."""
    from converter.kernels.compiled import rtn_rows

    seen = []
    real = rtn_rows.decode_source
    monkeypatch.setattr(rtn_rows, "decode_source", lambda plan, n: seen.append(real(plan, n)) or seen[-1])
    out = {}
    for kernels in ("numpy", "numba"):
        with run_options(kernels=kernels):
            report = api.convert(src, tmp_path / kernels, **kw)
        out[kernels] = (report, _files(tmp_path / kernels))
    (ra, fa), (rb, fb) = out["numpy"], out["numba"]
    assert fa.keys() == fb.keys() and fa  # same files, and some
    for name in fa:
        assert fa[name] == fb[name], name
    _same_report(ra, rb)
    assert any(t.get("vs_source") for t in ra["tensors"])  # a requantization with its error report
    assert seen and all((p is not None) == fused for p in seen)


CASES = [
    # GPTQ 4-bit g128 packed codes, decoded inside the kernel
    ("gptq_w4_g128_sym", True, dict(to="compressed-tensors", target=dict(bits=8, granularity="channel"))),
    ("gptq_w4_g128_sym", True, dict(to="compressed-tensors", target=dict(bits=3, group_size=32, symmetric=False))),
    ("gptq_w4_g128_sym", True, dict(to="compressed-tensors", target=dict(bits=2, group_size=128, scale_dtype="bf16"))),
    # integer zero points in the packed source
    ("ct_pack_w4a16_group128_asym", True, dict(to="gptq", target=dict(bits=8, granularity="channel"))),
    # AWQ's interleaved nibbles: unpacked at read, the uint8 codes decoded in the kernel
    ("awq_gemm_w4_g128_zp", True, dict(to="compressed-tensors",
                                        target=dict(bits=3, group_size=64, symmetric=False))),
    # MLX float biases (codes unpacked at read)
    ("mlx_affine_g64_b4", True, dict(to="compressed-tensors", target=dict(bits=8, granularity="channel"))),
]


@pytest.mark.parametrize("sample,fused,kw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_sample_requantization_is_byte_identical(tmp_path, monkeypatch, sample, fused, kw):
    _both(tmp_path, SAMPLES / sample, monkeypatch, fused, **kw)


def test_gptq_v1_asymmetric_source(tmp_path, monkeypatch):
    """A GPTQ v1 (``checkpoint_format: gptq``, stored zeros ``z - 1``) asymmetric 8-bit g128 source,
    written by qckpt (numpy path) from the GPTQModel sample (no real tool's v1
    asymmetric file is shipped), requantized to int8 per channel."""
    v1 = tmp_path / "v1"
    with run_options(kernels="numpy"):
        api.convert(SAMPLES / "gptq_w4_g128_sym", v1, to="gptq", checkpoint_format="gptq",
                    target=dict(bits=8, group_size=128, symmetric=False))
    _both(tmp_path, v1, monkeypatch, True, to="compressed-tensors", target=dict(bits=8, granularity="channel"))
