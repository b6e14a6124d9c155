"""Round-to-nearest quantize / dequantize: properties and numerics."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from converter import GroupMap, QuantScheme, ZeroPoint
from converter.errors import QuantizationError
from converter.quant.quantize import codes_for, quantize

SCHEMES = [QuantScheme(b, True, ZeroPoint.NONE, scale_dtype="F32") for b in (2, 3, 4, 8)] + \
          [QuantScheme(b, False, ZeroPoint.INTEGER, scale_dtype="F32") for b in (2, 4, 8)] + \
          [QuantScheme(4, False, ZeroPoint.FLOAT, scale_dtype="F32")]
GMAPS = [GroupMap.per_tensor(), GroupMap.per_channel("out"), GroupMap.per_channel("in"),
         GroupMap.per_group(3), GroupMap.per_group(4, axis="out")]

matrices = hnp.arrays(np.float32, st.tuples(st.integers(1, 7), st.integers(1, 11)),
                      elements=st.floats(-100, 100, width=32, allow_subnormal=False))


def _group_labels(gi: int, shape: tuple[int, int]) -> np.ndarray:
    """Independent group id of every element of an (out, in) matrix for GMAPS[gi] (no GroupMap code)."""
    o, i = np.indices(shape)
    return [np.zeros(shape, int), o, i, o * 10_000 + i // 3, (o // 4) * 10_000 + i][gi]


def _per_element(x: np.ndarray, labels: np.ndarray, fn) -> np.ndarray:
    """``fn`` (np.maximum / np.minimum) reduced over each group, broadcast back to every element."""
    _, inv = np.unique(labels.reshape(-1), return_inverse=True)
    init = -np.inf if fn is np.maximum else np.inf
    red = np.full(inv.max() + 1, init, dtype=x.dtype)
    fn.at(red, inv, x.reshape(-1))
    return red[inv].reshape(x.shape)


@settings(max_examples=120, deadline=None)
@given(x=matrices, si=st.integers(0, len(SCHEMES) - 1), gi=st.integers(0, len(GMAPS) - 1))
def test_error_at_most_half_a_step(x, si, gi):
    s, gm = SCHEMES[si], GMAPS[gi]
    t = quantize(x, s, gm)
    labels = _group_labels(gi, x.shape)
    if s.symmetric:  # step = absmax / qmax, computed here (float32, as stored in F32 scales)
        amax = _per_element(np.abs(x), labels, np.maximum)
        step = np.where(amax > 0, amax / np.float32((1 << (s.bits - 1)) - 1), np.float32(1.0)).astype(np.float32)
        stored = gm.expand(t.scales.astype(np.float32), x.shape, ("out", "in"))
        np.testing.assert_array_equal(stored, step.astype(s.scale_np_dtype).astype(np.float32))
        step = np.where(amax > 0, step, 0.0)  # an all-zero group reconstructs exactly
    else:  # step = (max - min) / (2^b - 1), the range widened to include 0, in float64
        x64 = x.astype(np.float64)
        hi = np.maximum(_per_element(x64, labels, np.maximum), 0)
        lo = np.minimum(_per_element(x64, labels, np.minimum), 0)
        step = (hi - lo) / ((1 << s.bits) - 1) * (1 + 1e-6)  # float32 rounding of the stored scale
    err = np.abs(t.dequantize().astype(np.float64) - x)
    # round-to-nearest: |x - x_hat| <= step/2 (+ float32 rounding of the arithmetic)
    assert (err <= step / 2 * (1 + 1e-5) + 1e-6 * np.abs(x) + 1e-30).all()


@settings(max_examples=80, deadline=None)
@given(x=matrices, si=st.integers(0, len(SCHEMES) - 1), gi=st.integers(0, len(GMAPS) - 1))
def test_requantize_same_scheme_is_idempotent(x, si, gi):
    s, gm = SCHEMES[si], GMAPS[gi]
    t = quantize(x, s, gm)
    # the same scales and zero points reproduce the same codes from the reconstruction
    codes = codes_for(t.dequantize(), t.scales, t.zero_points, s, gm, ("out", "in"))
    np.testing.assert_array_equal(codes, t.codes)


def test_g_idx_groups_follow_membership():
    # columns 0 and 2 are group 1, columns 1 and 3 group 0 (act-order), CASES.md B11
    x = np.array([[2.0, 0.3, 4.0, 0.5]], np.float32)
    gm = GroupMap.per_group(2, g_idx=np.array([1, 0, 1, 0]))
    t = quantize(x, QuantScheme(8, True, scale_dtype="F32"), gm)
    np.testing.assert_array_equal(t.scales, np.array([[0.5 / 127, 4.0 / 127]], np.float32))
    assert t.codes.tolist() == [[64, 76, 127, 127]]  # 2/(4/127)=63.5->64, 0.3/(0.5/127)=76.2->76


def test_fp16_overflow_computed_in_f32():
    # CASES.md B22: [300, -2, 0.5] x 250 overflows in fp16 ([inf, -500, 125]); in float32 it is
    # [75000, -500, 125], and the asymmetric range / 15 = 5033.33 is a finite fp16 scale
    w = np.array([[300.0, -2.0, 0.5]], np.float16)
    with np.errstate(over="ignore"):
        assert np.isinf((w * np.float16(250))[0, 0])
    x = w.astype(np.float32) * np.float32(250)
    t = quantize(x, QuantScheme(4, False, ZeroPoint.INTEGER, scale_dtype="F16"), GroupMap.per_tensor())
    assert float(t.scales[0, 0]) == float(np.float16(np.float32(75500.0) / np.float32(15)))
    assert abs(float(t.scales[0, 0]) - 5033.33) < 3
    assert np.isfinite(t.dequantize()).all()


def test_scale_overflow_in_fp16_is_a_named_error():
    # absmax 5e5 / 7 = 71428 > 65504: no finite fp16 scale exists; a named error, never inf
    x = np.array([[5e5, -500.0, 125.0, 0.0]], np.float32)
    with pytest.raises(QuantizationError, match="overflows the scale dtype") as e:
        quantize(x, QuantScheme(4, True, scale_dtype="F16"), GroupMap.per_tensor(), name="w")
    assert "'w'" in str(e.value) and "--scale-dtype f32" in str(e.value)
    t = quantize(x, QuantScheme(4, True, scale_dtype="F32"), GroupMap.per_tensor())
    assert np.isfinite(t.dequantize()).all()


def test_scale_underflow_in_fp16_never_zero():
    # a tiny but non-zero group: absmax/7 underflows fp16 -> smallest subnormal, never 0 or NaN
    x = np.array([[1e-9, -1e-9, 0, 0]], np.float32)
    t = quantize(x, QuantScheme(4, True, scale_dtype="F16"), GroupMap.per_tensor())
    assert t.scales.item() > 0 and np.isfinite(t.dequantize()).all()


def test_bf16_scale_narrowing_computed_in_f32():
    # CASES.md B24: bf16 scales hold 70144 and 1e-8 where fp16 would give inf and 0
    x = np.array([[70144.0 * 7, 1e-8 * 7]], np.float32)
    t = quantize(x, QuantScheme(4, True, scale_dtype="BF16"), GroupMap.per_channel("in"))
    assert t.scales.dtype == ml_dtypes.bfloat16
    assert np.isfinite(t.scales.astype(np.float32)).all() and (t.scales.astype(np.float32) > 0).all()


def test_non_finite_input_refused():
    with pytest.raises(QuantizationError, match="not all finite"):
        quantize(np.array([[np.nan, 1.0]], np.float32), QuantScheme(4, True), GroupMap.per_tensor())
