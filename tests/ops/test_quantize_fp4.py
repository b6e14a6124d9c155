"""``qckpt quantize --fp4``: the real SmolLM2 layer-0 bf16 weights quantized through the command line
give exactly the bytes compressed-tensors (MXFP4A16 / NVFP4A16, with the fused q/k/v global scale)
and MLX (mxfp4) wrote; the native output reads back; --to a format that cannot hold E2M1 codes is refused
with a typed error before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file

from converter.cli import main
from converter.formats.registry import load
from converter.schemas import validate_document
from tests.kernels.test_fp4_rtn import HERE, NAMES, bf16_values, load_fixture, pack
from tests.ops.test_quantize_fp8 import run, write_bf16


@pytest.fixture(scope="module")
def fx():
    return load_fixture()


@pytest.fixture()
def src(tmp_path, fx):
    p = tmp_path / "float.safetensors"
    write_bf16(p, {n: fx[f"{n}.bf16"] for n in NAMES})
    return p


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_cli_fp4_matches_compressed_tensors(src, fx, tmp_path, kind):
    dst = tmp_path / "q.safetensors"
    r = run("quantize", src, dst, "--fp4", kind, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "quantize-report")
    assert doc["target"]["element"] == kind and doc["target"]["rule"] == "ct" and doc["format"] == "native"
    ck = load(dst)
    for n in NAMES:
        t = ck[n]
        assert np.array_equal(pack(np.asarray(t.codes)), fx[f"{n}.{kind}.packed"]), n
        assert np.array_equal(np.asarray(t.scales).view(np.uint8), fx[f"{n}.{kind}.scale"]), n
        if kind == "nvfp4":  # q/k/v: the fused set's 512; down_proj its own 936
            assert t.global_scale == fx[f"{n}.nvfp4.global"][0] and t.scheme.global_scale == "divisor"
        else:
            assert t.global_scale is None
    rows = {r["name"]: r for r in doc["tensors"]}
    # 4 bits + one 8-bit scale per 32 (4.25) / per 16 (4.5), plus 4 bytes of global scale per tensor
    q = rows[NAMES[0]]
    per = 4.25 if kind == "mxfp4" else 4.5 + 32 / (576 * 576)
    assert q["bits_per_weight"] == pytest.approx(per)
    # the errors are those of the compressed-tensors decode vs the source (FP_MANIFEST rms_err_vs_source)
    want_rms = {"mxfp4": 0.04785331338644028, "nvfp4": 0.03750482574105263}[kind]
    assert np.sqrt(rows[NAMES[1]]["mse"]) == pytest.approx(want_rms, rel=1e-6)


def test_cli_fp4_mlx_rule(src, tmp_path):
    mlx = load_file(str(HERE / "smollm2_mlx_mxfp4.safetensors"))
    dst = tmp_path / "q.safetensors"
    r = run("quantize", src, dst, "--fp4", "mxfp4", "--fp4-rule", "mlx", "--json")
    assert r.exit_code == 0, r.output
    ck = load(dst)
    for n in NAMES[1:3]:
        assert np.array_equal(pack(np.asarray(ck[n].codes)), mlx[f"{n}.mlx.packed"])
        assert np.array_equal(np.asarray(ck[n].scales).view(np.uint8), mlx[f"{n}.mlx.scale"])


def test_cli_fp4_dequantize_matches_the_decode(src, fx, tmp_path):
    # the native file's decode: E2M1 value x 2^(e-127), by hand from the fixture bytes
    dst = tmp_path / "q.safetensors"
    assert run("quantize", src, dst, "--fp4", "mxfp4").exit_code == 0
    n = NAMES[2]
    b = fx[f"{n}.mxfp4.packed"]
    codes = np.stack([b & 15, b >> 4], -1).reshape(b.shape[0], -1)
    mag = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)[codes & 7]
    want = np.where(codes & 8, -mag, mag) * np.repeat(np.exp2(fx[f"{n}.mxfp4.scale"].astype(np.float32) - 127), 32, 1)
    assert np.array_equal(load(dst)[n].dequantize(), want)
    assert np.abs(want - bf16_values(fx[f"{n}.bf16"])).max() > 0  # lossy (the test can fail)


@pytest.mark.parametrize("extra,msg", [(("--fp8", "e4m3"), "--fp4 and --fp8"), (("--bits", "8"), "4 bits"),
                                       (("--asym",), "symmetric"), (("--group-size", "64"), "groups of 32"),
                                       (("--scale-dtype", "f16"), "scale dtype")])
def test_cli_fp4_option_conflicts(src, tmp_path, extra, msg):
    r = CliRunner().invoke(main, ["quantize", str(src), str(tmp_path / "q"), "--fp4", "mxfp4", *extra])
    assert r.exit_code == 2 and msg in r.output


def test_cli_fp4_rule_mlx_nvfp4_has_no_global_scale(src, tmp_path):
    """MLX's nvfp4 (mx.quantize without global_scale): E4M3 scales straight from amax / 6, no global scale; the
    bytes against mlx-lm's own file are tests/ops/test_quantize_fp4_targets.py."""
    dst = tmp_path / "q.safetensors"
    r = run("quantize", src, dst, "--fp4", "nvfp4", "--fp4-rule", "mlx", "--json")
    assert r.exit_code == 0, r.output
    ck = load(dst)
    assert all(ck[n].global_scale is None and ck[n].scheme.global_scale is None for n in NAMES)


def test_cli_fp4_to_format_without_fp4_codes_is_refused_with_the_reason(src, tmp_path):
    """GPTQ holds integer grids only: the target's own reason, the source named, nothing written (the FP4
    targets with writers are tests/ops/test_quantize_fp4_targets.py)."""
    from converter.errors import NotRepresentableError
    from converter.ops.quantize_model import QuantizeOptions, quantize_model
    opts = QuantizeOptions(bits=4, granularity="group", group_size=32, scale_dtype="F8_E8M0", fp4="mxfp4")
    dst = tmp_path / "out"
    with pytest.raises(NotRepresentableError) as ei:
        quantize_model(load(src), dst, opts, to="gptq")
    assert "GPTQ stores integer grids, not codebook indices" in str(ei.value) and ei.value.tensor in NAMES
    assert ei.value.file == str(src) and "--fp4" in ei.value.hint
    assert not dst.exists()
