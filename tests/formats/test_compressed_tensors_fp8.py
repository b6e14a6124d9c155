"""compressed-tensors ``float-quantized`` (FP8): the real llm-compressor sample, hand-computed layouts, mixed
config groups, input_scale metadata, the writer, bad inputs.

Expected values are written by hand (E4M3 / E5M2 codes as their bytes, scales chosen so products are exact)
or come from the producing tool (sample_checkpoints/ct_fp8_channel_smollm2/reference_dequant.safetensors:
compressed-tensors ``FloatQuantizationCompressor.decompress``, bf16).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from converter import codebooks
from converter.cli import main
from converter.errors import FormatError, MissingTensorError, NotRepresentableError, UnsupportedError
from converter.formats.registry import get, load
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, spec_of
from tests.conftest import SAMPLES
from tests.formats.conformance import ModelDirConformance, ToolDecodeConformance

CT = get("compressed-tensors")
SAMPLE = SAMPLES / "ct_fp8_channel_smollm2"
E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2


def _f8(values, dtype=E4M3) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(dtype)


def _weights(strategy="channel", block=None, **extra):
    w = {"dynamic": False, "group_size": None, "num_bits": 8, "strategy": strategy, "symmetric": True, "type": "float"}
    if block is not None:
        w["block_structure"] = block
    w.update(extra)
    return w


def _qc(groups: dict, fmt="float-quantized", ignore=()):
    return {"config_groups": groups, "format": fmt, "ignore": list(ignore), "quant_method": "compressed-tensors",
            "quantization_status": "compressed", "version": "0.20.1"}


def _group(weights, targets=("Linear",), fmt="float-quantized", acts=None):
    return {"format": fmt, "input_activations": acts, "output_activations": None, "targets": list(targets),
            "weights": weights}


def _make(tmp_path: Path, tensors: dict, qc: dict, name="m") -> Path:
    d = tmp_path / name
    d.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "toy", "quantization_config": qc}))
    return d


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32 if a.dtype == np.float32 else np.uint16)


# -- the real sample ---------------------------------------------------------------------------------
class TestFloatQuantizedConformance(ToolDecodeConformance, ModelDirConformance):
    """FP8_DYNAMIC from llm-compressor 0.14 (compressed-tensors 0.19): the tool's bf16 decode, bit for bit."""

    FORMAT = "compressed-tensors"
    SAMPLES = ((SAMPLE, SAMPLE / "reference_dequant.safetensors"),)

    def decode_like_tool(self, t):
        # FloatQuantizationCompressor.decompress: fp8.to(bf16) * bf16 scale, i.e. RNE(float32 product)
        return t.dequantize().astype(ml_dtypes.bfloat16)


def test_sample_specs_and_metadata():
    ck = load(SAMPLE)
    assert ck.format == "compressed-tensors" and ck.metadata["ct_format"] == "float-quantized"
    t = ck["model.layers.0.self_attn.k_proj.weight"]
    assert t.scheme == QuantScheme(8, False, scale_dtype="BF16", codebook=codebooks.E4M3)
    assert t.group_map.describe() == "channel(out)" and t.scales.shape == (192, 1)
    assert ck.metadata["activations"]["model.layers.0.self_attn.k_proj"] == "dynamic"
    assert ck.metadata["input_activations"] == "FP8_DYNAMIC: float 8-bit dynamic per-token"


def test_sample_round_trip_byte_identical_with_dynamic_activations(tmp_path):
    CT.write(load(SAMPLE), tmp_path / "out")
    a, b = Source(SAMPLE), Source(tmp_path / "out")
    assert sorted(a.tensor_names()) == sorted(b.tensor_names())
    for k in a.tensor_names():
        assert a.info(k).dtype == b.info(k).dtype and np.asarray(a.read(k)).tobytes() == np.asarray(b.read(k)).tobytes()
    g = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert g["format"] == "float-quantized" and g["targets"] == ["Linear"]
    assert g["weights"] == _weights("channel")
    assert g["input_activations"] == {"dynamic": True, "group_size": None, "num_bits": 8, "strategy": "token",
                                      "symmetric": True, "type": "float"}


