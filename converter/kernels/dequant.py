"""The one dequantize kernel: float32 values of codes and their group parameters, in row blocks.

Work runs in blocks of rows sized to stay in cache (about 16-64 rows of a 4096-wide matrix),
with the output rows filled in place by ufuncs, so no full-size temporary is made beyond the
float32 output. The formula is ``(q - c) * s`` (symmetric, implicit centre ``c``),
``(q - z) * s`` (integer zero point), ``q * s + b`` (float bias) or ``codebook[q] * s``, every
operand float32 and in that order, so a result does not depend on the blocking or the thread
count. Parameters come per group of ``group_size`` along the last axis, per row or once for the
whole matrix; a tensor grouped otherwise is one block (:func:`dequantize_block` on the whole
array, its parameters expanded to every element).

Decoding bytes through a lookup table: codes of 1, 2, 4 or 8 bits packed LSB-first (the
``stream`` layout, or ``padded`` when the width divides the word, in identity in-word order)
form, on a little-endian machine, an LSB-first stream of *bytes*; each byte holds ``8 / b``
whole fields. A 256-entry table (:func:`byte_table`) maps a byte to its ``8 / b`` field values
already shifted into the code domain (top-bit flip, sign extension, minus the symmetric centre),
as float32, and ``numpy.take`` writes them straight into the output rows.
"""

from __future__ import annotations

import threading

import numpy as np

from converter.kernels.threads import kernel_threads, run_rows

#: Target elements per block (rows x in); 1.5-2x faster than whole-matrix passes.
BLOCK_ELEMENTS = 1 << 16

#: Zero-point kinds of :func:`dequantize_rows` (the values of :class:`converter.scheme.ZeroPoint`).
ZERO_KINDS = ("none", "integer", "float")


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


