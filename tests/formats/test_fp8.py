"""fp8 (DeepSeek-V3 / transformers FineGrainedFP8 block FP8) and bare FP8 safetensors.

The real sample (auto-round 0.15.1, BF16 ``weight_scale_inv``, 64-wide partial edge blocks) decodes
like auto-round's ``_dequant_fp8_linear_weight`` bit for bit in bf16; small hand-computed cases cover
partial blocks, E8M0 / F16 / F32 scales, expert stacks, Mistral's spelling, bare FP8 and every
bad-input error (file, tensor and field named).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from converter.codebooks import E4M3, ELEMENTS
from converter.errors import ConverterError, ErrorKind, FormatError, MissingTensorError, NotRepresentableError
from converter.formats import registry
from converter.formats.fp8.writer import check_target, keep_dense
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.layout import EXPERT, IN, OUT
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, spec_of
from tests.conftest import SAMPLES
from tests.formats.conformance import (ModelDirConformance, QuantizedFormatConformance,
                                       ToolDecodeConformance)

SAMPLE = SAMPLES / "deepseek_fp8_block_smollm2tiny"
F8 = ml_dtypes.float8_e4m3fn
QCFG = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [2, 2], "activation_scheme": "dynamic"}


class TestFp8Conformance(QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance):
    FORMAT = "fp8"
    SAMPLES = ((SAMPLE, SAMPLE / "reference_dequant.safetensors"),)


def make_dir(tmp: Path, tensors: dict, qcfg: dict | None = QCFG, *, side: bool = False) -> Path:
    """A model directory: ``tensors`` in model.safetensors, ``qcfg`` in config.json (or a side file)."""
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / "model.safetensors"))
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    if qcfg is not None and not side:
        cfg["quantization_config"] = qcfg
    (tmp / "config.json").write_text(json.dumps(cfg))
    if side:
        (tmp / "quantization_config.json").write_text(json.dumps(qcfg))
    return tmp


def f8(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(F8)


# 3 x 5 weight in 2 x 2 blocks: a 1-row last block row and a 1-column last block column
W35 = [[1.0, 2.0, -1.0, 0.5, 4.0],
       [0.5, -2.0, 1.0, 1.0, -0.5],
       [2.0, 1.5, -4.0, 0.25, 1.0]]
S23 = [[0.5, 2.0, 4.0],
       [8.0, 0.25, 1.0]]
# by hand: element (i, j) times S23[i // 2][j // 2]
WANT35 = [[0.5, 1.0, -2.0, 1.0, 16.0],
          [0.25, -1.0, 2.0, 2.0, -2.0],
          [16.0, 12.0, -1.0, 0.0625, 1.0]]


def _one(path: Path, name: str = "model.layers.0.mlp.down_proj.weight"):
    ck = registry.load(path)
    return ck, ck[name]


# -- the real sample --------------------------------------------------------------------------------
def test_sample_is_block_fp8_with_partial_edge_blocks():
    ck = registry.load(SAMPLE)
    assert ck.format == "fp8" and len(ck.quantized_names()) == 7
    spec = ck.spec("model.layers.0.self_attn.k_proj.weight")
    assert spec.scheme.describe() == "e4m3 float" and spec.scheme.scale_dtype == "BF16"
    assert spec.group_map.block == (("out", 128), ("in", 128))
    assert spec.group_map.param_shape(spec.shape, spec.axes) == (2, 5)
    assert spec.group_map.partial_blocks(spec.shape, spec.axes) == 2 * 5 - 1 * 4  # last row and column partial
    assert any("transformers 5.24" in n and n.startswith("warning:") for n in spec.notes)


def test_sample_bf16_decode_has_zero_bit_mismatches():
    ck = registry.load(SAMPLE)
    ref = load_file(str(SAMPLE / "reference_dequant.safetensors"))
    assert set(ref) == {"model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.down_proj.weight"}
    for name, want in ref.items():
        got = ck[name].dequantize().astype(ml_dtypes.bfloat16)
        assert int(np.count_nonzero(got.view(np.uint16) != want.view(np.uint16))) == 0, name


def test_sample_codes_are_the_stored_bytes_without_a_copy():
    ck = registry.load(SAMPLE)
    t = ck["model.layers.0.self_attn.k_proj.weight"]
    assert t.codes.dtype == np.uint8 and not t.codes.flags.owndata
    raw = Source(SAMPLE).read("model.layers.0.self_attn.k_proj.weight")
    assert np.array_equal(t.codes, raw.view(np.uint8))


# -- hand-computed cases ------------------------------------------------------------------------------
@pytest.mark.parametrize("sdt", [np.float32, np.float16, ml_dtypes.bfloat16])
def test_partial_edge_blocks_by_hand(tmp_path, sdt):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.asarray(S23, np.float32).astype(sdt)})
    _, t = _one(d)
    assert t.group_map.param_shape(t.shape, t.axes) == (2, 3)
    assert np.array_equal(t.dequantize(), np.asarray(WANT35, np.float32))


def test_e8m0_scales_including_nan(tmp_path):
    # E8M0 byte b is 2^(b - 127); 0xFF is NaN (OCP MX spec; ml_dtypes float8_e8m0fnu)
    raw = np.array([[126, 128, 129], [130, 125, 255]], np.uint8)
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": raw.view(ml_dtypes.float8_e8m0fnu)})
    ck, t = _one(d)
    assert t.scheme.scale_dtype == "F8_E8M0"
    v = t.dequantize()
    assert v[0, 0] == 0.5 and v[0, 2] == -2.0 and v[0, 4] == 16.0 and v[2, 0] == 16.0 and v[2, 2] == -1.0
    assert np.isnan(v[2, 4]) and np.isfinite(v[:, :4]).all()  # only the NaN block is NaN


def test_ue8m0_bytes_with_scale_fmt(tmp_path):
    raw = np.array([[126, 128, 129], [130, 125, 127]], np.uint8)
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": raw}, dict(QCFG, scale_fmt="ue8m0"))
    _, t = _one(d)
    assert t.scheme.scale_dtype == "F8_E8M0" and t.dequantize()[2, 4] == 1.0 and t.dequantize()[0, 2] == -2.0


def test_expert_stack_with_per_expert_block_scales(tmp_path):
    w = np.stack([f8(W35).astype(np.float32), -f8(W35).astype(np.float32)]).astype(F8)  # [2, 3, 5]
    s = np.stack([np.asarray(S23, np.float32), 2 * np.asarray(S23, np.float32)])
    name = "model.layers.0.mlp.experts.gate_up_proj"
    down = "model.layers.0.mlp.experts.down_proj"
    d = make_dir(tmp_path, {name: w, name + "_scale_inv": s, down: w, down + "_scale_inv": s})
    ck, t = _one(d, name)
    assert t.axes == (EXPERT, OUT, IN) and t.scales.shape == (2, 2, 3)
    want = np.asarray(WANT35, np.float32)
    assert np.array_equal(t.dequantize(), np.stack([want, -2 * want]))
    assert keep_dense(ck.spec(name)) is None  # fused experts are stored quantized


def test_mistral_qscale_weight_and_qscale_act(tmp_path):
    # transformers 5.24 renames .qscale_weight to .weight_scale_inv (quantizer_finegrained_fp8.py): a multiplier
    p = "model.layers.0.self_attn.q_proj"
    d = make_dir(tmp_path, {f"{p}.weight": f8(W35), f"{p}.qscale_weight": np.array(0.25, np.float32),
                            f"{p}.qscale_act": np.array(0.0625, np.float32)},
                 {"quant_method": "fp8", "weight_block_size": None, "activation_scheme": "static"})
    ck = registry.load(d)
    t = ck[f"{p}.weight"]
    assert t.group_map.describe() == "tensor"
    assert np.array_equal(t.dequantize(), np.asarray(W35, np.float32) * 0.25)
    act = ck.spec(f"{p}.qscale_act")
    assert act.kind == "dense" and act.stored[0].role == "activation_scale"
    assert float(ck[f"{p}.qscale_act"].data) == 0.0625  # kept as stored, never applied to the weight
    out = tmp_path / "out"
    registry.get("fp8").write(ck, out)
    back = registry.load(out)
    assert np.array_equal(back[f"{p}.weight"].dequantize(), t.dequantize())
    # written under transformers' name: FP8Linear.activation_scale, a 0-d F32 parameter (finegrained_fp8.py)
    assert f"{p}.qscale_act" not in back
    assert Source(out).info(f"{p}.activation_scale").shape == ()
    assert float(back[f"{p}.activation_scale"].data) == 0.0625
    with open(out / "config.json") as fh:
        q = json.load(fh)["quantization_config"]
    assert q["activation_scheme"] == "static" and q["weight_block_size"] is None
    assert Source(out).info(f"{p}.weight_scale_inv").shape == ()  # transformers' 0-d per-tensor parameter


def test_vllm_weight_scale_and_input_scale(tmp_path):
    p = "model.layers.0.self_attn.o_proj"
    d = make_dir(tmp_path, {f"{p}.weight": f8(W35), f"{p}.weight_scale": np.array([2.0], np.float32),
                            f"{p}.input_scale": np.array([0.5], np.float32)},
                 {"quant_method": "fp8", "activation_scheme": "static"})
    ck = registry.load(d)
    assert np.array_equal(ck[f"{p}.weight"].dequantize(), np.asarray(W35, np.float32) * 2)
    assert ck.spec(f"{p}.input_scale").stored[0].role == "activation_scale"


def test_a_matrix_within_one_block_may_store_a_scalar_scale(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.array(0.5, np.float32)},
                 dict(QCFG, weight_block_size=[128, 128]))
    _, t = _one(d)
    assert t.scales.shape == (1, 1) and np.array_equal(t.dequantize(), np.asarray(W35, np.float32) * 0.5)


def test_e5m2_fmt(tmp_path):
    w = np.asarray(W35, np.float32).astype(ml_dtypes.float8_e5m2)
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": w,
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.asarray(S23, np.float32)},
                 dict(QCFG, fmt="e5m2"))
    _, t = _one(d)
    assert t.scheme.describe() == "e5m2 float" and np.array_equal(t.dequantize(), np.asarray(WANT35, np.float32))


def test_standalone_quantization_config_json(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.asarray(S23, np.float32)}, side=True)
    ck, t = _one(d)
    assert ck.format == "fp8" and np.array_equal(t.dequantize(), np.asarray(WANT35, np.float32))


def test_stale_side_config_beside_float_weights_is_not_fp8(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": np.ones((3, 5), np.float32)}, side=True)
    assert registry.detect(Source(d)).format == "plain"


# -- bare FP8 -----------------------------------------------------------------------------------------
def test_bare_fp8_cast_reads_with_scale_one(tmp_path):
    f = tmp_path / "model.safetensors"
    save_file({"blocks.0.attn.qkv.weight": f8(W35), "blocks.0.norm.weight": np.ones(5, np.float32)}, str(f))
    ck = registry.load(f)
    assert ck.format == "fp8"
    t = ck["blocks.0.attn.qkv.weight"]
    assert np.array_equal(t.dequantize(), np.asarray(W35, np.float32))
    assert ck.spec("blocks.0.norm.weight").kind == "dense"


def test_bare_comfyui_scaled_fp8(tmp_path):
    # ComfyUI comfy/ops.py scaled_fp8_ops: weight * scale_weight; scale_input is the activation scale
    f = tmp_path / "model.safetensors"
    save_file({"scaled_fp8": np.zeros(2, F8), "blocks.0.attn.qkv.weight": f8(W35),
               "blocks.0.attn.qkv.scale_weight": np.array(0.5, np.float32),
               "blocks.0.attn.qkv.scale_input": np.array(1.0, np.float32)}, str(f))
    ck = registry.load(f)
    assert np.array_equal(ck["blocks.0.attn.qkv.weight"].dequantize(), np.asarray(W35, np.float32) * 0.5)
    assert ck.spec("scaled_fp8").kind == "dense"
    assert ck.spec("blocks.0.attn.qkv.scale_input").stored[0].role == "activation_scale"


def test_plain_float_files_stay_plain(tmp_path):
    f = tmp_path / "model.safetensors"
    save_file({"a.weight": np.ones((3, 5), np.float16)}, str(f))
    assert registry.detect(Source(f)).format == "plain"


# -- bad inputs -----------------------------------------------------------------------------------------
def _err(d: Path, cls=ConverterError):
    with pytest.raises(cls) as info:
        ck = registry.load(d)
        for n in ck.names():
            ck[n]
    return info.value


def test_scale_extents_that_do_not_match_the_block(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.ones((2, 2), np.float32)})
    e = _err(d, FormatError)
    assert e.tensor == "model.layers.0.mlp.down_proj.weight_scale_inv" and e.field == "shape"
    assert e.expected == [2, 3] and e.found == [2, 2] and e.kind is ErrorKind.SHAPE and "model.safetensors" in e.file


@pytest.mark.parametrize("block", [[0, 128], [128], [128, "128"], [128, 128, 1]])
def test_block_size_that_does_not_tile(tmp_path, block):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.ones((2, 3), np.float32)},
                 dict(QCFG, weight_block_size=block))
    e = _err(d, FormatError)
    assert e.field == "quantization_config.weight_block_size" and e.found == block and e.file.endswith("config.json")


def test_fp8_dtype_the_config_does_not_declare(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35).astype(ml_dtypes.float8_e5m2),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.ones((2, 3), np.float32)})
    e = _err(d, FormatError)
    assert e.tensor == "model.layers.0.mlp.down_proj.weight" and e.field == "quantization_config.fmt"
    assert (e.expected, e.found) == ("F8_E4M3", "F8_E5M2") and e.kind is ErrorKind.CONFIG_MISMATCH


def test_config_naming_fp8_over_integer_tensors(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": np.ones((3, 5), np.int8),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.ones((2, 3), np.float32)})
    e = _err(d, FormatError)
    assert e.tensor == "model.layers.0.mlp.down_proj.weight" and e.field == "dtype"
    assert (e.expected, e.found) == ("F8_E4M3", "I8") and e.kind is ErrorKind.CONFIG_MISMATCH


def test_unknown_fmt(tmp_path):
    d = make_dir(tmp_path, {"x.weight": f8(W35), "x.weight_scale_inv": np.ones((2, 3), np.float32)},
                 dict(QCFG, fmt="e3m4"))
    e = _err(d, FormatError)
    assert e.field == "quantization_config.fmt" and e.found == "e3m4"


def test_fp8_weight_without_a_scale(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35)})
    e = _err(d, MissingTensorError)
    assert e.tensor == "model.layers.0.mlp.down_proj.weight_scale_inv" and e.found == "absent"


def test_scale_without_its_weight(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight_scale_inv": np.ones((2, 3), np.float32)})
    e = _err(d, MissingTensorError)
    assert e.tensor == "model.layers.0.mlp.down_proj.weight_scale_inv"


def test_integer_scale_dtype(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.ones((2, 3), np.int32)})
    e = _err(d, FormatError)
    assert e.tensor == "model.layers.0.mlp.down_proj.weight_scale_inv" and e.field == "dtype" and e.found == "I32"


def test_grid_scale_without_a_block_size(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.ones((2, 3), np.float32)},
                 dict(QCFG, weight_block_size=None))
    e = _err(d, FormatError)
    assert e.field == "shape" and e.found == [2, 3] and e.kind is ErrorKind.CONFIG_MISMATCH


def test_fp8_weight_in_modules_to_not_convert(tmp_path):
    d = make_dir(tmp_path, {"model.layers.0.mlp.down_proj.weight": f8(W35),
                            "model.layers.0.mlp.down_proj.weight_scale_inv": np.ones((2, 3), np.float32)},
                 dict(QCFG, modules_to_not_convert=["model.layers.0.mlp.down_proj"]))
    e = _err(d, FormatError)
    assert e.field == "quantization_config.modules_to_not_convert"


# -- the table decode to bf16 / f16 (the dequantize path) ----------------------------------------------------
@pytest.mark.parametrize("sdt", ["F32", "BF16", "F16", "F8_E8M0"])
@pytest.mark.parametrize("out_dtype", [ml_dtypes.bfloat16, np.float16])
def test_table_decode_equals_float32_then_one_rounding(sdt, out_dtype):
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 256, size=(2, 300, 200), dtype=np.uint8)  # every code, NaNs (0x7F, 0xFF) included
    raw = rng.uniform(1e-4, 3.0, size=(2, 3, 2)).astype(np.float32)  # 128 x 128 blocks, partial in both axes
    scheme = QuantScheme(8, False, scale_dtype=sdt, codebook=E4M3)
    scales = raw.astype(scheme.scale_np_dtype)
    if sdt == "F8_E8M0":
        scales.view(np.uint8)[0, 1, 1] = 0xFF  # a NaN scale
    t3 = QuantizedTensor("m.experts.down_proj", (EXPERT, OUT, IN), codes, scales, scheme, GroupMap.per_block(128, 128))
    t2 = QuantizedTensor("m.down_proj.weight", (OUT, IN), codes[1], scales[1], scheme, GroupMap.per_block(128, 128))
    for t in (t3, t2):
        want = t.dequantize().astype(out_dtype)
        got = t.dequantize(out_dtype)
        assert got.dtype == np.dtype(out_dtype) and got.shape == t.shape
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))


# -- writer ---------------------------------------------------------------------------------------------
def _block_tensor(name="model.layers.0.mlp.down_proj.weight", sdt="F32", element="e4m3", block=(2, 2)):
    el = ELEMENTS[element]
    codes = np.asarray(W35, np.float32).astype(el.numpy).view(np.uint8)
    scales = np.asarray(S23, np.float32).astype(QuantScheme(8, False, scale_dtype=sdt).scale_np_dtype)
    gm = GroupMap.per_block(*block)
    return QuantizedTensor(name, (OUT, IN), codes, scales, QuantScheme(8, False, scale_dtype=sdt, codebook=el.values),
                           gm)


@pytest.mark.parametrize("sdt", ["F32", "BF16", "F16", "F8_E8M0"])
def test_writer_keeps_the_scale_dtype(tmp_path, sdt):
    t = _block_tensor(sdt=sdt)
    emb = DenseTensor("model.embed_tokens.weight", np.ones((4, 5), np.float32))
    head = DenseTensor("lm_head.weight", np.ones((4, 5), np.float32))
    registry.get("fp8").write(Checkpoint.from_tensors([t, emb, head], config={"model_type": "llama"}), tmp_path / "o")
    src = Source(tmp_path / "o")
    assert src.info("model.layers.0.mlp.down_proj.weight").dtype == "F8_E4M3"
    assert src.info("model.layers.0.mlp.down_proj.weight_scale_inv").dtype == sdt
    q = json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]
    # E8M0 scales are declared scale_fmt "ue8m0" (transformers FineGrainedFP8Config.scale_fmt; DeepSeek-V3.1)
    ue8m0 = {"scale_fmt": "ue8m0"} if sdt == "F8_E8M0" else {}
    assert q == {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [2, 2], "activation_scheme": "dynamic",
                 "modules_to_not_convert": ["lm_head"], **ue8m0}
    back = registry.load(tmp_path / "o")["model.layers.0.mlp.down_proj.weight"]
    assert np.array_equal(back.codes, t.codes) and np.array_equal(back.dequantize(), t.dequantize(), equal_nan=True)


def test_writer_expert_stack_round_trip(tmp_path):
    t = _block_tensor()
    name = "model.layers.0.mlp.experts.down_proj"
    e = QuantizedTensor(name, (EXPERT, OUT, IN), np.stack([t.codes, t.codes[::-1].copy()]),
                        np.stack([t.scales, 2 * t.scales]), t.scheme, t.group_map)
    registry.get("fp8").write(Checkpoint.from_tensors([e]), tmp_path / "o")
    assert Source(tmp_path / "o").info(name + "_scale_inv").shape == (2, 2, 3)
    back = registry.load(tmp_path / "o")[name]
    assert np.array_equal(back.dequantize(), e.dequantize())


def test_check_target_refusals():
    int_t = QuantizedTensor("a.weight", (OUT, IN), np.zeros((3, 5), np.uint8), np.ones((3, 1), np.float16),
                            QuantScheme(4, False, scale_dtype="F16"), GroupMap.per_channel(OUT))
    assert "integer scheme" in check_target(spec_of(int_t))
    # transformers creates every FineGrainedFP8 weight as float8_e4m3fn (_FP8_DTYPE): E5M2 / fnuz are refused
    for el in ("e4m3fnuz", "e5m2"):
        reason = check_target(spec_of(_block_tensor(element=el)))
        assert reason.startswith(el.upper() + " weights") and "float8_e4m3fn" in reason
    chan = _block_tensor().replace(scales=np.ones((3, 1), np.float32), group_map=GroupMap.per_channel(OUT))
    assert "per 2-D block or per tensor" in check_target(spec_of(chan))
    half = _block_tensor().replace(scales=np.ones((1, 3), np.float32), group_map=GroupMap.per_block(None, 2))
    assert "tile both out and in" in check_target(spec_of(half))
    assert check_target(spec_of(_block_tensor())) is None


def test_writer_refuses_two_block_sizes_before_writing(tmp_path):
    a = _block_tensor()
    b = _block_tensor("model.layers.0.mlp.up_proj.weight").replace(scales=np.ones((1, 2), np.float32),
                                                                   group_map=GroupMap.per_block(4, 4))
    with pytest.raises(NotRepresentableError, match="weight_block_size"):
        registry.get("fp8").write(Checkpoint.from_tensors([a, b]), tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_keep_dense_policy():
    emb = spec_of(_block_tensor("model.embed_tokens.weight"))
    head = spec_of(_block_tensor("lm_head.weight"))
    router = spec_of(_block_tensor("model.layers.0.mlp.gate.weight"))
    assert keep_dense(emb) and keep_dense(head) and keep_dense(router)
    assert keep_dense(spec_of(_block_tensor())) is None


def test_codebook_is_e4m3():
    assert np.array_equal(np.asarray(E4M3[:3]), [0.0, 2.0 ** -9, 2.0 ** -8])  # subnormals 1/512, 2/512
    assert E4M3[0x38] == 1.0 and E4M3[0x7E] == 448.0 and np.isnan(E4M3[0x7F])


# -- CLI on the sample ----------------------------------------------------------------------------------
def _run(*args):
    from click.testing import CliRunner

    from converter.cli import main
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_cli_inspect_json():
    r = _run("inspect", SAMPLE, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["format"] == "fp8"
    rows = {t["name"]: t for t in doc["tensors"]}
    assert any(n.startswith("warning:") for n in rows["model.layers.0.mlp.down_proj.weight"]["notes"])


def test_cli_dequantize_bf16_sharded(tmp_path):
    out = tmp_path / "deq"
    r = _run("dequantize", SAMPLE, out, "--dtype", "bf16", "--max-shard-size", 2_000_000)
    assert r.exit_code == 0, r.output
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    assert not (out / "quantization_config.json").exists()  # no stale fp8 side config beside bf16 weights
    got = {}
    for f in sorted(set(index["weight_map"].values())):
        got.update(load_file(str(out / f)))
    ref = load_file(str(SAMPLE / "reference_dequant.safetensors"))
    for name, want in ref.items():
        assert got[name].dtype == want.dtype and np.array_equal(got[name].view(np.uint16), want.view(np.uint16))
    assert registry.detect(Source(out)).format == "plain"


def test_cli_convert_fp8_to_fp8_is_exact_and_warns(tmp_path):
    r = _run("convert", SAMPLE, tmp_path / "o", "--to", "fp8", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["summary"]["all_exact"] and doc["summary"]["quantized"]["exact"] == 7
    assert all(r["mode"] in ("exact", "passthrough") for r in doc["tensors"])
    notes = doc["written"]["notes"]["model.layers.0.self_attn.k_proj.weight"]
    assert any("transformers 5.24" in n for n in notes)
    text = _run("convert", SAMPLE, tmp_path / "t", "--to", "fp8").output
    assert "warning: partial edge blocks" in text
    a, b = Source(SAMPLE), Source(tmp_path / "o")
    for n in a.tensor_names():
        assert a.info(n).dtype == b.info(n).dtype and np.array_equal(a.read(n).view(np.uint8), b.read(n).view(np.uint8))
