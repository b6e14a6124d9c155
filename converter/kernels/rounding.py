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
    part is formed as ``f = trunc(x) - x`` (exact for every binary float: ``trunc(x)`` shares
    ``x``'s exponent, or ``x`` is already integral; in this order the sign of a zero survives), and
    ``trunc(2 f)`` (exact: -1, 0 or 1) is subtracted from ``trunc(x)``: one away from zero exactly
    when the fraction's magnitude is at least 1/2. Five element-wise passes, without a sign split,
    ``copysign`` or a boolean cast (several times faster on float32 blocks of llama.cpp's Q8_0).

    Parameters
    ----------
    x : ndarray of float (float16 / float32 / float64; the dtype is kept)
    out : ndarray, optional
        Where to write the result (may be ``x``).

    Returns
    -------
    ndarray of the same dtype, integral values; NaN and +-inf pass through, ``-0.4`` gives ``-0.0``.
    """
    t = np.trunc(x)
    with np.errstate(invalid="ignore"):  # inf - inf = NaN: fmin makes it 1, and inf - 1 = inf
        f = np.subtract(t, x)
        f *= 2
        np.trunc(f, out=f)
        np.fmin(f, 1, out=f)  # (-1, -0, 0 or 1 for finite x: unchanged)
    return np.subtract(t, f, out=out)
