"""Requantization: exact carries (hand-computed), lossy RTN bounds, idempotence, act-order,
partial groups, and the CASES.md numerics (B18, B20, B22, B23, B24, B25)."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.errors import QuantizationError, UnsupportedError
from converter.groups import GroupMap
from converter.quant.quantize import quantize
from converter.quant.requant import (Target, carry, classify, exact_regroup, mse_scale_search, requantize,
                                     resolve)
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor, spec_of

AX = ("out", "in")
S8F32 = QuantScheme(8, signed=True, scale_dtype="F32")
S4 = QuantScheme(4, signed=True)


def qt(codes, scales, scheme, gm, zp=None, name="w"):
    return QuantizedTensor(name, AX, np.asarray(codes, scheme.code_dtype), np.asarray(scales, scheme.scale_np_dtype),
                           scheme, gm, zero_points=zp, stored={})


# -- hand-computed --------------------------------------------------------------------------------

def test_small_and_large_rows_8bit():
    w = np.array([[0.1, -0.1], [10, -10]], np.float32)
    pc = quantize(w, S8F32, GroupMap.per_channel("out"))
    assert pc.codes.tolist() == [[127, -127], [127, -127]]
    np.testing.assert_array_equal(pc.scales.ravel(), np.float32([0.1, 10]) / np.float32(127))
    assert classify(pc, Target(granularity="tensor")) == ("lossy", "per-channel -> per-tensor merges channels")
    info = requantize(pc, Target(granularity="tensor"))
    pt = info.tensor
    assert info.route == "requantized"
    assert pt.codes.tolist() == [[1, -1], [127, -127]]  # the small row collapses to +-1
    assert pt.scales.ravel().tolist() == [np.float32(10) / np.float32(127)]
    # and back: per-tensor -> per-channel is exact (scale repeated, codes carried)
    info = requantize(pt, Target(granularity="channel"))
    back = info.tensor
    assert classify(pt, Target(granularity="channel"))[0] == "exact" and info.route == "carried"
    assert back.codes.tolist() == [[1, -1], [127, -127]]
    np.testing.assert_array_equal(back.dequantize(), pt.dequantize())


def test_round_half_to_even():
    # source: 8-bit per-tensor, scale 0.5 -> values 0.5 1.5 2.5 -0.5 -2.5 3.0
    src = qt([[1, 3, 5, -1, -5, 6]], [[0.5]], S8F32, GroupMap.per_tensor())
    out = requantize(src, Target(bits=3)).tensor  # absmax 3 / qpos 3 = scale 1.0
    assert out.scales.ravel().tolist() == [1.0]
    assert out.codes.tolist() == [[0, 2, 2, 0, -2, 3]]


def test_channel_group_channel_exact():
    rng = np.random.default_rng(1)
    w = rng.normal(size=(6, 96)).astype(np.float32)
    pc = quantize(w, S4, GroupMap.per_channel("out"))
    assert classify(pc, Target(group_size=32)) == ("exact", "per-channel scale repeated across groups")
    g = exact_regroup(pc, Target(group_size=32))
    np.testing.assert_array_equal(g.codes, pc.codes)
    np.testing.assert_array_equal(g.scales, np.repeat(pc.scales, 3, axis=1))
    info = requantize(g, Target(granularity="channel"))
    back = info.tensor
    assert classify(g, Target(granularity="channel"))[0] == "lossy"  # from the spec: it merges groups
    assert info.route == "carried"  # ... but the data allow carrying the codes
    np.testing.assert_array_equal(back.codes, pc.codes)
    np.testing.assert_array_equal(back.scales, pc.scales)


def test_group_128_to_32_repeats_scales():
    rng = np.random.default_rng(2)
    t = quantize(rng.normal(size=(4, 256)).astype(np.float32), S4, GroupMap.per_group(128))
    assert classify(spec_of(t), Target(group_size=32)) == ("exact", "group 128 -> 32: scales repeated")
    out = exact_regroup(t, Target(group_size=32))
    np.testing.assert_array_equal(out.scales, np.repeat(t.scales, 4, axis=1))
    np.testing.assert_array_equal(out.codes, t.codes)
    assert classify(spec_of(t), Target(group_size=256))[0] == "lossy"
    assert classify(spec_of(t), Target(group_size=96))[0] == "lossy"


def test_sym_to_asym_zero_is_centre():
    t = qt([[-8, -1, 0, 7]], [[0.25]], S4, GroupMap.per_tensor())
    assert classify(t, Target(symmetric=False))[0] == "exact"
    out = exact_regroup(t, Target(symmetric=False))
    assert out.scheme.zero_point is ZeroPoint.INTEGER and not out.scheme.signed
    assert out.zero_points.tolist() == [[8]] and out.codes.tolist() == [[0, 7, 8, 15]]
    np.testing.assert_array_equal(out.dequantize(), t.dequantize())
    # asym -> sym is lossy unless every zero point is the centre
    assert classify(out, Target(symmetric=True)) == ("lossy", "asym -> sym drops the zero points")
    info = requantize(out, Target(symmetric=True))
    back = info.tensor
    assert info.route == "carried" and back.codes.tolist() == [[-8, -1, 0, 7]]


def test_more_bits_same_scale():
    t = qt([[-8, 3, 7]], [[0.5]], S4, GroupMap.per_tensor())
    out = exact_regroup(t, Target(bits=8))
    assert out.codes.tolist() == [[-8, 3, 7]] and out.scheme.bits == 8
    u = QuantScheme(4, signed=False)  # GPTQ-style unsigned symmetric: centre 8 -> 128
    tu = qt([[0, 11, 15]], [[0.5]], u, GroupMap.per_tensor())
    ou = exact_regroup(tu, Target(bits=8))
    assert ou.codes.tolist() == [[120, 131, 135]]
    np.testing.assert_array_equal(ou.dequantize(), tu.dequantize())
    assert classify(tu, Target(bits=3)) == ("lossy", "fewer bits (4 -> 3)")


def test_scale_dtype_widening_and_narrowing():
    t = qt([[1, -2]], [[0.1]], S4, GroupMap.per_tensor())
    assert classify(t, Target(scale_dtype="f32"))[0] == "exact"
    out = exact_regroup(t, Target(scale_dtype="f32"))
    assert out.scales.dtype == np.float32 and out.scales[0, 0] == np.float32(np.float16(0.1))
    assert classify(t, Target(scale_dtype="bf16")) == ("lossy", "narrower scale dtype (F16 -> BF16)")


def test_asym_int_to_float_bias():
    a = QuantScheme(4, signed=False, zero_point=ZeroPoint.INTEGER)
    t = qt([[0, 5, 15]], [[0.1]], a, GroupMap.per_tensor(), zp=np.array([[3]], np.uint8))
    mlx = QuantScheme(4, signed=False, zero_point=ZeroPoint.FLOAT, scale_dtype="F32")
    ts, _ = resolve(mlx, GroupMap.per_tensor(), Target(symmetric=False))
    assert ts.zero_point is ZeroPoint.INTEGER  # --asym asks for integer zero points
    out = carry(t, a.replace(zero_point=ZeroPoint.FLOAT, scale_dtype="F32"), GroupMap.per_tensor())
    assert out is not None and out.zero_points.dtype == np.float32
    np.testing.assert_array_equal(out.dequantize(), t.dequantize())


def test_float_bias_to_integer_rounds_zero_and_carries():
    f = QuantScheme(4, signed=False, zero_point=ZeroPoint.FLOAT)
    # bias = -3 * 0.1 rounded to fp16: not exactly an integer zero point
    t = qt([[0, 5, 15]], [[0.1]], f, GroupMap.per_tensor(), zp=np.array([[-0.3]], np.float16))
    info = requantize(t, Target(symmetric=False))
    out = info.tensor
    assert info.route == "carried" and out.zero_points.tolist() == [[3]] and out.codes.tolist() == [[0, 5, 15]]
    assert np.abs(out.dequantize() - t.dequantize()).max() < 1e-3


def test_carry_declines_only_a_non_integer_bias_and_lets_bugs_through(monkeypatch):
    f = QuantScheme(4, signed=False, zero_point=ZeroPoint.FLOAT)
    a = QuantScheme(4, signed=False, zero_point=ZeroPoint.INTEGER)
    t = qt([[0, 5, 15]], [[0.1]], f, GroupMap.per_tensor(), zp=np.array([[-0.3]], np.float16))
    assert carry(t, a, GroupMap.per_tensor()) is None  # -b/s is not an integer: not carried exactly
    from converter.quant import carry as carry_module

    def broken(_):
        raise TypeError("a bug, not a refusal")
    monkeypatch.setattr(carry_module, "as_integer_zero", broken)
    with pytest.raises(TypeError):  # was swallowed by `except Exception` and reported as "not carried"
        carry(t, a, GroupMap.per_tensor())


def test_exact_regroup_refuses_lossy():
    t = quantize(np.random.default_rng(0).normal(size=(2, 64)).astype(np.float32), S4, GroupMap.per_group(32))
    with pytest.raises(QuantizationError):
        exact_regroup(t, Target(bits=3))


def test_target_validation():
    with pytest.raises(UnsupportedError):
        Target(granularity="group")
    with pytest.raises(UnsupportedError):
        Target(scale_dtype="f8")
    assert Target(group_size=64).granularity == "group"


# -- lossy bounds and properties ----------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), bits=st.integers(2, 8), src_g=st.sampled_from([8, 16, 32]),
       dst=st.sampled_from(["tensor", "channel", 24, 64]), sym=st.booleans())
def test_rtn_error_at_most_half_scale(seed, bits, src_g, dst, sym):
    rng = np.random.default_rng(seed)
    t = quantize(rng.normal(size=(5, 72)).astype(np.float32), QuantScheme(8, True, scale_dtype="F32"),
                 GroupMap.per_group(src_g))
    tgt = Target(bits=bits, symmetric=sym, scale_dtype="f32",
                 **({"granularity": dst} if isinstance(dst, str) else {"group_size": dst}))
    out = requantize(t, tgt).tensor
    x = t.dequantize()
    err = np.abs(out.dequantize() - x)
    s = out.group_map.expand(out.scales.astype(np.float32), x.shape, AX)
    assert np.all(err <= s / 2 * (1 + 1e-5) + 1e-7)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**16), bits=st.integers(2, 8), gran=st.sampled_from(["tensor", "channel", 16, 40]),
       sym=st.booleans(), sd=st.sampled_from(["F16", "BF16", "F32"]), carry_ok=st.booleans())
def test_requantize_same_scheme_is_idempotent(seed, bits, gran, sym, sd, carry_ok):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(4, 80)) * rng.uniform(0.01, 10)).astype(np.float32)
    tgt = Target(bits=bits, symmetric=sym, scale_dtype=sd,
                 **({"granularity": gran} if isinstance(gran, str) else {"group_size": gran}))
    src = quantize(x, QuantScheme(8, True, scale_dtype="F32"), GroupMap.per_channel("out"))
    once = requantize(src, tgt, allow_carry=False).tensor  # an RTN result in the target scheme
    info = requantize(once, tgt, allow_carry=carry_ok)
    twice = info.tensor
    if carry_ok:
        assert info.route == "carried"
    if carry_ok or sym:  # RTN from absmax reproduces its own grid; asym RTN may shift a zero point
        np.testing.assert_array_equal(twice.codes, once.codes)
        np.testing.assert_array_equal(twice.scales, once.scales)
    np.testing.assert_array_equal(twice.dequantize(), once.dequantize()) if carry_ok or sym else None


def test_mse_search_never_worse_and_vectorized():
    rng = np.random.default_rng(3)
    x = rng.standard_t(3, size=(16, 256)).astype(np.float32)  # heavy tails: clipping helps
    sch = QuantScheme(3, True)
    s, z, info = mse_scale_search(x, sch, GroupMap.per_group(32), AX)
    assert z is None and s.shape == (16, 8)
    assert info.search_sse <= info.absmax_sse and info.search_sse < 0.9 * info.absmax_sse
    asym = QuantScheme(3, False, zero_point=ZeroPoint.INTEGER)
    s2, z2, info2 = mse_scale_search(x, asym, GroupMap.per_group(32), AX)
    assert z2.shape == (16, 8) and info2.search_sse <= info2.absmax_sse
    t = quantize(x, QuantScheme(8, True, scale_dtype="F32"), GroupMap.per_group(32))
    info3 = requantize(t, Target(bits=3, scale_search="mse"))
    assert info3.scale_search.search_sse <= info3.scale_search.absmax_sse


# -- act-order and partial groups ---------------------------------------------------------------

def test_act_order_membership_and_honest_regroup():
    rng = np.random.default_rng(4)
    n, g = 64, 16
    perm = rng.permutation(n)
    g_idx = (np.argsort(perm) // g).astype(np.int32)  # column perm[k] is the k-th in act order
    gm = GroupMap.per_group(g, "in", g_idx=g_idx)
    t = quantize(rng.normal(size=(3, n)).astype(np.float32), S4, gm)
    spec = spec_of(t)
    assert spec.act_order
    # keep groups, fewer bits: still follows g_idx
    out = requantize(t, Target(bits=3)).tensor
    assert out.group_map.g_idx is not None and np.array_equal(out.group_map.g_idx, g_idx)
    amax = gm.reduce(np.abs(t.dequantize()), np.maximum, AX)
    np.testing.assert_array_equal(out.scales, (amax / np.float32(3)).astype(np.float16))
    # a target without g_idx regroups in column order (lossy plan)
    assert classify(spec, Target(group_size=g)) == ("lossy", "act-order (g_idx) groups regrouped in column order")
    col = requantize(t, Target(group_size=g)).tensor
    assert col.group_map.g_idx is None
    amax_col = np.abs(t.dequantize()).reshape(3, n // g, g).max(axis=2)
    np.testing.assert_array_equal(col.scales, (amax_col / np.float32(7)).astype(np.float16))
    # identical g_idx: exact
    assert classify(t, Target(bits=8))[0] == "exact"


def test_partial_final_groups():
    rng = np.random.default_rng(5)
    t = quantize(rng.normal(size=(3, 40)).astype(np.float32), S4, GroupMap.per_group(16))
    assert t.scales.shape == (3, 3)
    out = exact_regroup(t, Target(group_size=8))
    assert out.scales.shape == (3, 5)
    np.testing.assert_array_equal(out.dequantize(), t.dequantize())
    lossy = requantize(t, Target(group_size=32)).tensor
    assert lossy.scales.shape == (3, 2)
    tail = np.abs(t.dequantize()[:, 32:]).max(axis=1)
    np.testing.assert_array_equal(lossy.scales[:, 1], (tail / np.float32(7)).astype(np.float16))


# -- CASES.md numerics ----------------------------------------------------------------------------

def test_b18_all_zero_group_no_nan():
    x = np.zeros((2, 8), np.float32)
    x[1] = np.arange(8) - 3.5
    t = quantize(x, S8F32, GroupMap.per_group(4))
    for tgt in (Target(bits=2), Target(bits=4, symmetric=False), Target(granularity="channel", bits=3),
                Target(bits=3, scale_search="mse")):
        info = requantize(t, tgt)
        out = info.tensor
        d = out.dequantize()
        assert np.isfinite(out.scales.astype(np.float32)).all() and (out.scales.astype(np.float32) != 0).all()
        np.testing.assert_array_equal(d[0], 0)  # the all-zero group reconstructs exactly
        assert info.degenerate_groups == (2 if out.group_map.granularity.value == "group" else 1)


def test_b20_float_bias_zero_group():
    f = QuantScheme(4, signed=False, zero_point=ZeroPoint.FLOAT)
    # an MLX-like all-zero group with the guarded minimum scale, and bias 0
    t = qt([[0, 0, 0, 0]], [[1e-7]], f, GroupMap.per_tensor(), zp=np.zeros((1, 1), np.float16))
    for tgt in (Target(symmetric=False), Target(bits=8, symmetric=True), Target(scale_dtype="f32")):
        out = requantize(t, tgt).tensor
        assert np.all(out.dequantize() == 0) and np.isfinite(out.scales.astype(np.float32)).all()


def test_b22_fp32_compute_then_range_checked_fp16_scale():
    # values that overflow fp16 as weights ([300,-2,0.5] x 250) stay finite in fp32
    x = np.array([[75000, -500, 125]], np.float32)
    src = quantize(x, QuantScheme(8, True, scale_dtype="F32"), GroupMap.per_tensor())
    out = requantize(src, Target(bits=4, symmetric=False, scale_dtype="f16")).tensor
    lo, hi = min(src.dequantize().min(), 0), src.dequantize().max()
    assert out.scales[0, 0] == np.float16(np.float32(hi - lo) / np.float32(15))  # ~5033.33 -> fp16 5032
    assert np.isfinite(out.dequantize()).all()
    # a scale above fp16 max is a named error, not inf
    big = quantize(np.array([[1e6, -3]], np.float32), QuantScheme(8, True, scale_dtype="F32"), GroupMap.per_tensor())
    with pytest.raises(QuantizationError) as e:
        requantize(big, Target(bits=4, scale_dtype="f16"))
    assert e.value.field == "scales" and "--scale-dtype" in (e.value.hint or "")


def test_b23_small_scales_stay_invariant_and_underflow_is_safe():
    w = np.array([[0.5, -1, 1.5]], np.float32) * np.float32(2 ** -8)
    src = qt([[1, -2, 3]], [[2 ** -9]], QuantScheme(4, True, scale_dtype="F32"), GroupMap.per_tensor())
    np.testing.assert_array_equal(src.dequantize(), w)
    out = requantize(src, Target(scale_dtype="f16")).tensor  # 2^-9 is exact in fp16: carried
    np.testing.assert_array_equal(out.dequantize(), w)
    tiny = qt([[1, -2, 3]], [[2 ** -30]], QuantScheme(4, True, scale_dtype="F32"), GroupMap.per_tensor())
    out2 = requantize(tiny, Target(scale_dtype="f16")).tensor  # scale below fp16's smallest subnormal
    s = out2.scales.astype(np.float32)
    assert s[0, 0] == np.float32(2 ** -24) and np.isfinite(out2.dequantize()).all()


def test_b24_bf16_scales_to_fp16_range_checked():
    bf = QuantScheme(8, True, scale_dtype="BF16")
    t = qt([[1, 1], [1, 1], [1, 1]], np.array([[1.0e-8], [70144], [3.0e-5]], np.float32).astype(ml_dtypes.bfloat16),
           bf, GroupMap.per_channel("out"))
    assert classify(t, Target(scale_dtype="f16")) == ("lossy", "narrower scale dtype (BF16 -> F16)")
    with pytest.raises(QuantizationError) as e:  # 70144/127 fits, but the requantized grid must be checked
        requantize(t, Target(scale_dtype="f16", bits=2))
    assert e.value.field == "scales"
    # 8 bits: the 70144 scale cannot be cast, so the row is requantized in fp32 with a range-checked
    # fp16 scale (70144/127 = 552.3); the 1e-8 scale underflows to fp16's smallest subnormal (no 0, no inf)
    info = requantize(t, Target(scale_dtype="f16"))
    rq = info.tensor
    assert info.route == "requantized"
    s = rq.scales.astype(np.float32).ravel()
    assert np.isfinite(s).all() and (s > 0).all()
    assert s[1] == np.float32(np.float16(np.float32(70144) / np.float32(127)))
    assert s[0] == np.float32(2 ** -24)
    assert abs(rq.dequantize()[1, 0] - 70144) <= s[1] / 2
    out = exact_regroup(t, Target(scale_dtype="f32"))  # widening is exact
    np.testing.assert_array_equal(out.dequantize(), t.dequantize())


def test_b25_bf16_source_computed_in_fp32():
    bf = QuantScheme(8, True, scale_dtype="BF16")
    vals = np.array([3.140625, 0.01171875, -0.3046875], np.float32)  # bf16-exact
    t = qt([[1, 1, 1]], vals.reshape(1, 3).astype(ml_dtypes.bfloat16), bf, GroupMap.per_group(1))
    np.testing.assert_array_equal(t.dequantize()[0], vals)
    out = requantize(t, Target(granularity="tensor", scale_dtype="f32", bits=8)).tensor
    s = np.float32(3.140625) / np.float32(127)
    assert out.scales[0, 0] == s
    np.testing.assert_array_equal(out.codes[0], np.rint(vals / s).astype(np.int8))


# -- issue 18 item 8: integer zero points -> GGUF Q4_1's fp16 float minimum ------------------------------------
def _int_asym(scale: float, zps, group: int = 32, seed=0):
    """A 2 x 2*group uint4 tensor, groups of ``group`` along in, fp16 ``scale`` and integer zero points ``zps``
    (2 x 2); every group spans the whole grid."""
    a = QuantScheme(4, signed=False, zero_point=ZeroPoint.INTEGER, scale_dtype="F16")
    codes = np.random.default_rng(seed).integers(0, 16, (2, 2 * group))
    codes[:, [0, group]], codes[:, [1, group + 1]] = 0, 15
    return qt(codes, np.full((2, 2), scale), a, GroupMap.per_group(group, "in"), zp=np.asarray(zps, np.uint8))


def test_int_zero_to_q4_1_exact_when_the_fp16_minimum_is_exact():
    """s = 2^-4, z in 1..15: -z*s needs at most 4 significant bits, exact in fp16 -> exact carry (even at
    group 32, where llama.cpp's quantizer would otherwise define Q4_1)."""
    from converter.formats.gguf.requant import GGUF_QUANTIZER
    t = _int_asym(2.0 ** -4, [[3, 8], [15, 1]])
    info = requantize(t, Target(symmetric=False), fmt=GGUF_QUANTIZER)
    assert info.route == "carried" and info.identical
    np.testing.assert_array_equal(info.tensor.dequantize(), t.dequantize())
    assert classify(t, Target(symmetric=False), GGUF_QUANTIZER)[0] == "lossy"  # planned from headers alone


def test_int_zero_to_float_bias_carries_codes_with_the_minimum_rounded():
    """Group 64 (Q4_1 blocks repeating it; no llama.cpp quantizer for that target), s = fp16(0.1), z = 7 / 9:
    -z*s rounds in fp16, so by hand the result differs from the source by exactly m16 - (-z*s) on every
    element, codes and scales carried; a fresh min/max requantization is no closer."""
    from converter.formats.gguf.requant import GGUF_QUANTIZER
    t = _int_asym(0.1, [[7, 7], [7, 9]], group=64)
    info = requantize(t, Target(symmetric=False), fmt=GGUF_QUANTIZER)
    out = info.tensor
    assert info.route == "carried" and not info.identical and "rounded to F16" in info.note
    s = np.float32(np.float16(0.1))
    z = np.array([[7, 7], [7, 9]], np.float32)
    m16 = (-(z * s)).astype(np.float16)
    np.testing.assert_array_equal(out.zero_points, m16)
    np.testing.assert_array_equal(out.scales.astype(np.float32), np.full((2, 2), s))
    np.testing.assert_array_equal(out.codes, t.codes)
    err = out.dequantize() - t.dequantize()
    expect = np.repeat(m16.astype(np.float32) - (-(z * s)), 64, axis=1)
    np.testing.assert_allclose(err, expect, rtol=0, atol=2e-7)
    assert 0 < np.abs(err).max() <= np.abs(m16.astype(np.float32)).max() * 2.0 ** -11
    # min/max requantization of groups spanning the whole grid finds the same d and m (a tie: the carry
    # is taken); on the AWQ sample it is far worse (tests/ops/test_requantize_hints.py)
    rtn = requantize(t, Target(symmetric=False), fmt=GGUF_QUANTIZER, allow_carry=False).tensor
    assert np.sum((rtn.dequantize() - t.dequantize()).astype(np.float64) ** 2) >= np.sum(err.astype(np.float64) ** 2)
