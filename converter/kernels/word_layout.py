"""Where packed code fields sit: layouts, in-word orders, word counts and the slots of a
packing unit (the geometry :mod:`converter.kernels.packing` packs and unpacks by).

See :mod:`converter.kernels.packing` for the layouts (``"stream"``, ``"padded"``) and in-word
orders found in the wild.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np

from converter.errors import LayoutError, QuantizationError

__all__ = ["LAYOUTS", "packed_length", "padding_bits"]

LAYOUTS = ("stream", "padded")

_UNSIGNED = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32)}


# --------------------------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------------------------

def _container_dtype(container: "np.dtype | str | type") -> np.dtype:
    """Map ``container`` to an unsigned 8/16/32-bit dtype (signed ints of the same size accepted).

    Raises
    ------
    LayoutError
        If ``container`` is not an 8, 16 or 32-bit integer dtype.
    """
    try:
        dt = np.dtype(container)
    except TypeError as exc:
        raise LayoutError("container is not a numpy dtype", field="container",
                          expected="uint8, uint16 or uint32", found=container) from exc
    if dt.kind not in "ui" or dt.itemsize not in _UNSIGNED:
        raise LayoutError("unsupported packing container", field="container",
                          expected="uint8, uint16 or uint32", found=dt)
    return _UNSIGNED[dt.itemsize]


def _check_bits(bits: int) -> int:
    """Validate a bit width in 1..8; raises :class:`LayoutError` otherwise."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 8:
        raise LayoutError("bit width out of range", field="bits", expected="an int in 1..8",
                          found=bits)
    return int(bits)


def _check_layout(layout: str) -> str:
    """Validate ``layout`` against :data:`LAYOUTS`; raises :class:`LayoutError` otherwise."""
    if layout not in LAYOUTS:
        raise LayoutError("unknown packing layout", field="layout", expected=" or ".join(LAYOUTS),
                          found=layout)
    return layout


def _check_length(length: int) -> int:
    """Validate a non-negative logical length; raises :class:`LayoutError` otherwise."""
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 0:
        raise LayoutError("length must be a non-negative int", field="length",
                          expected=">= 0", found=length)
    return int(length)


