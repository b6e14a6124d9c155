"""``qckpt convert`` with requantize options, on the real compressed-tensors group-128 sample and the
real fp16 MiniLM weights as --reference."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file

from converter.cli import main
from converter.exit_codes import UNREADABLE, USAGE
from converter.formats.registry import load
from converter.schemas import validate_document
from tests.conftest import SAMPLES

CT = SAMPLES / "ct_pack_w4a16_group128_sym"
FP16 = SAMPLES / "minilm_fp16.safetensors"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def per_channel(tmp_path_factory):
    d = tmp_path_factory.mktemp("rq")
    dst, rep = d / "pc", d / "report.json"
    r = run("convert", CT, dst, "--per-channel", "--reference", FP16, "--report", rep)
    assert r.exit_code == 0, r.output
    assert "worst first" in r.output and "metadata cost" in r.output
    return d, dst, json.loads(rep.read_text())


def test_group128_to_per_channel_report(per_channel):
    _, dst, doc = per_channel
    validate_document(doc, "error-report")
    assert doc["source_format"] == doc["target_format"] == "compressed-tensors"
    assert doc["overall"]["tensors"] == 7 and doc["overall"]["planned_lossy"] == 7 and doc["overall"]["lossy"] == 7
    ref = load_file(str(FP16))
    src = load(CT)
    out = load(dst)
    for row in doc["tensors"]:
        assert row["planned"] == "lossy" and row["reason"] == "per-group -> per-channel merges groups"
        assert row["readback_bit_exact"] and row["target"]["groups"] == "channel(out)"
        name = row["name"]
        a = src[name].dequantize().astype(np.float64)
        b = out[name].dequantize().astype(np.float64)
        w = ref[name].astype(np.float64)
        # the report's figures from the two dequantized tensors and the float original
        assert np.isclose(row["vs_source"]["mse"], np.mean((b - a) ** 2), rtol=1e-9)
        rs = np.linalg.norm(a - w) / np.linalg.norm(w)
        rt = np.linalg.norm(b - w) / np.linalg.norm(w)
        assert np.isclose(row["vs_reference"]["source"]["rel_frobenius"], rs, rtol=1e-6)
        assert np.isclose(row["vs_reference"]["target"]["rel_frobenius"], rt, rtol=1e-6)
        # per-channel 4-bit is worse than group-128 4-bit against the real fp16 weights, within bounds
        assert 0.09 < rs < rt < 0.3
        # RTN on the new grid: error vs the source's values <= scale/2 per element
        s = out[name].scales.astype(np.float32)
        assert np.all(np.abs(b - a) <= s / 2 * (1 + 1e-5) + 1e-7)
    m = doc["overall"]["metadata"]
    assert m["before"]["metadata_bytes"] == 29952 and m["after"]["metadata_bytes"] == 7680
    assert m["before"]["bits_per_weight"] == 4.125
    rels = [r["vs_source"]["rel_frobenius"] for r in doc["tensors"]]
    assert rels == sorted(rels, reverse=True)


def test_per_channel_back_to_group128_is_exact(per_channel):
    d, pc, doc1 = per_channel
    dst = d / "g128"
    r = run("convert", pc, dst, "--group-size", 128, "--reference", FP16, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "error-report")
    assert doc["overall"]["planned_exact"] == 7 and doc["overall"]["exact"] == 7
    for row in doc["tensors"]:
        assert row["route"] == "carried" and row["vs_source"]["exact"] and row["vs_source"]["mse"] == 0
        before = next(x for x in doc1["tensors"] if x["name"] == row["name"])
        assert row["vs_reference"]["target"]["rel_frobenius"] == before["vs_reference"]["target"]["rel_frobenius"]
    a, b = load(pc), load(dst)
    for name in a.quantized_names():
        np.testing.assert_array_equal(a[name].codes, b[name].codes)
        assert b[name].group_map.group_size == 128


def test_to_other_format_with_requantize(tmp_path):
    dst = tmp_path / "gptq"
    r = run("convert", CT, dst, "--to", "gptq", "--bits", 8, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["target_format"] == "gptq" and doc["overall"]["exact"] == 7  # more bits, same scale: exact
    assert load(dst).format == "gptq"


def test_not_representable_refused_before_writing(tmp_path):
    dst = tmp_path / "awq"
    r = CliRunner().invoke(main, ["convert", str(CT), str(dst), "--to", "awq", "--bits", "2"])
    assert r.exit_code == UNREADABLE
    assert "--bits" in r.output and "not representable in awq" in r.output
    assert not dst.exists()


def test_usage_errors(tmp_path):
    r = CliRunner().invoke(main, ["convert", str(CT), str(tmp_path / "x"), "--per-channel", "--group-size", "32"])
    assert r.exit_code == USAGE


@pytest.mark.parametrize("to, why", [("nosuch", "unknown format"), ("bitsandbytes", "format has no writer")])
@pytest.mark.parametrize("requant", [(), ("--bits", "8")])
def test_unknown_or_read_only_target_format_is_a_usage_error(tmp_path, to, why, requant):
    dst = tmp_path / "x"
    r = CliRunner().invoke(main, ["convert", str(CT), str(dst), "--to", to, *requant])
    assert r.exit_code == USAGE, r.output
    assert why in r.output and to in r.output and "gptq" in r.output  # the writable formats are listed
    assert not dst.exists()


def test_requant_target_conflict_is_a_usage_error(tmp_path, monkeypatch):
    # a Target check click does not duplicate (here: the scale-dtype table emptied) is an option error
    from converter.quant import target
    monkeypatch.setattr(target, "SCALE_DTYPE_ALIASES", {})
    dst = tmp_path / "x"
    r = CliRunner().invoke(main, ["convert", str(CT), str(dst), "--scale-dtype", "f16"])
    assert r.exit_code == USAGE and "unknown scale dtype" in r.output
    assert not dst.exists()


def test_plain_convert_still_repacks(tmp_path):
    r = run("convert", CT, tmp_path / "same", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["mode"] == "repack"


def test_mlx_negative_scales_to_gptq_asym_validates_clean(tmp_path):
    """MLX stores negative scales; GPTQ/AWQ/compressed-tensors expect positive ones. The carried grid is
    flipped exactly (codes and zero points mirrored), so the output validates clean and decodes the same."""
    import numpy as np
    import converter
    from click.testing import CliRunner
    from converter.cli import main
    src = SAMPLES / "mlx_affine_g64_b4"
    for to in ("gptq", "compressed-tensors", "awq"):
        dst = tmp_path / to
        r = CliRunner().invoke(main, ["convert", str(src), str(dst), "--to", to, "--asym"])
        assert r.exit_code == 0, r.output
        v = CliRunner().invoke(main, ["validate", str(dst), "--json"])
        assert v.exit_code == 0, v.output
        out = converter.load(dst)
        w = out["encoder.layer.0.attention.self.query.weight"]
        assert (w.scales.astype(np.float32) >= 0).all()
