"""converter.quant.recode: exact re-expressions keep every dequantized value bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.errors import NotRepresentableError
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.quant.recode import as_float_bias, as_groups, as_integer_zero, as_signed, as_unsigned
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor


def _tensor(rng, O, I, gm, bits=4, signed=False, zp=ZeroPoint.NONE):
    s = QuantScheme(bits, signed, zp, "F16")
    codes = rng.integers(s.qmin, s.qmax + 1, (O, I)).astype(s.code_dtype)
    pshape = gm.param_shape((O, I), (OUT, IN))
    scales = np.exp2(rng.integers(-8, 2, pshape)).astype(np.float16)
    z = rng.integers(s.qmin, s.qmax + 1, pshape).astype(s.code_dtype) if zp is ZeroPoint.INTEGER else None
    return QuantizedTensor("w", (OUT, IN), codes, scales, s, gm, zero_points=z)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 31), O=st.integers(1, 6), k=st.integers(1, 5), g=st.sampled_from([8, 16, 32]),
       kind=st.sampled_from(["tensor", "channel", "group2", "group3"]), signed=st.booleans(), asym=st.booleans())
def test_as_groups_is_exact(seed, O, k, g, kind, signed, asym):
    rng = np.random.default_rng(seed)
    I = g * k * 3 if kind == "group3" else g * k * 2
    gm = {"tensor": GroupMap.per_tensor(), "channel": GroupMap.per_channel(),
          "group2": GroupMap.per_group(2 * g), "group3": GroupMap.per_group(3 * g)}[kind]
    if kind.startswith("group") and I % gm.group_size:
        I = gm.group_size * k
    t = _tensor(rng, O, I, gm, signed=signed, zp=ZeroPoint.INTEGER if asym else ZeroPoint.NONE)
    r = as_groups(t, g)
    assert r.group_map.group_size == g and r.scales.shape == (O, I // g)
    assert np.array_equal(r.codes, t.codes) and np.array_equal(r.dequantize(), t.dequantize())


def test_as_groups_partial_old_group():
    # old groups of 128 over in=160 (a partial tail of 32): new groups of 32 take the tail's scale
    rng = np.random.default_rng(1)
    t = _tensor(rng, 2, 160, GroupMap.per_group(128))
    r = as_groups(t, 32)
    assert r.scales.shape == (2, 5) and np.array_equal(r.scales[:, 4], t.scales[:, 1])
    assert np.array_equal(r.dequantize(), t.dequantize())


@pytest.mark.parametrize("gm,I,g,match", [
    (GroupMap.per_group(48), 96, 32, "regrouped"),  # 32 does not divide 48
    (GroupMap.per_channel(), 48, 32, "regrouped"),  # in % 32 != 0
    (GroupMap.per_group(32, g_idx=np.arange(64, dtype=np.int32)[::-1] // 32), 64, 32, "g_idx"),
    (GroupMap.per_channel(IN), 64, 32, "regrouped"),
])
def test_as_groups_refusals(gm, I, g, match):
    t = _tensor(np.random.default_rng(2), 2, I, gm)
    with pytest.raises(NotRepresentableError, match=match):
        as_groups(t, g)


def test_float_bias_round_trip_and_symmetric_centre():
    rng = np.random.default_rng(3)
    t = _tensor(rng, 4, 64, GroupMap.per_group(32), zp=ZeroPoint.INTEGER)
    fb, exact = as_float_bias(t)  # power-of-two scales: -z*s exact in fp16
    assert exact and np.array_equal(fb.dequantize(), t.dequantize())
    back = as_integer_zero(fb)
    assert np.array_equal(back.zero_points, t.zero_points)
    sym = _tensor(rng, 4, 64, GroupMap.per_group(32), signed=True)
    fb, exact = as_float_bias(sym)  # bias = -8*s, centre of the unsigned form
    assert exact and np.array_equal(fb.zero_points, np.float16(-8) * sym.scales)
    assert np.array_equal(as_signed(as_unsigned(sym)).codes, sym.codes)


def test_as_positive_scales_flips_negative_groups_exactly():
    # MLX-style negative scale in group 0: s=-0.5, z=3 (unsigned 4-bit): x = -0.5*(q-3)
    from converter.quant.recode import as_positive_scales
    t = QuantizedTensor("w", ("out", "in"), np.array([[0, 3, 15, 1, 2, 9]], np.uint8),
                        np.array([[-0.5, 0.25]], np.float16), QuantScheme(4, False, ZeroPoint.INTEGER),
                        GroupMap.per_group(3), zero_points=np.array([[3, 8]], np.uint8))
    p = as_positive_scales(t)
    assert p.scales.astype(np.float32).tolist() == [[0.5, 0.25]]
    assert p.codes.tolist() == [[15, 12, 0, 1, 2, 9]] and p.zero_points.tolist() == [[12, 8]]
    # x = [1.5, 0, -6, -1.75, -1.5, 0.25] both ways
    np.testing.assert_array_equal(p.dequantize(), t.dequantize())
    assert t.dequantize().tolist() == [[1.5, 0.0, -6.0, -1.75, -1.5, 0.25]]
