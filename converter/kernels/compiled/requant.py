"""Compiled round-to-nearest requantize of ``(out, in)`` row blocks (the ``fast`` extra): the
source's codes unpacked and dequantized, the new grid's extrema, codes, reconstruction and error in
two compiled passes over a cache-sized block. The numpy reference is
:func:`converter.kernels.rtn.quantize_rows`, which hands its work to
:func:`converter.kernels.compiled.rtn_rows.quantize_rows_compiled` when
:func:`~converter.kernels.compiled.use_compiled` says so.

Per row block of about :data:`converter.kernels.rtn.QUANT_BLOCK_ELEMENTS` values:

1. :func:`_decode_extrema`: the source rows as float32, from the bytes of their packed codes
   through the same 256-entry byte table (:func:`converter.kernels.dequant.byte_table`), then
   ``(f - z) * s``, ``f * s`` or ``f * s + b``, every operand float32 and in that order
   (:func:`converter.kernels.dequant.dequantize_block`); or the float32 rows the source produced.
   Then per target group ``max |x|`` (symmetric) or ``max x`` / ``min x`` (asymmetric). A NaN or
   inf stops the kernel (the numpy whole-array path then names it).
2. The group parameters by the numpy reference itself
   (:func:`converter.kernels.rtn.params_from_extrema`: scales cast to the scale dtype first,
   :func:`~converter.kernels.rtn.safe_cast_scales`, zero points), on the small ``(rows, groups)``
   arrays: identical scales and zero points by construction.
3. :func:`_codes_errors`: codes ``clamp(round(x / s) + z)`` (or ``+ c``), float32 operands in
   the reference's order (:func:`converter.kernels.rtn.codes_block`), rounding half to even
   (``numpy.rint``) or half away from zero as the grid says, stored in the code dtype; with an
   error report the reconstruction ``B = (q - z) * s`` / ``(q - c) * s`` and ``E = B - A`` in
   float32 (as :class:`~converter.kernels.error_sums.ErrorSums` forms them), the count of
   ``E != 0`` and ``max |E|``.
4. The summed figures (squared error per group, signal power, the output-space products on the
   fixed-seed inputs) by :meth:`ErrorSums.add_sums` on the very float32 blocks numpy would pass,
   the same block boundaries: BLAS / einsum sums in the same order.

Every result is therefore **bit-identical** to the numpy path's: codes, scales, zero points, the
file bytes and every figure of the error report (tests: ``tests/kernels/compiled``). The compiled
code avoids float reductions (which do not vectorize without fast-math, and fast-math is not
used): maxima are taken on the float32 bit patterns as integers.
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit
from converter.kernels.dequant import byte_table

__all__ = ["decode_source", "decode_extrema", "codes_errors"]

#: Source zero-point kinds as the kernels number them.
_SRC_KIND = {"none": 0, "integer": 1, "float": 2}

#: Stand-ins for the arguments a call does not use (the kernels are typed once for every call).
_NO_BYTES = np.zeros((1, 1), dtype=np.uint8)
_NO_TABLE = np.zeros((256, 1), dtype=np.float32)
_NO_PARAMS = np.zeros((1, 1), dtype=np.float32)
_NO_ROWS = np.zeros((1, 1), dtype=np.float32)
_ABS = np.int32(0x7FFFFFFF)
_INF_BITS = np.int32(0x7F800000)


@jit
def _decode_extrema(x, data, table, ssc, szp, src_kind, src_G, decode, G, symmetric, amax, mx, mn):
    """Rows of ``x`` (float32 ``(rows, in)``; written from ``data`` when ``decode``) and their
    target groups' extrema into ``amax`` or ``mx`` / ``mn`` (float32 ``(rows, groups)``).
    Returns False when a value is NaN or inf.

    Extrema are taken on the values' bit patterns read as int32 (integer max / min vectorize; a
    float max does not without fast-math): ``|x|`` orders as its pattern with the sign bit
    cleared (a pattern at or above inf's is NaN / inf), ``x`` as its pattern with the magnitude
    bits flipped when negative. The same maxima and minima as numpy's (a group of zeros may give
    +0 where numpy gives -0 or back: no scale, zero point or code depends on that sign)."""
    rows, n = x.shape
    per = table.shape[1]
    xi = x.view(np.int32)
    # whole bytes written as 8-byte words of two / four / eight fields (4-, 2-, 1-bit codes) or as one
    # 4-byte field (8-bit codes): a copy per byte instead of a loop over its fields
    words = decode and per >= 2 and n % per == 0 and data.shape[1] * per == n
    w = per // 2
    t32 = table.view(np.uint32)
    for r in range(rows):
        if decode:
            dr = data[r]
            if words:
                t64 = table.view(np.uint64)
                xr64 = x[r].view(np.uint64)
                for i in range(dr.shape[0]):
                    byte = dr[i]
                    for j in range(w):
                        xr64[i * w + j] = t64[byte, j]
            elif per == 1:
                xr32 = xi[r]
                for i in range(min(n, dr.shape[0])):
                    xr32[i] = t32[dr[i], 0]
            else:
                for i in range(dr.shape[0]):
                    byte = dr[i]
                    for j in range(per):
                        c = i * per + j
                        if c < n:
                            x[r, c] = table[byte, j]
            g0 = 0
            while g0 < n:  # the source's groups: (f - z) * s, f * s or f * s + b, float32
                g1 = min(n, g0 + src_G)
                gi = g0 // src_G
                sv = ssc[r, gi]
                seg = x[r, g0:g1]
                if src_kind == 1:
                    zv = szp[r, gi]
                    for c in range(seg.shape[0]):
                        seg[c] = (seg[c] - zv) * sv
                elif src_kind == 2:
                    bv = szp[r, gi]
                    for c in range(seg.shape[0]):
                        seg[c] = seg[c] * sv + bv
                else:
                    for c in range(seg.shape[0]):
                        seg[c] = seg[c] * sv
                g0 = g1
        g0 = 0
        while g0 < n:
            g1 = min(n, g0 + G)
            gi = g0 // G
            worst = np.int32(0)
            seg = xi[r, g0:g1]
            if symmetric:
                for c in range(seg.shape[0]):
                    worst = max(worst, seg[c] & _ABS)
                if worst >= _INF_BITS:
                    return False
                amax[r, gi] = np.array(worst, dtype=np.int32).view(np.float32)[()]
            else:
                hi = np.int32(-2147483648)
                lo = np.int32(2147483647)
                for c in range(seg.shape[0]):
                    b = seg[c]
                    worst = max(worst, b & _ABS)
                    k = b ^ ((b >> 31) & _ABS)
                    hi = max(hi, k)
                    lo = min(lo, k)
                if worst >= _INF_BITS:
                    return False
                hi = hi ^ ((hi >> 31) & _ABS)
                lo = lo ^ ((lo >> 31) & _ABS)
                mx[r, gi] = np.array(hi, dtype=np.int32).view(np.float32)[()]
                mn[r, gi] = np.array(lo, dtype=np.int32).view(np.float32)[()]
            g0 = g1
    return True


@jit
def _codes_errors(x, s32, zf, has_zp, center, G, half_away, qmin, qmax, codes, errors, bbuf, ebuf):
    """Codes of the rows of ``x`` into ``codes``; when ``errors``, their reconstruction ``B`` into
    ``bbuf`` and ``E = B - A`` into ``ebuf`` (float32, ``x``'s shape). Returns ``(changed, max |E|)``."""
    rows, n = x.shape
    changed = 0
    worst = np.int32(0)  # max |E| as its bit pattern (an integer max vectorizes)
    half = np.float32(0.5)
    add = has_zp or center != 0
    for r in range(rows):
        g0 = 0
        while g0 < n:
            g1 = min(n, g0 + G)
            gi = g0 // G
            s = s32[r, gi]
            c0 = zf[r, gi] if has_zp else center
            xs = x[r, g0:g1]
            qs = codes[r, g0:g1]
            if half_away:  # C roundf: |q| - floor(|q|) compared with one half, exactly
                for c in range(xs.shape[0]):
                    q = xs[c] / s
                    aq = abs(q)
                    fl = np.floor(aq)
                    if aq - fl >= half:
                        fl = fl + np.float32(1.0)
                    q = np.float32(np.copysign(fl, q))
                    if add:
                        q = q + c0
                    qs[c] = min(max(q, qmin), qmax)
            elif add:
                for c in range(xs.shape[0]):
                    qs[c] = min(max(np.rint(xs[c] / s) + c0, qmin), qmax)
            else:
                for c in range(xs.shape[0]):
                    qs[c] = min(max(np.rint(xs[c] / s), qmin), qmax)
            if errors:  # B = (q - z) * s or (q - c) * s, E = B - A: float32, the reference's order
                bs = bbuf[r, g0:g1]
                es = ebuf[r, g0:g1]
                ei = es.view(np.int32)
                for c in range(xs.shape[0]):
                    q = np.float32(qs[c])
                    b = (q - c0) * s if add else q * s
                    e = b - xs[c]
                    bs[c] = b
                    es[c] = e
                for c in range(xs.shape[0]):
                    changed += es[c] != 0
                    worst = max(worst, ei[c] & _ABS)
            g0 = g1
    return changed, np.array(worst, dtype=np.int32).view(np.float32)[()]


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


def decode_extrema(x: np.ndarray, source, G: int, symmetric: bool, amax: np.ndarray, mx: np.ndarray,
                   mn: np.ndarray) -> bool:
    """Step 1 on a block of rows: ``x`` float32 ``(rows, in)`` (C-contiguous) filled from ``source``
    (rows of :func:`decode_source`'s tuple) or, ``source=None``, already holding the values;
    extrema per group of ``G`` along ``in`` into float32 ``(rows, groups)`` arrays. False: a NaN / inf."""
    if source is None:
        return _decode_extrema(x, _NO_BYTES, _NO_TABLE, _NO_PARAMS, _NO_PARAMS, 0, 1, False, G, symmetric,
                               amax, mx, mn)
    data, table, sc, zp, kind, src_G = source
    return _decode_extrema(x, data, table, sc, zp, kind, src_G, True, G, symmetric, amax, mx, mn)


def codes_errors(x: np.ndarray, s32: np.ndarray, zf: np.ndarray | None, center: float, G: int, rounding: str,
                 qmin: int, qmax: int, codes: np.ndarray, bbuf: np.ndarray | None,
                 ebuf: np.ndarray | None) -> tuple[int, float]:
    """Step 3 on one block: codes of ``x`` (float32 ``(rows, in)``) for float32 scales ``s32`` and
    zero points ``zf`` (``(rows, groups)``, groups of ``G`` along ``in``) or the symmetric centre,
    into ``codes`` (``(rows, in)``, the code dtype); with ``bbuf`` / ``ebuf`` (float32, ``x``'s
    shape) the reconstruction and its error into them. Returns ``(changed, max |E|)`` of the block
    (0, 0.0 without the buffers)."""
    has_zp = zf is not None
    errors = bbuf is not None
    if not errors:
        bbuf = ebuf = _NO_ROWS
    changed, worst = _codes_errors(x, s32, zf if has_zp else _NO_PARAMS, has_zp, np.float32(center), G,
                                   rounding == "half_away", np.float32(qmin), np.float32(qmax), codes, errors,
                                   bbuf, ebuf)
    return int(changed), float(worst)
