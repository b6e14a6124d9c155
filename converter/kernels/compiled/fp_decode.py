"""Compiled decode of float-element codes (``fast`` extra): FP8 (E4M3 / E5M2) and FP4 (E2M1) codes times their
group, channel or block scales, to float32; and FP8 block-tiled codes to a 2-byte float through per-block tables.

Second implementations of the codebook paths of :func:`converter.kernels.dequant.dequantize_rows` (``np.take``
of the codebook, then ``*=`` the scales) and of :func:`converter.kernels.dequant.dequantize_block_tables` (one
``np.take`` per block). The arithmetic is the same single float32 product ``codebook[q] * s`` (no fused
multiply-add: IEEE results, NaN codes or scales included; a NaN code times a NaN scale is left to numpy, see
below) and the same table entries, so the output bytes are identical (``tests/kernels/compiled``). Scale and
global-scale handling (E8M0 / E4M3 scales widened, an NVFP4 global scale folded in) stays with the caller, in
numpy.

Scales are ``(rows or 1, params)``; the parameter column of code column ``c`` is ``c // col_div`` (the group
size; 1 for one scale per element; a value past the row length for one scale per row).
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit
from converter.kernels.threads import kernel_threads, run_rows

__all__ = ["codebook_rows", "codebook_nibbles", "block_tables"]


#: A product of two NaNs has no portable payload: x86 returns the first operand's, and which operand numpy
#: passes first depends on its loop (a broadcast scale comes first in its scalar loop, last elsewhere) while LLVM
#: may swap a product's operands. The kernels count those products (a NaN code times a NaN scale: corrupt data)
#: and the caller then decodes the tensor with numpy; every other product is IEEE-defined (one NaN operand:
#: that NaN, quieted; ``inf * 0``: the default NaN).


@jit
def codebook_rows(codes, codebook, scales, col_div, out):
    """``out[r, c] = codebook[codes[r, c]] * scales[r (or 0), c // col_div]`` (float32); returns how many
    products had two NaN operands (see the module's note: then ``out`` is not numpy's)."""
    rows, n = out.shape
    both_nan = 0
    broadcast_rows = scales.shape[0] == 1
    for r in range(rows):
        sr = 0 if broadcast_rows else r
        g = 0
        for c0 in range(0, n, col_div):  # one scale per run of columns (no division per element)
            s = scales[sr, g]
            g += 1
            c1 = min(n, c0 + col_div)
            if s != s:  # a NaN scale (rare): count the NaN codes it meets
                for c in range(c0, c1):
                    v = codebook[codes[r, c]]
                    if v != v:
                        both_nan += 1
                    out[r, c] = v * s
                continue
            for c in range(c0, c1):  # (no branch in the common loop)
                out[r, c] = codebook[codes[r, c]] * s
    return both_nan


@jit
def codebook_nibbles(packed, codebook, scales, col_div, out):
    """:func:`codebook_rows` of 4-bit codes packed two per byte, LSB first (``packed (rows, n / 2)`` uint8,
    code ``2k`` in the low nibble of byte ``k``)."""
    rows, n = out.shape
    both_nan = 0
    broadcast_rows = scales.shape[0] == 1
    for r in range(rows):
        sr = 0 if broadcast_rows else r
        g = 0
        for c0 in range(0, n, col_div):
            s = scales[sr, g]
            g += 1
            c1 = min(n, c0 + col_div)
            c = c0
            if s != s or c0 & 1 or c1 & 1:  # a NaN scale (rare) or a group not on byte boundaries: field by field
                while c < c1:
                    b = np.int64(packed[r, c >> 1])
                    v = codebook[(b >> 4) if c & 1 else (b & 15)]
                    if v != v and s != s:
                        both_nan += 1
                    out[r, c] = v * s
                    c += 1
                continue
            for k in range(c0 >> 1, c1 >> 1):  # whole bytes, no branch
                b = packed[r, k]
                out[r, 2 * k] = codebook[b & 15] * s
                out[r, 2 * k + 1] = codebook[b >> 4] * s
    return both_nan


@jit
def block_tables(codes, tables, block_out, block_in, out):
    """``out[r, c] = tables[r // block_out, c // block_in, codes[r, c]]`` (uint16 bits of a 2-byte float)."""
    rows, n = out.shape
    for r in range(rows):
        i = r // block_out
        j = 0
        for c0 in range(0, n, block_in):
            for c in range(c0, min(n, c0 + block_in)):
                out[r, c] = tables[i, j, codes[r, c]]
            j += 1


def decode_codebook(codes: np.ndarray, codebook: np.ndarray, scales: np.ndarray, *, n_in: int,
                    group_size: int | None, nibbles: bool = False) -> np.ndarray | None:
    """float32 ``(rows, n_in)`` = ``codebook[q] * s`` on the kernel threads, or None when the scales' shape is
    not one this kernel indexes or a NaN code meets a NaN scale (the caller then runs numpy).

    ``codes``: uint8 ``(rows, n_in)`` codes, or (``nibbles``) ``(rows, n_in / 2)`` bytes of two LSB-first 4-bit
    codes; ``codebook`` float32 ``(levels,)``; ``scales`` float32 ``(rows or 1, groups)`` with ``group_size``,
    else ``(rows or 1, 1)`` or ``(rows or 1, n_in)``.
    """
    rows, n = codes.shape[0], int(n_in)
    if scales.ndim != 2 or scales.shape[0] not in (1, rows) or (nibbles and n % 2):
        return None
    if group_size is not None:
        col_div = int(group_size)
    elif scales.shape[1] == n:
        col_div = 1
    elif scales.shape[1] == 1:
        col_div = max(n, 1)
    else:
        return None
    out = np.empty((rows, n), dtype=np.float32)
    if out.size == 0:
        return out
    scales = np.ascontiguousarray(scales, dtype=np.float32)
    per_row = scales.shape[0] != 1 or rows == 1
    kernel = codebook_nibbles if nibbles else codebook_rows
    step = max(1, (1 << 18) // max(n, 1))

    def work(a: int, b: int) -> int:
        return int(kernel(codes[a:b], codebook, scales[a:b] if per_row else scales, np.int64(col_div), out[a:b]))
    if sum(run_rows(work, rows, step, kernel_threads(out.size))):
        return None  # a NaN code times a NaN scale somewhere: numpy's payload (see the module's note)
    return out


def decode_block_tables(codes: np.ndarray, tables: np.ndarray, block: tuple[int, int], out: np.ndarray) -> None:
    """Write into ``out`` (uint16 ``(out, in)``) each code's entry of its block's 256-entry table (``tables``
    uint16 ``(blocks_out, blocks_in, 256)``)."""
    if out.size:
        block_tables(codes, np.ascontiguousarray(tables), np.int64(block[0]), np.int64(block[1]), out)