def test_sample_to_modelopt_and_back_is_byte_identical(tmp_path):
    get("modelopt").write(load(SAMPLE), tmp_path / "mo")
    assert load(tmp_path / "mo").format == "modelopt"
    hf = json.loads((tmp_path / "mo" / "hf_quant_config.json").read_text())
    assert hf["quantization"]["quant_algo"] == "FP8_PER_CHANNEL_PER_TOKEN"
    assert tuple(Source(tmp_path / "mo").info("model.layers.0.self_attn.k_proj.weight_scale").shape) == (192,)
    CT.write(load(tmp_path / "mo"), tmp_path / "ct")
    a, b = Source(SAMPLE), Source(tmp_path / "ct")
    assert sorted(a.tensor_names()) == sorted(b.tensor_names())
    for k in a.tensor_names():  # codes and scales: same dtype, shape and bytes
        assert (a.info(k).dtype, a.info(k).shape) == (b.info(k).dtype, b.info(k).shape), k
        assert np.asarray(a.read(k)).tobytes() == np.asarray(b.read(k)).tobytes(), k


# -- hand-computed layouts ---------------------------------------------------------------------------
def test_tensor_strategy_by_hand(tmp_path):
    vals = [[1.0, -2.0, 0.5], [448.0, -0.25, 3.0]]
    d = _make(tmp_path, {"l.weight": _f8(vals), "l.weight_scale": np.array([0.5], np.float32)},
              _qc({"g": _group(_weights("tensor"))}))
    t = load(d)["l.weight"]
    assert t.group_map.describe() == "tensor" and t.scales.shape == (1, 1)
    assert t.dequantize().tolist() == [[0.5, -1.0, 0.25], [224.0, -0.125, 1.5]]


