"""Rounding modes. Half-to-even is the default everywhere (IEEE 754, numpy ``rint``, ONNX
QuantizeLinear); half-away-from-zero is llama.cpp's (``roundf`` in ``ggml-quants.c``)."""

from __future__ import annotations

import numpy as np

from ..errors import LayoutError


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
        a = np.abs(x)
        a += 0.5
        np.floor(a, out=a)
        return np.copysign(a, x, out=out)
    raise LayoutError("unknown rounding mode", field="rounding", expected=["half_even", "half_away"], found=mode)
