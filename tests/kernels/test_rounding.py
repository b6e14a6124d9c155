"""converter.kernels.rounding: exact half-away-from-zero (C ``roundf``) near ties, vs decimal ROUND_HALF_UP."""

from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Context, Decimal

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from converter.errors import LayoutError
from converter.formats.gguf import block_legacy as gguf_blocks
from converter.kernels.rounding import round_half_away, round_values

NEAR_TIES = [0.49999997, 0.49999999999999994, 2.0 ** 52 + 1, 0.5, 0.50000006, 1.5, 2.5, -2.5, -0.5, -0.49999997,
             3.4999998, 8388607.5, 8388609.0, -8388609.0, 2.0 ** 24 + 2, 2.0 ** 24 + 1, 1e30, -3.4e38, 0.0, -0.0,
             1e-45, 7.0]


def ref_half_up(values: np.ndarray, mode=ROUND_HALF_UP) -> list[float]:
    """Independent reference: Python's decimal on the EXACT value of each float (Decimal(float) is exact).

    ROUND_HALF_UP in decimal rounds ties away from zero (it works on the magnitude)."""
    ctx = Context(prec=400)  # enough digits for any float64 integer part
    return [float(Decimal(float(v)).quantize(Decimal(1), rounding=mode, context=ctx)) for v in values]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_near_ties_match_decimal_half_up(dtype):
    x = np.array(NEAR_TIES, dtype)
    got = round_values(x, "half_away")
    assert got.dtype == dtype
    assert got.tolist() == ref_half_up(x)


def test_known_values_where_floor_plus_half_was_wrong():
    x = np.array([0.49999997, 8388609.0, 2.5, -2.5, 1.5], np.float32)
    assert float(x[0]) < 0.5 and float(x[1]) == 8388609  # the inputs are what they claim
    assert round_values(x, "half_away").tolist() == [0.0, 8388609.0, 3.0, -3.0, 2.0]
    assert round_values(x, "half_even").tolist() == [0.0, 8388609.0, 2.0, -2.0, 2.0]


def test_special_values_and_sign_of_zero():
    x = np.array([np.inf, -np.inf, np.nan, -0.4, 0.4, -0.0, 0.0, -0.5, 0.5], np.float32)
    got = round_half_away(x)
    assert np.isposinf(got[0]) and np.isneginf(got[1]) and np.isnan(got[2])
    assert got[3] == 0 and np.signbit(got[3]) and not np.signbit(got[4])
    assert got[5] == 0 and np.signbit(got[5]) and got[6] == 0 and not np.signbit(got[6])  # C roundf(-0.0f) = -0.0f
    assert got[7:].tolist() == [-1.0, 1.0]


def test_out_argument_in_place():
    x = np.array([0.5, -1.5, 2.4], np.float32)
    r = round_values(x, "half_away", out=x)
    assert r is x and x.tolist() == [1.0, -2.0, 2.0]


def test_gguf_blocks_uses_the_same_function():
    assert gguf_blocks.round_half_away is round_half_away


def test_unknown_mode():
    with pytest.raises(LayoutError, match="unknown rounding mode"):
        round_values(np.zeros(1, np.float32), "half_up")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1, max_size=40))
def test_random_float32_match_decimal(values):
    x = np.array(values, np.float32)
    assert round_values(x, "half_away").tolist() == ref_half_up(x)
    assert round_values(x, "half_even").tolist() == ref_half_up(x, ROUND_HALF_EVEN)


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2 ** 25), 2 ** 25))
def test_halves_and_neighbours(n):
    # k + 0.5 and its float32 neighbours on both sides (exact near-tie inputs)
    x = np.float32(n) + np.float32(0.5)
    cands = np.array([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf))], np.float32)
    assert round_values(cands, "half_away").tolist() == ref_half_up(cands)
