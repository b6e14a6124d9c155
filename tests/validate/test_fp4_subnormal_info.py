"""``scale-subnormal`` is ``info``, not a warning that fails ``--strict``, where the producing tool writes
subnormal E4M3 (UE4M3) group scales routinely: GGUF NVFP4 from llama.cpp's quantizer has no global scale,
so ``ggml_fp32_to_ue4m3(amax / 6)`` is subnormal for every 16-group with amax < 6 * 2^-6 = 0.09375
(ggml-quants.c ``quantize_row_nvfp4_ref``); the values are exact and every NVFP4 kernel decodes them.

The files are llama.cpp's own bytes: rows of ``quantize_row_nvfp4_ref`` output compiled from ggml's C
(tests/data/gguf_fp4/PROVENANCE.json), and the real MiniLM F16 GGUF through ``--quant-type NVFP4`` (the
port is byte-identical to that C function: tests/formats/test_gguf_fp4.py). A subnormal scale of a
non-E2M1 scheme stays a warning (contrast).
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor
from converter.validate import validate
from converter.validate.data_checks import check_scales
from tests.conftest import SAMPLES
from tests.formats.test_gguf_fp4 import REF, _gguf

#: UE4M3 bytes 0x01..0x07: exponent field 0, a non-zero mantissa (subnormal: m * 2^-9)
SUBNORMAL = range(1, 8)


def _subnormal_rows() -> np.ndarray:
    """Rows of llama.cpp's hard-case NVFP4 blocks with subnormal scales and no zero scale."""
    d = REF["nvfp4.hard.blocks"].reshape(64, -1, 36)[:, :, :4].reshape(64, -1)
    rows = np.flatnonzero(np.isin(d, SUBNORMAL).any(1) & ~(d == 0).any(1))
    assert rows.size >= 2  # the premise: llama.cpp wrote subnormal scales here
    return rows


def _findings(rep, code):
    return [f for f in rep.findings if f.code == code]


def test_llama_cpp_nvfp4_blocks_with_subnormal_scales_are_clean_strict(tmp_path):
    rows = _subnormal_rows()
    blocks = REF["nvfp4.hard.blocks"][rows]
    want = int(np.isin(blocks.reshape(len(rows), -1, 36)[:, :, :4], SUBNORMAL).sum())
    p = _gguf(tmp_path / "nvfp4.gguf", {"blk.0.attn_v.weight": (blocks, "NVFP4")})
    rep = validate(p, strict=True)
    assert rep.exit_code == 0, [(f.severity, f.code, f.message) for f in rep.findings]
    (f,) = _findings(rep, "scale-subnormal")
    assert f.severity == "info" and f.evidence["count"] == want
    r = CliRunner().invoke(main, ["validate", "--strict", str(p)])
    assert r.exit_code == 0, r.output


def test_minilm_quant_type_nvfp4_is_clean_strict(tmp_path):
    dst = tmp_path / "nvfp4.gguf"
    r = CliRunner().invoke(main, ["convert", str(SAMPLES / "gguf" / "minilm_gguf_F16.gguf"), str(dst), "--to", "gguf",
                                  "--quant-type", "NVFP4"])
    assert r.exit_code == 0, r.output
    rep = validate(dst, strict=True)
    assert rep.exit_code == 0, [(f.severity, f.code, f.tensor) for f in rep.findings if f.severity != "info"]
    sub = _findings(rep, "scale-subnormal")
    assert sub and all(f.severity == "info" for f in sub)  # MiniLM's small weights: many tiny 16-groups


@pytest.mark.parametrize("scale_dtype", ["F16", "BF16"])
def test_subnormal_scale_of_an_integer_scheme_still_warns(scale_dtype):
    import ml_dtypes
    dt = np.float16 if scale_dtype == "F16" else ml_dtypes.bfloat16
    tiny = float(ml_dtypes.finfo(dt).smallest_subnormal)  # ml_dtypes.finfo: np.finfo knows bfloat16 only from 0.7
    s = np.array([[tiny], [1.0]], dtype=dt)
    t = QuantizedTensor("w", (OUT, IN), np.zeros((2, 32), np.int8), s, QuantScheme(4, True, scale_dtype=scale_dtype),
                        GroupMap.per_group(32, axis=IN))
    (f,) = [f for f in check_scales(t, negative_ok=False) if f.code == "scale-subnormal"]
    assert f.severity == "warning"
