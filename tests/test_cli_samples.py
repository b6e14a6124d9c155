"""``qckpt inspect``, ``dequantize`` and ``convert --to`` through CliRunner on every real sample.

- inspect --json validates against schemas/inspect.schema.json and reports the right format.
- dequantize --dtype f16: every tensor of reference_dequant.safetensors (the tool's own decode)
  equals ours after casting both to fp16, bit for bit, except MLX: mx.dequantize computes in fp16
  (rounds s*q, then the sum) where we round once from float32; there the tolerance is exactly that
  double rounding (as in tests/formats/test_mlx.py).
- convert --to X --json for every writable X: exit 0 with a report that validates against
  schemas/convert-report.schema.json and proves the pair (see tests/test_repack_matrix.py for
  the expected outcome per pair), or exit 3 with one line naming the reason and no output left.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file

from converter.cli import main
from converter.formats import registry
from converter.schemas import validate_document
from tests.conftest import SAMPLES
from tests.test_repack_matrix import EXPECTED, NO_ARCH, REASONS, REFUSE, ROUND

FORMATS = {
    "awq_gemm_w4_g128_zp": "awq", "bnb_int8": "bitsandbytes", "bnb_nf4_bs64": "bitsandbytes",
    "ct_pack_w4a16_channel_sym": "compressed-tensors", "ct_pack_w4a16_group128_asym": "compressed-tensors",
    "ct_pack_w4a16_group128_sym": "compressed-tensors", "ct_pack_w8a16_channel_sym": "compressed-tensors",
    "gptq_w4_g128_sym": "gptq", "gptq_w4_gchan_sym": "gptq", "mlx_affine_g32_b8": "mlx",
    "mlx_affine_g64_b4": "mlx", "minilm_fp16.safetensors": "plain",
}
QUANTIZED = {k: (0 if v == "plain" else 5 if k.startswith("bnb") else 7) for k, v in FORMATS.items()}
#: Every sample's format for the convert matrix (the FP8 samples have their own CLI tests in tests/formats/).
CONVERT_FORMATS = {**FORMATS, "ct_fp8_channel_smollm2": "compressed-tensors",
                   **{f"modelopt_{t}_smollm2tiny": "modelopt" for t in ("fp8", "fp8_pc_pt", "fp8_pb_wo")},
                   "deepseek_fp8_block_smollm2tiny": "fp8", "ct_mxfp4_smollm2": "compressed-tensors",
                   "ct_nvfp4_smollm2": "compressed-tensors", "modelopt_nvfp4_smollm2tiny": "modelopt",
                   **{f"mlx_{m}_smollm2tiny": "mlx" for m in ("mxfp4", "nvfp4")}, "mlx_nvfp4_global_smollm2": "mlx"}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.mark.parametrize("sample", sorted(FORMATS))
def test_inspect_json(sample):
    r = run("inspect", SAMPLES / sample, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "inspect")
    assert doc["format"] == FORMATS[sample] and doc["n_quantized"] == QUANTIZED[sample]
    for row in doc["tensors"]:
        if row["kind"] == "quantized":
            assert row["axes"] == ["out", "in"] and row["shape"][0] in (384, 1536)
            assert sum(s["bytes"] for s in row["stored"]) > 0


@pytest.mark.parametrize("sample", sorted(s for s in FORMATS if s != "minilm_fp16.safetensors"))
def test_dequantize_matches_tool_reference(sample, tmp_path):
    out = tmp_path / "deq.safetensors"
    r = run("dequantize", SAMPLES / sample, out, "--dtype", "f16", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["source_format"] == FORMATS[sample] and doc["dtype"] == "f16"
    ours = load_file(str(out))
    src = registry.load(SAMPLES / sample)
    assert sorted(ours) == sorted(src.names()) and all(v.dtype == np.float16 for v in ours.values())
    ref = load_file(str(SAMPLES / sample / "reference_dequant.safetensors"))
    assert len(ref) == 4
    for name, r_val in ref.items():
        r16 = r_val.astype(np.float16)  # bnb_int8's reference is float32: cast, as the brief says
        if FORMATS[sample] == "mlx" and name.endswith(".weight"):
            t = src[name]
            s = t.group_map.expand(t.scales, t.shape, t.axes)
            prod = (t.codes.astype(np.float16) * s).astype(np.float16)
            tol = 0.5 * np.spacing(np.abs(prod)).astype(np.float32) + 0.5 * np.spacing(np.abs(r16)).astype(np.float32)
            # ours is round-to-fp16 of the float32 value: add half an fp16 ulp of our output
            tol += 0.5 * np.spacing(np.abs(ours[name])).astype(np.float32)
            assert (np.abs(ours[name].astype(np.float32) - r16.astype(np.float32)) <= tol).all(), name
        else:
            assert np.array_equal(ours[name], r16), name


def test_dequantize_float_sample_is_identity(tmp_path):
    out = tmp_path / "deq.safetensors"
    r = run("dequantize", SAMPLES / "minilm_fp16.safetensors", out, "--dtype", "f16")
    assert r.exit_code == 0, r.output
    a, b = load_file(str(SAMPLES / "minilm_fp16.safetensors")), load_file(str(out))
    assert sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in a)


@pytest.mark.parametrize("sample,target", sorted(EXPECTED), ids=lambda x: x)
def test_convert_json(sample, target, tmp_path):
    dst = tmp_path / "out"
    r = CliRunner().invoke(main, ["convert", str(SAMPLES / sample), str(dst), "--to", target, "--json"])
    if EXPECTED[(sample, target)] == NO_ARCH:  # a float file without config.json: GGUF needs an architecture
        assert r.exit_code == 3, r.output
        err = json.loads(r.output)
        validate_document(err, "error")
        assert err["field"] == "general.architecture" and "no GGUF architecture" in err["message"]
        assert list(tmp_path.iterdir()) == []
        return
    if EXPECTED[(sample, target)] == REFUSE:
        assert r.exit_code == 3, r.output
        err = json.loads(r.output)  # under --json a refusal is one JSON error object (schemas/error.schema.json)
        validate_document(err, "error")
        assert err["exit_code"] == 3 and REASONS[(sample, target)] in " ".join(str(v) for v in err.values())
        assert "Traceback" not in r.output and list(tmp_path.iterdir()) == []
        return
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "convert-report")
    assert doc["target_format"] == target and doc["source_format"] == CONVERT_FORMATS[sample]
    s = doc["summary"]
    assert s["changed"] == 0 and s["within_rounding"] and s["tensors"] == len(registry.load(SAMPLES / sample))
    rounded = [r for r in doc["tensors"] if r["mode"] == "exact_up_to_rounding"]
    # all_exact only when every tensor is bit-exact (issue 18: rounded biases made it claim true)
    # activation scales GGUF and a float model have no place for
    dropped = [r for r in doc["tensors"] if r["mode"] == "dropped"]
    assert all(r["name"].endswith("input_scale") and target in ("gguf", "plain") for r in dropped)
    assert s["all_exact"] is (not rounded and not dropped)
    if EXPECTED[(sample, target)] == ROUND:
        assert rounded and s["quantized"]["exact_up_to_rounding"] == len(rounded) == 7
        assert 0 < s["quantized"]["max_rounding_diff"] == max(r["max_abs_diff"] for r in rounded)
    assert s["dense"]["exact"] + len(dropped) == s["dense"]["tensors"]  # biases passed through, counted apart
    assert s["quantized"]["tensors"] + s["dense"]["tensors"] == s["tensors"]
