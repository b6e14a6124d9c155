"""FP8 (E4M3, 128 x 128 blocks) as a source: the lossy converts to GGUF Q8_0 / int4 / int8 formats
and native, the exact scale-dtype carry, FP8 -> FP8 requantization, and the exact carry into
MLX ``mxfp8`` (power-of-two scales) with its refusals. Sources are real SmolLM2 rows
(tests/data/fp8) quantized by qckpt and written as native files."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from converter.codebooks import E4M3, ELEMENTS
from converter.errors import NotRepresentableError
from converter.formats.native import write_native
from converter.formats.registry import load
from converter.groups import GroupMap
from converter.ops.convert import convert_exact
from converter.ops.requantize_model import requantize_model
from converter.quant.carry import as_mx_groups, nan_code_count
from converter.quant.classify import classify
from converter.quant.float_quant import quantize_float
from converter.quant.requant import Target, requantize
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor
from tests.kernels.test_fp_rtn import NAMES, load_fixture

BF16 = ml_dtypes.bfloat16
K = NAMES[0]  # k_proj [192, 576]: 2 x 5 blocks of 128, 6 of them partial


@pytest.fixture(scope="module")
def weights():
    fx = load_fixture()
    return {n: fx[f"{n}.bf16"].view(BF16) for n in NAMES}


def fp8_block(name: str, w: np.ndarray, *, pow2: bool = False, scale_dtype: str = "BF16") -> QuantizedTensor:
    q, _, _ = quantize_float(w, ELEMENTS["e4m3"], GroupMap.per_block(128, 128), scale_dtype="BF16",
                             arith_dtype="BF16", name=name)
    if pow2:  # E8M0-representable scales (DeepSeek V3.1 style): the nearest power of two
        s = np.exp2(np.round(np.log2(q.scales.astype(np.float32)))).astype(np.float32)
        scheme = q.scheme.replace(scale_dtype=scale_dtype)
        q = QuantizedTensor(name, q.axes, q.codes, s.astype(scheme.scale_np_dtype), scheme, q.group_map)
    return q


def native_source(tmp_path: Path, tensors) -> Path:
    p = tmp_path / "fp8.safetensors"
    extra = DenseTensor("model.norm.weight", np.ones(576, dtype=np.float32))
    cfg = {"model_type": "llama", "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3}
    write_native(Checkpoint.from_tensors([*tensors, extra], config=cfg), p)
    return p


@pytest.fixture()
def src(tmp_path, weights):
    return native_source(tmp_path, [fp8_block(n, w) for n, w in weights.items()])


def test_classify_never_treats_e4m3_as_an_integer_grid(weights):
    t = fp8_block(K, weights[K])
    mode, why = classify(t, Target(bits=8, granularity="channel"))
    assert mode == "lossy" and "e4m3 float (codebook) values are not on an integer grid" in why
    assert classify(t, Target(scale_dtype="f32")) == ("exact", "same e4m3 float codes, wider scale dtype (BF16 -> F32)")
    assert classify(t, Target(scale_dtype="f16"))[0] == "lossy"


@pytest.mark.parametrize("to,target,scheme", [
    ("gguf", Target(bits=8, group_size=32), "int8 sym"),
    ("gptq", Target(bits=4, group_size=32), "int4 sym"),
    ("awq", Target(bits=4, group_size=32, symmetric=False), "uint4 asym(int zp)"),
    ("compressed-tensors", Target(bits=4, group_size=32), "int4 sym"),
    ("mlx", Target(bits=4, group_size=32), "int4 sym"),
    ("native", Target(bits=8, granularity="channel"), "int8 sym"),
])
def test_lossy_converts_from_fp8_blocks(src, tmp_path, weights, to, target, scheme):
    dst = tmp_path / ("out.gguf" if to == "gguf" else "out")
    doc = requantize_model(src, dst, target, to=to)
    rows = {r["name"]: r for r in doc["tensors"]}
    assert set(rows) == set(NAMES)
    back = load(dst, format=to)
    for name, w in weights.items():
        r = rows[name]
        assert r["planned"] == "lossy" and r["route"] == "requantized" and r["readback_bit_exact"]
        assert r["source"] == {"scheme": "e4m3 float", "groups": "block(out 128 x in 128)"}
        assert r["target"]["scheme"] == scheme, r["target"]
        before = r["metadata"]["before"]
        gm = GroupMap.per_block(128, 128)
        assert before["n_groups"] == gm.group_count(w.shape, ("out", "in"))  # 2-D blocks counted, partial ones too
        assert before["metadata_bytes"] == 2 * before["n_groups"]
        # the reported error against the FP8 source, recomputed independently from the file read back
        x = fp8_block(name, w).dequantize().astype(np.float64)
        e = back[name].dequantize().astype(np.float64) - x
        v = r["vs_source"]
        assert v["max_abs"] == pytest.approx(float(np.abs(e).max()), rel=1e-6)
        assert v["mse"] == pytest.approx(float(np.mean(e * e)), rel=1e-4)
        assert v["sqnr_db"] == pytest.approx(10 * np.log10(np.sum(x * x) / np.sum(e * e)), abs=1e-3)


def test_scale_dtype_only_is_an_exact_carry_with_partial_blocks_counted(src, tmp_path):
    doc = requantize_model(src, tmp_path / "out.safetensors", Target(scale_dtype="f32"), to="native")
    r = {r["name"]: r for r in doc["tensors"]}[K]
    assert (r["planned"], r["route"], r["result"], r["readback_bit_exact"]) == ("exact", "carried", "exact", True)
    assert r["target"] == {"scheme": "e4m3 float", "groups": "block(out 128 x in 128)"}
    assert r["partial_groups"] == 6 and r["partial_tail"] == 576 % 128  # 2 x 5 blocks, 1 x 4 full
    assert load(tmp_path / "out.safetensors")[K].scheme.scale_dtype == "F32"


def test_fp8_to_fp8_narrower_scales_requantizes_with_the_fp8_quantizer():
    """F32 scales that F16 cannot hold (below its subnormals): the FP8 round-to-nearest, not a carry."""
    x = np.array([[3e-12, -1e-12, 0.0, 2e-12]], np.float32)
    q, _, _ = quantize_float(x, ELEMENTS["e4m3"], GroupMap.per_channel("out"), scale_dtype="F32")
    res = requantize(q, Target(scale_dtype="f16"))
    assert res.route == "requantized" and res.tensor.scheme.scale_dtype == "F16"
    assert res.tensor.scheme.codebook == E4M3
    s = float(res.tensor.scales[0, 0])
    # raised, never 0: compressed-tensors 0.20.1 calculate_qparams puts finfo(scale dtype).eps there (F16: 2^-10)
    assert s == 2.0 ** -10
    assert res.vs_source is not None and res.vs_source.numel == 4


def test_mx_groups_carry_by_hand():
    codes = np.arange(2 * 96, dtype=np.uint8).reshape(2, 96) % 0x7E
    scales = np.array([[0.5, 4.0]], np.float32)  # blocks 1 x 64: columns 0-63 and 64-95 (partial)
    t = QuantizedTensor("w", ("out", "in"), codes, scales, QuantScheme(8, False, scale_dtype="F32", codebook=E4M3),
                        GroupMap.per_block(None, 64))
    m = as_mx_groups(t)
    assert m.scheme.scale_dtype == "F8_E8M0" and m.group_map.describe() == "group(in, 32)"
    assert m.scales.astype(np.float32).tolist() == [[0.5, 0.5, 4.0]] * 2
    assert m.scales.view(np.uint8).tolist() == [[126, 126, 129]] * 2  # E8M0: exponent + 127
    np.testing.assert_array_equal(m.codes, codes)
    np.testing.assert_array_equal(m.dequantize(), t.dequantize())


def test_mx_groups_refusals_name_the_block(weights):
    t = fp8_block(K, weights[K])  # absmax / 448 scales: not powers of two
    with pytest.raises(NotRepresentableError, match=r"block \[0, 0\] \(rows 0-127, columns 0-127\)") as e:
        as_mx_groups(t)
    assert "requantize" in e.value.hint
    p = fp8_block(K, weights[K], pow2=True, scale_dtype="F32")
    bad = p.scales.copy()
    bad[1, 4] = 3.0
    with pytest.raises(NotRepresentableError, match=r"3.0 at block \[1, 4\] \(rows 128-191, columns 512-575\)"):
        as_mx_groups(p.replace(scales=bad))
    tiny = p.scales.copy()
    tiny[0, 1] = 2.0 ** -130
    with pytest.raises(NotRepresentableError, match="outside 2"):
        as_mx_groups(p.replace(scales=tiny))
    odd = QuantizedTensor("w", ("out", "in"), np.zeros((2, 48), np.uint8), np.ones((1, 1), np.float32),
                          QuantScheme(8, False, scale_dtype="F32", codebook=E4M3), GroupMap.per_block(128, 128))
    with pytest.raises(NotRepresentableError, match="not a multiple of the MX group size 32"):
        as_mx_groups(odd)
    straddle = odd.replace(codes=np.zeros((2, 96), np.uint8), scales=np.ones((1, 2), np.float32),
                           group_map=GroupMap.per_block(128, 48))
    with pytest.raises(NotRepresentableError, match="constant over groups of 32"):
        as_mx_groups(straddle)


def test_mx_groups_per_expert():
    codes = np.full((2, 4, 64), 0x38, np.uint8)  # E4M3 0x38 = 1.0
    s = np.array([[[2.0]], [[0.25]]], np.float32)  # (expert, 1, 1): one scale per expert
    t = QuantizedTensor("w", ("expert", "out", "in"), codes, s, QuantScheme(8, False, scale_dtype="F32",
                                                                              codebook=E4M3), GroupMap.per_tensor())
    m = as_mx_groups(t)
    assert m.scales.shape == (2, 4, 2)
    assert m.dequantize()[0].max() == 2.0 and m.dequantize()[1].max() == 0.25


def test_convert_fp8_blocks_to_mlx_mxfp8_exactly(tmp_path, weights):
    tensors = [fp8_block(n, w, pow2=True, scale_dtype="F32") for n, w in weights.items()]
    src = native_source(tmp_path, tensors)
    dst = tmp_path / "mlx"
    doc = convert_exact(src, dst, "mlx")
    assert doc["summary"]["all_exact"]
    rows = {r["name"]: r for r in doc["tensors"]}
    import json
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": 32, "bits": 8, "mode": "mxfp8"}
    back = load(dst)
    for t in tensors:
        assert rows[t.name]["mode"] == "exact" and rows[t.name]["codes_identical"]
        b = back[t.name]
        assert b.scheme.scale_dtype == "F8_E8M0" and b.group_map.describe() == "group(in, 32)"
        np.testing.assert_array_equal(b.codes, t.codes)
        # E8M0 byte of row r, group g = log2(scale of block (r // 128, g // 4)) + 127, by hand
        e = np.log2(t.scales).astype(np.int64) + 127
        want = np.repeat(np.repeat(e, 128, axis=0)[: t.shape[0]], 4, axis=1)[:, : t.shape[1] // 32]
        np.testing.assert_array_equal(b.scales.view(np.uint8), want)
        np.testing.assert_array_equal(b.dequantize(), t.dequantize())


def test_convert_to_mlx_refuses_non_power_of_two_scales(src, tmp_path):
    dst = tmp_path / "mlx"
    with pytest.raises(NotRepresentableError, match="not all powers of two") as e:
        convert_exact(src, dst, "mlx")
    assert "requantize" in e.value.render()
    assert not dst.exists()


def test_mlx_mixed_affine_and_mxfp8_modules_get_their_mode(tmp_path, weights):
    from converter.quant.quantize import quantize
    fp8 = fp8_block(K, weights[K], pow2=True, scale_dtype="F32")
    down = quantize(weights[NAMES[1]].astype(np.float32), QuantScheme(4, True, scale_dtype="F16"),
                    GroupMap.per_group(64), name=NAMES[1])
    src = native_source(tmp_path, [fp8, down])
    dst = tmp_path / "mlx"
    convert_exact(src, dst, "mlx")
    import json
    q = json.loads((dst / "config.json").read_text())["quantization"]
    modes = {q.get("mode"), q.get(NAMES[1][:-7], {}).get("mode"), q.get(K[:-7], {}).get("mode")}
    assert "mxfp8" in modes and "affine" in modes
    back = load(dst)
    assert back[K].scheme.codebook == E4M3 and back[NAMES[1]].scheme.codebook is None


def test_mlx_still_refuses_other_float_elements():
    """Of the 8-bit elements only E4M3 (mxfp8) is written: E5M2 stays refused with the reason; E2M1 is written
    as mxfp4 / nvfp4 only with E8M0 / E4M3 scales (tests/formats/test_mlx_fp4.py), F32 scales refused."""
    from converter.codebooks import E2M1
    from converter.formats.mlx import check_target
    from converter.tensor import spec_of
    for cb, bits, reason in ((E2M1, 4, "MLX mxfp4 stores E8M0 and nvfp4 E4M3 group scales"),
                             (ELEMENTS["e5m2"].values, 8, "cannot be written to MLX")):
        t = QuantizedTensor("m.weight", ("out", "in"), np.zeros((2, 64), np.uint8), np.ones((2, 2), np.float32),
                            QuantScheme(bits, False, scale_dtype="F32", codebook=cb), GroupMap.per_group(32))
        assert reason in check_target(spec_of(t))


def test_mx_groups_carry_nan_codes():
    """A NaN code (E4M3 0x7F / 0xFF) decodes to NaN under either scale: the carry is not refused."""
    codes = np.arange(2 * 64, dtype=np.uint8).reshape(2, 64) % 0x7E
    codes[0, 3], codes[1, 40] = 0x7F, 0xFF
    t = QuantizedTensor("w", ("out", "in"), codes, np.array([[0.25]], np.float32),
                        QuantScheme(8, False, scale_dtype="F32", codebook=E4M3), GroupMap.per_tensor())
    m = as_mx_groups(t)
    np.testing.assert_array_equal(m.codes, codes)
    assert m.scales.astype(np.float32).tolist() == [[0.25, 0.25]] * 2
    v = m.dequantize()
    assert np.isnan(v[0, 3]) and np.isnan(v[1, 40]) and np.isnan(v).sum() == 2
    assert nan_code_count(t) == 2


def test_mx_groups_of_an_expert_stack_with_nan_codes():
    codes = (np.arange(2 * 4 * 64, dtype=np.uint8).reshape(2, 4, 64) % 0x7E)
    codes[1, 2, 5] = 0x7F
    scales = np.array([[[0.5, 2.0]], [[1.0, 0.125]]], np.float32)  # (expert, out blocks, in blocks): 4 x 32 blocks
    t = QuantizedTensor("w", ("expert", "out", "in"), codes, scales,
                        QuantScheme(8, False, scale_dtype="F32", codebook=E4M3), GroupMap.per_block(None, 32))
    m = as_mx_groups(t)
    assert m.scales.astype(np.float32).tolist() == [[[0.5, 2.0]] * 4, [[1.0, 0.125]] * 4]
    v = m.dequantize()
    assert np.isnan(v[1, 2, 5]) and np.isnan(v).sum() == 1
    np.testing.assert_array_equal(v, t.dequantize())  # (numpy's testing helper: NaN equal to NaN in place)
    # the MX scale of element [e, r, c] is its block's: codes * 2^k by hand at a few places
    assert v[0, 3, 40] == np.float32(codes[0, 3, 40:41].view(ml_dtypes.float8_e4m3fn)[0]) * 2.0
    assert v[1, 0, 10] == np.float32(codes[1, 0, 10:11].view(ml_dtypes.float8_e4m3fn)[0]) * 1.0
