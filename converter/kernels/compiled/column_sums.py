"""Compiled per-column sums of squares (``fast`` extra), for the validator's column magnitude profile.

Second implementation of ``acc += (block.astype(float64) ** 2).sum(axis=0)`` without the float64 copy of the
block: numpy reduces a C-contiguous ``(rows, cols)`` array over axis 0 row by row (the first row's values, then
each next row added element-wise), so the same additions in the same order give the same float64 bits
(``tests/kernels/compiled``).
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit

__all__ = ["add_column_squares"]


@jit
def add_column_squares(block, acc):
    """``acc[j] += sum_i float64(block[i, j]) ** 2`` (float32 ``(rows, cols)`` block, float64 ``(cols,)`` acc),
    the column sums formed first in row order, then added to ``acc``."""
    rows, cols = block.shape
    if rows == 0:
        return
    col = np.empty(cols, dtype=np.float64)
    for j in range(cols):
        v = np.float64(block[0, j])
        col[j] = v * v
    for i in range(1, rows):
        for j in range(cols):
            v = np.float64(block[i, j])
            col[j] += v * v
    for j in range(cols):
        acc[j] += col[j]
