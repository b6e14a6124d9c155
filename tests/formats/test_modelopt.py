"""NVIDIA ModelOpt FP8: real nvidia-modelopt 0.47.0 exports (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO), hand-built
layouts, MIXED_PRECISION, refusals and bad inputs, the writer (both config files as ModelOpt writes them).

References: sample_checkpoints/modelopt_*/reference_dequant.safetensors, ModelOpt's own ``FP8QTensor.dequantize``
in float32 (sample_checkpoints/modelopt_fp8_scripts/make_modelopt_fp8.py); hand cases use exact products.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from converter import codebooks
from converter.cli import main
from converter.errors import FormatError, MissingTensorError, NotRepresentableError, UnsupportedError
from converter.formats.registry import detect, get, load
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, QuantizedTensor, spec_of
from tests.conftest import SAMPLES
from tests.formats.conformance import ModelDirConformance, ToolDecodeConformance

MO = get("modelopt")
TAGS = ("fp8", "fp8_pc_pt", "fp8_pb_wo")
DIRS = {t: SAMPLES / f"modelopt_{t}_smollm2tiny" for t in TAGS}
E4M3 = ml_dtypes.float8_e4m3fn
K = "model.layers.0.self_attn.k_proj"


def _f8(values, dtype=E4M3):
    return np.asarray(values, dtype=np.float32).astype(dtype)


def _make(tmp_path: Path, tensors: dict, quant: dict | None, qc: dict | None = None, name="m") -> Path:
    d = tmp_path / name
    d.mkdir()
    arrays = {k: np.ascontiguousarray(v).reshape(np.shape(v)) for k, v in tensors.items()}
    save_file(arrays, str(d / "model.safetensors"))
    cfg = {"model_type": "toy"}
    if qc is not None:
        cfg["quantization_config"] = qc
    (d / "config.json").write_text(json.dumps(cfg))
    if quant is not None:
        (d / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"},
                                                            "quantization": quant}))
    return d


def _same_files(a: Path, b: Path) -> None:
    sa, sb = Source(a), Source(b)
    assert sorted(sa.tensor_names()) == sorted(sb.tensor_names())
    for k in sa.tensor_names():
        assert (sa.info(k).dtype, tuple(sa.info(k).shape)) == (sb.info(k).dtype, tuple(sb.info(k).shape)), k
        assert np.asarray(sa.read(k)).tobytes() == np.asarray(sb.read(k)).tobytes(), k


# -- real exports ----------------------------------------------------------------------------------------
class TestModelOptConformance(ToolDecodeConformance, ModelDirConformance):
    """ModelOpt's float32 decode (``FP8QTensor.dequantize``), bit for bit, for the three FP8 algorithms."""

    FORMAT = "modelopt"
    SAMPLES = tuple((d, d / "reference_dequant.safetensors") for d in DIRS.values())


@pytest.mark.parametrize("tag,algo,gm,scale_shape", [
    ("fp8", "FP8", "tensor", ()), ("fp8_pc_pt", "FP8_PER_CHANNEL_PER_TOKEN", "channel(out)", (192,)),
    ("fp8_pb_wo", "FP8_PB_WO", "block(out 128 x in 128)", (2, 1, 5, 1))])
def test_real_exports_read(tag, algo, gm, scale_shape):
    ck = load(DIRS[tag])
    assert ck.format == "modelopt" and ck.metadata["modelopt_quant_algo"] == algo
    t = ck[K + ".weight"]
    assert t.scheme == QuantScheme(8, False, scale_dtype="F32", codebook=codebooks.E4M3)
    assert t.group_map.describe() == gm
    assert tuple(Source(DIRS[tag]).info(K + ".weight_scale").shape) == scale_shape
    assert ck.spec("model.embed_tokens.weight").kind == "dense"
    if tag == "fp8":
        spec = ck.spec(K + ".input_scale")
        assert [a.role for a in spec.stored] == ["activation_scale"] and spec.shape == ()
        assert ck.metadata["activations"][K] == "static"
    if tag == "fp8_pc_pt":
        assert ck.metadata["activations"][K] == "dynamic"
    if tag == "fp8_pb_wo":  # 192 x 576 in 128 x 128 blocks: row block 1 and column block 4 are 64 wide
        assert "activations" not in ck.metadata
        assert any("partial edge block" in n for n in ck.spec(K + ".weight").notes)
    assert not any(f.endswith("hf_quant_config.json") for f in ck.extra_files)


