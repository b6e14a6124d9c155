"""Compiled scans over one-byte codes for the validator (``fast`` extra): range-end saturation per group, exact
code-offset sums, equality of every code. One pass over the codes each, no full-size temporaries.

These are second implementations of the numpy scans in :mod:`converter.validate.data_checks`; the results are
integers (group flags, counts, sums), so both paths give the same numbers exactly (``tests/kernels/compiled``).

Codes are passed as a 2-D ``uint8`` view ``(rows, cols)`` of the logical codes (an ``int8`` array viewed as
bytes). Per-byte facts come from 256-entry tables built by the caller: ``ends[b]`` (the byte's code is
saturated whatever the zero point: a range end, or a codebook's largest magnitude) and ``values[b]`` (the
byte's code value, sign-extended for ``int8`` codes). A parameter array ``zeros`` ``(rows or 1, params)``
holds integer zero points; ``zero_cols[c]`` is the parameter column of code column ``c``.

A grouping is ``(row_div, col_group, n_col_groups)``: code ``(r, c)`` belongs to group
``(r // row_div) * n_col_groups + col_group[c]``.
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit

__all__ = ["group_saturation", "group_max", "offset_sums", "all_equal", "byte_histogram", "count_flagged"]


@jit
def group_saturation(codes, ends, values, zeros, zero_cols, use_zero, center, half, row_divs, col_groups,
                     n_col_groups, run_lens, offsets, flags):
    """Set ``flags[offsets[k] + g] = 1`` for every group ``g`` of grouping ``k`` holding a saturated code: every
    grouping of one tensor in one pass over its codes (``row_divs``, ``n_col_groups``, ``offsets`` int64 ``(K,)``,
    ``col_groups`` int64 ``(K, cols)``).

    A code is saturated when ``ends[byte]``, or (``use_zero``) when its zero point equals ``center`` and
    ``|value - zero| >= half`` (``zeros`` is int16, as the numpy path widens them).
    """
    rows, cols = codes.shape
    broadcast_rows = zeros.shape[0] == 1
    hits = np.empty(cols, dtype=np.uint8)  # one row's saturation flags, then OR-ed into each grouping
    for r in range(rows):
        zr = 0 if broadcast_rows else r
        if use_zero:
            for c in range(cols):
                b = codes[r, c]
                hit = ends[b]
                z = zeros[zr, zero_cols[c]]
                if z == center:
                    d = np.int32(values[b]) - np.int32(z)
                    hit |= np.uint8((d if d >= 0 else -d) >= half)
                hits[c] = hit
        else:
            for c in range(cols):
                hits[c] = ends[codes[r, c]]
        for k in range(row_divs.shape[0]):
            base = offsets[k] + (r // row_divs[k]) * n_col_groups[k]
            run = run_lens[k]
            if run == 1:  # one group per column (groups along the rows)
                for c in range(cols):
                    flags[base + c] |= hits[c]
                continue
            if run > 1:  # consecutive runs of columns
                g = 0
                for c0 in range(0, cols, run):
                    acc = np.uint8(0)
                    for c in range(c0, min(cols, c0 + run)):
                        acc |= hits[c]
                    flags[base + g] |= acc
                    g += 1
                continue
            group = col_groups[k, 0]
            acc = np.uint8(0)  # the flag of the current run of columns in one group, kept in a register
            for c in range(cols):
                g = col_groups[k, c]
                if g != group:
                    flags[base + group] |= acc
                    group = g
                    acc = np.uint8(0)
                acc |= hits[c]
            flags[base + group] |= acc


@jit
def offset_sums(codes, values, zeros, zero_cols):
    """``(sum(q - z), sum((q - z)**2))`` as int64 over every code, ``q = values[byte]``."""
    rows, cols = codes.shape
    broadcast_rows = zeros.shape[0] == 1
    s1 = np.int64(0)
    s2 = np.int64(0)
    for r in range(rows):
        zr = 0 if broadcast_rows else r
        for c in range(cols):
            d = np.int64(values[codes[r, c]]) - np.int64(zeros[zr, zero_cols[c]])
            s1 += d
            s2 += d * d
    return s1, s2


@jit
def all_equal(flat):
    """Every element of the 1-D array equals the first (True for fewer than two)."""
    n = flat.shape[0]
    if n == 0:
        return True
    first = flat[0]
    for i in range(1, n):
        if flat[i] != first:
            return False
    return True


@jit
def byte_histogram(flat, counts):
    """Add the count of each byte value of the 1-D ``uint8`` array to ``counts`` (int64, 256)."""
    for i in range(flat.shape[0]):
        counts[flat[i]] += 1


@jit
def group_max(codes, table, row_div, col_group, n_col_groups, out):
    """``out[g] = max(out[g], table[byte])`` over the codes of each group ``g`` (uint8 ``table`` and ``out``, the
    caller zeroes ``out``); groups as in :func:`group_saturation`."""
    rows, cols = codes.shape
    for r in range(rows):
        base = (r // row_div) * n_col_groups
        group = col_group[0]
        acc = np.uint8(0)
        for c in range(cols):
            g = col_group[c]
            if g != group:
                if acc > out[base + group]:
                    out[base + group] = acc
                group = g
                acc = np.uint8(0)
            v = table[codes[r, c]]
            if v > acc:
                acc = v
        if acc > out[base + group]:
            out[base + group] = acc


@jit
def count_flagged(flat, table):
    """How many bytes of the 1-D ``uint8`` array have a nonzero ``table`` entry."""
    k = np.int64(0)
    for i in range(flat.shape[0]):
        k += table[flat[i]] != 0
    return k