def test_block_strategy_partial_edge_blocks_by_hand(tmp_path):
    # O=3, I=5, block [2, 2]: scales [ceil(3/2), ceil(5/2)] = [2, 3]; row 2 and column 4 are partial blocks
    vals = np.array([[1, 2, 3, 4, 5], [-1, -2, -3, -4, -5], [0.5, 1.5, 2, 6, 8]], np.float32)
    scales = np.array([[1.0, 2.0, 4.0], [0.5, 0.25, 8.0]], np.float32)
    d = _make(tmp_path, {"l.weight": _f8(vals), "l.weight_scale": scales},
              _qc({"g": _group(_weights("block", [2, 2]))}))
    ck = load(d)
    t = ck["l.weight"]
    assert t.group_map.describe() == "block(out 2 x in 2)"
    assert t.dequantize().tolist() == [[1, 2, 6, 8, 20], [-1, -2, -6, -8, -20], [0.25, 0.75, 0.5, 1.5, 64]]
    assert any("partial edge block" in n for n in ck.spec("l.weight").notes)
    CT.write(ck, tmp_path / "w")
    qc = json.loads((tmp_path / "w" / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"]["weights"]["block_structure"] == [2, 2]
    back = load(tmp_path / "w")["l.weight"]
    assert np.array_equal(back.codes, t.codes) and np.array_equal(back.scales, t.scales)


def test_e5m2_weights_read_from_the_stored_dtype(tmp_path):
    d = _make(tmp_path, {"l.weight": _f8([[1.0, -3.0], [57344.0, 0.0078125]], E5M2),
                         "l.weight_scale": np.array([[2.0], [0.5]], np.float16)},
              _qc({"g": _group(_weights("channel"))}))
    t = load(d)["l.weight"]
    assert t.scheme.codebook == codebooks.ELEMENTS["e5m2"].values and t.scheme.scale_dtype == "F16"
    assert t.dequantize().tolist() == [[2.0, -6.0], [28672.0, 0.00390625]]
    # float-quantized declares no element: its loaders create float8_e4m3fn, so E5M2 is not written
    assert "e5m2" in CT.check_target(spec_of(t))
    with pytest.raises(NotRepresentableError, match="e5m2"):
        CT.write(load(d), tmp_path / "w")


def test_static_input_scale_is_activation_metadata(tmp_path):
    acts = {"dynamic": False, "num_bits": 8, "strategy": "tensor", "symmetric": True, "type": "float"}
    d = _make(tmp_path, {"l.weight": _f8([[1.0, 2.0]]), "l.weight_scale": np.array([[0.5]], np.float32),
                         "l.input_scale": np.array([0.0123], np.float32)},
              _qc({"g": _group(_weights("channel"), acts=acts)}))
    ck = load(d)
    spec = ck.spec("l.input_scale")
    assert spec.kind == "dense" and [a.role for a in spec.stored] == ["activation_scale"]
    assert ck["l.weight"].dequantize().tolist() == [[0.5, 1.0]]  # never applied to the weight
    assert ck["l.input_scale"].data.tolist() == [np.float32(0.0123)]
    assert ck.metadata["activations"] == {"l": "static"}
    CT.write(ck, tmp_path / "w")
    g = json.loads((tmp_path / "w" / "config.json").read_text())["quantization_config"]["config_groups"]["group_0"]
    assert g["input_activations"]["dynamic"] is False and g["input_activations"]["strategy"] == "tensor"
    assert np.asarray(Source(tmp_path / "w").read("l.input_scale")).tobytes() == np.float32(0.0123).tobytes()
    r = CliRunner().invoke(main, ["inspect", str(d), "--json"])
    rows = {row["name"]: row for row in json.loads(r.output)["tensors"]}
    assert rows["l.input_scale"]["stored"][0]["role"] == "activation_scale"
    assert json.loads(r.output)["metadata"]["input_activations"] == "g: float 8-bit static per-tensor"


# -- mixed config groups -----------------------------------------------------------------------------
def _mixed(tmp_path):
    int4 = {"dynamic": False, "group_size": None, "num_bits": 4, "strategy": "channel", "symmetric": True,
            "type": "int"}
    nvfp4 = {"dynamic": False, "group_size": 16, "num_bits": 4, "strategy": "tensor_group", "symmetric": True,
             "type": "float"}
    qc = _qc({"fp8_attn": _group(_weights("channel"), targets=["re:.*attn.*"]),
              "int4_mlp": _group(int4, targets=["re:.*mlp.up$"], fmt="pack-quantized"),
              "fp4_down": _group(nvfp4, targets=["re:.*mlp.down$"], fmt="mxfp6-pack-quantized")},
             fmt="mixed-precision")
    # int4 channel: fields q + 8 packed LSB-first in int32 words; row 0 = codes -8..-1 (fields 0..7), row 1 = +0..7
    words = np.array([[0x76543210], [np.int32(np.uint32(0xFEDCBA98).view(np.int32))]], dtype=np.int32)
    tensors = {"m.attn.weight": _f8([[1.0, -2.0], [4.0, 0.5]]), "m.attn.weight_scale": np.array([[0.25], [2.0]],
                                                                                                np.float32),
               "m.mlp.up.weight_packed": words, "m.mlp.up.weight_shape": np.array([2, 8], np.int64),
               "m.mlp.up.weight_scale": np.array([[1.0], [0.5]], np.float16),
               "m.mlp.down.weight_packed": np.zeros((4, 4), np.uint8),
               "m.mlp.down.weight_scale": np.ones((4, 1), np.uint8),
               "m.mlp.down.weight_global_scale": np.ones(1, np.float32),
               "m.mlp.down.input_global_scale": np.ones(1, np.float32),
               "m.norm.weight": np.ones(2, np.float16)}
    return _make(tmp_path, tensors, qc)


def test_mixed_groups_each_read_with_its_codec_and_unsupported_group_opaque(tmp_path):
    ck = load(_mixed(tmp_path))
    assert ck["m.attn.weight"].dequantize().tolist() == [[0.25, -0.5], [8.0, 1.0]]
    up = ck["m.mlp.up.weight"]
    assert up.scheme.bits == 4 and up.dequantize().tolist() == [list(range(-8, 0)), [0.5 * q for q in range(8)]]
    spec = ck.spec("m.mlp.down.weight")
    assert spec.kind == "opaque" and "mxfp6-pack-quantized" in spec.dtype and "fp4_down" in spec.dtype
    assert sorted(a.name for a in spec.stored) == ["m.mlp.down.input_global_scale", "m.mlp.down.weight_global_scale",
                                                   "m.mlp.down.weight_packed", "m.mlp.down.weight_scale"]
    assert "not supported" in spec.notes[0]
    assert ck.metadata["unreadable_groups"].endswith("1 module(s) opaque")
    with pytest.raises(UnsupportedError, match="mxfp6-pack-quantized"):
        ck["m.mlp.down.weight"]
    with pytest.raises(UnsupportedError, match="mxfp6-pack-quantized"):
        CT.write(ck, tmp_path / "w")
    r = CliRunner().invoke(main, ["inspect", str(tmp_path / "m"), "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.output)["tensors"]}
    assert rows["m.mlp.down.weight"]["kind"] == "opaque" and "fp4_down" in rows["m.mlp.down.weight"]["dtype"]


def test_fp8_and_int_groups_written_with_their_own_formats(tmp_path):
    ck = load(_mixed(tmp_path))
    keep = Checkpoint.from_tensors([ck["m.attn.weight"], ck["m.mlp.up.weight"], ck["m.norm.weight"]])
    CT.write(keep, tmp_path / "w")
    qc = json.loads((tmp_path / "w" / "config.json").read_text())["quantization_config"]
    assert qc["format"] == "mixed-precision"
    fmts = {tuple(g["targets"]): g["format"] for g in qc["config_groups"].values()}
    assert fmts == {("m.attn",): "float-quantized", ("m.mlp.up",): "pack-quantized"}
    back = load(tmp_path / "w")
    for n in ("m.attn.weight", "m.mlp.up.weight"):
        assert np.array_equal(back[n].dequantize(), ck[n].dequantize()), n


def test_whole_checkpoint_of_an_unsupported_group_is_refused(tmp_path):
    d = _make(tmp_path, {"l.weight": _f8([[1.0]]), "l.weight_scale": np.ones((1, 1), np.uint8)},
              _qc({"g": _group(_weights("channel"), fmt="mxfp8-quantized")}, fmt="mxfp8-quantized"))
    with pytest.raises(UnsupportedError, match="mxfp8-quantized"):
        load(d)


# -- writer from other FP8 tensors -------------------------------------------------------------------
@pytest.mark.parametrize("gm,scales", [
    (GroupMap.per_tensor(), np.array([[0.5]], np.float32)),
    (GroupMap.per_channel("out"), np.array([[0.5], [2.0], [4.0]], ml_dtypes.bfloat16)),
    (GroupMap.per_block(2, 128), np.array([[0.5], [2.0]], np.float16))])
def test_writer_round_trip_each_granularity(tmp_path, gm, scales):
    codes = _f8([[1.0, -2.0, 3.0, 448.0], [0.5, 0.25, -6.0, 8.0], [16.0, -1.0, 2.0, 0.0]]).view(np.uint8)
    s = QuantScheme(8, False, scale_dtype={np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}.get(
        scales.dtype, "BF16"), codebook=codebooks.E4M3)
    t = QuantizedTensor("a.weight", ("out", "in"), codes, scales, s, gm)
    CT.write(Checkpoint.from_tensors([t]), tmp_path / "w")
    back = load(tmp_path / "w")["a.weight"]
    assert np.array_equal(back.codes, t.codes) and back.scales.dtype == t.scales.dtype
    assert np.array_equal(_bits(back.dequantize()), _bits(t.dequantize()))
    assert back.group_map.describe() == gm.describe()
    shape = tuple(Source(tmp_path / "w").info("a.weight_scale").shape)
    assert shape == {"tensor": (1,), "channel": (3, 1), "block": (2, 1)}[gm.granularity.value]


def test_writer_refuses_what_float_quantized_cannot_hold():
    codes = np.zeros((2, 4), np.uint8)
    col = QuantizedTensor("a.weight", ("out", "in"), codes, np.ones((1, 4), np.float32),
                          QuantScheme(8, False, scale_dtype="F32", codebook=codebooks.E4M3), GroupMap.per_channel("in"))
    assert "per-column" in CT.check_target(spec_of(col))
    e8 = QuantizedTensor("a.weight", ("out", "in"), codes, np.ones((2, 1), ml_dtypes.float8_e8m0fnu),
                         QuantScheme(8, False, scale_dtype="F8_E8M0", codebook=codebooks.E4M3), GroupMap.per_channel())
    assert "F8_E8M0" in CT.check_target(spec_of(e8))


# -- bad input ----------------------------------------------------------------------------------------
def _one(tmp_path, weight=None, scale=None, weights=None, extra=None, acts=None, fmt="float-quantized"):
    t = {"l.weight": _f8([[1.0, 2.0], [3.0, 4.0]]) if weight is None else weight,
         "l.weight_scale": np.ones((2, 1), np.float32) if scale is None else scale, **(extra or {})}
    return _make(tmp_path, t, _qc({"g": _group(weights or _weights("channel"), acts=acts, fmt=fmt)}, fmt=fmt))


def test_fp8_weight_under_an_int_group(tmp_path):
    int8 = {"dynamic": False, "group_size": None, "num_bits": 8, "strategy": "channel", "symmetric": True,
            "type": "int"}
    with pytest.raises(FormatError) as ei:
        load(_one(tmp_path, weights=int8, fmt="int-quantized"))
    e = ei.value
    assert (e.tensor, e.field, e.expected, e.found) == ("l.weight", "quantization_config.config_groups.g.weights.type",
                                                        "float", "int")
    assert str(tmp_path / "m" / "model.safetensors") in str(e)


def test_int8_weight_under_a_float_group(tmp_path):
    with pytest.raises(FormatError) as ei:
        load(_one(tmp_path, weight=np.ones((2, 2), np.int8)))
    assert ei.value.tensor == "l.weight" and ei.value.expected == "int" and ei.value.found == "float"


def test_float_num_bits_other_than_8_refused(tmp_path):
    with pytest.raises(UnsupportedError) as ei:
        load(_one(tmp_path, weights=_weights("channel", num_bits=6)))
    assert ei.value.field.endswith("weights.num_bits") and ei.value.expected == [4, 8] and ei.value.found == 6


@pytest.mark.parametrize("scale,field,expected", [(np.ones((1, 2), np.float32), "shape", [2, 1]),
                                                  (np.ones((2, 1), np.int32), "dtype", ["F16", "BF16", "F32"])])
def test_bad_weight_scale(tmp_path, scale, field, expected):
    with pytest.raises(FormatError) as ei:
        load(_one(tmp_path, scale=scale))
    e = ei.value
    assert (e.tensor, e.field, e.expected) == ("l.weight_scale", field, expected)


def test_block_scale_shape_names_the_grid(tmp_path):
    with pytest.raises(FormatError) as ei:
        load(_one(tmp_path, scale=np.ones((2, 1), np.float32), weights=_weights("block", [1, 1])))
    assert ei.value.expected == [2, 2] and ei.value.found == [2, 1]


@pytest.mark.parametrize("bs", [[128], [0, 128], "128x128", [1.5, 2]])
def test_malformed_block_structure(tmp_path, bs):
    with pytest.raises(FormatError, match="block_structure"):
        load(_one(tmp_path, weights=_weights("block", bs)))


def test_static_activations_without_input_scale(tmp_path):
    acts = {"dynamic": False, "num_bits": 8, "strategy": "tensor", "type": "float"}
    with pytest.raises(MissingTensorError) as ei:
        load(_one(tmp_path, acts=acts))
    assert ei.value.tensor == "l.input_scale"


def test_unusual_fp8_element_refused(tmp_path):
    with pytest.raises(FormatError) as ei:
        load(_one(tmp_path, weight=_f8([[1.0, 2.0], [3.0, 4.0]], ml_dtypes.float8_e4m3fnuz)))
    assert ei.value.found == "F8_E4M3FNUZ" and ei.value.expected == ["F8_E4M3", "F8_E5M2"]


def test_nonzero_zero_point_of_symmetric_float(tmp_path):
    d = _one(tmp_path, extra={"l.weight_zero_point": np.array([[0], [3]], np.int8)})
    with pytest.raises(FormatError, match="non-zero weight_zero_point"):
        load(d)["l.weight"]
    ok = _one(tmp_path / "z" if (tmp_path / "z").mkdir() is None else tmp_path,
              extra={"l.weight_zero_point": np.zeros((2, 1), np.int8)})
    assert load(ok)["l.weight"].dequantize().tolist() == [[1.0, 2.0], [3.0, 4.0]]


def test_missing_weight_scale(tmp_path):
    d = _make(tmp_path, {"l.weight": _f8([[1.0]]), "l.other": np.ones(1, np.float32)},
              _qc({"g": _group(_weights("channel"))}))
    ck = load(d)  # without weight_scale the F8 weight is not recognised as quantized: read as dense F8
    assert ck.spec("l.weight").kind == "dense" and ck.spec("l.weight").dtype == "F8_E4M3"


# -- CLI on the sample --------------------------------------------------------------------------------
def test_cli_inspect_dequantize_convert(tmp_path):
    r = CliRunner().invoke(main, ["inspect", str(SAMPLE), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["format"] == "compressed-tensors" and doc["n_quantized"] == 4
    assert {row["scheme_label"] for row in doc["tensors"]} == {"e4m3 float"}
    r = CliRunner().invoke(main, ["inspect", str(SAMPLE)])
    assert r.exit_code == 0 and "e4m3 float" in r.output and "FP8_DYNAMIC" in r.output
    out = tmp_path / "deq.safetensors"
    r = CliRunner().invoke(main, ["dequantize", str(SAMPLE), str(out), "--dtype", "bf16", "--json"])
    assert r.exit_code == 0, r.output
    ours, ref = Source(out), Source(SAMPLE / "reference_dequant.safetensors")
    for name in ref.tensor_names():
        assert np.array_equal(_bits(np.asarray(ours.read(name))), _bits(np.asarray(ref.read(name)))), name
    for to in ("compressed-tensors", "modelopt"):
        r = CliRunner().invoke(main, ["convert", str(SAMPLE), str(tmp_path / to), "--to", to, "--json"])
        assert r.exit_code == 0, r.output
        s = json.loads(r.output)["summary"]
        assert s["all_exact"] and s["changed"] == 0 and s["quantized"]["tensors"] == 4
    dense = DenseTensor("x.weight", np.ones((2, 2), np.float16))
    assert CT.check_target(spec_of(dense)) is None
