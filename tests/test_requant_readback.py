"""The read-back check of requantize_model: its digest tells a changed code or scale apart and
agrees across equivalent representations (signed vs unsigned codes, implicit vs explicit zero)."""

import numpy as np

from converter.groups import GroupMap
from converter.ops.requantize_model import _digest
from converter.quant.quantize import quantize
from converter.quant.recode import as_integer_zero, as_unsigned
from converter.scheme import QuantScheme


def _t():
    w = np.random.default_rng(3).standard_normal((6, 40)).astype(np.float32)
    return quantize(w, QuantScheme(8, True), GroupMap.per_group(16))


def test_digest_sees_one_changed_code_and_scale():
    t = _t()
    d = _digest(t)
    codes = t.codes.copy()
    codes[5, 39] ^= 1
    assert _digest(t.replace(codes=codes)) != d
    scales = t.scales.copy()
    scales[0, 0] = np.nextafter(scales[0, 0], np.float16(np.inf))
    assert _digest(t.replace(scales=scales)) != d


def test_digest_equal_for_equivalent_representations():
    t = _t()
    assert _digest(as_unsigned(t)) == _digest(t)
    assert _digest(as_integer_zero(as_unsigned(t))) == _digest(t)
    assert np.array_equal(as_integer_zero(as_unsigned(t)).dequantize(), t.dequantize())


def test_digest_ignores_the_rounding_label():
    """The rule that made the codes is not an input of dequantize: a GGUF output read back (scheme
    labelled with llama.cpp's rounding) proves a tensor requantized half-to-even (regression: every
    requantized GGUF tensor reported readback_bit_exact false)."""
    t = _t()
    assert t.scheme.rounding == "half_even"
    away = t.replace(scheme=t.scheme.replace(rounding="half_away"))
    assert np.array_equal(away.dequantize(), t.dequantize())
    assert _digest(away) == _digest(t)