@pytest.mark.parametrize("tag", TAGS)
def test_round_trip_byte_identical_with_modelopt_configs(tag, tmp_path):
    MO.write(load(DIRS[tag]), tmp_path / "out")
    _same_files(DIRS[tag], tmp_path / "out")
    for f in ("hf_quant_config.json", "config.json"):
        assert json.loads((tmp_path / "out" / f).read_text()) == json.loads((DIRS[tag] / f).read_text()), f


@pytest.mark.parametrize("tag", TAGS)
def test_exact_convert_to_compressed_tensors_and_back(tag, tmp_path):
    get("compressed-tensors").write(load(DIRS[tag]), tmp_path / "ct")
    ct = load(tmp_path / "ct")
    assert ct.format == "compressed-tensors"
    src = load(DIRS[tag])
    assert np.array_equal(ct[K + ".weight"].codes, src[K + ".weight"].codes)
    assert np.array_equal(ct[K + ".weight"].scales, src[K + ".weight"].scales)
    if tag == "fp8":  # compressed-tensors' per-tensor input_scale is [1], ModelOpt's 0-dim: same bytes
        assert tuple(Source(tmp_path / "ct").info(K + ".input_scale").shape) == (1,)
    MO.write(ct, tmp_path / "mo")
    _same_files(DIRS[tag], tmp_path / "mo")


# -- hand-built layouts ------------------------------------------------------------------------------------
def test_per_tensor_by_hand(tmp_path):
    d = _make(tmp_path, {"l.weight": _f8([[1.0, -2.0], [448.0, 0.5]]), "l.weight_scale": np.float32(0.25),
                         "l.input_scale": np.float32(0.125)},
              {"quant_algo": "FP8", "kv_cache_quant_algo": None, "exclude_modules": []})
    assert detect(Source(d)).format == "modelopt"
    ck = load(d)
    assert ck["l.weight"].dequantize().tolist() == [[0.25, -0.5], [112.0, 0.125]]
    assert ck["l.input_scale"].data.tolist() == 0.125


def test_block_partial_edges_by_hand(tmp_path):
    # O = 130, I = 129: scales [2, 1, 2, 1]; element (r, c) uses block (r // 128, c // 128)
    w = np.ones((130, 129), np.float32)
    scales = np.array([1.0, 2.0, 4.0, 8.0], np.float32).reshape(2, 1, 2, 1)
    d = _make(tmp_path, {"l.weight": _f8(w), "l.weight_scale": scales},
              {"quant_algo": "fp8_pb_wo", "kv_cache_quant_algo": None, "exclude_modules": []})
    v = load(d)["l.weight"].dequantize()
    assert v[0, 0] == 1 and v[0, 128] == 2 and v[129, 0] == 4 and v[129, 128] == 8 and v[127, 127] == 1


def test_config_json_only(tmp_path):
    qc = {"ignore": [], "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN", "quant_method": "modelopt"}
    d = _make(tmp_path, {"l.weight": _f8([[1.0, 2.0], [3.0, 4.0]]), "l.weight_scale": np.array([2.0, 0.5], np.float32)},
              None, qc)
    assert load(d)["l.weight"].dequantize().tolist() == [[2.0, 4.0], [1.5, 2.0]]


