"""compressed-tensors ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized``: the real llm-compressor samples (their
tool's bf16 decode), hand-computed layouts (nibble order, divisor direction, the E8M0 version rule, NaN
exponents, partial groups), the writer (exact repack, global-scale directions, legacy encoding).

Expected values are written by hand from the E2M1 table (code i: 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign)
or come from compressed-tensors 0.19.0's own decode (``reference_dequant.safetensors``).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from converter.codebooks import E2M1_VALUES
from converter.errors import MissingTensorError, NotRepresentableError, UnsupportedError
from converter.formats.registry import get, load
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.layout import IN
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, QuantizedTensor, spec_of
from converter.validate import validate
from tests.conftest import SAMPLES
from tests.formats.conformance import ModelDirConformance, ToolDecodeConformance

CT = get("compressed-tensors")
NV, MX = SAMPLES / "ct_nvfp4_smollm2", SAMPLES / "ct_mxfp4_smollm2"
E4M3, E8M0 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e8m0fnu


class TestNVFP4Conformance(ToolDecodeConformance, ModelDirConformance):
    """NVFP4A16 from llm-compressor 0.14 (compressed-tensors 0.19.0): NVFP4PackedCompressor.decompress, bf16."""

    FORMAT = "compressed-tensors"
    SAMPLES = ((NV, NV / "reference_dequant.safetensors"),)

    def decode_like_tool(self, t):
        return t.dequantize().astype(ml_dtypes.bfloat16)  # RNE_bf16(fp32(e2m1 * fp32(s / g)))


class TestMXFP4Conformance(TestNVFP4Conformance):
    """MXFP4A16 (compressed-tensors 0.19.0): MXFP4PackedCompressor.decompress, bf16."""

    SAMPLES = ((MX, MX / "reference_dequant.safetensors"),)


def _weights(fmt):
    nv = fmt == "nvfp4-pack-quantized"
    return {"actorder": None, "block_structure": None, "dynamic": False, "group_size": 16 if nv else 32,
            "num_bits": 4, "observer": None, "observer_kwargs": {},
            "scale_dtype": "torch.float8_e4m3fn" if nv else "torch.uint8",
            "strategy": "tensor_group" if nv else "group", "symmetric": True, "type": "float", "zp_dtype": None}


def _make(tmp_path: Path, tensors: dict, fmt: str, version="0.20.1", name="m", extra_cfg=None) -> Path:
    d = tmp_path / name
    d.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(d / "model.safetensors"))
    qc = {"config_groups": {"g": {"format": fmt, "input_activations": None, "output_activations": None,
                                  "targets": ["Linear"], "weights": _weights(fmt)}},
          "format": fmt, "ignore": ["lm_head"], "quant_method": "compressed-tensors",
          "quantization_status": "compressed"}
    if version is not None:
        qc["version"] = version
    (d / "config.json").write_text(json.dumps({"model_type": "toy", "quantization_config": qc, **(extra_cfg or {})}))
    return d


def _pack(codes: np.ndarray) -> np.ndarray:
    """By hand: element 2j in the low nibble of byte j."""
    c = np.asarray(codes, dtype=np.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


P = "model.layers.0.mlp.up_proj"
CODES = np.array([list(range(16))], dtype=np.uint8)  # one row, 16 inputs: every E2M1 code once
HAND = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


# -- the real samples ---------------------------------------------------------------------------------
def test_samples_specs_roles_and_global_scale():
    ck = load(NV)
    t = ck["model.layers.0.mlp.down_proj.weight"]
    assert t.scheme == QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=E2M1_VALUES, global_scale="divisor")
    assert t.group_map.describe() == GroupMap.per_group(16, IN).describe() and t.scales.shape == (576, 96)
    assert float(t.global_scale) == 936.0 and t.global_scale.shape == ()  # FP_MANIFEST observation
    roles = {a.role for a in ck.spec(t.name).stored}
    assert roles == {"codes", "scales", "global_scale"}
    m = load(MX)
    s = m.spec("model.layers.0.self_attn.q_proj.weight")
    assert s.scheme.scale_dtype == "F8_E8M0" and s.scheme.global_scale is None
    assert m.metadata["mx_e8m0_rule"] == "standard (version)"
    assert any("decided by version" in n for n in s.notes)


@pytest.mark.parametrize("sample", [NV, MX])
def test_sample_round_trip_byte_identical_with_preset_config(sample, tmp_path):
    CT.write(load(sample), tmp_path / "out")
    a, b = Source(sample), Source(tmp_path / "out")
    assert sorted(a.tensor_names()) == sorted(b.tensor_names())
    for k in a.tensor_names():
        assert a.info(k).dtype == b.info(k).dtype and np.asarray(a.read(k)).tobytes() == np.asarray(b.read(k)).tobytes()
    want = json.loads((sample / "config.json").read_text())["quantization_config"]
    got = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert got["config_groups"] == want["config_groups"]  # group name, format, weights: as llm-compressor wrote
    assert got["format"] == want["format"] and got["version"] == "0.20.1"


@pytest.mark.parametrize("sample", [NV, MX])
def test_samples_validate_clean(sample):
    rep = validate(sample)
    assert rep.exit_code == 0 and not rep.findings


# -- hand-computed layouts ----------------------------------------------------------------------------
def test_nvfp4_nibble_order_and_divisor_by_hand(tmp_path):
    # weight_scale 4.0 (E4M3), weight_global_scale 8.0 (divisor): effective 0.5
    t = {P + ".weight_packed": _pack(CODES), P + ".weight_scale": np.array([[4.0]], np.float32).astype(E4M3),
         P + ".weight_global_scale": np.array([8.0], np.float32)}
    got = load(_make(tmp_path, t, "nvfp4-pack-quantized"))[P + ".weight"].dequantize()
    assert got.tolist() == [[v * 0.5 for v in HAND]]
    assert np.signbit(got[0, 8])  # code 0x8 = -0.0
    # the same bytes with the nibbles swapped decode to the pairs exchanged
    t[P + ".weight_packed"] = _pack(CODES[:, [i ^ 1 for i in range(16)]])
    swapped = load(_make(tmp_path, t, "nvfp4-pack-quantized", name="sw"))[P + ".weight"].dequantize()
    assert swapped.tolist() == [[HAND[i ^ 1] * 0.5 for i in range(16)]]
    assert not np.array_equal(swapped, got)


def test_nvfp4_global_scale_is_a_divisor_not_a_multiplier(tmp_path):
    # code 7 (6.0), scale 2.0, global 512: 6 * 2 / 512 = 0.0234375 (a multiplier reading would give 6144)
    t = {P + ".weight_packed": _pack(np.full((1, 16), 7)), P + ".weight_scale": np.array([[2.0]], np.float32)
         .astype(E4M3), P + ".weight_global_scale": np.array([512.0], np.float32)}
    assert load(_make(tmp_path, t, "nvfp4-pack-quantized"))[P + ".weight"].dequantize()[0, 0] == 0.0234375


def _mx(byte: int, code: int = 7):
    return {P + ".weight_packed": _pack(np.full((2, 32), code)), P + ".weight_scale": np.full((2, 1), byte, np.uint8)}


def test_mxfp4_e8m0_bias_rule_old_and_new_by_hand(tmp_path):
    # byte 125: standard (>= 0.14) 2^(125-127) = 0.25 -> code 7 = 1.5; legacy (0.13.0) 2^(125+2-127) = 1 -> 6.0
    new = load(_make(tmp_path, _mx(125), "mxfp4-pack-quantized", "0.20.1", "new"))
    old = load(_make(tmp_path, _mx(125), "mxfp4-pack-quantized", "0.13.0", "old"))
    assert new[P + ".weight"].dequantize()[0, 0] == 1.5 and old[P + ".weight"].dequantize()[0, 0] == 6.0
    assert old.metadata["mx_e8m0_rule"] == "legacy (version)"
    assert np.asarray(old[P + ".weight"].scales).view(np.uint8)[0, 0] == 127  # the true E8M0 byte


def test_mxfp4_data_check_decides_when_version_missing_or_contradicted(tmp_path):
    # codes 7 everywhere: standard decode RMS = 6 * 2^(b-127); a dense sibling of RMS 6.0 matches b = 127 + 2 - 2
    sib = {"model.embed_tokens.weight": np.full((4, 32), 6.0, np.float32)}
    miss = load(_make(tmp_path, {**_mx(125), **sib}, "mxfp4-pack-quantized", None, "miss"))
    assert miss.metadata["mx_e8m0_rule"] == "legacy (data check)"  # standard would be 1.5, 4x too small
    assert miss[P + ".weight"].dequantize()[0, 0] == 6.0
    contra = load(_make(tmp_path, {**_mx(125), **sib}, "mxfp4-pack-quantized", "0.20.1", "contra"))
    assert contra.metadata["mx_e8m0_rule"] == "legacy (data check)"
    assert "contradicted by the data" in contra.metadata["mx_e8m0_evidence"]
    agree = load(_make(tmp_path, {**_mx(127), **sib}, "mxfp4-pack-quantized", None, "agree"))
    assert agree.metadata["mx_e8m0_rule"] == "standard (data check)" and agree[P + ".weight"].dequantize()[0, 0] == 6
    alone = load(_make(tmp_path, _mx(125), "mxfp4-pack-quantized", None, "alone"))
    assert alone.metadata["mx_e8m0_rule"] == "standard (default)"


def test_mxfp4_nan_exponent_loads_and_validate_flags_it(tmp_path):
    t = _mx(127)
    t[P + ".weight_scale"][1, 0] = 0xFF
    d = _make(tmp_path, t, "mxfp4-pack-quantized")
    w = load(d)[P + ".weight"].dequantize()
    assert w[0, 0] == 6.0 and np.isnan(w[1]).all()
    rep = validate(d)
    assert any(f.code == "scale-nonfinite" and f.tensor == P + ".weight" for f in rep.findings) and rep.exit_code


def test_partial_final_group_is_refused_like_compressed_tensors(tmp_path):
    # compressed-tensors 0.20.1 _process_group: ValueError "tensor column shape must be divisble by ... group_size"
    t = {P + ".weight_packed": _pack(np.zeros((1, 24))), P + ".weight_scale": np.ones((1, 2), np.float32).astype(E4M3),
         P + ".weight_global_scale": np.array([1.0], np.float32)}
    with pytest.raises(UnsupportedError, match="not a multiple of group_size 16"):
        load(_make(tmp_path, t, "nvfp4-pack-quantized"))
    q = QuantizedTensor(P + ".weight", ("out", "in"), np.zeros((2, 48), np.uint8), np.ones((2, 2), np.uint8).view(E8M0),
                        QuantScheme(4, False, scale_dtype="F8_E8M0", codebook=E2M1_VALUES), GroupMap.per_group(32, IN))
    assert "partial final FP4 group" in CT.target_reason(spec_of(q))


def test_bad_inputs_raise_typed_errors(tmp_path):
    t = {P + ".weight_packed": _pack(CODES), P + ".weight_scale": np.array([[4.0]], np.float32).astype(E4M3)}
    with pytest.raises(MissingTensorError, match="weight_global_scale"):
        load(_make(tmp_path, t, "nvfp4-pack-quantized", name="a"))
    m = {P + ".weight_packed": _pack(np.zeros((1, 32))), P + ".weight_scale": np.array([[120.0]], np.float32)
         .astype(E4M3)}
    with pytest.raises(UnsupportedError, match="float8_e4m3fn"):
        load(_make(tmp_path, m, "mxfp4-pack-quantized", name="b"))


# -- the writer ---------------------------------------------------------------------------------------
def _nv(g, direction):
    codes = np.tile(np.arange(16, dtype=np.uint8), (2, 2))
    s = np.array([[1.0, 2.0], [4.0, 0.5]], np.float32).astype(E4M3)
    return QuantizedTensor(P + ".weight", ("out", "in"), codes, s,
                           QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=E2M1_VALUES, global_scale=direction),
                           GroupMap.per_group(16, IN), global_scale=None if g is None else np.array(g, np.float32))


@pytest.mark.parametrize("g, direction, divisor", [(2.0 ** -9, "multiplier", 512.0), (5.25, "amax", 512.0),
                                                   (None, None, 1.0), (936.0, "divisor", 936.0)])
def test_write_global_scale_as_divisor_exact(tmp_path, g, direction, divisor):
    t = _nv(g, direction)
    CT.write(Checkpoint.from_tensors([t], format="memory", config={"model_type": "toy"}), tmp_path / "o")
    assert np.asarray(Source(tmp_path / "o").read(P + ".weight_global_scale")).tolist() == [divisor]
    back = load(tmp_path / "o")[P + ".weight"]
    assert np.array_equal(back.codes, t.codes)
    assert np.array_equal(back.dequantize().view(np.uint32), t.dequantize().view(np.uint32))


def test_write_refuses_a_multiplier_with_no_exact_divisor_before_writing(tmp_path):
    t = _nv(0.001209077425301075, "multiplier")  # ModelOpt gate_proj weight_scale_2 (FP_MANIFEST)
    with pytest.raises(NotRepresentableError, match="0.00120907") as exc:
        CT.write(Checkpoint.from_tensors([t], format="memory", config={"model_type": "toy"}), tmp_path / "o")
    assert exc.value.tensor == P + ".weight" and "requantize" in str(exc.value.render())
    assert not (tmp_path / "o").exists()


def test_write_mxfp4_legacy_encoding_with_ct_version(tmp_path):
    d = _make(tmp_path, _mx(125), "mxfp4-pack-quantized")
    CT.write(load(d), tmp_path / "old", ct_version="0.13.0")
    assert np.asarray(Source(tmp_path / "old").read(P + ".weight_scale")).tolist() == [[123], [123]]  # 125 - 2
    back = load(tmp_path / "old")
    assert back.metadata["mx_e8m0_rule"] == "legacy (version)" and back[P + ".weight"].dequantize()[0, 0] == 1.5
    with pytest.raises(NotRepresentableError, match="mxfp4-pack-quantized exists from 0.13.0"):
        CT.write(load(d), tmp_path / "older", ct_version="0.12.2")


def test_input_global_scale_is_activation_metadata_and_passes_through(tmp_path):
    t = {P + ".weight_packed": _pack(CODES), P + ".weight_scale": np.array([[4.0]], np.float32).astype(E4M3),
         P + ".weight_global_scale": np.array([8.0], np.float32),
         P + ".input_global_scale": np.array([3.5], np.float32)}
    ck = load(_make(tmp_path, t, "nvfp4-pack-quantized"))
    assert {a.role for a in ck.spec(P + ".input_global_scale").stored} == {"activation_scale"}
    CT.write(ck, tmp_path / "o")
    qc = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    assert list(qc["config_groups"]) == ["NVFP4"]
    assert qc["config_groups"]["NVFP4"]["input_activations"]["strategy"] == "tensor_group"
    assert np.asarray(Source(tmp_path / "o").read(P + ".input_global_scale")).tolist() == [3.5]


def test_write_refuses_3d_and_other_fp4_pairings():
    q = QuantizedTensor(P + ".weight", ("expert", "out", "in"), np.zeros((2, 2, 32), np.uint8),
                        np.ones((2, 2, 1), np.uint8).view(E8M0),
                        QuantScheme(4, False, scale_dtype="F8_E8M0", codebook=E2M1_VALUES), GroupMap.per_group(32, IN))
    assert "2-D" in CT.target_reason(spec_of(q))
    q16 = QuantizedTensor(P + ".weight", ("out", "in"), np.zeros((2, 32), np.uint8), np.ones((2, 2), np.uint8)
                          .view(E8M0), QuantScheme(4, False, scale_dtype="F8_E8M0", codebook=E2M1_VALUES),
                          GroupMap.per_group(16, IN))
    assert "E8M0 per 32" in CT.target_reason(spec_of(q16))
