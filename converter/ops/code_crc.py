"""CRC-32 of quantized codes in cache-sized row blocks (:func:`crc_codes`), the primitive of the read-back
digests (:mod:`converter.ops.readback`'s whole-tensor :func:`~converter.ops.readback.digest` and
:mod:`converter.ops.row_digest`'s row-block :class:`~converter.ops.row_digest.RowDigest`): signed int8 codes
moved to the unsigned domain block by block in a reused buffer, packed codes unpacked block by block (or
read as their words' bytes when those are the codes in order), so no full-size temporary is made; the CRC of
consecutive blocks chained is the CRC of the whole converted array."""

from __future__ import annotations

import sys

import numpy as np

from converter.kernels.crc32 import crc32
from converter.errors import ConverterError
from converter.layout import PackedCodes
from converter.quant.recode import as_integer_zero, as_unsigned
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor

__all__ = ["BLOCK_BYTES", "crc_codes", "digest_parts"]

#: Codes per CRC block, about (1 MiB: the converted block stays in cache between conversion and CRC).
BLOCK_BYTES = 1 << 20


def crc_codes(raw: "np.ndarray | PackedCodes", crc: int = 0, *, offset: int = 0) -> int:
    """CRC-32 (:func:`converter.kernels.crc32.crc32`, equal to ``zlib.crc32``) of the C-order bytes of ``raw``'s
    codes moved by ``offset`` (mod 256), continuing ``crc``.

    Parameters
    ----------
    raw : ndarray of int8 / uint8 codes, or PackedCodes
        Logical axes, outermost first (``(out, in)``, ``(expert, out, in)`` ...). Packed codes are
        unpacked in row blocks of the outermost axis when they can be cut there
        (:meth:`PackedCodes.rows`), else whole.
    offset : int
        Added to every code byte modulo 256 (``2^(b-1)``: signed b-bit codes to the unsigned domain,
        the same bytes as ``(q.astype(int16) + offset).astype(uint8)``). Arrays only.

    Returns
    -------
    int
        The CRC, equal to ``zlib.crc32`` of the whole converted array's bytes.
    """
    shape = tuple(raw.shape)
    rows = shape[0] if shape else 1
    per_row = max(1, int(np.prod(shape[1:], dtype=np.int64))) if shape else 1
    step = max(1, BLOCK_BYTES // per_row)
    if isinstance(raw, PackedCodes):
        if offset:
            raise ValueError("an offset applies to code arrays, not packed codes (use PackedCodes.shifted)")
        plain = _byte_fields(raw)
        if plain is not None:  # the words' bytes are the codes: no unpacked copy
            for r0 in range(0, rows, step):
                crc = crc32(plain[r0:r0 + step], crc)
            return crc
        if not shape or raw.rows(0, 0) is None:  # rows would split words: whole
            return crc32(raw.unpack(), crc)
        for r0 in range(0, rows, step):
            crc = crc32(raw.rows(r0, min(rows, r0 + step)).unpack(), crc)
        return crc
    arr = np.asarray(raw)
    if arr.dtype.itemsize != 1 or not shape:
        if offset:
            raise ValueError("an offset applies to one-byte codes")
        return crc32(np.ascontiguousarray(arr).data, crc)
    buf = np.empty(min(rows, step) * per_row, np.uint8) if offset else None
    add = np.uint8(offset % 256)
    for r0 in range(0, rows, step):
        blk = np.ascontiguousarray(arr[r0:r0 + step]).reshape(-1).view(np.uint8)
        if buf is not None:
            blk = np.add(blk, add, out=buf[:blk.size])
        crc = crc32(blk, crc)
    return crc


def _byte_fields(raw: PackedCodes) -> "np.ndarray | None":
    """The codes of ``raw`` as the bytes of its words, ``(rows, row bytes)`` uint8, when they are exactly the
    unpacked codes in order: unsigned 8-bit fields, unflipped, LSB-first in little-endian words stored in
    logical axis order, packed along the last axis with no padding (compressed-tensors' 8-bit ``weight_packed``
    read back); else None."""
    s = raw.amap
    words = raw.words
    if (raw.bits != 8 or raw.signed or raw.flip or sys.byteorder != "little" or tuple(s.stored_axes) != tuple(raw.axes)
            or s.packed_axis != raw.axes[-1] or s.order not in (None, tuple(range(words.dtype.itemsize)))
            or words.ndim < 1 or not words.flags.c_contiguous
            or words.shape[-1] * words.dtype.itemsize != raw.sizes[raw.axes[-1]]):
        return None
    return words.reshape(words.shape[0] if words.ndim else 1, -1).view(np.uint8)


def _canonical_signed(t: QuantizedTensor) -> "tuple | None":
    """For signed int8 code arrays with an implicit centre or integer zero points: ``(scheme, zero points,
    offset)`` of ``as_integer_zero(as_unsigned(t))`` (unsigned, explicit integer zero points) without
    converting the codes (the offset moves them, block by block, in :func:`crc_codes`); None for every
    other tensor (the general path)."""
    s = t.scheme
    raw = t.__dict__["_codes"]
    if (isinstance(raw, PackedCodes) or not s.signed or s.codebook is not None or raw.dtype != np.int8
            or s.zero_point not in (ZeroPoint.NONE, ZeroPoint.INTEGER)):
        return None
    off = 1 << (s.bits - 1)
    u = s.replace(signed=False, zero_point=ZeroPoint.INTEGER)
    if s.zero_point is ZeroPoint.NONE:  # (as_unsigned: the centre moves; as_integer_zero: made explicit)
        zp = np.full(t.scales.shape, u.center, dtype=u.code_dtype)
    else:
        zp = (t.zero_points.astype(np.int16) + off).astype(np.uint8)
    return u, zp, off


def digest_parts(t: QuantizedTensor) -> "tuple | None":
    """What the parameters digest of ``t`` is taken over: ``(scheme, zero points, code offset, codes)`` of
    ``as_integer_zero(as_unsigned(t))`` (signed int8 arrays without converting their codes: the offset moves
    them in :func:`crc_codes`), the scheme with scale dtype F32 and rounding half-even (neither is an input of
    the values); None when the zero points have no integer form (float biases: digest the values instead).
    Shared by :func:`converter.ops.readback.digest` and :class:`converter.ops.row_digest.RowDigest`."""
    fast = _canonical_signed(t)
    if fast is not None:
        scheme, zp, off = fast
        raw = t.__dict__["_codes"]
    else:
        try:
            c = as_integer_zero(as_unsigned(t))
        except ConverterError:
            return None
        scheme, zp, off, raw = c.scheme, c.zero_points, 0, c.__dict__["_codes"]
    return scheme.replace(scale_dtype="F32", rounding="half_even"), zp, off, raw