def test_mixed_precision_unsupported_layer_is_opaque(tmp_path):
    quant = {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
             "quantized_layers": {"a": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"},
                                  "b": {"quant_algo": "NVFP4_AWQ", "group_size": 16}}}
    d = _make(tmp_path, {"a.weight": _f8([[1.0, 2.0]]), "a.weight_scale": np.array([0.5], np.float32),
                         "b.weight": np.zeros((2, 8), np.uint8), "b.weight_scale": np.ones((2, 1), E4M3),
                         "b.weight_scale_2": np.float32(1.0), "b.input_scale": np.float32(1.0)}, quant)
    ck = load(d)
    assert ck["a.weight"].dequantize().tolist() == [[0.5, 1.0]]
    spec = ck.spec("b.weight")
    assert spec.kind == "opaque" and spec.dtype == "ModelOpt NVFP4_AWQ" and "NVFP4_AWQ" in spec.notes[0]
    assert len(spec.stored) == 4 and "1 module(s) opaque" in ck.metadata["unreadable_groups"]
    with pytest.raises(UnsupportedError):
        MO.write(ck, tmp_path / "w")


def test_writer_mixed_precision_configs(tmp_path):
    ck = load(DIRS["fp8_pc_pt"])
    k = ck[K + ".weight"]
    block = QuantizedTensor("x.weight", ("out", "in"), k.codes, np.ones((2, 5), np.float32), k.scheme,
                            GroupMap.per_block(128, 128))
    MO.write(Checkpoint.from_tensors([k, block]), tmp_path / "w")
    hf = json.loads((tmp_path / "w" / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quant_algo"] == "MIXED_PRECISION"
    assert hf["quantized_layers"] == {K: {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}, "x": {"quant_algo": "fp8_pb_wo"}}
    back = load(tmp_path / "w")
    assert back[K + ".weight"].group_map.describe() == "channel(out)"
    assert back["x.weight"].group_map.describe() == "block(out 128 x in 128)"


# -- refusals and bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("algo", ["NVFP4_AWQ", "W4A16_AWQ", "MXFP8"])
def test_other_algorithms_refused_by_name(tmp_path, algo):
    d = _make(tmp_path, {"l.weight": np.zeros((2, 8), np.uint8), "l.weight_scale": np.ones((2, 1), np.float32)},
              {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": []})
    with pytest.raises(UnsupportedError, match=f"quant_algo '{algo}' is not supported yet") as ei:
        load(d)
    assert ei.value.found == algo and str(d / "hf_quant_config.json") in str(ei.value)


def test_the_two_configs_disagree(tmp_path):
    d = _make(tmp_path, {"l.weight": _f8([[1.0]]), "l.weight_scale": np.float32(1.0)},
              {"quant_algo": "FP8", "exclude_modules": []},
              {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN", "quant_method": "modelopt"})
    with pytest.raises(FormatError) as ei:
        load(d)
    assert (ei.value.field, ei.value.expected, ei.value.found) == ("quantization_config.quant_algo", "FP8",
                                                                  "FP8_PER_CHANNEL_PER_TOKEN")


def _fp8(tmp_path, tensors, algo="FP8"):
    return _make(tmp_path, tensors, {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ["x"]})


def test_weight_not_e4m3(tmp_path):
    d = _fp8(tmp_path, {"l.weight": _f8([[1.0]], ml_dtypes.float8_e5m2), "l.weight_scale": np.float32(1.0)})
    with pytest.raises(FormatError) as ei:
        load(d)
    assert (ei.value.tensor, ei.value.field, ei.value.expected, ei.value.found) == ("l.weight", "dtype", "F8_E4M3",
                                                                                    "F8_E5M2")


@pytest.mark.parametrize("algo,scale", [("FP8", np.ones((2,), np.float32)),
                                        ("FP8_PER_CHANNEL_PER_TOKEN", np.ones((3,), np.float32)),
                                        ("FP8_PB_WO", np.ones((1, 2, 1, 1), np.float32))])
def test_scale_shape_does_not_fit_the_algorithm(tmp_path, algo, scale):
    d = _fp8(tmp_path, {"l.weight": _f8(np.ones((2, 3))), "l.weight_scale": scale}, algo)
    with pytest.raises(FormatError, match=f"does not fit quant_algo {algo}") as ei:
        load(d)
    assert ei.value.tensor == "l.weight_scale" and ei.value.found == list(scale.shape)


def test_scale_dtype(tmp_path):
    d = _fp8(tmp_path, {"l.weight": _f8([[1.0]]), "l.weight_scale": np.array(1, np.int32)})
    with pytest.raises(FormatError) as ei:
        load(d)
    assert ei.value.field == "dtype" and ei.value.found == "I32"


def test_excluded_module_with_fp8_weight(tmp_path):
    d = _fp8(tmp_path, {"x.weight": _f8([[1.0]]), "x.weight_scale": np.float32(1.0)})
    with pytest.raises(FormatError, match="does not quantize it") as ei:
        load(d)
    assert ei.value.tensor == "x.weight" and ei.value.found == "excluded"


def test_malformed_side_file(tmp_path):
    d = _fp8(tmp_path, {"l.weight": _f8([[1.0]]), "l.weight_scale": np.float32(1.0)})
    (d / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": [1]}))
    with pytest.raises(FormatError):  # detected by config.json? no: not detected as modelopt at all
        load(d, format="modelopt")


def test_writer_refusals(tmp_path):
    k = load(DIRS["fp8_pc_pt"])[K + ".weight"]
    per_tensor = QuantizedTensor("a.weight", ("out", "in"), k.codes, np.ones((1, 1), np.float32), k.scheme,
                                 GroupMap.per_tensor())
    with pytest.raises(NotRepresentableError, match="static input_scale") as ei:
        MO.write(Checkpoint.from_tensors([per_tensor]), tmp_path / "w")
    assert ei.value.field == "input_scale" and not (tmp_path / "w").exists()
    b64 = QuantizedTensor("a.weight", ("out", "in"), k.codes, np.ones((3, 9), np.float32), k.scheme,
                          GroupMap.per_block(64, 64))
    assert "128 x 128 blocks only" in MO.check_target(spec_of(b64))
    e5 = QuantizedTensor("a.weight", ("out", "in"), k.codes, k.scales,
                         QuantScheme(8, False, scale_dtype="F32", codebook=codebooks.ELEMENTS["e5m2"].values),
                         GroupMap.per_channel())
    assert "E4M3 only" in MO.check_target(spec_of(e5))
    int4 = load(SAMPLES / "ct_pack_w4a16_channel_sym")
    assert "FP8 (E4M3) only" in MO.check_target(int4.spec("encoder.layer.0.attention.self.query.weight"))


def test_missing_weight_scale_means_dense(tmp_path):
    d = _fp8(tmp_path, {"l.weight": np.ones((2, 2), np.float16)})
    assert load(d).spec("l.weight").kind == "dense"
    d2 = _make(tmp_path, {"l.weight": _f8([[1.0]]), "l.weight_scale": np.float32(1.0)},
               {"quant_algo": "MIXED_PRECISION", "quantized_layers": {"z": {"quant_algo": "FP8"}}}, name="mixed")
    with pytest.raises(FormatError, match="does not quantize it"):
        load(d2)
    with pytest.raises(MissingTensorError):
        from converter.formats.modelopt.reader import module
        from converter.formats.modelopt.config import parse
        src = Source(d2)
        module(src, parse(src), "q", "FP8")


# -- CLI -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tag", TAGS)
def test_cli_inspect_dequantize_convert(tag, tmp_path):
    d = DIRS[tag]
    r = CliRunner().invoke(main, ["inspect", str(d), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["format"] == "modelopt" and doc["n_quantized"] == 2
    r = CliRunner().invoke(main, ["inspect", str(d)])
    assert r.exit_code == 0 and "e4m3 float" in r.output
    out = tmp_path / "deq.safetensors"
    r = CliRunner().invoke(main, ["dequantize", str(d), str(out), "--dtype", "f32", "--json"])
    assert r.exit_code == 0, r.output
    ref, ours = Source(d / "reference_dequant.safetensors"), Source(out)
    for n in ref.tensor_names():
        assert np.asarray(ours.read(n)).tobytes() == np.asarray(ref.read(n)).tobytes(), n
    for to in ("compressed-tensors", "modelopt"):
        r = CliRunner().invoke(main, ["convert", str(d), str(tmp_path / to), "--to", to, "--json"])
        assert r.exit_code == 0, r.output
        s = json.loads(r.output)["summary"]
        assert s["all_exact"] and s["changed"] == 0 and s["quantized"]["tensors"] == 2
    shutil.rmtree(tmp_path / "modelopt")
