"""convert_exact across formats, where the CASES.md bugs happened: B06 (GPTQ -> AWQ), B11 (act-order
g_idx into formats without g_idx), B12 (no actorder for a channel scheme), B13/B14/B15 (partial
groups), B17 (per-channel), B24 (bf16 scales never narrowed to fp16), B27/B29 (shape inference
after writing). Per-format decode cases live in tests/formats/; tied heads in
tests/formats/test_ties.py, sharded sources in tests/formats/test_source.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import converter
from converter.errors import NotRepresentableError, QuantizationError
from converter.formats import registry
from converter.formats.native import write_native
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.ops.convert import convert_exact
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor
from converter.validate import validate
from tests.conftest import SAMPLES
from tests.synthetic import lsb_words

U4 = QuantScheme(4, False, ZeroPoint.INTEGER, "F16")


def _native(tmp_path, tensors, config=None, name="src.safetensors"):
    p = tmp_path / name
    write_native(Checkpoint.from_tensors(tensors, config=config or {}), p)
    return p


# -- B06: GPTQ v1 -> AWQ: scales on the right axis, the v1 "+1" undone -----------------------------
def test_b06_gptq_v1_to_awq(tmp_path):
    O, I, G = 8, 4, 2
    S = np.tile(np.array([[1, 2], [10, 20]], np.float16), (4, 1))  # logical [O, nG]
    q = np.full((O, I), 9, np.uint8)  # (q - z) = 1 with z = 8
    t = QuantizedTensor("m.l.weight", (OUT, IN), q, S, U4, GroupMap.per_group(G),
                        zero_points=np.full((O, 2), 8, np.uint8))
    gptq_dir = tmp_path / "gptq"
    registry.get("gptq").write(Checkpoint.from_tensors([t]), gptq_dir, checkpoint_format="gptq")
    raw = load_file(str(gptq_dir / "model.safetensors"))
    assert raw["m.l.scales"].tolist()[:2] == [[1, 10, 1, 10, 1, 10, 1, 10], [2, 20, 2, 20, 2, 20, 2, 20]]
    assert (raw["m.l.qzeros"].view(np.uint32) == 0x77777777).all()  # v1 stores z - 1 = 7
    rep = convert_exact(gptq_dir, tmp_path / "awq", "awq")
    assert rep["summary"]["all_exact"]
    awq = load_file(str(tmp_path / "awq" / "model.safetensors"))
    assert (awq["m.l.qzeros"].view(np.uint32) == 0x88888888).all()  # AWQ stores the raw zero 8
    assert awq["m.l.scales"].tolist()[:2] == raw["m.l.scales"].tolist()[:2]  # both [G, O]
    back = registry.load(tmp_path / "awq")["m.l.weight"].dequantize()
    assert back[:2].tolist() == [[1, 1, 2, 2], [10, 10, 20, 20]]
    # q = [0, 8, 15], s = 0.1, v1-stored 7 -> zero 8: [-0.8, 0, 0.7]
    q2 = np.zeros((O, 8), np.uint8)
    q2[0, :3] = [0, 8, 15]
    s = np.full((O, 1), 0.1, np.float16)
    t2 = QuantizedTensor("m.k.weight", (OUT, IN), q2, s, U4, GroupMap.per_group(8),
                         zero_points=np.full((O, 1), 8, np.uint8))
    registry.get("gptq").write(Checkpoint.from_tensors([t2]), tmp_path / "g2", checkpoint_format="gptq")
    convert_exact(tmp_path / "g2", tmp_path / "a2", "awq")
    x = registry.load(tmp_path / "a2")["m.k.weight"].dequantize()[0, :3]
    assert np.array_equal(x, np.float32(np.float16(0.1)) * np.array([-8, 0, 7], np.float32))


# -- B11: act-order g_idx is kept where the format has it and refused where it has not ------------
B11_G_IDX = np.array([1, 0, 1, 0], np.int32)


def _b11_tensor():
    # row 0: (q - z) = [2, 3, 4, 5], group scales [0.1, 1.0] -> [2.0, 0.3, 4.0, 0.5]
    q = np.full((8, 4), 8, np.uint8)
    q[0] = 8 + np.array([2, 3, 4, 5])
    s = np.tile(np.array([[0.1, 1.0]], np.float16), (8, 1))
    return QuantizedTensor("m.l.weight", (OUT, IN), q, s, QuantScheme(4, False, ZeroPoint.NONE, "F16"),
                           GroupMap.per_group(2, g_idx=B11_G_IDX))


@pytest.mark.parametrize("target,outcome", [
    ("gptq", "exact"), ("native", "exact"),
    ("awq", "AWQ has no g_idx"), ("mlx", "MLX has no g_idx"),
    ("compressed-tensors", "compressed-tensors >= 0.13 stores no weight_g_idx"),
    ("gguf", "act-order g_idx"),
])
def test_b11_act_order_across_formats(tmp_path, target, outcome):
    src = _native(tmp_path, [_b11_tensor()])
    dst = tmp_path / "out"
    if outcome != "exact":
        with pytest.raises(NotRepresentableError, match=outcome):
            convert_exact(src, dst, target)
        assert not dst.exists()
        return
    rep = convert_exact(src, dst, target)
    assert rep["summary"]["all_exact"]
    t = registry.load(dst)["m.l.weight"]
    assert np.array_equal(t.group_map.g_idx, B11_G_IDX)
    expect = np.array([2.0, 0.3, 4.0, 0.5], np.float32)
    assert np.allclose(t.dequantize()[0], expect, rtol=1e-3)  # fp16 0.1 -> 0.0999755...
    assert np.array_equal(t.dequantize()[0], np.array([2, 3, 4, 5], np.float32)
                          * np.float16([1.0, 0.1, 1.0, 0.1]).astype(np.float32))  # scale of g_idx[i]


def test_b11_ct_0_12_keeps_g_idx(tmp_path):
    src = _native(tmp_path, [_b11_tensor()])
    rep = convert_exact(src, tmp_path / "ct", "compressed-tensors", options={"ct_version": "0.12.2"})
    assert rep["summary"]["all_exact"]
    assert np.array_equal(registry.load(tmp_path / "ct")["m.l.weight"].group_map.g_idx, B11_G_IDX)


# -- B13 / B14 / B15: partial final groups ------------------------------------------------------
def _b13_tensor(I=6, G=4, out=8):
    # row 0: (q - z) = [2, -1, 3, 1, 4, -2], scales [0.1, 0.5] -> [0.2, -0.1, 0.3, 0.1, 2.0, -1.0]
    q = np.full((out, I), 8, np.uint8)
    q[0, :6] = 8 + np.array([2, -1, 3, 1, 4, -2])
    ng = -(-I // G)
    s = np.tile(np.array([[0.1, 0.5] + [1.0] * (ng - 2)], np.float16), (out, 1))
    return QuantizedTensor("m.l.weight", (OUT, IN), q, s, QuantScheme(4, False, ZeroPoint.NONE, "F16"),
                           GroupMap.per_group(G))


@pytest.mark.parametrize("target,outcome", [
    ("gptq", "partial final group: gptq loaders cannot read"), ("native", "exact"),
    ("compressed-tensors", "partial final group: compressed-tensors loaders cannot read"),
    ("awq", "partial final group: awq loaders cannot read"),
    ("mlx", "MLX group_size must be one of (32, 64, 128), found 4"),
    ("gguf", "32 consecutive elements"),
])
def test_b13_partial_group_across_formats(tmp_path, target, outcome):
    src = _native(tmp_path, [_b13_tensor()])
    dst = tmp_path / "out"
    if outcome != "exact":
        with pytest.raises(NotRepresentableError, match=outcome.replace("(", r"\(").replace(")", r"\)")):
            convert_exact(src, dst, target)
        assert not dst.exists()
        return
    rep = convert_exact(src, dst, target)
    assert rep["summary"]["all_exact"]
    t = registry.load(dst)["m.l.weight"]
    assert t.scales.shape == (8, 2)  # ceil(6/4) groups, not 6 // 4
    s = np.float16([0.1, 0.5]).astype(np.float32)
    expect = np.array([2, -1, 3, 1, 4, -2], np.float32) * np.repeat(s, [4, 2])
    assert np.array_equal(t.dequantize()[0], expect)
    assert np.allclose(expect, [0.2, -0.1, 0.3, 0.1, 2.0, -1.0], rtol=1e-3)


@pytest.mark.parametrize("target", ["gptq", "compressed-tensors"])
def test_b13_partial_group_written_only_when_allowed(tmp_path, target):
    # the formats can hold ceil(I/G) groups (GPTQModel pads at inference, B14), but their common
    # loaders cannot (compressed-tensors 0.20 decompress, gptqmodel's CPU kernel): only on request
    src = _native(tmp_path, [_b13_tensor()])
    rep = convert_exact(src, tmp_path / "out", target, options={"allow_partial_groups": True})
    assert rep["summary"]["all_exact"]
    t = registry.load(tmp_path / "out")["m.l.weight"]
    assert t.scales.shape == (8, 2)  # ceil(6/4) groups, not 6 // 4
    s = np.float16([0.1, 0.5]).astype(np.float32)
    expect = np.array([2, -1, 3, 1, 4, -2], np.float32) * np.repeat(s, [4, 2])
    assert np.array_equal(t.dequantize()[0], expect)
    assert np.allclose(expect, [0.2, -0.1, 0.3, 0.1, 2.0, -1.0], rtol=1e-3)


def test_b13_refusal_names_the_group_sizes_that_divide(tmp_path):
    # widths 96 and 160 with groups of 64: partial in both; of the kernel sizes only 32 divides both
    # (96 = 3*32, 160 = 5*32)
    a, b = _b13_tensor(I=96, G=64), _b13_tensor(I=160, G=64)
    b = QuantizedTensor("m.k.weight", b.axes, b.codes, b.scales, b.scheme, b.group_map)
    with pytest.raises(NotRepresentableError) as err:
        convert_exact(_native(tmp_path, [a, b]), tmp_path / "out", "compressed-tensors")
    # the first tensor in the file (m.k, width 160) is named, with the count of the others
    assert "(and 1 more tensors)" in str(err.value) and "in_features 160" in str(err.value)
    assert err.value.tensor == "m.k.weight"
    # ... and one command line (group 64 -> 32: every 32-group inside a 64-group, an exact requantize)
    assert err.value.hint == ("use --group-size 32 (divides every layer); or requantize instead (exact): "
                              f"qckpt convert {tmp_path / 'src.safetensors'} {tmp_path / 'out'} "
                              "--to compressed-tensors --group-size 32")
    assert not (tmp_path / "out").exists()


def test_b15_mlx_in_not_multiple_of_group(tmp_path):
    t = _b13_tensor(I=48, G=32)
    with pytest.raises(NotRepresentableError, match=r"in_features 48 is not a multiple of group_size 32 \(B15\)"):
        convert_exact(_native(tmp_path, [t]), tmp_path / "out", "mlx")


def test_b14_partial_group_recorded_in_gptq_notes(tmp_path):
    t = _b13_tensor(I=192, G=128)
    rep = convert_exact(_native(tmp_path, [t]), tmp_path / "g", "gptq", options={"allow_partial_groups": True})
    notes = " ".join(rep["written"]["notes"]["m.l.weight"])
    assert "partial final group (64 of 128)" in notes and "padded to 256" in notes
    doc = registry.load(tmp_path / "g")
    assert doc.spec("m.l.weight").group_map.param_shape((8, 192), (OUT, IN)) == (8, 2)


# -- B17: per-channel (group_size -1) survives every conversion as real values --------------------
def test_b17_per_channel_not_zero_after_conversion(tmp_path):
    src = registry.load(SAMPLES / "gptq_w4_gchan_sym")
    name = "encoder.layer.0.output.dense.weight"
    for target in ("awq", "compressed-tensors", "mlx", "gguf", "gptq"):
        convert_exact(SAMPLES / "gptq_w4_gchan_sym", tmp_path / target, target)
        x = registry.load(tmp_path / target)[name].dequantize()
        assert np.count_nonzero(x) > 0.5 * x.size and np.array_equal(x, src[name].dequantize()), target
    qc = json.loads((tmp_path / "gptq" / "config.json").read_text())["quantization_config"]
    assert qc["group_size"] == -1 and qc["desc_act"] is False


# -- B27 / B29: after writing, the config (not the packed shape) carries in_features ---------------
def test_b27_mlx_2bit_g64_not_read_as_4bit_g32(tmp_path):
    rng = np.random.default_rng(27)
    t = QuantizedTensor("m.l.weight", (OUT, IN), rng.integers(0, 4, (8, 256)).astype(np.uint8),
                        rng.uniform(0.01, 1, (8, 4)).astype(np.float16), QuantScheme(2, False, ZeroPoint.NONE, "F16"),
                        GroupMap.per_group(64))
    convert_exact(_native(tmp_path, [t]), tmp_path / "mlx", "mlx")
    raw = load_file(str(tmp_path / "mlx" / "model.safetensors"))
    assert raw["m.l.weight"].shape == (8, 16) and raw["m.l.scales"].shape == (8, 4)  # same as 4-bit/g32/in=128
    back = registry.load(tmp_path / "mlx")["m.l.weight"]
    assert back.shape == (8, 256) and back.scheme.bits == 2 and back.group_map.group_size == 64
    assert np.array_equal(back.codes, t.codes)


def test_b29_3bit_gptq_to_ct_dense_words_and_weight_shape(tmp_path):
    rng = np.random.default_rng(29)
    t = QuantizedTensor("m.l.weight", (OUT, IN), rng.integers(0, 8, (8, 512)).astype(np.uint8),
                        rng.uniform(0.01, 1, (8, 4)).astype(np.float16), QuantScheme(3, False, ZeroPoint.NONE, "F16"),
                        GroupMap.per_group(128))
    registry.get("gptq").write(Checkpoint.from_tensors([t]), tmp_path / "g")
    assert load_file(str(tmp_path / "g" / "model.safetensors"))["m.l.qweight"].shape == (48, 8)  # 512*3/32
    rep = convert_exact(tmp_path / "g", tmp_path / "ct", "compressed-tensors")
    assert rep["summary"]["all_exact"]
    raw = load_file(str(tmp_path / "ct" / "model.safetensors"))
    assert raw["m.l.weight_packed"].shape == (8, 48)  # dense words (>= 0.18), not 52 padded
    assert raw["m.l.weight_shape"].tolist() == [8, 512]
    assert np.array_equal(registry.load(tmp_path / "ct")["m.l.weight"].codes.astype(np.int16) + 4, t.codes)


# -- B12: the writer never serializes actorder for a channel scheme ---------------------------------
@pytest.mark.parametrize("ct_version", [None, "0.12.2"])
def test_b12_channel_scheme_written_without_actorder(tmp_path, ct_version):
    # GPTQModel may save per-channel with desc_act true (g_idx all zero): act-order means nothing here
    q = np.tile(np.array([[8, 12], [5, 8], [15, 0], [8, 9]]), (2, 4))  # stored [I=8, O=8]
    qweight = np.array([lsb_words(q[:, o], 4) for o in range(8)], np.uint64).T.astype(np.uint32).view(np.int32)
    d = tmp_path / "g"
    d.mkdir()
    save_file({"m.l.qweight": np.ascontiguousarray(qweight),
               "m.l.qzeros": np.array([[0x88888888]], np.uint32).view(np.int32),
               "m.l.scales": np.full((1, 8), 0.5, np.float16), "m.l.g_idx": np.zeros(8, np.int32)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": -1, "sym": True, "desc_act": True,
        "checkpoint_format": "gptq_v2"}}))
    rep = convert_exact(d, tmp_path / "ct", "compressed-tensors",
                        options={"ct_version": ct_version} if ct_version else None)
    assert rep["summary"]["all_exact"]
    weights = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["config_groups"]
    for g in weights.values():
        assert g["weights"]["strategy"] == "channel" and g["weights"].get("actorder") is None
    assert not [f for f in validate(tmp_path / "ct").findings if f.code == "config-mismatch"]
    back = converter.load(tmp_path / "ct")["m.l.weight"]
    assert back.dequantize()[:2, :4].tolist() == [[0, -1.5, 3.5, 0], [2.0, 0, -4.0, 0.5]]


# -- B24: exact repacks never narrow bf16 scales [1e-8, 70144, 3e-5] to fp16 [0, inf, 3e-5] -----------
def _b24_source(tmp_path) -> tuple[Path, QuantizedTensor]:
    s = np.array([[1.0e-8], [70144], [3.0e-5]] + [[1.0]] * 5, np.float32).astype(ml_dtypes.bfloat16)
    t = QuantizedTensor("model.layers.0.mlp.up_proj.weight", (OUT, IN), np.full((8, 32), 9, np.uint8), s,
                        QuantScheme(4, False, ZeroPoint.NONE, "BF16"), GroupMap.per_channel(OUT))
    p = tmp_path / "src.safetensors"
    converter.save(Checkpoint.from_tensors([t], config={"model_type": "llama"}), p)
    return p, t


@pytest.mark.parametrize("target", ["gptq", "awq", "gguf"])
def test_b24_fp16_targets_refuse_out_of_range_bf16_scales(tmp_path, target):
    src, _ = _b24_source(tmp_path)
    with np.errstate(over="ignore"):
        bf16 = np.array([1.0e-8, 70144, 3.0e-5], np.float32).astype(ml_dtypes.bfloat16)
        naive = bf16.astype(np.float32).astype(np.float16)
    assert naive[0] == 0 and np.isinf(naive[1])  # what an unchecked cast would write
    dst = tmp_path / ("out.gguf" if target == "gguf" else "out")
    with pytest.raises((QuantizationError, NotRepresentableError)) as ei:
        convert_exact(src, dst, target)
    assert "model.layers.0.mlp.up_proj.weight" in str(ei.value)
    assert not dst.exists()


@pytest.mark.parametrize("target", ["compressed-tensors", "mlx"])
def test_b24_bf16_targets_keep_the_scales(tmp_path, target):
    src, t = _b24_source(tmp_path)
    rep = convert_exact(src, tmp_path / "out", target)
    assert rep["summary"]["all_exact"]
    back = converter.load(tmp_path / "out")["model.layers.0.mlp.up_proj.weight"]
    assert back.scheme.scale_dtype == "BF16" and np.isfinite(back.dequantize()).all()
    assert np.array_equal(back.dequantize(), t.dequantize())
