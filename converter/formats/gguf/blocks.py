"""GGUF / ggml block codecs in pure numpy, exposing codes and scales, not only floats.

Every codec works on whole tensors viewed as ``(rows, n_blocks, type_size)`` bytes, where a row is one
GGUF row of ``ne[0]`` elements (blocks never cross rows). There are no Python loops over elements or
blocks; bit shifts are broadcasts. ``encode`` and ``dequantize`` walk the rows in chunks of about 64K
elements (a loop over row chunks, as gguf-py does) so temporaries stay in cache; results do not depend on
the chunking.

Layouts follow ``ggml/src/ggml-common.h`` (``block_q4_0``, ``block_q4_1``, ``block_q5_0``,
``block_q5_1``, ``block_q8_0``, ``block_q2_K``, ``block_q3_K``, ``block_q4_K``, ``block_q5_K``,
``block_q6_K``); arithmetic follows ``ggml/src/ggml-quants.c`` (``quantize_row_q*_ref``,
``dequantize_row_q*``) and gguf-py ``gguf/quants.py`` (v0.19.0), with the same float32 operation order so
results are bit-identical with ``gguf.quants.quantize`` / ``gguf.quants.dequantize``.

Codes are exposed **unsigned with an implicit offset** (``Codec.code_offset``): the stored value
``q`` and the signed value ``q - code_offset``. Q8_0 is the exception: its codes are stored signed
(``int8``) and exposed as ``int8`` with offset 0.

Public API
----------
``codec_for(type_name)``, ``CODECS``, ``SUPPORTED_READ``, ``SUPPORTED_WRITE``, ``BlockFields``,
``LegacyCodec``, ``KQuantCodec``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter.errors import ErrorKind, CorruptFileError, QuantizationError, UnsupportedError
from converter.kernels.rounding import round_half_away

__all__ = [
    "BlockFields", "LegacyCodec", "KQuantCodec", "CODECS", "SUPPORTED_READ", "SUPPORTED_WRITE",
    "codec_for", "QK_K",
]

QK_K = 256
"""Elements per K-quant super-block (``QK_K`` in ``ggml-common.h``)."""

_F16_MAX = float(np.finfo(np.float16).max)
_NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)
_CRUMB_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)
_BIT_SHIFTS = np.arange(8, dtype=np.uint8)


# --------------------------------------------------------------------------------------------
# Fields
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BlockFields:
    """The decoded contents of one quantized tensor, as codes and scales.

    Shapes use ``rows`` (GGUF rows, numpy axis 0 of the reader's data), ``row_len`` (``ne[0]``),
    ``n_blocks = row_len / block_size`` and, for K-quants, ``n_super = row_len / 256`` and
    ``n_sub = row_len / sub_block_size``.

    Attributes
    ----------
    type_name : str
        GGML type name (``"Q4_0"`` ...).
    codes : ndarray, shape (rows, row_len)
        Stored integer codes, in element order. ``uint8`` unsigned for all types (Q4_0 0..15 offset 8,
        Q5_0 0..31 offset 16, Q4_1 0..15, Q5_1 0..31, Q2_K 0..3, Q3_K 0..7 offset 4, Q4_K 0..15,
        Q5_K 0..31, Q6_K 0..63 offset 32) except Q8_0: ``int8`` -128..127, no offset.
    scales : ndarray of float16, shape (rows, n_blocks), optional
        Legacy types: the block scale ``d``.
    mins : ndarray of float16, shape (rows, n_blocks), optional
        Q4_1 / Q5_1: the block minimum ``m`` (``y = d*q + m``); None for other types.
    super_scales : ndarray of float16, shape (rows, n_super), optional
        K-quants: the super-block scale ``d``.
    super_mins : ndarray of float16, shape (rows, n_super), optional
        Q2_K / Q4_K / Q5_K: the super-block min scale ``dmin``; None for Q3_K / Q6_K.
    sub_scales : ndarray, shape (rows, n_sub), optional
        K-quants: the integer sub-block scales. ``uint8`` 0..15 (Q2_K), ``int8`` -32..31 (Q3_K, the
        stored 6-bit value minus 32), ``uint8`` 0..63 (Q4_K, Q5_K), ``int8`` (Q6_K).
    sub_mins : ndarray of uint8, shape (rows, n_sub), optional
        Q2_K (0..15) / Q4_K / Q5_K (0..63) integer sub-block mins; None for Q3_K / Q6_K.
    sub_block_size : int, optional
        Elements per sub-block: 16 (Q2_K, Q3_K, Q6_K) or 32 (Q4_K, Q5_K).
    """

    type_name: str
    codes: np.ndarray
    scales: np.ndarray | None = None
    mins: np.ndarray | None = None
    super_scales: np.ndarray | None = None
    super_mins: np.ndarray | None = None
    sub_scales: np.ndarray | None = None
    sub_mins: np.ndarray | None = None
    sub_block_size: int | None = None

    @property
    def rows(self) -> int:
        """Number of GGUF rows."""
        return int(self.codes.shape[0])

    @property
    def row_len(self) -> int:
        """Elements per row (GGUF ``ne[0]``)."""
        return int(self.codes.shape[1])


# --------------------------------------------------------------------------------------------
# Byte-level helpers
# --------------------------------------------------------------------------------------------

def _block_view(raw: np.ndarray, type_name: str, type_size: int) -> np.ndarray:
    """View raw rows as blocks.

    Parameters
    ----------
    raw : ndarray of uint8, shape (rows, n_blocks * type_size)

    Returns
    -------
    ndarray of uint8, shape (rows, n_blocks, type_size)

    Raises
    ------
    CorruptFileError
        If ``raw`` is not 2-D uint8 or its row length is not a multiple of ``type_size``.
    """
    if not isinstance(raw, np.ndarray) or raw.dtype != np.uint8 or raw.ndim != 2:
        found = f"{getattr(raw, 'dtype', type(raw).__name__)} ndim={getattr(raw, 'ndim', '?')}"
        raise CorruptFileError(f"{type_name} raw data must be a 2-D uint8 array", field="data",
                               expected="uint8 (rows, row_bytes)", found=found)
    rows, row_bytes = raw.shape
    if row_bytes % type_size:
        raise CorruptFileError(f"{type_name} row byte length is not a whole number of blocks",
                               field="data", expected=f"multiple of {type_size} bytes",
                               found=row_bytes)
    return raw.reshape(rows, row_bytes // type_size, type_size)


def _f16_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    """Read the little-endian ``ggml_half`` at byte ``offset`` of every block.

    ``(rows, n_blocks, type_size)`` uint8 -> ``(rows, n_blocks)`` float16.
    """
    two = np.ascontiguousarray(blocks[..., offset:offset + 2])
    return two.view("<f2").reshape(blocks.shape[:2]).astype(np.float16, copy=False)


def _f16_bytes(values: np.ndarray) -> np.ndarray:
    """``(rows, n_blocks)`` float16 -> ``(rows, n_blocks, 2)`` little-endian bytes."""
    le = np.ascontiguousarray(values, dtype="<f2")
    return le.view(np.uint8).reshape(*values.shape, 2)


def _split_nibbles(qs: np.ndarray) -> np.ndarray:
    """``(..., k)`` uint8 -> ``(..., 2k)``: the k low nibbles, then the k high nibbles."""
    parts = (qs[..., None, :] >> _NIBBLE_SHIFTS[:, None]) & np.uint8(0x0F)
    return parts.reshape(*qs.shape[:-1], 2 * qs.shape[-1])


def _join_nibbles(q: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_split_nibbles`: ``(..., 2k)`` codes -> ``(..., k)`` bytes (lo | hi<<4)."""
    half = q.shape[-1] // 2
    lo = q[..., :half] & np.uint8(0x0F)
    hi = q[..., half:] & np.uint8(0x0F)
    return (lo | (hi << np.uint8(4))).astype(np.uint8)


#: Q4_0 byte -> ``q - 8`` of its low / high nibble, float32 (:meth:`LegacyCodec.dequantize_raw`).
_Q4_LO = ((np.arange(256) & 0x0F) - 8).astype(np.float32)
_Q4_HI = ((np.arange(256) >> 4) - 8).astype(np.float32)
_Q4_PAIRS = np.stack([_Q4_LO, _Q4_HI], axis=1).view(np.uint64).reshape(256)

_CHUNK_ELEMENTS = 1 << 16
"""Rows are processed in chunks of about this many elements so temporaries stay in cache."""


def _row_chunks(rows: int, row_len: int) -> range:
    """Start indices of row chunks of ``max(1, _CHUNK_ELEMENTS // row_len)`` rows each."""
    step = max(1, _CHUNK_ELEMENTS // max(row_len, 1))
    return range(0, rows, step)


def _map_row_chunks(out: np.ndarray, row_len: int, fn) -> np.ndarray:
    """Fill ``out`` chunk by chunk: ``out[a:b] = fn(a, b)`` over the :func:`_row_chunks` of ``out``'s rows."""
    chunks = _row_chunks(out.shape[0], row_len)
    for start in chunks:
        out[start:start + chunks.step] = fn(start, start + chunks.step)
    return out


def _dequantize_chunked(fields: BlockFields, rows_fn) -> np.ndarray:
    """``(rows, row_len)`` float32 from ``rows_fn`` (a codec's ``_dequantize_rows``) chunk by chunk."""
    rows, row_len = fields.codes.shape
    out = np.empty((rows, row_len), dtype=np.float32)
    return _map_row_chunks(out, row_len, lambda a, b: rows_fn(_rows_slice(fields, a, b)))


def _rows_slice(fields: BlockFields, start: int, stop: int) -> BlockFields:
    """The rows ``start:stop`` of every array in ``fields`` (views, no copy)."""
    def cut(a):
        return None if a is None else a[start:stop]
    return BlockFields(fields.type_name, cut(fields.codes), cut(fields.scales), cut(fields.mins),
                       cut(fields.super_scales), cut(fields.super_mins), cut(fields.sub_scales),
                       cut(fields.sub_mins), fields.sub_block_size)


def _check_f16_range(name: str, values: np.ndarray, type_name: str) -> None:
    """Raise QuantizationError if float32 ``values`` (a scale or min field) are not finite or overflow
    float16. Block maxima/minima propagate NaN and inf, so this also catches non-finite inputs."""
    if not np.isfinite(values).all():
        raise QuantizationError(f"{type_name} {name} is not finite (NaN/inf input, or float32 overflow)",
                                field=name, expected="finite", found="NaN/inf")
    big = np.abs(values) > _F16_MAX
    if big.any():
        raise QuantizationError(f"{type_name} {name} overflows float16", field=name,
                                expected=f"|{name}| <= {_F16_MAX}",
                                found=float(np.abs(values)[big].max()))


# --------------------------------------------------------------------------------------------
# Legacy types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-element blocks)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LegacyCodec:
    """Codec for a 32-element legacy ggml block type.

    Parameters
    ----------
    name : str
        ``"Q4_0"``, ``"Q4_1"``, ``"Q5_0"``, ``"Q5_1"`` or ``"Q8_0"``.
    bits : int
        Code width: 4, 5 or 8.
    affine : bool
        True for the ``_1`` types (float min ``m``), False for the symmetric ``_0`` types.

    Notes
    -----
    Byte layout per block (``ggml-common.h``): ``d: f16``, [``m: f16``], [``qh: u8[4]``],
    ``qs``. 4/5-bit: byte ``j`` of ``qs`` holds element ``j`` (low nibble) and ``j+16`` (high
    nibble); bit ``j`` of little-endian uint32 ``qh`` is the 5th bit of element ``j``.
    """

    name: str
    bits: int
    affine: bool
    block_size: int = 32

    @property
    def type_size(self) -> int:
        """Bytes per block (34, 18, 20, 22, 24)."""
        header = 4 if self.affine else 2
        qh = 4 if self.bits == 5 else 0
        qs = self.block_size if self.bits == 8 else self.block_size // 2
        return header + qh + qs

    @property
    def code_offset(self) -> int:
        """Implicit zero point subtracted from stored codes (8 Q4_0, 16 Q5_0, else 0)."""
        return 0 if (self.affine or self.bits == 8) else 1 << (self.bits - 1)

    @property
    def code_max(self) -> int:
        """Largest stored code (15, 31; 127 for the signed Q8_0)."""
        return 127 if self.bits == 8 else (1 << self.bits) - 1

    @property
    def code_min(self) -> int:
        """Smallest stored code (0; -128 for Q8_0)."""
        return -128 if self.bits == 8 else 0

    # ---- decode / dequantize ------------------------------------------------------------

    def decode(self, raw: np.ndarray) -> BlockFields:
        """Split raw blocks into codes, scales and mins.

        Parameters
        ----------
        raw : ndarray of uint8, shape (rows, n_blocks * type_size)

        Returns
        -------
        BlockFields
            ``codes`` (rows, n_blocks*32) uint8 (int8 for Q8_0), ``scales`` (rows, n_blocks) float16,
            ``mins`` (rows, n_blocks) float16 for Q4_1/Q5_1 else None.

        Raises
        ------
        CorruptFileError
            If ``raw`` is not ``(rows, k*type_size)`` uint8.
        """
        blocks = _block_view(raw, self.name, self.type_size)
        rows, n_blocks, _ = blocks.shape
        d = _f16_at(blocks, 0)
        m = _f16_at(blocks, 2) if self.affine else None
        pos = 4 if self.affine else 2
        if self.bits == 8:
            codes = np.ascontiguousarray(blocks[..., pos:]).view(np.int8)
        else:
            qh = blocks[..., pos:pos + 4] if self.bits == 5 else None
            pos += 4 if self.bits == 5 else 0
            codes = _split_nibbles(blocks[..., pos:pos + 16])
            if qh is not None:
                high = np.unpackbits(qh, axis=-1, bitorder="little")
                codes = codes | (high << np.uint8(4))
        return BlockFields(self.name, codes.reshape(rows, n_blocks * self.block_size), scales=d, mins=m)

    def dequantize(self, fields: BlockFields) -> np.ndarray:
        """Decode fields to float32 exactly as ``dequantize_row_q*`` / gguf-py do.

        Q4_0/Q5_0: ``d * (q - offset)``; Q4_1/Q5_1: ``(d * q) + m``; Q8_0: ``q * d``; all float32.

        Parameters
        ----------
        fields : BlockFields
            As returned by :meth:`decode`.

        Returns
        -------
        ndarray of float32, shape (rows, row_len)
        """
        return _dequantize_chunked(fields, self._dequantize_rows)

    def dequantize_raw(self, raw: np.ndarray) -> np.ndarray:
        """Raw blocks straight to float32: ``dequantize(decode(raw))`` without the codes array.

        Q4_0 and Q8_0 read the bytes once: Q4_0 through a 256-entry table (byte -> its two
        ``q - 8`` values as a float32 pair), then ``d *``, then the pairs are laid out low nibble
        to element ``j``, high nibble to ``j + 16``; Q8_0 multiplies the int8 bytes by ``d`` in one ufunc pass. Same float32
        products as :meth:`dequantize`, so the results are bit-identical. Other types decode
        the fields first.

        Parameters
        ----------
        raw : ndarray of uint8, shape (rows, n_blocks * type_size)

        Returns
        -------
        ndarray of float32, shape (rows, n_blocks * block_size)
        """
        if self.name not in ("Q4_0", "Q8_0"):
            return self.dequantize(self.decode(raw))
        blocks = _block_view(raw, self.name, self.type_size)
        rows, n_blocks, _ = blocks.shape
        out = np.empty((rows, n_blocks, self.block_size), dtype=np.float32)
        step = max(1, (1 << 17) // max(1, n_blocks * self.block_size))
        pairs = np.empty((min(step, rows), n_blocks, 16), dtype=np.uint64) if self.bits == 4 else None
        for start in range(0, rows, step):
            b = blocks[start:start + step]
            o = out[start:start + step]
            k = b.shape[0]
            d = np.ascontiguousarray(b[..., :2]).view("<f2")[..., 0].astype(np.float32)[..., None]
            if self.bits == 8:
                np.multiply(b[..., 2:].view(np.int8), d, out=o)  # q * d, q widened exactly
            else:
                t = pairs[:k]
                np.take(_Q4_PAIRS, b[..., 2:], out=t, mode="wrap")  # byte j -> (lo - 8, hi - 8)
                tv = t.view(np.float32).reshape(k, n_blocks, 16, 2)
                np.multiply(d[..., None], tv, out=tv)  # d * (q - 8)
                o.reshape(k, n_blocks, 2, 16)[...] = tv.transpose(0, 1, 3, 2)  # lo -> j, hi -> j + 16
        return out.reshape(rows, n_blocks * self.block_size)

    def _dequantize_rows(self, fields: BlockFields) -> np.ndarray:
        """:meth:`dequantize` on one chunk of rows."""
        rows, row_len = fields.codes.shape
        n_blocks = row_len // self.block_size
        q = fields.codes.reshape(rows, n_blocks, self.block_size)
        d = fields.scales.astype(np.float32)[..., None]
        if self.bits == 8:
            out = q.astype(np.float32) * d
        elif self.affine:
            out = (d * q.astype(np.float32)) + fields.mins.astype(np.float32)[..., None]
        else:
            signed = q.astype(np.int16) - np.int16(self.code_offset)
            out = d * signed.astype(np.float32)
        return out.reshape(rows, row_len)

    # ---- encode / pack ------------------------------------------------------------------

    def _check_values(self, values: np.ndarray) -> np.ndarray:
        """Validate ``(rows, row_len)`` finite values; return them as float32 ``(rows, row_len)``."""
        values = np.asarray(values)
        if values.ndim != 2:
            raise QuantizationError(f"{self.name} encode needs a 2-D (rows, row_len) array",
                                    field="shape", expected="2-D", found=values.shape)
        rows, row_len = values.shape
        if row_len % self.block_size:
            raise QuantizationError(f"{self.name} row length is not a multiple of the block size",
                                    field="row_len", expected=f"multiple of {self.block_size}",
                                    found=row_len)
        return values.astype(np.float32, copy=False)

    @staticmethod
    def _inverse(d: np.ndarray) -> np.ndarray:
        """``1/d`` in float32 with ``id = 0`` where ``d == 0`` (all-zero blocks)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.float32(1.0) / d
        return np.where(d == 0, np.float32(0.0), inv).astype(np.float32)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Quantize float32 rows with llama.cpp's reference quantizer; bytes equal gguf-py's.

        Q8_0 (``quantize_row_q8_0_ref``): ``d = amax/127``, ``q = roundf(x/d)``.
        Q4_0/Q5_0 (``quantize_row_q4_0_ref``, ``_q5_0_ref``): ``d = mx / -2^(b-1)`` with ``mx`` the
        signed element of largest magnitude (first on ties), ``q = min(2^b-1, trunc(x/d + 2^(b-1)+0.5))``.
        Q4_1/Q5_1 (``quantize_row_q4_1_ref``, ``_q5_1_ref``): ``d = (max-min)/(2^b-1)``, ``m = min``,
        ``q = trunc((x-min)/d + 0.5)``. ``x/d`` is ``x * (1/d)`` in float32, with ``1/d := 0`` for ``d == 0``.

        Parameters
        ----------
        values : array_like of float, shape (rows, row_len)
            ``row_len`` a multiple of 32.

        Returns
        -------
        ndarray of uint8, shape (rows, row_len/32 * type_size)

        Raises
        ------
        QuantizationError
            Row length not a multiple of 32, non-finite values, or a scale/min that overflows float16.
        """
        values = self._check_values(values)
        rows, row_len = values.shape
        out = np.empty((rows, row_len // self.block_size * self.type_size), dtype=np.uint8)
        return _map_row_chunks(out, row_len, lambda a, b: self._encode_rows(values[a:b]))

    def _encode_rows_transposed(self, values: np.ndarray) -> np.ndarray:
        """Q4_0 / Q8_0 :meth:`encode` of one chunk with the blocks transposed to ``(32, n_blocks)``.

        Per-block reductions over 32 contiguous floats are slow in numpy (one short inner loop
        per block); on the transposed chunk they are 31 element-wise passes over long rows. The
        arithmetic is unchanged: Q8_0 ``amax = max|x|``; Q4_0 ``mx`` = the element of largest
        magnitude, taken from the block max / min, with the first-on-ties rule of
        ``quantize_row_q4_0_ref`` (and the sign of an all-zero block's first element) resolved by
        ``argmax`` on the few blocks where ``max == -min``.
        """
        rows, row_len = values.shape
        blocks = values.reshape(-1, self.block_size)
        t = np.ascontiguousarray(blocks.T)  # (32, M)
        pmax, nmin = t.max(axis=0), t.min(axis=0)
        if self.bits == 8:
            d = np.abs(np.maximum(pmax, -nmin)) / np.float32(127)  # abs: +0.0 for an all-zero block
        else:
            mx = np.where(pmax > -nmin, pmax, nmin)
            tie = pmax == -nmin
            if tie.any():
                sub = blocks[tie]
                mx[tie] = sub[np.arange(sub.shape[0]), np.abs(sub).argmax(axis=1)]
            d = mx / np.float32(-self.code_offset)
        _check_f16_range("d", d, self.name)
        inv = self._inverse(d)
        t *= inv
        out = np.empty((blocks.shape[0], self.type_size), dtype=np.uint8)
        out[:, :2] = _f16_bytes(d.astype(np.float16))
        if self.bits == 8:
            codes = np.clip(round_half_away(t), -128, 127).astype(np.int8)
            out[:, 2:] = codes.view(np.uint8).T
        else:
            t += np.float32(self.code_offset + 0.5)
            np.minimum(t, np.float32(self.code_max), out=t)  # in [0, 2^b + 0.5]: the cast truncates
            codes = t.astype(np.uint8)
            half = self.block_size // 2
            codes[half:] <<= np.uint8(4)
            codes[half:] |= codes[:half]
            out[:, 2:] = codes[half:].T
        return out.reshape(rows, -1)

    def _encode_rows(self, values: np.ndarray) -> np.ndarray:
        """:meth:`encode` on one chunk of shape-checked float32 rows."""
        if self.name in ("Q4_0", "Q8_0"):
            return self._encode_rows_transposed(values)
        rows, row_len = values.shape
        blocks = values.reshape(rows, row_len // self.block_size, self.block_size)
        d, mn = self._block_scales(blocks)
        inv = self._inverse(d)[..., None]
        if self.bits == 8:
            codes = np.clip(round_half_away(blocks * inv), -128, 127).astype(np.int8)
        elif self.affine:
            scaled = (blocks - mn[..., None]) * inv + np.float32(0.5)
            codes = np.clip(np.trunc(scaled), 0, self.code_max).astype(np.uint8)
        else:
            scaled = blocks * inv
            scaled += np.float32(self.code_offset + 0.5)
            # |x| <= |mx| puts x/d + off + 0.5 in [0, 2^b + 0.5]: trunc is the float -> uint8 cast
            # there, and only the upper clip can bite
            np.minimum(scaled, np.float32(self.code_max), out=scaled)
            codes = scaled.astype(np.uint8)
        mins = None if mn is None else mn.astype(np.float16)
        fields = BlockFields(self.name, codes.reshape(rows, -1), scales=d.astype(np.float16), mins=mins)
        return self.pack(fields)

    def _block_scales(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Reference scale ``d`` (and min ``m`` for ``_1`` types) per block, float32 ``(rows, n_blocks)``.

        Raises QuantizationError if a scale is not finite (NaN/inf input) or overflows float16.
        """
        mn = None
        if self.bits == 8:
            d = np.abs(blocks).max(axis=-1) / np.float32(127)
        elif self.affine:
            mn = blocks.min(axis=-1)
            d = (blocks.max(axis=-1) - mn) / np.float32(self.code_max)
            _check_f16_range("m", mn, self.name)
        else:
            idx = np.abs(blocks).argmax(axis=-1)[..., None]
            mx = np.take_along_axis(blocks, idx, axis=-1)[..., 0]
            d = mx / np.float32(-self.code_offset)
        _check_f16_range("d", d, self.name)
        return d, mn

    def _check_fields(self, fields: BlockFields) -> tuple[int, int]:
        """Check shapes, dtypes and code range of ``fields``; return ``(rows, n_blocks)``."""
        codes = fields.codes
        if codes.ndim != 2 or codes.shape[1] % self.block_size:
            raise QuantizationError(f"{self.name} codes must be (rows, k*{self.block_size})",
                                    field="codes", expected=f"(rows, multiple of {self.block_size})",
                                    found=codes.shape)
        rows, n_blocks = codes.shape[0], codes.shape[1] // self.block_size
        if codes.size and (int(codes.min()) < self.code_min or int(codes.max()) > self.code_max):
            raise QuantizationError(f"{self.name} codes out of range", field="codes",
                                    expected=f"{self.code_min}..{self.code_max}",
                                    found=f"{int(codes.min())}..{int(codes.max())}")
        wanted = {"scales": fields.scales, "mins": fields.mins if self.affine else None}
        for name, arr in wanted.items():
            if (name == "scales" or self.affine) and (arr is None or arr.shape != (rows, n_blocks)):
                raise QuantizationError(f"{self.name} {name} has the wrong shape", field=name,
                                        expected=(rows, n_blocks), found=getattr(arr, "shape", None), kind=ErrorKind.SHAPE)
        return rows, n_blocks

    def pack(self, fields: BlockFields) -> np.ndarray:
        """Write codes and float16 scales/mins as raw blocks; exact inverse of :meth:`decode`.

        Parameters
        ----------
        fields : BlockFields
            ``codes`` (rows, n_blocks*32) in ``code_min..code_max``; ``scales`` (and ``mins`` for the
            ``_1`` types) (rows, n_blocks), cast to float16 (pass float16 to keep them exact).

        Returns
        -------
        ndarray of uint8, shape (rows, n_blocks * type_size)

        Raises
        ------
        QuantizationError
            Codes out of range or arrays of the wrong shape.
        """
        rows, n_blocks = self._check_fields(fields)
        q = fields.codes.reshape(rows, n_blocks, self.block_size)
        parts = [_f16_bytes(fields.scales.astype(np.float16))]
        if self.affine:
            parts.append(_f16_bytes(fields.mins.astype(np.float16)))
        if self.bits == 8:
            parts.append(q.astype(np.int8).view(np.uint8))
        else:
            q = q.astype(np.uint8)
            if self.bits == 5:
                high = (q >> np.uint8(4)) & np.uint8(1)
                parts.append(np.packbits(high, axis=-1, bitorder="little"))
            parts.append(_join_nibbles(q))
        out = np.concatenate(parts, axis=-1)
        return out.reshape(rows, n_blocks * self.type_size)


# --------------------------------------------------------------------------------------------
# K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-element super-blocks)
# --------------------------------------------------------------------------------------------

def _unpack_q4k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack ``scales[12]`` of ``block_q4_K`` / ``block_q5_K`` (``get_scale_min_k4``).

    ``(..., 12)`` uint8 -> two ``(..., 8)`` uint8 arrays (6-bit scales, 6-bit mins). For ``j < 4``:
    ``sc = s[j] & 63``, ``m = s[j+4] & 63``; else ``sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4`` and
    ``m = (s[j+4] >> 4) | (s[j] >> 6) << 4``.
    """
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    six = np.uint8(0x3F)
    sc = np.concatenate([a & six, (c & np.uint8(0x0F)) | ((a >> np.uint8(6)) << np.uint8(4))], axis=-1)
    mn = np.concatenate([b & six, (c >> np.uint8(4)) | ((b >> np.uint8(6)) << np.uint8(4))], axis=-1)
    return sc, mn


def _unpack_q3k_scales(s: np.ndarray) -> np.ndarray:
    """Unpack ``scales[12]`` of ``block_q3_K`` to sixteen signed scales (``dequantize_row_q3_K``).

    ``(..., 12)`` uint8 -> ``(..., 16)`` int8 in -32..31: the low 4 bits of scale ``i`` are nibble
    ``i // 8`` of byte ``i % 8``; the high 2 bits are bits ``2*(i // 4)`` of byte ``8 + i % 4``.
    """
    low = _split_nibbles(s[..., 0:8])
    high = (s[..., None, 8:12] >> _CRUMB_SHIFTS[:, None]) & np.uint8(3)
    high = high.reshape(*s.shape[:-1], 16)
    six = low | (high << np.uint8(4))
    return (six.astype(np.int16) - np.int16(32)).astype(np.int8)


def _crumbs(qs: np.ndarray, width: int) -> np.ndarray:
    """2-bit fields: ``(..., n*width)`` uint8 -> ``(..., n*4*width)``.

    Chunk ``c`` of ``width`` bytes gives 4 runs of ``width`` elements, run ``s`` = bits ``2s..2s+1``.
    """
    lead = qs.shape[:-1]
    chunks = qs.reshape(*lead, -1, 1, width)
    out = (chunks >> _CRUMB_SHIFTS[:, None]) & np.uint8(3)
    return out.reshape(*lead, -1)


def _bit_planes(mask: np.ndarray) -> np.ndarray:
    """``(..., 32)`` uint8 -> ``(..., 256)``: element ``32*j + l`` = bit ``j`` of ``mask[l]``."""
    out = (mask[..., None, :] >> _BIT_SHIFTS[:, None]) & np.uint8(1)
    return out.reshape(*mask.shape[:-1], 8 * mask.shape[-1])


def _nibble_chunks(qs: np.ndarray, width: int) -> np.ndarray:
    """4-bit fields: chunk ``c`` of ``width`` bytes gives its low nibbles then its high nibbles."""
    lead = qs.shape[:-1]
    chunks = qs.reshape(*lead, -1, 1, width)
    out = (chunks >> _NIBBLE_SHIFTS[:, None]) & np.uint8(0x0F)
    return out.reshape(*lead, -1)


@dataclass(frozen=True)
class KQuantCodec:
    """Decode-only codec for a ggml K-quant super-block type (``QK_K = 256``).

    Parameters
    ----------
    name : str
        ``"Q2_K"``, ``"Q3_K"``, ``"Q4_K"``, ``"Q5_K"`` or ``"Q6_K"``.
    bits : int
        Code width (2, 3, 4, 5, 6).
    type_size : int
        Bytes per super-block (84, 110, 144, 176, 210).
    sub_block_size : int
        Elements per sub-block (16 or 32).
    code_offset : int
        Implicit offset of the unsigned codes (4 for Q3_K, 32 for Q6_K, else 0).
    has_mins : bool
        Whether the type carries ``dmin`` and integer sub-block mins.

    Notes
    -----
    Encoding K-quants needs llama.cpp's search-based quantizers (``quantize_row_q4_K_ref`` ...); not
    provided here (gguf-py has none either).
    """

    name: str
    bits: int
    type_size: int
    sub_block_size: int
    code_offset: int
    has_mins: bool
    block_size: int = QK_K

    def decode(self, raw: np.ndarray) -> BlockFields:
        """Split raw super-blocks into codes, super-block scales and sub-block scales/mins.

        Parameters
        ----------
        raw : ndarray of uint8, shape (rows, n_super * type_size)

        Returns
        -------
        BlockFields
            See :class:`BlockFields` for per-type dtypes and ranges.

        Raises
        ------
        CorruptFileError
            If ``raw`` is not ``(rows, k*type_size)`` uint8.
        """
        blocks = _block_view(raw, self.name, self.type_size)
        rows, n_super, _ = blocks.shape
        parts = getattr(self, f"_decode_{self.name}")(blocks)
        codes, d, dmin, sc, mn = parts
        n_sub = n_super * (QK_K // self.sub_block_size)
        return BlockFields(
            self.name, codes.reshape(rows, n_super * QK_K), super_scales=d, super_mins=dmin,
            sub_scales=sc.reshape(rows, n_sub), sub_mins=None if mn is None else mn.reshape(rows, n_sub),
            sub_block_size=self.sub_block_size)

    # Layout of each type, in byte order (ggml-common.h). Each returns
    # (codes (r, S, 256) uint8, d (r, S) f16, dmin (r, S) f16 | None, sc (r, S, k), mins (r, S, k) | None).

    @staticmethod
    def _decode_Q2_K(b: np.ndarray):
        """``block_q2_K``: ``scales[16]`` (lo nibble sc, hi nibble m), ``qs[64]``, ``d``, ``dmin``."""
        scales, qs = b[..., 0:16], b[..., 16:80]
        return (_crumbs(qs, 32), _f16_at(b, 80), _f16_at(b, 82),
                scales & np.uint8(0x0F), scales >> np.uint8(4))

    @staticmethod
    def _decode_Q3_K(b: np.ndarray):
        """``block_q3_K``: ``hmask[32]``, ``qs[64]``, ``scales[12]``, ``d``; q3 = low2 | hbit << 2."""
        hmask, qs, scales = b[..., 0:32], b[..., 32:96], b[..., 96:108]
        codes = _crumbs(qs, 32) | (_bit_planes(hmask) << np.uint8(2))
        return codes, _f16_at(b, 108), None, _unpack_q3k_scales(scales), None

    @staticmethod
    def _decode_Q4_K(b: np.ndarray):
        """``block_q4_K``: ``d``, ``dmin``, ``scales[12]``, ``qs[128]`` (32-byte chunks, lo then hi)."""
        sc, mn = _unpack_q4k_scales(b[..., 4:16])
        return _nibble_chunks(b[..., 16:144], 32), _f16_at(b, 0), _f16_at(b, 2), sc, mn

    @staticmethod
    def _decode_Q5_K(b: np.ndarray):
        """``block_q5_K``: ``d``, ``dmin``, ``scales[12]``, ``qh[32]``, ``qs[128]``."""
        sc, mn = _unpack_q4k_scales(b[..., 4:16])
        codes = _nibble_chunks(b[..., 48:176], 32) | (_bit_planes(b[..., 16:48]) << np.uint8(4))
        return codes, _f16_at(b, 0), _f16_at(b, 2), sc, mn

    @staticmethod
    def _decode_Q6_K(b: np.ndarray):
        """``block_q6_K``: ``ql[128]``, ``qh[64]``, ``scales: int8[16]``, ``d`` (last).

        Per 128-element half ``h``: element ``r`` takes nibble ``r // 64`` of ``ql[64h + r % 64]`` and
        bits ``2*(r // 32)`` of ``qh[32h + r % 32]`` as its top two bits.
        """
        low = _nibble_chunks(b[..., 0:128], 64)
        high = _crumbs(b[..., 128:192], 32)
        scales = np.ascontiguousarray(b[..., 192:208]).view(np.int8)
        return low | (high << np.uint8(4)), _f16_at(b, 208), None, scales, None

    def dequantize(self, fields: BlockFields) -> np.ndarray:
        """Decode fields to float32 in ggml's operation order.

        ``y = (d * sc) * (q - offset) - (dmin * m)`` per sub-block, every product in float32
        (``dequantize_row_q2_K`` ... ``dequantize_row_q6_K``; gguf-py ``Q*_K.dequantize_blocks``).
        Types without mins drop the subtraction.

        Parameters
        ----------
        fields : BlockFields
            As returned by :meth:`decode`.

        Returns
        -------
        ndarray of float32, shape (rows, row_len)
        """
        return _dequantize_chunked(fields, self._dequantize_rows)

    def _dequantize_rows(self, fields: BlockFields) -> np.ndarray:
        """:meth:`dequantize` on one chunk of rows."""
        rows, row_len = fields.codes.shape
        n_super = row_len // QK_K
        per = QK_K // self.sub_block_size
        d = fields.super_scales.astype(np.float32)[..., None]
        dl = (d * fields.sub_scales.reshape(rows, n_super, per).astype(np.float32))[..., None]
        q = fields.codes.reshape(rows, n_super, per, self.sub_block_size)
        if self.code_offset:
            q = (q.astype(np.int16) - np.int16(self.code_offset))
        out = dl * q.astype(np.float32)
        if self.has_mins:
            dmin = fields.super_mins.astype(np.float32)[..., None]
            ml = dmin * fields.sub_mins.reshape(rows, n_super, per).astype(np.float32)
            out = out - ml[..., None]
        return out.reshape(rows, row_len)

    def encode(self, values: np.ndarray) -> np.ndarray:  # noqa: ARG002 - uniform interface
        """Not available: K-quant encoding needs llama.cpp (``quantize_row_*_K_ref``)."""
        raise UnsupportedError(f"encoding {self.name} is not supported", field="ggml_type",
                               expected=f"one of {', '.join(SUPPORTED_WRITE)}", found=self.name,
                               hint="quantize K-quants with llama.cpp's llama-quantize")

    def pack(self, fields: BlockFields) -> np.ndarray:  # noqa: ARG002 - uniform interface
        """Not available for K-quants (see :meth:`encode`)."""
        raise UnsupportedError(f"packing {self.name} is not supported", field="ggml_type",
                               expected=f"one of {', '.join(SUPPORTED_WRITE)}", found=self.name)


# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

def _build_registry() -> dict[str, LegacyCodec | KQuantCodec]:
    legacy = [LegacyCodec("Q4_0", 4, False), LegacyCodec("Q4_1", 4, True), LegacyCodec("Q5_0", 5, False),
              LegacyCodec("Q5_1", 5, True), LegacyCodec("Q8_0", 8, False)]
    kquants = [KQuantCodec("Q2_K", 2, 84, 16, 0, True), KQuantCodec("Q3_K", 3, 110, 16, 4, False),
               KQuantCodec("Q4_K", 4, 144, 32, 0, True), KQuantCodec("Q5_K", 5, 176, 32, 0, True),
               KQuantCodec("Q6_K", 6, 210, 16, 32, False)]
    return {c.name: c for c in (*legacy, *kquants)}


CODECS: dict[str, LegacyCodec | KQuantCodec] = _build_registry()
"""Every codec, keyed by GGML type name."""

SUPPORTED_READ: tuple[str, ...] = tuple(CODECS)
"""Type names :meth:`decode` / :meth:`dequantize` handle."""

SUPPORTED_WRITE: tuple[str, ...] = tuple(n for n, c in CODECS.items() if isinstance(c, LegacyCodec))
"""Type names :meth:`encode` / :meth:`pack` handle."""


def codec_for(type_name: str) -> LegacyCodec | KQuantCodec:
    """Return the codec for a GGML type name (``"Q4_0"``, ``"Q6_K"`` ...).

    Raises
    ------
    UnsupportedError
        If the name is not a supported block type; the message lists the supported ones.
    """
    try:
        return CODECS[type_name]
    except (KeyError, TypeError):
        raise UnsupportedError("GGML block type not supported", field="ggml_type",
                               expected=f"one of {', '.join(SUPPORTED_READ)}", found=type_name) from None
