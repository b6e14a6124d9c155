"""Vectorized bit packing of integer codes into unsigned container words.

Codes of ``bits`` bits (1..8) are packed along one array axis into 8-, 16- or 32-bit unsigned
words. Two layouts exist in the wild (FORMATS.md section 0, 1.2, 3.4, 4.2):

``"stream"``
    Consecutive words form one little-endian bit string; element ``k`` occupies bits
    ``[k*bits, (k+1)*bits)`` (LSB-first), so 3/5/6/7-bit fields straddle word boundaries.
    Packed length ``ceil(length*bits/W)``. Sources: AutoGPTQ ``QuantLinear.pack`` (2/4/8-bit
    and the 10/1/10/1/10 3-bit stream), MLX ``mx.quantize`` (affine, 2..8 bits),
    compressed-tensors ``pack_to_int32`` >= 0.18 (dense packing, PR #732).
``"padded"``
    ``W // bits`` codes per word, LSB-first, leftover high bits zero. Packed length
    ``ceil(length / (W // bits))``. Source: compressed-tensors ``pack_to_int32`` <= 0.17
    (PR #715). For widths dividing ``W`` both layouts are identical.

An optional ``order`` permutes elements within a word: slot ``k`` holds logical element
``order[k]`` of the word's group. Sources: AutoAWQ ``awq/utils/packing_utils.py``
``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]``; bitsandbytes ``quantize_4bit`` (element ``2k`` in the
high nibble of a uint8, i.e. ``order=[1, 0]``).

No Python loop runs over elements: loops run over the (at most 32) slots of one packing unit
and each iteration is a strided-slice numpy operation along the packed axis. The axis is
addressed in place with index tuples, so no transpose copy is made and results are
C-contiguous.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence

import numpy as np

from converter.errors import LayoutError
from converter.kernels.compiled import use_compiled
from converter.kernels.compiled.packing import pack_fields, unpack_fields
from converter.kernels.word_layout import (LAYOUTS, _as_words, _check_axis, _word_aligned,
                                           _check_bits, _check_codes, _check_layout, _check_length, _check_order,
                                           _container_dtype, _slots, _unit, packed_length, padding_bits)

# (the geometry's public names are re-exported: callers import them from here)
__all__ = ["pack_codes", "unpack_codes", "packed_length", "padding_bits", "LAYOUTS"]



# --------------------------------------------------------------------------------------------
# strided slices along one axis
# --------------------------------------------------------------------------------------------

def _along(ndim: int, axis: int, index: slice) -> tuple:
    """Index tuple applying ``index`` on ``axis`` and ``:`` elsewhere."""
    return (slice(None),) * axis + (index,) + (slice(None),) * (ndim - axis - 1)


def _count(total: int, start: int, step: int) -> int:
    """Number of items of ``range(start, total, step)``."""
    return max(0, -(-(total - start) // step))


def _strided(start: int, step: int, count: int) -> slice:
    """Slice selecting ``count`` items ``start, start+step, ...``."""
    return slice(start, start + step * count, step)


#: Codes handled per block: keeps each slot's temporaries cache-resident (about 2x faster on a
#: 4096 x 11008 matrix than whole-array slot operations). Tests lower it to exercise blocking.
_BLOCK_CODES = 1 << 18


def _blocks(shape: Sequence[int], axis: int, per_unit: int,
            words_per_unit: int) -> Iterator[tuple[tuple, tuple]]:
    """Yield ``(code_index, word_index)`` tuples splitting the work into cache-sized blocks.

    Blocks run along axis 0 when it is not the packed axis; otherwise along the packed axis in
    whole packing units, so every block starts at a unit boundary. ``shape`` is the code shape.
    """
    nd, n = len(shape), shape[axis]
    total = math.prod(shape)
    if total <= _BLOCK_CODES or shape[0] == 0:
        yield (slice(None),) * nd, (slice(None),) * nd
        return
    if axis != 0:
        rows = max(1, _BLOCK_CODES // (total // shape[0]))
        for start in range(0, shape[0], rows):
            index = _along(nd, 0, slice(start, start + rows))
            yield index, index
        return
    units = max(1, _BLOCK_CODES // (per_unit * (total // n)))
    for start in range(0, -(-n // per_unit), units):
        stop = start + units
        yield (_along(nd, 0, slice(start * per_unit, stop * per_unit)),
               _along(nd, 0, slice(start * words_per_unit, stop * words_per_unit)))


# --------------------------------------------------------------------------------------------
# pack / unpack
# --------------------------------------------------------------------------------------------

def pack_codes(codes: np.ndarray, bits: int, *, axis: int, container: np.dtype = np.uint32,
               layout: str = "stream", order: Sequence[int] | None = None) -> np.ndarray:
    """Pack unsigned integer codes along ``axis`` into container words.

    Parameters
    ----------
    codes : ndarray of int, shape ``(..., n, ...)``
        Codes in ``[0, 2**bits)``; ``n`` is the size of ``axis``. Any integer dtype.
    bits : int
        Code width, 1..8.
    axis : int
        Axis to pack along (negative allowed).
    container : dtype, default uint32
        uint8, uint16 or uint32 (signed ints of those sizes are mapped to unsigned).
    layout : {"stream", "padded"}
        See the module docstring; identical when ``bits`` divides ``W``.
    order : sequence of int, optional
        In-word permutation: slot ``k`` holds element ``order[k]`` of the word's group of
        ``W // bits`` elements. ``converter.formats.awq.ORDER`` for AutoAWQ GEMM,
        ``converter.formats.bnb.NIBBLE_ORDER`` for bitsandbytes 4-bit in uint8. Only where words
        hold whole codes.

    Returns
    -------
    ndarray of container dtype, shape ``(..., packed_length(n), ...)``
        C-contiguous; a partial final unit is zero-padded. Callers storing int32 use
        ``.view(np.int32)``.

    Raises
    ------
    QuantizationError
        If ``codes`` is not integer or holds a value outside ``[0, 2**bits)``.
    LayoutError
        On an invalid bit width, axis, container, layout or order.

    Examples
    --------
    >>> hex(int(pack_codes(np.arange(1, 9), 4, axis=0)[0]))
    '0x87654321'
    """
    codes = np.asarray(codes)
    bits, layout = _check_bits(bits), _check_layout(layout)
    container = _container_dtype(container)
    width = container.itemsize * 8
    slots = _check_order(order, bits, width, layout)
    if codes.ndim == 0:
        raise LayoutError("cannot pack a 0-d array", field="axis", expected="ndim >= 1", found=0)
    axis = _check_axis(axis, codes.ndim)
    _check_codes(codes, bits)
    n = codes.shape[axis]
    shape = list(codes.shape)
    shape[axis] = packed_length(n, bits, container=container, layout=layout)
    per_word = width // bits
    if (axis == codes.ndim - 1 and bits in (4, 8) and slots == tuple(range(per_word)) and n % per_word == 0
            and sys.byteorder == "little"):
        # whole words of LSB-first 4/8-bit fields along the last axis are that many little-endian
        # bytes: build the bytes and view them as words
        u8 = codes.astype(np.uint8, copy=False)
        if bits == 4:
            u8 = u8[..., 0::2] | (u8[..., 1::2] << np.uint8(4))
        return np.ascontiguousarray(u8).view(container).reshape(shape)
    out = np.zeros(shape, dtype=container)
    if axis < codes.ndim - 1 and _word_aligned(bits, width, layout) and use_compiled(codes.size):
        # the fast extra, packed axis not last (GPTQ qweight): one pass, 2.4-3.5x the slot loop on 4096 x 11008
        # (along the last axis the numpy paths are as fast: bench_packing.py)
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        pack_fields(np.ascontiguousarray(codes).reshape(outer, n, inner), bits, np.asarray(slots, dtype=np.int64),
                    out.reshape(outer, shape[axis], inner))
        return out
    for code_block, word_block in _blocks(codes.shape, axis, *_unit(bits, width, layout)):
        _pack_into(out[word_block], codes[code_block], bits, axis, layout, slots)
    return out


def _pack_into(out: np.ndarray, codes: np.ndarray, bits: int, axis: int, layout: str,
               slots: tuple[int, ...]) -> None:
    """OR every slot of every unit into ``out`` (one strided numpy op per slot, two on straddle)."""
    width = out.dtype.itemsize * 8
    n, nd = codes.shape[axis], codes.ndim
    per_unit, words_per_unit = _unit(bits, width, layout)
    for element, word, shift, straddles in _slots(bits, width, layout, slots):
        count = _count(n, element, per_unit)
        if count == 0:
            continue
        src = codes[_along(nd, axis, _strided(element, per_unit, count))].astype(out.dtype)
        if straddles:  # the high part's word exists whenever the element does (end bit <= n*bits)
            out[_along(nd, axis, _strided(word + 1, words_per_unit, count))] |= src >> (width - shift)
        if shift:
            src <<= shift
        out[_along(nd, axis, _strided(word, words_per_unit, count))] |= src


def unpack_codes(words: np.ndarray, bits: int, *, axis: int, length: int, container=np.uint32,
                 layout: str = "stream", order: Sequence[int] | None = None,
                 signed: bool = False, flip: bool = False) -> np.ndarray:
    """Unpack container words along ``axis`` into ``length`` codes (inverse of :func:`pack_codes`).

    Parameters
    ----------
    words : ndarray of int, shape ``(..., packed_length(length), ...)``
        Packed words; a signed int array of the container's size (e.g. int32 ``qweight``) is
        viewed as unsigned.
    bits : int
        Code width, 1..8.
    axis : int
        Packed axis (negative allowed).
    length : int
        Logical number of codes along ``axis``; drops the zero padding of the last unit.
    container, layout, order
        As for :func:`pack_codes`.
    signed : bool, default False
        Sign-extend each ``bits``-bit field as two's complement.
    flip : bool, default False
        XOR each field's top bit first (a domain shift by ``2**(bits-1)``; with ``signed``, fields
        stored as ``q + 2**(bits-1)`` give ``q``).

    Returns
    -------
    ndarray, shape ``(..., length, ...)``
        uint8 codes in ``[0, 2**bits)``, or int8 in ``[-2**(bits-1), 2**(bits-1))`` when
        ``signed``. C-contiguous.

    Raises
    ------
    LayoutError
        If ``words.shape[axis] != packed_length(length, ...)`` (expected vs found), on a words
        dtype whose size differs from the container, or on an invalid bit width, axis, length,
        container, layout or order.
    """
    bits, layout, length = _check_bits(bits), _check_layout(layout), _check_length(length)
    container = _container_dtype(container)
    width = container.itemsize * 8
    slots = _check_order(order, bits, width, layout)
    words = _as_words(words, container)
    if words.ndim == 0:
        raise LayoutError("cannot unpack a 0-d array", field="axis", expected="ndim >= 1", found=0)
    axis = _check_axis(axis, words.ndim)
    expected = packed_length(length, bits, container=container, layout=layout)
    if words.shape[axis] != expected:
        raise LayoutError(f"packed axis {axis} does not hold {length} {bits}-bit codes "
                          f"({layout} layout in {container})", field="shape",
                          expected=expected, found=words.shape[axis])
    shape = list(words.shape)
    shape[axis] = length
    if bits == 8 and (width == 8 or (axis == words.ndim - 1 and sys.byteorder == "little"
                                      and slots == tuple(range(width // 8)))):
        # one code per byte, LSB-first: the words' bytes are the codes in order (one copy)
        raw = np.ascontiguousarray(words).view(np.uint8) if width > 8 else words
        out = np.array(raw[_along(raw.ndim, axis, slice(0, length))], dtype=np.uint8, order="C")
        if flip:
            out ^= np.uint8(0x80)
        return _sign_extend(out, bits) if signed else out
    if (bits == 4 and axis == words.ndim - 1 and slots == tuple(range(width // 4)) and length % 2 == 0
            and sys.byteorder == "little"):
        return _unpack_nibbles(words, shape, signed=signed, flip=flip)
    out = np.empty(shape, dtype=np.uint8)
    if axis < words.ndim - 1 and _word_aligned(bits, width, layout) and use_compiled(out.size):
        # the fast extra, packed axis not last (GPTQ qweight): one pass (see pack_codes)
        outer, inner = math.prod(shape[:axis]), math.prod(shape[axis + 1:])
        unpack_fields(np.ascontiguousarray(words).reshape(outer, words.shape[axis], inner), bits,
                      np.asarray(slots, dtype=np.int64), out.reshape(outer, length, inner))
    else:
        for code_block, word_block in _blocks(out.shape, axis, *_unit(bits, width, layout)):
            _unpack_into(out[code_block], words[word_block], bits, axis, layout, slots)
    if flip:
        out ^= np.uint8(1 << (bits - 1))
    return _sign_extend(out, bits) if signed else out


def _unpack_nibbles(words: np.ndarray, shape: list[int], *, signed: bool, flip: bool) -> np.ndarray:
    """4-bit LSB-first fields along the last axis (identity in-word order, little-endian host,
    even length): the words' bytes are a byte stream whose byte ``k`` holds codes ``2k`` (low
    nibble) and ``2k+1`` (high nibble). Each byte is widened to a 16-bit lane ``b``, and
    ``(b | b << 4) & 0x0F0F`` puts the two nibbles into the lane's two bytes, which are the two
    output codes in order; flip and sign extension then act on every byte of the lane at once
    (``(f + c + 0x80) ^ 0x80`` adds ``c`` to each byte without a carry into the next). Six
    whole-lane numpy operations per cache-sized block of rows, about 4x faster than the slot loop.
    """
    length = shape[-1]
    nbytes = length // 2
    out = np.empty(shape, dtype=np.uint8)
    if out.size == 0:
        return out.view(np.int8) if signed else out
    src = np.ascontiguousarray(words.reshape(-1, words.shape[-1])).view(np.uint8)[:, :nbytes]
    lanes = out.reshape(-1, length).view(np.uint16)  # (rows, nbytes): one lane per source byte
    rows = lanes.shape[0]
    step = max(1, _BLOCK_CODES // length)
    tmp = np.empty((min(step, rows), nbytes), dtype=np.uint16)
    # per byte: f -> f ^ 8 (flip); sign extension of a 4-bit g is (g ^ 8) - 8; the two XORs of
    # flip + sign cancel, leaving f - 8
    xor = 8 if flip != signed else 0
    add = -8 if signed else 0
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        x, t = lanes[r0:r1], tmp[:r1 - r0]
        np.copyto(x, src[r0:r1])  # uint8 -> uint16 lanes
        np.left_shift(x, np.uint16(4), out=t)
        np.bitwise_or(x, t, out=x)
        np.bitwise_and(x, np.uint16(0x0F0F), out=x)
        if xor:
            np.bitwise_xor(x, np.uint16(0x0808), out=x)
        if add:
            np.add(x, np.uint16(0x0101 * (0x80 + add)), out=x)
            np.bitwise_xor(x, np.uint16(0x8080), out=x)
    return out.view(np.int8) if signed else out


def _unpack_into(out: np.ndarray, words: np.ndarray, bits: int, axis: int, layout: str,
                 slots: tuple[int, ...]) -> None:
    """Fill ``out`` slot by slot with masked shifts of strided word slices."""
    width = words.dtype.itemsize * 8
    n, nd, mask = out.shape[axis], out.ndim, words.dtype.type((1 << bits) - 1)
    per_unit, words_per_unit = _unit(bits, width, layout)
    for element, word, shift, straddles in _slots(bits, width, layout, slots):
        count = _count(n, element, per_unit)
        if count == 0:
            continue
        value = words[_along(nd, axis, _strided(word, words_per_unit, count))] >> shift
        if straddles:  # OR in the low bits of the next word, shifted above the first part
            value |= words[_along(nd, axis, _strided(word + 1, words_per_unit, count))] << (width - shift)
        if shift + bits < width or straddles:
            value &= mask
        out[_along(nd, axis, _strided(element, per_unit, count))] = value


def _sign_extend(codes: np.ndarray, bits: int) -> np.ndarray:
    """Reinterpret uint8 ``bits``-bit fields as two's complement int8 (in place, arithmetic shift)."""
    signed = codes.view(np.int8)
    if bits < 8:
        codes <<= 8 - bits
        signed >>= 8 - bits
    return signed
