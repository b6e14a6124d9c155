"""FP4 sources requantized to integer targets (GGUF Q4_0 / Q8_0, GPTQ, AWQ, compressed-tensors int4,
MLX affine): the route is ``requantized`` / ``lossy`` and the error report's figures are those of the
written file against the source's true decode -- computed here by hand from the compressed-tensors
bytes of the fixture (E2M1 value x E8M0 2^(e-127), or x E4M3 / global scale): a reader of the NVFP4
global scale in the wrong direction would be off by g^2 (512^2) and fail these numbers."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.formats.registry import load
from converter.schemas import validate_document
from tests.kernels.test_fp4_rtn import HERE, NAMES, load_fixture
from tests.ops.test_quantize_fp8 import write_bf16

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)
TARGETS = [("gguf", ["--quant-type", "Q4_0"]), ("gguf", ["--quant-type", "Q8_0"]),
           ("gptq", ["--bits", "4", "--group-size", "64"]), ("awq", ["--bits", "4", "--group-size", "64"]),
           ("compressed-tensors", ["--bits", "4", "--group-size", "64"]),
           ("mlx", ["--bits", "4", "--group-size", "32"])]


def hand_decode(fx, name: str, kind: str) -> np.ndarray:
    b = fx[f"{name}.{kind}.packed"]
    c = np.stack([b & 15, b >> 4], -1).reshape(b.shape[0], -1)
    v = np.where(c & 8, -E2M1[c & 7], E2M1[c & 7])
    if kind == "mxfp4":
        s = np.exp2(fx[f"{name}.mxfp4.scale"].astype(np.float32) - 127)
        return v * np.repeat(s, 32, axis=1)
    import ml_dtypes
    s = fx[f"{name}.nvfp4.scale"].view(ml_dtypes.float8_e4m3fn).astype(np.float32) / fx[f"{name}.nvfp4.global"][0]
    return v * np.repeat(s, 16, axis=1)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    fx = load_fixture()
    root = tmp_path_factory.mktemp("fp4src")
    (root / "f").mkdir()
    write_bf16(root / "f" / "model.safetensors", {n: fx[f"{n}.bf16"] for n in NAMES})
    shutil.copy(HERE / "config.json", root / "f" / "config.json")
    for kind in ("mxfp4", "nvfp4"):
        r = CliRunner().invoke(main, ["quantize", str(root / "f"), str(root / kind), "--fp4", kind])
        assert r.exit_code == 0, r.output
    return fx, root


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("to,opts", TARGETS, ids=[f"{t}-{o[1]}" for t, o in TARGETS])
def test_fp4_requantized_with_a_correct_error_report(sources, tmp_path, kind, to, opts):
    fx, root = sources
    dst, rep = tmp_path / "out", tmp_path / "rep.json"
    r = CliRunner().invoke(main, ["convert", str(root / kind), str(dst), "--to", to, *opts, "--report", str(rep)])
    assert r.exit_code == 0, r.output
    doc = json.loads(rep.read_text())
    validate_document(doc, "error-report")
    out = load(dst)
    rows = {t["name"]: t for t in doc["tensors"]}
    for n in NAMES:
        src = hand_decode(fx, n, kind)
        assert np.array_equal(load(root / kind)[n].dequantize(), src)  # our decode = the bytes' decode
        got = out[n].dequantize().astype(np.float64)
        rmse = float(np.sqrt(np.mean((got - src) ** 2)))
        row = rows[n]
        assert row["route"] == "requantized" and row["result"] == "lossy" and row["readback_bit_exact"], n
        assert row["vs_source"]["rmse"] == pytest.approx(rmse, rel=1e-5), n
        assert row["vs_source"]["max_abs"] == pytest.approx(float(np.abs(got - src).max()), rel=1e-6), n
        # relative to the decode's magnitude the error is small: the global scale was honoured
        assert rmse < 0.2 * float(np.sqrt(np.mean(src.astype(np.float64) ** 2))), n


@pytest.mark.parametrize("kind,group,scale_bytes,global_bytes", [("mxfp4", 32, 1, 0), ("nvfp4", 16, 1, 4)])
def test_fp4_report_counts_the_source_metadata_with_its_global_scale(sources, tmp_path, kind, group, scale_bytes,
                                                                      global_bytes):
    """The report's "before" cost of an FP4 source, by hand: payload N/2 bytes, one scale byte per
    group (E8M0 / E4M3), plus NVFP4's float32 global scale (4 bytes; it was once left out), so
    bits per weight are 4.25 for MXFP4 and 4.5 + 32/N for NVFP4."""
    fx, root = sources
    rep = tmp_path / "rep.json"
    r = CliRunner().invoke(main, ["convert", str(root / kind), str(tmp_path / "o"), "--to", "gguf",
                                  "--quant-type", "Q8_0", "--report", str(rep)])
    assert r.exit_code == 0, r.output
    rows = {t["name"]: t for t in json.loads(rep.read_text())["tensors"]}
    for n in NAMES:
        numel = fx[f"{n}.bf16"].size
        before = rows[n]["metadata"]["before"]
        assert before["payload_bytes"] == numel // 2
        assert before["metadata_bytes"] == numel // group * scale_bytes + global_bytes
        assert before["bits_per_weight"] == pytest.approx(4 + 8 / group + 8 * global_bytes / numel)
