"""The row-blocked round-to-nearest kernel: bit-identical to the whole-array quantizer."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from converter.errors import QuantizationError
from converter.groups import Granularity, GroupMap
from converter.kernels.rtn import quantize_rows
from converter.layout import IN, OUT
from converter.quant import quantize as Q
from converter.scheme import QuantScheme, ZeroPoint


def _rows(x, s, gm):
    """:func:`quantize_rows` for a group map with row-local groups."""
    assert gm.row_local((OUT, IN))
    return quantize_rows(x, s, group_size=gm.group_size if gm.granularity is Granularity.GROUP else None)


def _reference_quantize(x, s, gm):
    x = np.asarray(x, np.float32)
    sc, z = Q.choose_params(x, s, gm, (OUT, IN))
    if z is not None:
        z = z.astype(s.code_dtype)
    return sc, z, Q.codes_for(x, sc, z, s, gm, (OUT, IN))


@pytest.mark.parametrize("bits,signed,zp", [(b, sg, z) for b, sg, z in itertools.product(
    [2, 4, 8], [True, False], [ZeroPoint.NONE, ZeroPoint.INTEGER])])
def test_blocked_quantize_is_bit_exact(bits, signed, zp):
    rng = np.random.default_rng(bits)
    for shape, sd, gm in [((37, 300), "F16", GroupMap.per_group(128)), ((9, 64), "BF16", GroupMap.per_channel()),
                          ((70, 1000), "F32", GroupMap.per_group(32))]:
        s = QuantScheme(bits, signed, zp, sd)
        x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 300.0])).astype(np.float32)
        x[1] = 0
        x[2, :7] = 0
        for xin in (x, x.astype(np.float16)):
            want = _reference_quantize(xin, s, gm)
            got = _rows(xin, s, gm)
            assert np.array_equal(got.scales.view(np.uint8), want[0].view(np.uint8))
            assert (got.zero_points is None) == (want[1] is None)
            if got.zero_points is not None:
                assert got.zero_points.dtype == want[1].dtype and np.array_equal(got.zero_points, want[1])
            assert got.codes.dtype == want[2].dtype and np.array_equal(got.codes, want[2])


@pytest.mark.parametrize("signed,zp,rounding",
                         [(True, ZeroPoint.NONE, "half_even"), (False, ZeroPoint.NONE, "half_away"),
                          (False, ZeroPoint.INTEGER, "half_even"), (True, ZeroPoint.INTEGER, "half_away")])
def test_blocked_quantize_clips_where_a_rounded_scale_is_too_small(signed, zp, rounding):
    """Scales in fp16's subnormal range can round well below max/qmax: codes then exceed the range
    and must be clipped, in the blocks (rows) that need it and only there."""
    tiny = float(np.finfo(np.float16).smallest_subnormal)
    s, gm = QuantScheme(4, signed, zp, "F16", rounding=rounding), GroupMap.per_group(64)
    levels = 7 if zp is ZeroPoint.NONE else 15
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((200, 256)) * 0.05).astype(np.float32)
    top = np.float32(1.49 * tiny * levels)  # top / levels rounds down to 1 subnormal step: codes ~1.5x too big
    low = -1 if zp is ZeroPoint.NONE else 0  # asymmetric: range [0, top], zero point 0
    x[150:, :64] = top * rng.uniform(low, 1, (50, 64)).astype(np.float32)
    x[150:, 0], x[150:, 1] = top, low * top
    want = _reference_quantize(x, s, gm)
    got = _rows(x, s, gm)
    assert np.array_equal(got.scales.view(np.uint16), want[0].view(np.uint16))
    assert np.array_equal(got.codes, want[2])
    assert want[2][150:, 0].max() == s.qmax  # the clip did act


def test_blocked_quantize_defers_errors_to_the_whole_array_path():
    x = np.ones((4, 256), np.float32)
    x[2, 7] = np.nan
    s, gm = QuantScheme(4, True, ZeroPoint.NONE, "F16"), GroupMap.per_group(128)
    assert _rows(x, s, gm) is None
    with pytest.raises(QuantizationError):
        Q.quantize(x, s, gm)
    x[2, 7] = -np.inf  # the integer max of |x| bit patterns sees inf (and NaN) above every finite value
    assert _rows(x, s, gm) is None
    zeros = np.zeros((3, 256), np.float32)
    zeros[1, :128] = -0.0
    got = quantize_rows(zeros, s, group_size=128)
    assert got.degenerate_groups == 6 and not got.codes.any() and (got.scales == 1).all()
    big = np.full((2, 128), 1e9, np.float32)
    with pytest.raises(QuantizationError, match="overflows"):
        Q.quantize(big, s, gm)


def test_hand_computed_codes_and_scales():
    """Values chosen so every scale is exact: the codes worked out by hand (round half to even)."""
    sym = QuantScheme(4, True, ZeroPoint.NONE, "F32")
    x = np.array([[3.5, -7.0, 1.75, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)  # amax 7 -> scale 7 / 7 = 1
    got = _rows(x, sym, GroupMap.per_channel())
    assert got.scales.tolist() == [[1.0], [1.0]] and got.zero_points is None and got.degenerate_groups == 1
    assert got.codes.tolist() == [[4, -7, 2, 0], [0, 0, 0, 0]]  # 3.5 -> 4, 1.75 -> 2
    asym = QuantScheme(4, False, ZeroPoint.INTEGER, "F32")
    x = np.array([[-5.0, 10.0, 2.5, 0.0]], np.float32)  # range [-5, 10] / 15 levels: scale 1, zero 5
    got = _rows(x, asym, GroupMap.per_group(4))
    assert got.scales.tolist() == [[1.0]] and got.zero_points.tolist() == [[5]]
    assert got.codes.tolist() == [[0, 15, 7, 5]]  # 2.5 -> 2 (half to even), + 5
    whole = Q.quantize(x, asym, GroupMap.per_tensor())  # not row-blocked: the whole-array path
    assert whole.codes.tolist() == [[0, 15, 7, 5]] and whole.zero_points.tolist() == [[5]]


# Hand-computed values, independent of the kernels (the blocked-vs-whole comparisons above share
# the kernels' formulas since the two paths became one).
TINY16 = float(np.finfo(np.float16).smallest_subnormal)  # 2^-24


@pytest.mark.parametrize("rounding,codes", [("half_even", [7, 2, -2, 0]), ("half_away", [7, 3, -2, 1])])
def test_hand_values_rounding_of_exact_halves(rounding, codes):
    # max|x| = 0.875 -> scale 0.875 / 7 = 0.125 (exact in fp16); x / 0.125 = 7, 2.5, -1.5, 0.5
    s = QuantScheme(4, True, ZeroPoint.NONE, "F16", rounding=rounding)
    x = np.array([[0.875, 0.3125, -0.1875, 0.0625]], np.float32)
    for got in (_rows(x, s, GroupMap.per_channel()), Q.quantize(x, s, GroupMap.per_channel())):
        assert got.scales.dtype == np.float16 and float(got.scales.reshape(-1)[0]) == 0.125
        assert got.codes.reshape(-1).tolist() == codes


def test_hand_values_fp16_scale_rounding():
    # 0.7 / 7 = 0.1 in float32; fp16 spacing on [2^-4, 2^-3) is 2^-14: 0.1 * 2^14 = 1638.4 -> 1638,
    # scale 1638 * 2^-14 = 0.0999755859375; codes round(x / scale): 7.0017 -> 7, -3.5009 -> -4, 1.0002 -> 1
    s = QuantScheme(4, True, ZeroPoint.NONE, "F16")
    x = np.array([[0.7, -0.35, 0.1, 0.0]], np.float32)
    for got in (_rows(x, s, GroupMap.per_channel()), Q.quantize(x, s, GroupMap.per_channel())):
        assert float(got.scales.reshape(-1)[0]) == 1638 * 2.0 ** -14 == 0.0999755859375
        assert got.codes.reshape(-1).tolist() == [7, -4, 1, 0]


def test_hand_values_clip_where_the_fp16_scale_rounds_down():
    # max|x| = 10.43 * 2^-24 -> scale 1.49 * 2^-24 rounds to one fp16 subnormal step (2^-24);
    # x / 2^-24 = 10.43 -> 10, above qmax 7: clipped to 7; -3 * 2^-24 -> -3
    s = QuantScheme(4, True, ZeroPoint.NONE, "F16")
    x = np.array([[np.float32(1.49 * 7) * np.float32(TINY16), -3 * TINY16, 0.0, TINY16]], np.float32)
    for got in (_rows(x, s, GroupMap.per_channel()), Q.quantize(x, s, GroupMap.per_channel())):
        assert float(got.scales.reshape(-1)[0]) == TINY16
        assert got.codes.reshape(-1).tolist() == [7, -3, 0, 1]
