"""Compiled per-column sums of squares (``fast`` extra), for the validator's column magnitude profile.

Second implementation of ``acc += (block.astype(float64) ** 2).sum(axis=0)`` without the float64 copy of the
block: numpy reduces a C-contiguous ``(rows, cols)`` array over axis 0 row by row (the first row's values, then
each next row added element-wise), so the same additions in the same order give the same float64 bits
(``tests/kernels/compiled``), NaN payloads included where one operand is NaN; a sum of two NaNs is counted and
left to numpy (which operand's payload x86 returns depends on numpy's loop and on LLVM's operand order).
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit

__all__ = ["add_column_squares", "add_column_squares_codes"]


@jit
def add_column_squares(block, acc):
    """``acc[j] += sum_i float64(block[i, j]) ** 2`` (float32 ``(rows, cols)`` block, float64 ``(cols,)`` acc),
    the column sums formed first in row order, then added to ``acc``. Returns how many additions had two NaN
    operands (their payload is numpy's loop's choice, not portable: the caller then redoes the sums in numpy)."""
    rows, cols = block.shape
    both_nan = 0
    if rows == 0:
        return both_nan
    col = np.empty(cols, dtype=np.float64)
    for j in range(cols):
        v = np.float64(block[0, j])
        col[j] = v * v
    for i in range(1, rows):
        for j in range(cols):
            v = np.float64(block[i, j])
            sq = v * v
            a = col[j]
            if a != a and sq != sq:
                both_nan += 1
            col[j] = a + sq
    for j in range(cols):
        a = acc[j]
        if a != a and col[j] != col[j]:
            both_nan += 1
        acc[j] = a + col[j]
    return both_nan


@jit
def add_column_squares_codes(codes, center, zeros, use_zero, scales, col_div, step, acc):
    """:func:`add_column_squares` of the dequantized values of integer codes, block by block of ``step`` rows
    (the blocks :class:`converter.rows.Rows` dequantizes), without the float32 values: per element
    ``v = (float32(q) - z) * s`` in float32, the operations and order of :func:`converter.values.dequantize`
    (``z`` the float32 zero point when ``use_zero``, else ``center``), then squared in float64.

    ``codes`` ``(rows, cols)`` int8 / uint8 code values; ``zeros`` and ``scales`` float32 ``(rows or 1, params)``,
    the parameter column of code column ``c`` being ``c // col_div``. Every scale and zero point must be finite
    (the caller checks): no sum can then be NaN, and the loops carry no NaN branch (they vectorize).
    """
    rows, cols = codes.shape
    if rows == 0:
        return
    col = np.empty(cols, dtype=np.float64)
    scale_rows = scales.shape[0] != 1
    zero_rows = zeros.shape[0] != 1
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        for r in range(r0, r1):
            sr = r if scale_rows else 0
            zr = r if zero_rows else 0
            g = 0
            for c0 in range(0, cols, col_div):
                s = scales[sr, g]
                z = zeros[zr, g] if use_zero else center
                g += 1
                c1 = min(cols, c0 + col_div)
                if r == r0:  # the block's first row starts each column sum
                    for c in range(c0, c1):
                        d = np.float64((np.float32(codes[r, c]) - z) * s)
                        col[c] = d * d
                else:
                    for c in range(c0, c1):
                        d = np.float64((np.float32(codes[r, c]) - z) * s)
                        col[c] += d * d
        for j in range(cols):
            acc[j] += col[j]
