"""Compiled round-to-nearest requantize of ``(out, in)`` row blocks: the source's packed codes
unpacked and dequantized, the new grid's extrema, codes and the error report's sums in two passes
over a cache-sized block (the ``fast`` extra; the numpy reference is
:func:`converter.kernels.rtn.quantize_rows`, which calls :func:`quantize_rows_compiled` when
:func:`~converter.kernels.compiled.use_compiled` says so).

Per row block of about :data:`converter.kernels.rtn.QUANT_BLOCK_ELEMENTS` values:

1. :func:`_decode_extrema`: the source rows as float32, from the bytes of their packed codes
   through the same 256-entry byte table, ``(f - c) * s``, ``(f - z) * s`` or ``f * s + b``,
   every operand float32 and in that order (:func:`converter.kernels.dequant.dequantize_block`),
   or the float32 rows the source produced; and per target group ``max |x|`` (symmetric) or
   ``max x`` / ``min x`` (asymmetric). A NaN or inf stops the kernel (the numpy whole-array path
   then names it).
2. The group parameters by the numpy reference itself
   (:func:`converter.kernels.rtn.params_from_extrema`: scales cast to the scale dtype first,
   :func:`~converter.kernels.rtn.safe_cast_scales`; zero points), on the small ``(rows, groups)``
   arrays: identical scales and zero points by construction.
3. :func:`_codes_errors`: codes ``clamp(round(x / s) + z)`` (or ``+ c``), float32 operands in
   the reference's order, rounding half to even (``numpy.rint``) or half away from zero as the
   grid says, written in the code dtype: **bit-identical codes**. With an error report, the
   reconstruction ``(q - z) * s`` / ``(q - c) * s`` and ``E = B - A`` in float32 as
   :class:`~converter.kernels.error_sums.ErrorSums` forms them, so the **largest |error| and the
   count of changed elements are exact (equal to numpy's)**. The summed figures (squared error per
   group, signal power, output-space ``||E X||^2`` and ``||A X||^2`` on the fixed-seed inputs) are
   accumulated in float64 element by element, where numpy sums float32 chunks with einsum and
   forms the products with BLAS (float32 GEMMs above ``LARGE``): the two orders cannot be made
   bit-equal cheaply, and both are within the ~1e-6 relative precision :class:`ErrorSums`
   documents (the compiled sums are the more precise; the tests hold them to 1e-6 relative).

File bytes do not depend on the error figures (they go to the report only), so every output
byte is identical to the numpy path's.
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit
from converter.kernels.dequant import byte_table

__all__ = ["decode_source", "decode_extrema", "codes_errors"]

#: Source zero-point kinds as the kernels number them.
_SRC_KIND = {"none": 0, "integer": 1, "float": 2}


@jit
def _decode_extrema(x, data, table, ssc, szp, src_kind, src_G, decode, G, symmetric, amax, mx, mn):
    """Rows of ``x`` (float32 ``(rows, in)``; written from ``data`` when ``decode``) and their
    target groups' extrema into ``amax`` or ``mx`` / ``mn`` (float32 ``(rows, groups)``).
    Returns False at the first NaN / inf."""
    rows, n = x.shape
    per = table.shape[1]
    for r in range(rows):
        if decode:
            nb = data.shape[1]
            for i in range(nb):
                byte = data[r, i]
                for j in range(per):
                    c = i * per + j
                    if c >= n:
                        break
                    v = table[byte, j]
                    g = c // src_G
                    if src_kind == 1:
                        v = v - szp[r, g]
                    v = v * ssc[r, g]
                    if src_kind == 2:
                        v = v + szp[r, g]
                    x[r, c] = v
        g0 = 0
        while g0 < n:
            g1 = min(n, g0 + G)
            gi = g0 // G
            if symmetric:
                m = np.float32(0.0)
                for c in range(g0, g1):
                    v = x[r, c]
                    if not np.isfinite(v):
                        return False
                    a = abs(v)
                    if a > m:
                        m = a
                amax[r, gi] = m
            else:
                hi = x[r, g0]
                lo = hi
                for c in range(g0, g1):
                    v = x[r, c]
                    if not np.isfinite(v):
                        return False
                    if v > hi:
                        hi = v
                    if v < lo:
                        lo = v
                mx[r, gi] = hi
                mn[r, gi] = lo
            g0 = g1
    return True


@jit
def _codes_errors(x, s32, zf, has_zp, center, G, half_away, qmin, qmax, codes, errors, large, X,
                  row_sr, row_orf, row_oe, grp_se, grouped, r0):
    """Codes of the rows of ``x`` into ``codes`` and, when ``errors``, the error sums of rows
    ``r0 + r`` into the per-row / per-group float64 arrays. Returns ``(changed, max |E|)``."""
    rows, n = x.shape
    nx = X.shape[1]
    y = np.zeros(nx, dtype=np.float64)
    dy = np.zeros(nx, dtype=np.float64)
    changed = 0
    worst = np.float32(0.0)
    half = np.float32(0.5)
    for r in range(rows):
        if errors:
            y[:] = 0.0
            dy[:] = 0.0
        sr = 0.0
        row_se = 0.0
        g0 = 0
        while g0 < n:
            g1 = min(n, g0 + G)
            gi = g0 // G
            s = s32[r, gi]
            if has_zp:
                c0 = zf[r, gi]
            else:
                c0 = center
            add = has_zp or center != 0
            se = 0.0
            for c in range(g0, g1):
                a = x[r, c]
                q = a / s
                if half_away:
                    aq = abs(q)
                    fl = np.floor(aq)
                    if aq - fl >= half:
                        fl = fl + np.float32(1.0)
                    q = np.float32(np.copysign(fl, q))
                else:
                    q = np.rint(q)
                if add:
                    q = q + c0
                if q < qmin:
                    q = qmin
                elif q > qmax:
                    q = qmax
                codes[r, c] = q
                if errors:
                    b = q - c0 if add else q
                    b = b * s
                    e = b - a
                    if e != 0:
                        changed += 1
                    ae = abs(e)
                    if ae > worst:
                        worst = ae
                    e64 = np.float64(e)
                    a64 = np.float64(a)
                    se += e64 * e64
                    sr += a64 * a64
                    d64 = e64 if large else np.float64(b) - a64
                    for j in range(nx):
                        xv = X[c, j]
                        y[j] += a64 * xv
                        dy[j] += d64 * xv
            if errors and grouped:
                grp_se[r0 + r, gi] = se
            row_se += se
            g0 = g1
        if errors:
            if not grouped:
                grp_se[r0 + r, 0] = row_se
            row_sr[r0 + r] = sr
            acc = 0.0
            acc2 = 0.0
            for j in range(nx):
                acc += y[j] * y[j]
                acc2 += dy[j] * dy[j]
            row_orf[r0 + r] = acc
            row_oe[r0 + r] = acc2
    return changed, worst


def decode_source(plan, n: int):
    """The arguments :func:`_decode_extrema` decodes a :class:`~converter.values.RowPlan`'s rows by,
    ``(bytes, table, scales, zero_points, kind, group_size)``, or None when the plan does not decode
    bytewise through a table (codebooks, codes wider than a byte, per-element parameters: the source's own
    numpy decode runs then). Unpacked 8-bit codes decode through the 8-bit byte table, whose entries
    are the reference's ``float32(q) - float32(c)``."""
    if plan is None or plan.codebook is not None or plan.zero_kind not in _SRC_KIND:
        return None
    codes, table = plan.codes, plan.table
    if table is None:  # one code per byte (MLX codes as read, 8-bit arrays): the 8-bit table of the
        if codes.dtype not in (np.uint8, np.int8) or codes.ndim != 2:  # same f - c values
            return None
        table = byte_table(8, signed=codes.dtype == np.int8, flip=False, center=plan.center)
        codes = codes.view(np.uint8)
    k = plan.codes.shape[0]
    sc = plan.scales
    zp = plan.zero_points
    G = plan.group_size
    if G is None:
        if sc.shape not in ((k, 1), (1, 1)) or (zp is not None and zp.shape != sc.shape):
            return None
        G = n
        sc = np.broadcast_to(sc, (k, 1))
        zp = None if zp is None else np.broadcast_to(zp, (k, 1))
    if zp is None:
        zp = np.zeros((1, 1), dtype=np.float32)
    return (np.ascontiguousarray(codes, dtype=np.uint8), np.ascontiguousarray(table, dtype=np.float32),
            np.ascontiguousarray(sc, dtype=np.float32), np.ascontiguousarray(zp, dtype=np.float32),
            _SRC_KIND[plan.zero_kind], int(G))


