"""Compiled pack / unpack of word-aligned code fields (``fast`` extra): every layout where each word holds whole
codes (``bits`` divides the word width, or the ``"padded"`` layout), any packed axis, any in-word order.

Second implementation of :func:`converter.kernels.packing.pack_codes` / ``unpack_codes`` for those layouts (the
3/5/6/7-bit ``"stream"`` layout, whose fields straddle words, stays on numpy). Arrays are seen as
``(outer, packed, inner)``: the packed axis in the middle, the axes before and after it merged, so one kernel
serves every axis without a transposed copy. Field ``k`` of a word (bits ``[k*bits, (k+1)*bits)``, LSB first)
holds element ``order[k]`` of the word's group of ``per_word`` codes (``tests/kernels/compiled``). Used for a packed
axis that is not the last one (GPTQ ``qweight``): along the last axis numpy's byte views and slot loops are as
fast (``benchmarks/bench_packing.py``).
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit

__all__ = ["unpack_fields", "pack_fields"]


@jit
def unpack_fields(words, bits, order, out):
    """``out[a, e, b]`` = field of element ``e`` from ``words[a, e // per_word, b]`` (uint8 ``out``, the padding
    fields of a partial last word dropped). ``words``: unsigned ``(outer, packed, inner)``."""
    outer, packed, inner = words.shape
    length = out.shape[1]
    per_word = order.shape[0]
    mask = (1 << bits) - 1
    for a in range(outer):
        for p in range(packed):
            for k in range(per_word):
                e = p * per_word + order[k]
                if e >= length:
                    continue
                shift = k * bits
                for b in range(inner):
                    out[a, e, b] = np.uint8((np.int64(words[a, p, b]) >> shift) & mask)


@jit
def pack_fields(codes, bits, order, out):
    """Inverse of :func:`unpack_fields`: OR each code of ``codes (outer, length, inner)`` into its field of
    ``out (outer, packed, inner)`` (zeroed by the caller; the fields past ``length`` stay 0)."""
    outer, length, inner = codes.shape
    packed = out.shape[1]
    per_word = order.shape[0]
    for a in range(outer):
        for p in range(packed):
            for k in range(per_word):
                e = p * per_word + order[k]
                if e >= length:
                    continue
                shift = k * bits
                for b in range(inner):
                    out[a, p, b] = np.int64(out[a, p, b]) | (np.int64(codes[a, e, b]) << shift)