def _check_axis(axis: int, ndim: int) -> int:
    """Normalise ``axis`` (negative allowed) for an array of ``ndim`` dims."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise LayoutError("axis must be an int", field="axis", expected="int", found=axis)
    if not -ndim <= axis < ndim:
        raise LayoutError("axis out of range", field="axis",
                          expected=f"in [{-ndim}, {ndim})", found=axis)
    return int(axis) % ndim


def _word_aligned(bits: int, width: int, layout: str) -> bool:
    """True when every word holds whole codes (``bits`` divides ``W`` or the layout is padded)."""
    return width % bits == 0 or layout == "padded"


def _check_order(order: Sequence[int] | None, bits: int, width: int, layout: str) -> tuple[int, ...]:
    """Return the within-word slot order (identity when ``order`` is None).

    Raises
    ------
    LayoutError
        If ``order`` is given for a stream layout whose width does not divide ``W`` (no word
        boundary to permute within), or is not a permutation of ``range(W // bits)``.
    """
    per_word = width // bits
    if order is None:
        return tuple(range(per_word))
    if not _word_aligned(bits, width, layout):
        raise LayoutError(f"an in-word order needs whole codes per word; {bits}-bit stream codes "
                          f"straddle {width}-bit words", field="order", expected=None, found=order)
    try:
        slots = tuple(int(k) for k in order)
    except (TypeError, ValueError) as exc:
        raise LayoutError("order is not a sequence of ints", field="order",
                          expected=f"a permutation of range({per_word})", found=order) from exc
    if sorted(slots) != list(range(per_word)):
        raise LayoutError("order is not a permutation of the slots of one word", field="order",
                          expected=f"a permutation of range({per_word})", found=list(slots))
    return slots


def _check_codes(codes: np.ndarray, bits: int) -> None:
    """Ensure ``codes`` is an integer array with every value in ``[0, 2**bits)``.

    Real packers (AutoGPTQ ``QuantLinear.pack``, AutoAWQ ``from_linear``) OR unmasked values in,
    so an out-of-range code silently corrupts its neighbours; here it is an error.

    Raises
    ------
    QuantizationError
        On a non-integer dtype or the first out-of-range value (named with its index).
    """
    if codes.dtype.kind not in "ui":
        raise QuantizationError("codes must be an integer array", field="codes",
                                expected="integer dtype", found=codes.dtype)
    if codes.size == 0:
        return
    hi = (1 << bits) - 1
    if codes.dtype.kind == "u" and np.iinfo(codes.dtype).max <= hi:
        return
    bad = codes.max() > hi or (codes.dtype.kind == "i" and codes.min() < 0)
    if bad:
        mask = (codes < 0) | (codes > hi) if codes.dtype.kind == "i" else codes > hi
        where = np.unravel_index(int(np.argmax(mask)), codes.shape)
        value = int(codes[where])
        raise QuantizationError(f"code {value} at index {tuple(int(i) for i in where)} does not fit "
                                f"in {bits} bits", field="codes", expected=f"0..{hi}", found=value)


def _as_words(words: np.ndarray, container: np.dtype) -> np.ndarray:
    """View ``words`` as the unsigned container dtype (int32 storage is common; same size only).

    Raises
    ------
    LayoutError
        If ``words`` is not an integer array of the container's size.
    """
    words = np.asarray(words)
    if words.dtype.kind not in "ui" or words.dtype.itemsize != container.itemsize:
        raise LayoutError("packed words have the wrong dtype", field="dtype",
                          expected=f"{container} (or the signed int of that size)", found=words.dtype)
    return words if words.dtype == container else words.view(container)


# --------------------------------------------------------------------------------------------
# sizes
# --------------------------------------------------------------------------------------------

def packed_length(length: int, bits: int, *, container: "np.dtype | str | type" = np.uint32,
                  layout: str = "stream") -> int:
    """Number of container words holding ``length`` codes along the packed axis.

    Parameters
    ----------
    length : int
        Logical number of codes along the axis (>= 0).
    bits : int
        Code width, 1..8.
    container : dtype, default uint32
        Word dtype; ``W`` is its bit width.
    layout : {"stream", "padded"}
        ``"stream"`` gives ``ceil(length*bits/W)`` (compressed-tensors >= 0.18, GPTQ, MLX);
        ``"padded"`` gives ``ceil(length / (W//bits))`` (compressed-tensors <= 0.17).

    Returns
    -------
    int

    Raises
    ------
    LayoutError
        On an invalid length, bit width, container or layout.

    Examples
    --------
    Case B29 (``length=512``, 3-bit): 48 dense words, 52 padded words.
    """
    length, bits = _check_length(length), _check_bits(bits)
    width = _container_dtype(container).itemsize * 8
    if _check_layout(layout) == "padded":
        return -(-length // (width // bits))
    return -(-length * bits // width)


def padding_bits(length: int, bits: int, *, container: "np.dtype | str | type" = np.uint32,
                 layout: str = "stream") -> int:
    """Bits of one packed line that hold no code: ``packed_length * W - length * bits``.

    Counts the zero tail of the final word and, for ``"padded"``, the unused high bits of every
    word. Parameters and errors as for :func:`packed_length`.
    """
    width = _container_dtype(container).itemsize * 8
    return packed_length(length, bits, container=container, layout=layout) * width - length * bits


def _unit(bits: int, width: int, layout: str) -> tuple[int, int]:
    """(codes, words) in one packing unit: a word when word-aligned, else ``lcm(bits, W)`` bits."""
    if _word_aligned(bits, width, layout):
        return width // bits, 1
    unit_bits = math.lcm(bits, width)
    return unit_bits // bits, unit_bits // width


def _slots(bits: int, width: int, layout: str, order: tuple[int, ...]) -> Iterator[tuple[int, int, int, bool]]:
    """Yield ``(element, word, shift, straddles)`` for every slot of one packing unit.

    ``element`` is the unit-relative element index, stored at bit ``shift`` of unit-relative
    word ``word``; when ``straddles`` its high ``shift + bits - W`` bits start word ``word + 1``.
    """
    per_unit, _ = _unit(bits, width, layout)
    if _word_aligned(bits, width, layout):
        for slot, element in enumerate(order):
            yield element, 0, slot * bits, False
        return
    for element in range(per_unit):
        word, shift = divmod(element * bits, width)
        yield element, word, shift, shift + bits > width
