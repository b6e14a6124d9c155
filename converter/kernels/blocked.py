"""Blocked float32 kernels over ``(out, in)`` matrices: dequantize straight from packed words.

Work runs in blocks of rows sized to stay in cache (about 16-64 rows of a 4096-wide matrix),
with buffers reused across blocks and in-place ufuncs, so no full-size temporary is made beyond
the float32 output. Every operation is the one :func:`converter.quant.quantize.dequantize`
defines, in the same order (``(q - c) * s``, ``(q - z) * s``, ``q * s + b``), so results are
bit-identical to it; only the memory traffic differs.

Decoding bytes through a lookup table: codes of 1, 2, 4 or 8 bits packed LSB-first (the
``stream`` layout, or ``padded`` when the width divides the word, in identity in-word order)
form, on a little-endian machine, an LSB-first stream of *bytes*; each byte holds ``8 / b``
whole fields. A 256-entry table maps a byte to its ``8 / b`` field values already shifted into
the code domain (top-bit flip, sign extension, minus the symmetric centre), as float32, and
``numpy.take`` writes them straight into the output rows.
"""

from __future__ import annotations

import sys

import numpy as np

from converter.kernels.threads import kernel_threads, run_rows

#: Target elements per block (rows x in); 1.5-2x faster than whole-matrix passes.
BLOCK_ELEMENTS = 1 << 16
#: Blocks of :func:`quantize_blocked`, about 25 numpy calls each: twice as large halves that
#: per-call overhead (~10% faster on 11008 x 4096; 4x as large spills the caches).
QUANT_BLOCK_ELEMENTS = 1 << 17
#: Elements per super-block when values are produced on demand (:class:`Rows`).
SUPER_ELEMENTS = 1 << 20


