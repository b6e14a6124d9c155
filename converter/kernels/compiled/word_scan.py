"""The validator's per-code facts in one pass over packed words (``fast`` extra): saturation per group under the
declared grouping and its swapped alternative, exact code-offset sums and the per-column sums of squared values,
read straight from the stored 32-bit words (no unpacked codes, no transposed copy, no float32 values).

A second implementation of the numpy scans in :mod:`converter.validate.data_checks` (``saturation_profile``,
``zero_offset``, ``check_degenerate``) and :mod:`converter.validate.nibble_order` (``column_profile``): the
integers are the same integers, and the float64 column sums are formed by the same operations in the same order
(``tests/kernels/compiled/test_word_scan.py``).

Layout. Codes are ``bits``-wide fields (2, 4 or 8) packed LSB-first along ``in``, ``F = 32 // bits`` per word,
in the identity in-word order: field ``k`` of word ``j`` of row ``o`` is code ``(o, j * F + k)``. ``words`` is
``(out, in / F)`` (compressed-tensors, MLX) or, with ``transposed``, ``(in / F, out)`` (GPTQ ``qweight``), read
64 rows at a time into a small buffer. A field ``f`` becomes the code ``q = f ^ xor``, sign-extended when
``signed`` (two's complement).

Parameters per row ``o`` and group ``g`` (``group_words`` words per group): ``scales`` float32 and, with
``use_zero``, ``zeros_f`` float32 / ``zeros_i`` int32 of shape ``(out or 1, groups)``; else the centre.

- Saturation: a code is saturated when ``q <= sat_lo`` or ``q >= sat_hi`` where its zero point equals the
  centre (always, without zero points), else when ``q <= lo_end`` or ``q >= hi_end`` (the range ends).
  ``declared[o, g]`` = 1 when group ``(o, g)`` holds one; bit ``k`` of ``alt[o // alt_rows, j]`` = 1 when
  code ``(o, j * F + k)`` is saturated for some ``o`` in that run of ``alt_rows`` rows (groups along ``out``).
- ``stats``: ``sum(q - z)``, ``sum((q - z)**2)`` (``z`` the zero point, or the centre ``center_i``).
- ``acc[k, j]`` (float64 ``(F, in / F)``, in index ``j * F + k``): plus, per block of ``step`` rows, the
  block's sum of ``float64(v) ** 2`` with ``v = (float32(q) - z) * s`` in float32, each block's sum formed row
  by row from the block's first row (what numpy's ``(x * x).sum(axis=0)`` over a C-contiguous block does)
  and then added to ``acc``; every scale and zero point must be finite (the caller checks).
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit

__all__ = ["scan_words", "TILE_ROWS", "FLUSH_ROWS"]

#: Rows of a transposed word array gathered into the row buffer at a time.
TILE_ROWS = 64
#: Rows between flushes of the int32 per-lane offset sums into int64 (8-bit codes: 4 * 255**2 * 4096 < 2**31).
FLUSH_ROWS = 4096


@jit
def scan_words(words, transposed, bits, xor, signed, scales, zeros_f, zeros_i, use_zero, center_f, center_i,
               sat_lo, sat_hi, lo_end, hi_end, group_words, step, alt_rows, acc, declared, alt, stats):
    """One pass over ``words`` (see the module docstring for every argument); adds into ``acc``, ``declared``,
    ``alt`` (zeroed by the caller) and writes ``stats`` (int64 ``(2,)``)."""
    if transposed:
        nw, out = words.shape
    else:
        out, nw = words.shape
    per_word = 32 // bits
    mask = np.uint32((1 << bits) - 1)
    # q = (f ^ xor) sign-extended = ((f ^ xor ^ top) - top) when signed: one XOR and one subtraction, no branch
    sign = np.int32(1 << (bits - 1)) if signed else np.int32(0)
    flip = np.uint32(xor) ^ np.uint32(sign)
    n_groups = -(-nw // group_words)
    buf = np.empty((TILE_ROWS, nw), dtype=np.uint32)
    col = np.zeros((per_word, nw), dtype=np.float64)
    run = np.zeros(nw, dtype=np.uint32)
    hit = np.zeros(nw, dtype=np.uint32)
    sj = np.empty(nw, dtype=np.float32)
    zf = np.empty(nw, dtype=np.float32)  # (with zero points)
    zj = np.empty(nw, dtype=np.int32)
    lo = np.empty(nw, dtype=np.int32)
    hi = np.empty(nw, dtype=np.int32)
    s1 = np.zeros(nw, dtype=np.int32)
    s2 = np.zeros(nw, dtype=np.int32)
    total1 = np.int64(0)
    total2 = np.int64(0)
    scale_rows = scales.shape[0] != 1
    zero_rows = zeros_i.shape[0] != 1
    for o0 in range(0, out, TILE_ROWS):
        o1 = min(out, o0 + TILE_ROWS)
        if transposed:
            for j in range(nw):
                for t in range(o1 - o0):
                    buf[t, j] = words[j, o0 + t]
        for o in range(o0, o1):
            wo = buf[o - o0] if transposed else words[o]
            so = o if scale_rows else 0
            zo = o if zero_rows else 0
            for g in range(n_groups):  # each word's parameters (per row: the scales; the zero points' facts)
                sv = scales[so, g]
                for j in range(g * group_words, min(nw, (g + 1) * group_words)):
                    sj[j] = sv
                if use_zero:
                    zi = zeros_i[zo, g]
                    zv = zeros_f[zo, g]
                    a = sat_lo if zi == center_i else lo_end
                    b = sat_hi if zi == center_i else hi_end
                    for j in range(g * group_words, min(nw, (g + 1) * group_words)):
                        zf[j] = zv
                        zj[j] = zi
                        lo[j] = a
                        hi[j] = b
            for j in range(nw):
                hit[j] = 0
            for k in range(per_word):
                shift = np.uint32(k * bits)
                bit = np.uint32(k)
                ck = col[k]
                if not use_zero:  # the centre for every code: one loop, scalars (vectorized across words)
                    for j in range(nw):
                        q = np.int32(np.int32(((wo[j] >> shift) & mask) ^ flip) - sign)
                        v = np.float64((np.float32(q) - center_f) * sj[j])
                        ck[j] += v * v
                        d = np.int32(q - center_i)  # (int32 lanes: numba would widen to int64)
                        s1[j] = np.int32(s1[j] + d)
                        s2[j] = np.int32(s2[j] + np.int32(d * d))
                        hit[j] |= np.uint32((q <= sat_lo) | (q >= sat_hi)) << bit
                    continue
                for j in range(nw):  # zero points per group: the same loop, parameters per word
                    q = np.int32(np.int32(((wo[j] >> shift) & mask) ^ flip) - sign)
                    v = np.float64((np.float32(q) - zf[j]) * sj[j])
                    ck[j] += v * v
                    d = np.int32(q - zj[j])
                    s1[j] = np.int32(s1[j] + d)
                    s2[j] = np.int32(s2[j] + np.int32(d * d))
                    hit[j] |= np.uint32((q <= lo[j]) | (q >= hi[j])) << bit
            for g in range(n_groups):
                a = np.uint32(0)
                for j in range(g * group_words, min(nw, (g + 1) * group_words)):
                    a |= hit[j]
                declared[o, g] = a != 0
            for j in range(nw):
                run[j] |= hit[j]
            if (o + 1) % alt_rows == 0 or o + 1 == out:
                alt[o // alt_rows, :] = run
                run[:] = 0
            if (o + 1) % FLUSH_ROWS == 0:
                total1 += s1.astype(np.int64).sum()
                total2 += s2.astype(np.int64).sum()
                s1[:] = 0
                s2[:] = 0
            if (o + 1) % step == 0 or o + 1 == out:
                for k in range(per_word):
                    for j in range(nw):
                        acc[k, j] += col[k, j]
                        col[k, j] = 0.0
    stats[0] = total1 + s1.astype(np.int64).sum()
    stats[1] = total2 + s2.astype(np.int64).sum()
