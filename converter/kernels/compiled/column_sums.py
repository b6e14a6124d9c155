"""Compiled per-column sums of squares (``fast`` extra), for the validator's column magnitude profile.

Second implementation of ``acc += (block.astype(float64) ** 2).sum(axis=0)`` without the float64 copy of the
block: numpy reduces a C-contiguous ``(rows, cols)`` array over axis 0 row by row (the first row's values, then
each next row added element-wise), so the same additions in the same order give the same float64 bits
(``tests/kernels/compiled``), NaN payloads included: x86 returns the first NaN operand, so where a sum is NaN
the kernel takes it from the operand numpy puts first.
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
            a = col[j]
            t = a + v * v
            if t != t:  # numpy's operand order decides a NaN's payload (LLVM may swap an addition's operands)
                t = a + 0.0 if a != a else t
            col[j] = t
    for j in range(cols):
        a = acc[j]
        t = a + col[j]
        if t != t:
            t = a + 0.0 if a != a else (col[j] + 0.0 if col[j] != col[j] else t)
        acc[j] = t
