"""``qckpt convert --fp8``: any quantized source requantized to FP8 in one step (GPTQ int4 -> DeepSeek
block FP8, -> ModelOpt per-channel FP8); the refusal of an FP8-only target names that command line;
``quantize --fp8 --to mlx`` is refused before quantizing (MLX mxfp8 stores E8M0 scales)."""

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.codebooks import ELEMENTS
from converter.formats.registry import load
from converter.schemas import validate_document
from tests.conftest import SAMPLES

GPTQ = SAMPLES / "gptq_w4_g128_sym"
FP16 = SAMPLES / "minilm_fp16.safetensors"
E4M3 = ml_dtypes.float8_e4m3fn


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def _by_hand(w: np.ndarray, bo: int, bi: int, scale_np) -> tuple[np.ndarray, np.ndarray]:
    """Absmax E4M3 of float32 ``w`` per ``bo x bi`` tile: scale = amax / 448 stored in ``scale_np``,
    codes = RNE E4M3 of clip(w / stored scale, +-448), -0 quotients as +0 (compressed-tensors)."""
    o, i = w.shape
    ts = np.zeros((-(-o // bo), -(-i // bi)), scale_np)
    codes = np.zeros(w.shape, np.uint8)
    for a in range(ts.shape[0]):
        for b in range(ts.shape[1]):
            blk = w[a * bo:(a + 1) * bo, b * bi:(b + 1) * bi]
            amax = np.float32(np.abs(blk).max())
            s = (amax / np.float32(448)).astype(scale_np) if amax else scale_np(1)
            ts[a, b] = s
            q = np.clip(blk / np.float32(s), -448, 448) + np.float32(0)
            codes[a * bo:(a + 1) * bo, b * bi:(b + 1) * bi] = q.astype(E4M3).view(np.uint8)
    return ts, codes


@pytest.mark.parametrize("to,opts,tile", [("fp8", ["--block", "128x128"], (128, 128)),
                                          ("modelopt", ["--per-channel"], (1, None))])
def test_gptq_to_fp8_in_one_step(tmp_path, to, opts, tile):
    dst, rep = tmp_path / "out", tmp_path / "report.json"
    r = run("convert", GPTQ, dst, "--to", to, "--fp8", "e4m3", *opts, "--report", rep)
    assert r.exit_code == 0, r.output
    doc = json.loads(rep.read_text())
    validate_document(doc, "error-report")
    assert doc["target"]["element"] == "e4m3" and doc["target"]["bits"] == 8
    assert doc["overall"]["tensors"] == 7 and doc["overall"]["lossy"] == 7
    src, out = load(GPTQ), load(dst)
    assert out.format == to
    for name in src.quantized_names():
        t, w = out[name], src[name].dequantize()
        assert t.scheme.codebook == ELEMENTS["e4m3"].values
        bo, bi = tile
        s, codes = _by_hand(w, bo, bi or w.shape[1], t.scales.dtype.type)
        np.testing.assert_array_equal(t.scales.reshape(s.shape), s)
        np.testing.assert_array_equal(t.codes, codes)


@pytest.mark.parametrize("to", ["fp8", "modelopt"])
def test_fp8_only_target_refusal_names_the_fp8_command(tmp_path, to):
    r = run("convert", GPTQ, tmp_path / "x", "--to", to)
    assert r.exit_code != 0
    assert f"qckpt convert {GPTQ} {tmp_path / 'x'} --to {to} --fp8 e4m3 --block 128x128" in r.output
    assert "--bits B" not in r.output  # the integer hint cannot work for an FP8-only target


def test_convert_fp8_usage_errors(tmp_path):
    r = run("convert", GPTQ, tmp_path / "x", "--to", "fp8", "--fp8", "e4m3", "--group-size", "32")
    assert r.exit_code != 0 and "--group-size does not apply to --fp8" in r.output
    r = run("convert", GPTQ, tmp_path / "x", "--to", "fp8", "--block", "128x128")
    assert r.exit_code != 0 and "--block needs --fp8" in r.output


def test_quantize_fp8_to_mlx_is_refused_up_front(tmp_path):
    dst = tmp_path / "m"
    r = run("quantize", FP16, dst, "--fp8", "e4m3", "--per-channel", "--to", "mlx")
    assert r.exit_code != 0
    assert "MLX mxfp8 needs E8M0 (power-of-two) scales" in r.output
    assert "--to compressed-tensors | fp8 | modelopt" in r.output and "--bits 8 --group-size 32 --to mlx" in r.output
    assert not dst.exists()
    r = run("quantize", FP16, dst, "--bits", "8", "--group-size", "32", "--to", "mlx")  # what the message offers
    assert r.exit_code == 0, r.output


def test_error_report_counts_partial_blocks_along_out(tmp_path):
    """100 x 128 blocks of 384- and 1536-row matrices: out leaves partial blocks, in does not
    (partial_tail 0); the report counts them (by hand: grid ceil(O/100) x I/128 minus the whole ones)."""
    dst, rep = tmp_path / "out", tmp_path / "report.json"
    r = run("convert", GPTQ, dst, "--to", "native", "--fp8", "e4m3", "--block", "100x128", "--report", rep)
    assert r.exit_code == 0, r.output
    doc = json.loads(rep.read_text())
    validate_document(doc, "error-report")
    for row in doc["tensors"]:
        o, i = row["shape"]
        want = -(-o // 100) * (i // 128) - (o // 100) * (i // 128)
        assert row["partial_tail"] == 0 and row["partial_blocks"] == row["partial_groups"] == want > 0
    assert doc["overall"]["partial_groups"] == sum(r["partial_blocks"] for r in doc["tensors"])
    gm = load(dst)[doc["tensors"][0]["name"]].group_map
    o, i = doc["tensors"][0]["shape"]
    assert gm.to_json((o, i), ("out", "in"))["partial_blocks"] == -(-o // 100) * (i // 128) - (o // 100) * (i // 128)