_NO_BYTES = np.zeros((1, 1), dtype=np.uint8)
_NO_TABLE = np.zeros((256, 1), dtype=np.float32)
_NO_PARAMS = np.zeros((1, 1), dtype=np.float32)


def decode_extrema(x: np.ndarray, source, G: int, symmetric: bool, amax: np.ndarray, mx: np.ndarray,
                   mn: np.ndarray) -> bool:
    """Step 1 on one block: ``x`` float32 ``(rows, in)`` (C-contiguous) filled from ``source``
    (rows of :func:`decode_source`'s tuple) or, ``source=None``, already holding the values;
    extrema per group of ``G`` along ``in`` into float32 ``(rows, groups)`` arrays. False: a NaN / inf."""
    if source is None:
        return _decode_extrema(x, _NO_BYTES, _NO_TABLE, _NO_PARAMS, _NO_PARAMS, 0, 1, False, G, symmetric,
                               amax, mx, mn)
    data, table, sc, zp, kind, src_G = source
    return _decode_extrema(x, data, table, sc, zp, kind, src_G, True, G, symmetric, amax, mx, mn)


def codes_errors(x: np.ndarray, s32: np.ndarray, zf: np.ndarray | None, center: float, G: int, rounding: str,
                 qmin: int, qmax: int, codes: np.ndarray, sums, X: np.ndarray | None, r0: int) -> tuple[int, float]:
    """Step 3 on one block: codes of ``x`` (float32 ``(rows, in)``) for float32 scales ``s32`` and
    zero points ``zf`` (``(rows, groups)``, groups of ``G`` along ``in``) or the symmetric centre,
    into ``codes`` (``(rows, in)``, the code dtype); with ``sums`` (an :class:`ErrorSums` whose
    groups are these groups, or one per row) the error sums of rows ``r0 : r0 + rows`` into its
    per-row arrays, ``X`` the fixed-seed inputs as float64 ``(in, N_INPUTS)``.
    Returns ``(changed, max |E|)`` of the block (0, 0.0 without ``sums``)."""
    has_zp = zf is not None
    zf = zf if has_zp else _NO_PARAMS
    errors = sums is not None
    if errors:
        out = (sums.row_sr, sums.row_orf, sums.row_oe, sums.grp_se, sums.grouped, sums.large)
    else:
        e1 = np.zeros(1, dtype=np.float64)
        out = (e1, e1, e1, np.zeros((1, 1), dtype=np.float64), False, False)
        X = np.zeros((1, 1), dtype=np.float64)
    row_sr, row_orf, row_oe, grp_se, grouped, large = out
    changed, worst = _codes_errors(x, s32, zf, has_zp, np.float32(center), G, rounding == "half_away",
                                   np.float32(qmin), np.float32(qmax), codes, errors, large, X,
                                   row_sr, row_orf, row_oe, grp_se, grouped, r0)
    return int(changed), float(worst)
