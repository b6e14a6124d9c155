"""What a ggml block codec exposes (:class:`BlockFields`: codes, scales, mins per row and block) and the
byte-level helpers every codec shares (block views, fp16 fields, nibble split / join, row chunks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter.errors import CorruptFileError, QuantizationError


QK_K = 256
"""Elements per K-quant super-block (``QK_K`` in ``ggml-common.h``)."""

_F16_MAX = float(np.finfo(np.float16).max)
NIBBLE_SHIFTS = np.array([0, 4], dtype=np.uint8)
CRUMB_SHIFTS = np.array([0, 2, 4, 6], dtype=np.uint8)
BIT_SHIFTS = np.arange(8, dtype=np.uint8)


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

def block_view(raw: np.ndarray, type_name: str, type_size: int) -> np.ndarray:
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


def f16_at(blocks: np.ndarray, offset: int) -> np.ndarray:
    """Read the little-endian ``ggml_half`` at byte ``offset`` of every block.

    ``(rows, n_blocks, type_size)`` uint8 -> ``(rows, n_blocks)`` float16.
    """
    two = np.ascontiguousarray(blocks[..., offset:offset + 2])
    return two.view("<f2").reshape(blocks.shape[:2]).astype(np.float16, copy=False)


def f16_bytes(values: np.ndarray) -> np.ndarray:
    """``(rows, n_blocks)`` float16 -> ``(rows, n_blocks, 2)`` little-endian bytes."""
    le = np.ascontiguousarray(values, dtype="<f2")
    return le.view(np.uint8).reshape(*values.shape, 2)


def split_nibbles(qs: np.ndarray) -> np.ndarray:
    """``(..., k)`` uint8 -> ``(..., 2k)``: the k low nibbles, then the k high nibbles."""
    parts = (qs[..., None, :] >> NIBBLE_SHIFTS[:, None]) & np.uint8(0x0F)
    return parts.reshape(*qs.shape[:-1], 2 * qs.shape[-1])


def join_nibbles(q: np.ndarray) -> np.ndarray:
    """Inverse of :func:`split_nibbles`: ``(..., 2k)`` codes -> ``(..., k)`` bytes (lo | hi<<4)."""
    half = q.shape[-1] // 2
    lo = q[..., :half] & np.uint8(0x0F)
    hi = q[..., half:] & np.uint8(0x0F)
    return (lo | (hi << np.uint8(4))).astype(np.uint8)


_CHUNK_ELEMENTS = 1 << 16
"""Rows are processed in chunks of about this many elements so temporaries stay in cache."""


def _row_chunks(rows: int, row_len: int) -> range:
    """Start indices of row chunks of ``max(1, _CHUNK_ELEMENTS // row_len)`` rows each."""
    step = max(1, _CHUNK_ELEMENTS // max(row_len, 1))
    return range(0, rows, step)


def map_row_chunks(out: np.ndarray, row_len: int, fn) -> np.ndarray:
    """Fill ``out`` chunk by chunk: ``out[a:b] = fn(a, b)`` over the :func:`_row_chunks` of ``out``'s rows."""
    chunks = _row_chunks(out.shape[0], row_len)
    for start in chunks:
        out[start:start + chunks.step] = fn(start, start + chunks.step)
    return out


def check_f16_range(name: str, values: np.ndarray, type_name: str) -> None:
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