def dequantize_rows(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *, n_in: int,
                    zero_kind: str, group_size: int | None = None, center: float = 0.0,
                    table: np.ndarray | None = None, codebook: np.ndarray | None = None,
                    out: np.ndarray | None = None) -> np.ndarray:
    """Float32 values of a ``(rows, in)`` matrix of codes.

    Parameters
    ----------
    codes : ndarray, ``(rows, in)`` integer codes; or, with ``table``, ``(rows, in * bits / 8)``
        uint8 bytes of codes packed LSB-first.
    scales : ndarray of float32, ``(rows, groups)`` (groups of ``group_size`` along ``in``, the
        last possibly partial), ``(rows, 1)`` or ``(1, 1)`` (one per row or for the whole matrix,
        ``group_size=None``), or ``(rows, in)`` (one per element, ``group_size=None``).
    zero_points : ndarray of float32 like ``scales``, or None (``zero_kind="none"``).
    n_in : length of the ``in`` axis.
    zero_kind : ``"none"`` (``(q - center) * s``), ``"integer"`` (``(q - z) * s``) or ``"float"``
        (``q * s + z``).
    group_size : elements per group along ``in``; None when ``scales`` broadcast as they are.
    center : the symmetric centre subtracted from the codes (not used with ``table``, which
        holds it already, nor with ``codebook``).
    table : ndarray of float32, ``(256, 8 / bits)``, from :func:`byte_table`: decode ``codes`` as bytes.
    codebook : ndarray of float32, ``(levels,)``: the value of each code (``codebook[q] * s``).
    out : ndarray of float32, ``(rows, in)``, C-contiguous, optional: written instead of a new array.

    Returns
    -------
    ndarray of float32, ``(rows, in)`` (``out`` when given).
    """
    if zero_kind not in ZERO_KINDS:
        raise ValueError(f"unknown zero-point kind {zero_kind!r}")
    rows = codes.shape[0]
    n = int(n_in)
    if out is None:
        out = np.empty((rows, n), dtype=np.float32)
    elif out.shape != (rows, n) or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"out: expected a C-contiguous float32 ({rows}, {n}) array, found {out.dtype} {out.shape}")
    if out.size == 0:
        return out
    if table is not None:
        per = table.shape[1]
        table = table.view(np.dtype((np.void, 4 * per))).reshape(256) if per > 1 else table.reshape(256)
    G = group_size
    full = (n // G) * G if G else 0
    per_row = scales.shape[0] != 1 or rows == 1
    step = block_rows(n)

    def work(a: int, b: int) -> None:
        for r0 in range(a, b, step):
            r1 = min(b, r0 + step)
            dequantize_block(out[r0:r1], codes[r0:r1], scales[r0:r1] if per_row else scales,
                             None if zero_points is None else (zero_points[r0:r1] if per_row else zero_points),
                             zero_kind=zero_kind, group_size=G, full=full, center=center, table=table,
                             codebook=codebook)
    run_rows(work, rows, step, kernel_threads(out.size))  # row ranges on the cores allowed
    return out


def dequantize_block(o: np.ndarray, codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, *,
                     zero_kind: str, group_size: int | None = None, full: int = 0, center: float = 0.0,
                     table: np.ndarray | None = None, codebook: np.ndarray | None = None) -> None:
    """One block of :func:`dequantize_rows`, written into ``o`` (float32, the block's shape).

    With ``group_size=None`` the parameters broadcast against ``o`` as they are: any shape,
    e.g. a whole N-D tensor with its parameters expanded (broadcast views) to every element.
    ``table`` is the void-typed view :func:`dequantize_rows` makes of a :func:`byte_table`;
    ``full`` the columns covered by whole groups.
    """
    center32 = np.float32(center)
    if codebook is not None:
        np.take(codebook, codes, out=o)
    elif table is None:
        np.copyto(o, codes, casting="unsafe")  # exact: |q| <= 2^24
        if center32:
            o -= center32
    else:  # mode="wrap": byte indices are always in range, and it skips numpy's checked copy
        dst = o.view(table.dtype) if table.dtype.kind == "V" else o
        np.take(table, _indices(codes), out=dst.reshape(codes.shape), mode="wrap")
    if zero_kind == "integer":
        _apply(o, zero_points, group_size, full, np.subtract)
    _apply(o, scales, group_size, full, np.multiply)
    if zero_kind == "float":
        _apply(o, zero_points, group_size, full, np.add)


_LOCAL = threading.local()


def _indices(codes: np.ndarray) -> np.ndarray:
    """``codes`` (byte indices) as ``intp`` in this thread's reused buffer: ``np.take`` would otherwise convert
    them into a new ``intp`` array per call, 8 bytes per index (4 MiB for a block of a million 4-bit codes: new
    pages the kernel zeroes each time). Integer codes already ``intp`` are returned as they are."""
    if codes.dtype == np.intp:
        return codes
    buf = getattr(_LOCAL, "intp", None)
    if buf is None or buf.size < codes.size:
        buf = _LOCAL.intp = np.empty(max(codes.size, 1 << 16), dtype=np.intp)
    idx = buf[:codes.size].reshape(codes.shape)
    np.copyto(idx, codes, casting="unsafe")  # (uint8 / int8 / uint16 ... -> intp: exact)
    return idx


def _apply(o: np.ndarray, p: np.ndarray, G: int | None, full: int, ufunc: np.ufunc) -> None:
    """``o = ufunc(o, p expanded)`` in place: ``p`` is ``(rows, nG)`` per group of ``G`` along
    ``in``, or broadcasts as it is (``G=None``: ``(rows, 1)``, ``(1, 1)``, or any shape
    broadcasting against ``o``)."""
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


def dequantize_block_tables(codes: np.ndarray, scales: np.ndarray, codebook: np.ndarray, block: tuple[int, int],
                            dtype: np.dtype) -> np.ndarray:
    """``codebook[q] * s`` of a 2-D block-tiled ``(out, in)`` matrix of 8-bit codebook codes, rounded to
    ``dtype`` (2-byte floats: bfloat16 / float16), without a float32 matrix.

    Per block ``(i, j)`` a 256-entry table ``dtype(float32(codebook) * float32(s[i, j]))`` maps each
    code to its rounded value: the same float32 product and the same one rounding as
    ``(codebook[q] * s).astype(dtype)`` element by element (bit-identical, NaN codes and scales
    included), at one table lookup (a 2-byte write) per element.

    Parameters
    ----------
    codes : ndarray of uint8, ``(out, in)``
    scales : ndarray of float32, ``(ceil(out / block[0]), ceil(in / block[1]))``
    codebook : ndarray of float32, ``(256,)``
    block : (block_out, block_in)
    dtype : numpy dtype of 2 bytes

    Returns
    -------
    ndarray of ``dtype``, ``(out, in)``.
    """
    dtype = np.dtype(dtype)
    rows, n = codes.shape
    bo, bi = block
    out = np.empty((rows, n), dtype=np.uint16)
    if out.size == 0:
        return out.view(dtype)
    tables = (codebook[None, None, :] * scales[:, :, None]).astype(dtype).view(np.uint16)
    for i in range(tables.shape[0]):
        r = slice(i * bo, min(rows, (i + 1) * bo))
        for j in range(tables.shape[1]):
            c = slice(j * bi, min(n, (j + 1) * bi))
            np.take(tables[i, j], codes[r, c], out=out[r, c], mode="wrap")  # uint8 codes < 256: in range
    return out.view(dtype)