class Rows:
    """Float32 values of a 2-D ``(out, in)`` tensor produced block by block, never whole.

    ``Rows(t)`` dequantizes rows of a QuantizedTensor on demand (``take_rows(t, r0, r1)``; codes
    still packed are sliced as words), so a kernel reading it holds one super-block of floats at a
    time instead of the whole matrix. ``Rows(array)`` wraps an array. ``rows[r0:r1]`` returns
    float32 rows; a one-block cache makes consecutive small reads inside a super-block cheap.
    """

    def __init__(self, source) -> None:
        self.source = source
        self.shape = tuple(source.shape)
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.dtype = np.dtype(np.float32)
        self._lazy = not isinstance(source, np.ndarray)
        if self._lazy:
            from converter.tensor import row_splittable
            self._lazy = row_splittable(source)
            if not self._lazy:
                self.source = source.dequantize()
        self._cache: tuple[int, int, np.ndarray] | None = None
        self.step = max(1, SUPER_ELEMENTS // max(1, self.shape[-1])) if self.shape else 1

    def array(self) -> np.ndarray:
        """All values at once (for whole-array fallbacks)."""
        return self.source.dequantize() if self._lazy else np.asarray(self.source, dtype=np.float32)

    def __getitem__(self, idx) -> np.ndarray:
        if not isinstance(idx, slice) or idx.step not in (None, 1):
            raise TypeError("Rows supports [r0:r1] only")
        r0, r1, _ = idx.indices(self.shape[0])
        if not self._lazy:
            return np.asarray(self.source[r0:r1], dtype=np.float32)
        c = self._cache
        if c is None or not (c[0] <= r0 and r1 <= c[1]):
            from converter.tensor import take_rows
            b0 = r0
            b1 = max(r1, min(self.shape[0], b0 + self.step))
            c = (b0, b1, take_rows(self.source, b0, b1).dequantize())
            self._cache = c
        return c[2][r0 - c[0]:r1 - c[0]]


def block_rows(n_cols: int, elements: int | None = None) -> int:
    """Rows per block of about ``elements`` (default :data:`BLOCK_ELEMENTS`) for ``n_cols`` columns."""
    return max(1, (elements or BLOCK_ELEMENTS) // max(1, n_cols))


def byte_table(bits: int, *, signed: bool, flip: bool, center: float) -> np.ndarray:
    """``(256, 8 // bits)`` float32: the code values of the fields of every byte, minus ``center``.

    Fields are LSB-first; ``flip`` XORs each field's top bit (domain shift by ``2^(b-1)``),
    ``signed`` reads the field as two's complement.
    """
    per = 8 // bits
    b = np.arange(256, dtype=np.int32)[:, None]
    f = (b >> (np.arange(per, dtype=np.int32) * bits)[None, :]) & ((1 << bits) - 1)
    if flip:
        f ^= 1 << (bits - 1)
    if signed:
        f = np.where(f >= (1 << (bits - 1)), f - (1 << bits), f)
    out = f.astype(np.float32)
    if center:
        out -= np.float32(center)
    return np.ascontiguousarray(out)


def _raw_bytes(t):
    """``(bytes, bits, signed, flip)`` when ``t``'s codes are packed so that each byte of the words
    (in logical row order, ``(out, in * bits / 8)`` uint8) holds ``8 / bits`` whole fields
    LSB-first; else None. ``signed`` / ``flip`` say how a field maps to its code
    (:class:`converter.layout.PackedCodes`)."""
    pc = t.packed
    if pc is None or sys.byteorder != "little" or pc.bits not in (1, 2, 4, 8):
        return None
    from converter.layout import PackedCodes
    # raw stored fields in logical order (no copy when already so); the caller applies the flip
    words = PackedCodes(pc.words, pc.amap, pc.axes, pc.sizes, signed=pc.signed).logical_words()
    if words is None:
        return None
    rows, n = t.shape
    if (n * pc.bits) % 8:
        return None
    return words.view(np.uint8).reshape(rows, -1)[:, : n * pc.bits // 8], pc.bits, pc.signed, pc.flip


def _decoder(t):
    """(words as uint8 rows, table) when ``t``'s codes can be decoded bytewise, else None."""
    got = _raw_bytes(t)
    if got is None:
        return None
    raw, bits, signed, flip = got
    center = float(t.scheme.center) if t.scheme.zero_point.value == "none" else 0.0
    return raw, byte_table(bits, signed=signed, flip=flip, center=center)


def _codes_table(t):
    """(codes as uint8 rows, 256-entry table) for an unpacked int8 / uint8 code array."""
    codes = np.ascontiguousarray(t.codes)
    center = float(t.scheme.center) if t.scheme.zero_point.value == "none" else 0.0
    table = byte_table(8, signed=codes.dtype == np.int8, flip=False, center=center)
    return codes.view(np.uint8), table


def dequantize_blocked(t) -> np.ndarray | None:
    """Float32 values of a 2-D ``(out, in)`` QuantizedTensor, blocked; None when not applicable.

    Applies to: no codebook; groups per tensor, per ``out`` channel, or along ``in`` without
    ``g_idx``. Others return None (the caller uses the whole-array formula).
    """
    s, gm = t.scheme, t.group_map
    if s.codebook is not None or t.axes != ("out", "in") or t.double_quant is not None:
        return None
    g = gm.granularity.value
    if not (g == "tensor" or (g == "channel" and gm.axis == "out")
            or (g == "group" and gm.axis == "in" and gm.g_idx is None)):
        return None
    rows, n = t.shape
    out = np.empty((rows, n), dtype=np.float32)
    if out.size == 0:
        return out
    dec = _decoder(t)
    direct = None
    if dec is not None:
        raw, table = dec
    else:  # unpacked int8 / uint8 codes: the cast itself is the table
        direct = np.ascontiguousarray(t.codes)
        center = np.float32(t.scheme.center if s.zero_point.value == "none" else 0)
        raw, table = direct, np.zeros((256, 1), np.float32)
    per = table.shape[1]
    if per > 1:
        table = table.view(np.dtype((np.void, 4 * per))).reshape(256)
    else:
        table = table.reshape(256)
    scales = t.scales.astype(np.float32)
    zp = t.zero_points.astype(np.float32) if t.zero_points is not None else None
    zkind = s.zero_point.value
    G = gm.group_size if g == "group" else None
    full = (n // G) * G if G else 0
    step = block_rows(n)

    def work(a: int, b: int) -> None:
        for r0 in range(a, b, step):
            r1 = min(b, r0 + step)
            o = out[r0:r1]
            if direct is not None:
                np.copyto(o, direct[r0:r1], casting="unsafe")  # exact: |q| <= 255
                if center:
                    o -= center
            else:  # mode="wrap": byte indices are always in range, and it skips numpy's checked copy
                dst = o.view(table.dtype) if per > 1 else o
                np.take(table, raw[r0:r1], out=dst.reshape(raw[r0:r1].shape), mode="wrap")
            sc = scales if g == "tensor" else scales[r0:r1]
            zz = None if zp is None else (zp if g == "tensor" else zp[r0:r1])
            if zkind == "integer":
                _apply(o, zz, G, full, np.subtract)
            _apply(o, sc, G, full, np.multiply)
            if zkind == "float":
                _apply(o, zz, G, full, np.add)
    run_rows(work, rows, step, kernel_threads(out.size))  # row ranges on the cores allowed
    return out


def _apply(o: np.ndarray, p: np.ndarray, G: int | None, full: int, ufunc) -> None:
    """``o = ufunc(o, p expanded)`` in place: ``p`` is ``(rows, nG)`` per group of ``G`` along
    ``in``, ``(rows, 1)`` per channel or ``(1, 1)`` per tensor."""
    if G is None:
        ufunc(o, p, out=o)
        return
    rows = o.shape[0]
    nfull = full // G
    if nfull:
        body = o[:, :full].reshape(rows, nfull, G)
        ufunc(body, p[:, :nfull, None], out=body)
    if full < o.shape[1]:
        tail = o[:, full:]
        ufunc(tail, p[:, nfull:nfull + 1], out=tail)


def _reduce(x3: np.ndarray, tail: np.ndarray | None, ufunc) -> np.ndarray:
    """Per-group reduction of a block: ``x3`` ``(rows, nfull, G)`` plus an optional partial tail."""
    parts = []
    if x3.shape[1]:
        parts.append(ufunc.reduce(x3, axis=2))
    if tail is not None:
        parts.append(ufunc.reduce(tail, axis=1, keepdims=True))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def params_from_extrema(s, *, amax: np.ndarray | None = None, mx: np.ndarray | None = None,
                        mn: np.ndarray | None = None, tensor: str | None = None):
    """Round-to-nearest parameters of groups from their extrema (the formulas of
    :func:`converter.quant.quantize.choose_params`, same operation order, bit-identical).

    Parameters
    ----------
    s : QuantScheme (symmetric, or integer zero point; no codebook)
    amax : ndarray of float32, ``(rows, groups)``: ``max |x|`` per group (symmetric schemes).
    mx, mn : ndarray of float32, ``(rows, groups)``: ``max x`` / ``min x`` per group (asymmetric).
    tensor : name, for errors.

    Returns
    -------
    ``(scales, zero_points, degenerate)``: scales in the scheme's scale dtype, integer zero points
    in the code dtype (None when symmetric), the number of all-zero groups; or None when an
    extremum is not finite (the caller takes the whole-array path, which raises the precise error).

    Raises
    ------
    QuantizationError
        A scale that overflows the scale dtype.
    """
    from converter.quant.quantize import _safe_cast_scales  # noqa: PLC0415 - shared safeguard
    from converter.kernels.rounding import round_values
    # NaN propagates through abs / max / min and inf survives them: checking the (small)
    # reductions is checking every element
    if s.symmetric:
        if not np.isfinite(amax).all():
            return None
        degenerate = int(np.count_nonzero(amax == 0))
        qpos = np.float32((1 << (s.bits - 1)) - 1)
        sc = np.where(amax > 0, amax / qpos, np.float32(1.0)).astype(np.float32)  # finite / positive
        return _safe_cast_scales(sc, s, tensor=tensor), None, degenerate
    if not (np.isfinite(mx).all() and np.isfinite(mn).all()):
        return None
    degenerate = int(np.count_nonzero((mx == 0) & (mn == 0)))
    levels = np.float32((1 << s.bits) - 1)
    lo = np.minimum(mn, 0).astype(np.float32)
    hi = np.maximum(mx, 0).astype(np.float32)
    rng = hi - lo
    sc = np.where(rng > 0, rng / levels, np.float32(1.0)).astype(np.float32)
    sc = _safe_cast_scales(sc, s, tensor=tensor)
    z = round_values(-lo / sc.astype(np.float32), s.rounding)  # sc > 0: finite
    z = np.clip(z, 0, levels)
    if s.signed:
        z = z - np.float32(1 << (s.bits - 1))
    return sc, z.astype(np.int16).astype(s.code_dtype), degenerate  # as quantize() stores them


def quantize_blocked(values: np.ndarray, scheme, group_map, axes, *, tensor: str | None = None,
                     stats: dict | None = None, compare=None):
    """Round-to-nearest ``(scales, zero_points, codes)`` of a 2-D ``(out, in)`` float matrix in row
    blocks, or None when not applicable (the caller takes the whole-array path, which also
    produces the precise error for non-finite inputs or overflowing scales).

    Same formulas and operation order as :func:`converter.quant.quantize.choose_params` and
    :func:`~converter.quant.quantize.codes_for` (bit-identical results); applies to symmetric
    and integer-zero-point schemes without codebook, grouped per ``out`` channel or along ``in``
    without ``g_idx``. ``stats``, when given, receives ``degenerate_groups`` (groups whose
    values are all zero). ``compare``, an :class:`converter.quant.error_report.ErrorSums` of
    the matrix, receives each block's values and their reconstruction from the new codes (the
    target's dequantize formula, bit-identical) while both are in cache: the error report
    without a second pass over the tensor.
    """
    from converter.kernels.rounding import round_values
    from converter.errors import QuantizationError
    gm, s = group_map, scheme
    g = gm.granularity.value
    if (tuple(axes) != ("out", "in") or len(values.shape) != 2 or s.codebook is not None
            or s.zero_point.value == "float"
            or not ((g == "channel" and gm.axis == "out") or (g == "group" and gm.axis == "in" and gm.g_idx is None))):
        return None
    if s.symmetric and s.bits < 2:
        return None
    rows, n = values.shape
    if rows == 0 or n == 0:
        return None
    G = n if g == "channel" else int(gm.group_size)
    nfull, full = n // G, (n // G) * G
    n_groups = nfull + (1 if full < n else 0)
    scales = np.empty((rows, n_groups), dtype=s.scale_np_dtype)
    zps = None if s.symmetric else np.empty((rows, n_groups), dtype=np.int16)
    codes = np.empty((rows, n), dtype=s.code_dtype)
    step = block_rows(n, QUANT_BLOCK_ELEMENTS)
    if isinstance(values, Rows):
        step = max(1, min(step, values.step))

    def work(a: int, b: int):
        """Rows ``a:b`` with this thread's own buffers, value cache and error sums."""
        vals = values if a == 0 or not isinstance(values, Rows) else Rows(values.source)
        part = compare if a == 0 or compare is None else compare.part()
        buf = np.empty((step, n), dtype=np.float32)
        xbuf = np.empty((step, n), dtype=np.float32) if values.dtype != np.float32 else None
        if part is not None:
            bbuf = np.empty((step, n), dtype=np.float32)
            ebuf = np.empty((step, n), dtype=np.float32)
        deg_total = 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # per thread, once
            for r0 in range(a, b, step):
                r1 = min(b, r0 + step)
                k = r1 - r0
                x = vals[r0:r1]
                if xbuf is not None:
                    x = xbuf[:k]
                    np.copyto(x, vals[r0:r1], casting="unsafe")
                q = buf[:k]
                if s.symmetric:
                    np.abs(x, out=q)
                    # |x| orders as its bit pattern read as int32 (+0 < finite < inf < NaN): the
                    # integer max is the float max, without the NaN-aware float reduction (~3x faster)
                    qi = q.view(np.int32)
                    amax = _reduce(qi[:, :full].reshape(k, nfull, G), qi[:, full:] if full < n else None,
                                   np.maximum).view(np.float32)
                    ext = {"amax": amax}
                else:
                    x3 = x[:, :full].reshape(k, nfull, G)
                    tail = x[:, full:] if full < n else None
                    mx = _reduce(x3, tail, np.maximum)
                    mn = _reduce(x3, tail, np.minimum)
                    ext = {"mx": mx, "mn": mn}
                got = params_from_extrema(s, tensor=tensor, **ext)  # None: NaN / inf somewhere
                if got is None:
                    return None  # (this range)
                sc, z, deg = got
                deg_total += deg
                scales[r0:r1] = sc
                if zps is not None:
                    zps[r0:r1] = z
                s32 = sc.astype(np.float32)
                _apply_to(q, x, s32, G, full, np.divide)  # (a tiny scale may overflow to inf: clipped)
                # x / s is monotone in x, so a group's codes lie between those of its extremes:
                # when those are in range for every group, the clip below changes nothing
                if s.symmetric:
                    top = round_values(amax / s32, s.rounding)
                    bottom = -top
                else:
                    top, bottom = round_values(mx / s32, s.rounding), round_values(mn / s32, s.rounding)
                round_values(q, s.rounding, out=q)
                if z is not None:
                    zf = z.astype(np.float32)
                    _apply(q, zf, G, full, np.add)
                    top, bottom = top + zf, bottom + zf
                elif s.center:
                    q += np.float32(s.center)
                    top, bottom = top + np.float32(s.center), bottom + np.float32(s.center)
                # no NaN can arise here (finite values over finite non-zero scales), so codes_for's
                # nan_to_num pass is skipped; an overflow to +-inf is clipped like any large value
                if not ((top <= s.qmax).all() and (bottom >= s.qmin).all()):
                    np.clip(q, s.qmin, s.qmax, out=q)
                codes[r0:r1] = q
                if part is not None:  # the target's dequantize: (q - c) * s or (q - z) * s
                    bq = bbuf[:k]
                    if z is not None:
                        _apply_to(bq, q, zf, G, full, np.subtract)
                    elif s.center:
                        np.subtract(q, np.float32(s.center), out=bq)
                    else:
                        np.copyto(bq, q)
                    _apply(bq, s32, G, full, np.multiply)
                    part.add(r0, x, bq, ebuf[:k])
        return deg_total, part

    try:
        parts = run_rows(work, rows, step, kernel_threads(rows * n))  # row ranges on the cores allowed
    except QuantizationError:
        return None
    if any(p is None for p in parts):  # a NaN / inf somewhere: the whole-array path says where
        return None
    degenerate = sum(p[0] for p in parts)
    for p in parts[1:]:
        if compare is not None:
            compare.absorb(p[1])
    if zps is not None:
        zps = zps.astype(s.code_dtype)
    if stats is not None:
        stats["degenerate_groups"] = degenerate
    return scales, zps, codes


def _apply_to(out: np.ndarray, x: np.ndarray, p: np.ndarray, G: int, full: int, ufunc) -> None:
    """``out = ufunc(x, p expanded per group of G along in)`` (``out`` may be ``x``)."""
    rows, n = x.shape
    nfull = full // G
    if nfull:
        ufunc(x[:, :full].reshape(rows, nfull, G), p[:, :nfull, None], out=out[:, :full].reshape(rows, nfull, G))
    if full < n:
        ufunc(x[:, full:], p[:, nfull:nfull + 1], out=out[:, full:])
