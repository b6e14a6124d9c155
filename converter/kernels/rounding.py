"""Rounding modes. Half-to-even is the default everywhere (IEEE 754, numpy ``rint``, ONNX
QuantizeLinear); half-away-from-zero is llama.cpp's (``roundf`` in ``ggml-quants.c``)."""

from __future__ import annotations

import numpy as np

from converter.errors import LayoutError


def round_values(x: np.ndarray, mode: str = "half_even", *, out: np.ndarray | None = None) -> np.ndarray:
    """Round a float array to integral values (still float), in place when ``out`` is ``x``.

    Parameters
    ----------
    x : ndarray of float32
    mode : ``"half_even"`` or ``"half_away"``

    Raises
    ------
    LayoutError
        On an unknown mode.
    """
    if mode == "half_even":
        return np.rint(x, out=out)
    if mode == "half_away":
        return round_half_away(x, out=out)
    raise LayoutError("unknown rounding mode", field="rounding", expected=["half_even", "half_away"], found=mode)


def round_half_away(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Round to the nearest integer, ties away from zero (C ``roundf`` / ``round``), exactly.

    ``floor(|x| + 0.5)`` is wrong near ties: the addition itself rounds, so ``0.49999997f`` gives 1
    and ``8388609f`` (odd, above 2^23 where the spacing is 1) gives 8388610. Instead the fractional
    part ``|x| - floor(|x|)`` is computed, which is exact for every binary float (both operands
    share the exponent range, or ``|x|`` is already integral), and compared with one half.

    Parameters
    ----------
    x : ndarray of float (float16 / float32 / float64; the dtype is kept)
    out : ndarray, optional
        Where to write the result (may be ``x``).

    Returns
    -------
    ndarray of the same dtype, integral values; NaN and +-inf pass through, ``-0.4`` gives ``-0.0``.
    """
    a = np.abs(x)
    fl = np.floor(a)
    with np.errstate(invalid="ignore"):  # inf - inf = NaN compares False: inf stays inf
        frac = a - fl  # exact: no rounding error, unlike |x| + 0.5
    fl += frac >= 0.5
    return np.copysign(fl, x, out=out)
