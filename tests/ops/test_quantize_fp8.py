"""``qckpt quantize --fp8``: the real SmolLM2 rows of tests/data/fp8 quantized through the command
line give exactly the codes and scales compressed-tensors (per channel) and auto-round (128 x 128
blocks) wrote; the report conforms to its schema; ``--to`` writes through any writable handler."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.formats.registry import load
from converter.schemas import validate_document
from tests.kernels.test_fp_rtn import NAMES, load_fixture


def write_bf16(path, arrays: dict[str, np.ndarray]) -> None:
    """A safetensors file of BF16 tensors given as uint16 bit patterns (written by hand)."""
    head, blobs, off = {}, [], 0
    for name, a in arrays.items():
        b = np.ascontiguousarray(a, dtype="<u2").tobytes()
        head[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


@pytest.fixture(scope="module")
def fx():
    return load_fixture()


@pytest.fixture()
def src(tmp_path, fx):
    p = tmp_path / "float.safetensors"
    write_bf16(p, {n: fx[f"{n}.bf16"] for n in NAMES})
    return p


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("layout,tool,scale", [(("--per-channel",), "ct_channel", "scale"),
                                               (("--block", "128x128"), "autoround_block", "scale_inv")])
def test_cli_fp8_matches_the_real_encoders(src, fx, tmp_path, layout, tool, scale):
    dst = tmp_path / "q.safetensors"
    r = run("quantize", src, dst, "--fp8", "e4m3", *layout, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "quantize-report")
    assert doc["target"]["element"] == "e4m3" and doc["format"] == "native"
    ckpt = load(dst)
    for name in NAMES:
        t = ckpt[name]
        assert t.scheme.describe() == "e4m3 float" and t.scheme.scale_dtype == "BF16"
        np.testing.assert_array_equal(t.codes, fx[f"{name}.{tool}.codes"])
        np.testing.assert_array_equal(t.scales.view(np.uint16).reshape(-1), fx[f"{name}.{tool}.{scale}"].reshape(-1))
    rows = {row["name"]: row for row in doc["tensors"]}
    k = rows[NAMES[0]]
    w = fx[f"{NAMES[0]}.bf16"].view(__import__("ml_dtypes").bfloat16).astype(np.float32)
    e = ckpt[NAMES[0]].dequantize() - w
    assert k["max_abs_error"] == float(np.abs(e).max())
    assert k["mse"] == pytest.approx(float(np.mean(e.astype(np.float64) ** 2)), rel=1e-5)
    if layout[0] == "--block":  # k_proj [192, 576]: 2 x 5 blocks, of which 1 x 4 full
        assert k["n_groups"] == 10 and k["partial_blocks"] == 6
        assert k["bits_per_weight"] == pytest.approx(8 + 10 * 16 / (192 * 576))


def test_cli_fp8_scale_dtype_and_e5m2(src, tmp_path):
    dst = tmp_path / "q.safetensors"
    r = run("quantize", src, dst, "--fp8", "e5m2", "--per-tensor", "--scale-dtype", "f32", "--json")
    assert r.exit_code == 0, r.output
    t = load(dst)[NAMES[0]]
    assert t.scheme.describe() == "e5m2 float" and t.scheme.scale_dtype == "F32" and t.scales.shape == (1, 1)


@pytest.mark.parametrize("args,msg", [
    (("--fp8", "e4m3", "--group-size", "32"), "--group-size does not apply to --fp8"),
    (("--fp8", "e4m3", "--per-channel", "--block", "128x128"), "conflicting options --per-channel and --block"),
    (("--fp8", "e4m3", "--bits", "4", "--per-channel"), "drop --bits 4"),
    (("--fp8", "e4m3", "--asym", "--per-channel"), "drop --asym"),
    (("--fp8", "e4m3", "--block", "0x128"), "positive integers"),
    (("--bits", "4", "--block", "128x128"), "--block needs --fp8"),
    (("--per-channel",), "Missing option '--bits'"),
])
def test_cli_fp8_usage_errors(src, tmp_path, args, msg):
    r = run("quantize", src, tmp_path / "q.safetensors", *args)
    assert r.exit_code == 2 and msg in r.output
    assert not (tmp_path / "q.safetensors").exists()


def test_quantize_to_another_format(src, tmp_path):
    """``--to gptq`` writes through the GPTQ handler (read back as GPTQ, same codes as native)."""
    a, b = tmp_path / "native.safetensors", tmp_path / "gptq"
    assert run("quantize", src, a, "--bits", "4", "--group-size", "64").exit_code == 0
    r = run("quantize", src, b, "--bits", "4", "--group-size", "64", "--to", "gptq", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["format"] == "gptq"
    na, nb = load(a), load(b)
    assert nb.format == "gptq"
    for name in NAMES:
        np.testing.assert_array_equal(na[name].dequantize(), nb[name].dequantize())


def test_quantize_to_a_format_that_cannot_store_fp8_is_refused_before_writing(src, tmp_path):
    dst = tmp_path / "gptq"
    r = CliRunner().invoke(main, ["quantize", str(src), str(dst), "--fp8", "e4m3", "--per-channel", "--to", "gptq"])
    assert r.exit_code == 3 and "not representable in gptq" in r.output and "--fp8" in r.output
    assert not dst.exists()
    r = CliRunner().invoke(main, ["quantize", str(src), str(dst), "--bits", "4", "--per-channel", "--to", "nope"])
    assert r.exit_code == 2 and "unknown format" in r.output
