"""FP8 across formats (issue 14): the readers, writers and the quantizer of different formats agree.

- ``qckpt quantize --fp8 ... --to compressed-tensors | fp8 | modelopt`` from real SmolLM2 bf16 rows
  writes exactly the codes and scales compressed-tensors (per channel) and auto-round (128 x 128
  blocks) wrote for the same rows (tests/data/fp8, FP_MANIFEST.json), read back by each format's reader.
- DeepSeek-style block FP8 (auto-round) -> compressed-tensors FP8_BLOCK -> fp8: codes and scales
  byte-identical at every hop, and the dequantized values equal the tool's own decode.
- compressed-tensors per-channel FP8 -> ModelOpt FP8_PER_CHANNEL_PER_TOKEN -> compressed-tensors:
  byte-identical.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file

from converter.cli import main
from converter.formats.registry import load
from tests.conftest import SAMPLES
from tests.kernels.test_fp_rtn import NAMES, load_fixture
from tests.ops.test_quantize_fp8 import write_bf16

DEEPSEEK = SAMPLES / "deepseek_fp8_block_smollm2tiny"
CT_CHANNEL = SAMPLES / "ct_fp8_channel_smollm2"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def fx():
    return load_fixture()


@pytest.fixture()
def src(tmp_path, fx):
    p = tmp_path / "float.safetensors"
    write_bf16(p, {n: fx[f"{n}.bf16"] for n in NAMES})
    return p


@pytest.mark.parametrize("to,layout,tool,scale", [
    ("compressed-tensors", ("--per-channel",), "ct_channel", "scale"),
    ("modelopt", ("--per-channel",), "ct_channel", "scale"),
    ("compressed-tensors", ("--block", "128x128"), "autoround_block", "scale_inv"),
    ("fp8", ("--block", "128x128"), "autoround_block", "scale_inv"),
    ("modelopt", ("--block", "128x128"), "autoround_block", "scale_inv"),
])
def test_quantize_fp8_to_each_fp8_format_writes_the_real_tools_codes(src, fx, tmp_path, to, layout, tool, scale):
    dst = tmp_path / to
    r = run("quantize", src, dst, "--fp8", "e4m3", *layout, "--to", to, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["format"] == to
    ckpt = load(dst)
    assert ckpt.format == to
    for name in NAMES:
        t = ckpt[name]
        assert t.scheme.describe() == "e4m3 float" and t.scheme.scale_dtype == "BF16"
        np.testing.assert_array_equal(t.codes, fx[f"{name}.{tool}.codes"])
        np.testing.assert_array_equal(t.scales.view(np.uint16).reshape(-1), fx[f"{name}.{tool}.{scale}"].reshape(-1))


def _fp8_arrays(ckpt):
    return {n: (ckpt[n].codes, ckpt[n].scales, ckpt[n].group_map.describe())
            for n in ckpt.names() if ckpt.spec(n).kind == "quantized"}


def test_deepseek_block_fp8_to_compressed_tensors_and_back_is_byte_identical(tmp_path):
    ct, back = tmp_path / "ct", tmp_path / "fp8"
    r = run("convert", DEEPSEEK, ct, "--to", "compressed-tensors", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert {row["mode"] for row in doc["tensors"] if row["kind"] == "quantized"} == {"exact"}
    qc = json.loads((ct / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "float-quantized"
    # two groups: the same 128 x 128 weights, activations declared per group (down_proj) or per token
    assert [g["weights"]["block_structure"] for g in qc["config_groups"].values()] == [[128, 128]] * 2
    assert run("convert", ct, back, "--to", "fp8").exit_code == 0
    a, b, c = (_fp8_arrays(load(p)) for p in (DEEPSEEK, ct, back))
    assert set(a) == set(b) == set(c) and len(a) == 7
    for n in a:
        for x, y in ((a[n], b[n]), (a[n], c[n])):
            assert np.array_equal(x[0], y[0]) and x[1].dtype == y[1].dtype
            assert np.array_equal(x[1].view(np.uint16), y[1].view(np.uint16))
            assert x[2] == y[2] == "block(out 128 x in 128)"
    # the tool's own decode (auto-round, bf16) of the tensors shipped with the sample
    ref = load_file(str(DEEPSEEK / "reference_dequant.safetensors"))
    got = load(back)
    for n, want in ref.items():
        mine = got[n].dequantize().astype(ml_dtypes.bfloat16)
        assert np.array_equal(mine.view(np.uint16), np.asarray(want).view(np.uint16)), n


def test_ct_channel_fp8_to_modelopt_and_back_is_byte_identical(tmp_path):
    mo, back = tmp_path / "mo", tmp_path / "ct"
    assert run("convert", CT_CHANNEL, mo, "--to", "modelopt").exit_code == 0
    hq = json.loads((mo / "hf_quant_config.json").read_text())["quantization"]
    assert hq["quant_algo"] == "FP8_PER_CHANNEL_PER_TOKEN"
    assert run("convert", mo, back, "--to", "compressed-tensors").exit_code == 0
    a, b = _fp8_arrays(load(CT_CHANNEL)), _fp8_arrays(load(back))
    assert set(a) == set(b) and len(a) == 4
    for n in a:
        assert np.array_equal(a[n][0], b[n][0]) and np.array_equal(a[n][1].view(np.uint16), b[n][1].view(np.uint16))


def test_validate_fp8_samples_with_their_readers_finds_only_partial_blocks():
    from converter.validate import validate
    rep = validate(DEEPSEEK)
    assert rep.exit_code == 0 and len(rep.tensors) == 7
    assert {f.code for f in rep.findings} == {"block-tail"} and all(f.severity == "info" for f in rep.findings)


def test_deepseek_dynamic_group_activations_declared_where_they_tile(tmp_path):
    """DeepSeek's activations are quantized per token group of 128 (``act_quant``); compressed-tensors'
    runtime cannot run a partial group, so a module whose in_features 128 does not divide (576) is declared
    per token and the report warns; down_proj (1536 = 12 x 128) keeps the group-128 declaration."""
    ct = tmp_path / "ct"
    r = run("convert", DEEPSEEK, ct, "--to", "compressed-tensors")
    assert r.exit_code == 0, r.output
    assert "do not tile in_features 576: declared per token" in " ".join(r.output.split())
    groups = json.loads((ct / "config.json").read_text())["quantization_config"]["config_groups"]
    by_target = {t: g["input_activations"] for g in groups.values() for t in g["targets"]}
    down = [a for t, a in by_target.items() if "down_proj" in t]
    others = [a for t, a in by_target.items() if "down_proj" not in t]
    assert down and all(a["strategy"] == "group" and a["group_size"] == 128 and a["dynamic"] for a in down)
    assert others and all(a["strategy"] == "token" and a["dynamic"] for a in others)
