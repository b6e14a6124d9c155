"""Named axes and the axis map: how a stored array maps onto logical axes.

A Linear weight is logical ``(out, in)``; stacked experts add a leading ``expert`` axis. Formats
store codes and quantization parameters transposed, packed and permuted in many ways (GPTQ
``qweight`` is ``[in/8, out]`` packed along ``in``; AWQ GEMM ``[in, out/8]`` packed along ``out``
with an interleave; compressed-tensors ``[out, in/8]``). An :class:`AxisMap` states those storage
facts once, and this module is the only place that transposes or unpacks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from converter.errors import LayoutError
from converter.kernels.packing import pack_codes, packed_length, unpack_codes
from converter.kernels.transpose import equal_transposed, transpose_2d  # (re-exported for callers)

OUT = "out"
IN = "in"
EXPERT = "expert"
#: Logical axis names, in logical order (outermost first).
LOGICAL_AXES: tuple[str, ...] = (EXPERT, OUT, IN)

_CONTAINERS = {"U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
               "I8": np.uint8, "I16": np.uint16, "I32": np.uint32}
_SIGNED_VIEW = {"I8": np.int8, "I16": np.int16, "I32": np.int32}


def check_axes(axes: Sequence[str], *, field: str = "axes") -> tuple[str, ...]:
    """Validate a tuple of logical axis names: known names, no repeats, logical order.

    Raises
    ------
    LayoutError
        On an unknown or repeated name, or names out of the ``(expert, out, in)`` order.
    """
    axes = tuple(axes)
    for a in axes:
        if a not in LOGICAL_AXES:
            raise LayoutError("unknown axis name", field=field, expected=list(LOGICAL_AXES), found=a)
    if len(set(axes)) != len(axes):
        raise LayoutError("repeated axis name", field=field, found=list(axes))
    if list(axes) != sorted(axes, key=LOGICAL_AXES.index):
        raise LayoutError("axes must be in logical order", field=field,
                          expected=[a for a in LOGICAL_AXES if a in axes], found=list(axes))
    return axes


@dataclass(frozen=True)
class AxisMap:
    """How one stored array maps onto logical axes.

    Parameters
    ----------
    stored_axes : tuple of str
        The logical axis name of each stored dimension, outermost first. GPTQ ``qweight`` is
        ``("in", "out")``; compressed-tensors ``weight_packed`` is ``("out", "in")``.
    packed_axis : str, optional
        The logical axis along which integer fields are packed into words; ``None`` when the
        array holds one value per element.
    bits : int, optional
        Bits per packed field (1-8). Required when ``packed_axis`` is set.
    container : str, optional
        Storage dtype of the packed words: ``"U8" | "U16" | "U32" | "I8" | "I16" | "I32"``.
    order : tuple of int, optional
        Permutation within one word: slot ``k`` holds element ``order[k]`` of the word's group
        (AWQ GEMM: ``(0, 2, 4, 6, 1, 3, 5, 7)``, AutoAWQ ``packing_utils.AWQ_ORDER``).
    packing : str
        ``"stream"`` (fields straddle words; GPTQ, MLX, compressed-tensors >= 0.18) or
        ``"padded"`` (``W // bits`` fields per word; compressed-tensors <= 0.17).

    Raises
    ------
    LayoutError
        When the fields contradict each other (checked at construction).
    """

    stored_axes: tuple[str, ...]
    packed_axis: str | None = None
    bits: int | None = None
    container: str | None = None
    order: tuple[int, ...] | None = None
    packing: str = "stream"

    def __post_init__(self) -> None:
        if len(set(self.stored_axes)) != len(self.stored_axes):
            raise LayoutError("repeated stored axis", field="stored_axes", found=list(self.stored_axes))
        for a in self.stored_axes:
            if a not in LOGICAL_AXES:
                raise LayoutError("unknown axis name", field="stored_axes", expected=list(LOGICAL_AXES), found=a)
        if self.packed_axis is None:
            for f in ("order", "bits"):  # packing fields describe nothing without a packed axis
                if getattr(self, f) is not None:
                    raise LayoutError(f"{f} given without a packed axis", field=f, expected="packed_axis set",
                                      found=getattr(self, f))
            return
        if self.packed_axis not in self.stored_axes:
            raise LayoutError("packed axis is not a stored axis", field="packed_axis",
                              expected=list(self.stored_axes), found=self.packed_axis)
        if self.bits is None or not 1 <= self.bits <= 8:
            raise LayoutError("packed arrays need bits in 1..8", field="bits", expected="1..8", found=self.bits)
        if self.container not in _CONTAINERS:
            raise LayoutError("unknown container dtype", field="container",
                              expected=sorted(_CONTAINERS), found=self.container)
        if self.packing not in ("stream", "padded"):
            raise LayoutError("unknown packing", field="packing", expected=["stream", "padded"], found=self.packing)

    # -- shapes -----------------------------------------------------------------------------
    @property
    def word_bits(self) -> int:
        """Bits per container word (8, 16 or 32); 0 when not packed."""
        return np.dtype(_CONTAINERS[self.container]).itemsize * 8 if self.container else 0

    def stored_shape(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        """Stored shape for logical ``sizes`` (axis name -> length), packing included."""
        shape = []
        for a in self.stored_axes:
            n = int(sizes[a])
            if a == self.packed_axis:
                n = packed_length(n, self.bits, container=_CONTAINERS[self.container], layout=self.packing)
            shape.append(n)
        return tuple(shape)

    # -- conversions --------------------------------------------------------------------------
    def to_logical(self, stored: np.ndarray, axes: Sequence[str], sizes: Mapping[str, int], *,
                   signed: bool = False, flip: bool = False) -> np.ndarray:
        """Stored array -> logical array with dims in ``axes`` order (unpacked, transposed).

        Parameters
        ----------
        stored : ndarray, shape ``stored_shape(sizes)``
        axes : logical axis order wanted, e.g. ``("out", "in")``.
        sizes : logical length of each axis (needed to drop packing padding).
        signed : bool
            Sign-extend packed fields (two's complement) into int8.
        flip : bool
            XOR the top bit of every packed field first (see :class:`PackedCodes`).

        Returns
        -------
        ndarray in logical orientation; uint8 when unpacked from words, else ``stored.dtype``.

        Raises
        ------
        LayoutError
            When the stored shape does not match ``sizes`` or the axes differ, or packed words
            are not integers of the container's size (float32 words are never reinterpreted).
        """
        if set(axes) != set(self.stored_axes):
            raise LayoutError("logical and stored axes differ", field="stored_axes",
                              expected=sorted(axes), found=list(self.stored_axes))
        expected = self.stored_shape(sizes)
        if tuple(stored.shape) != expected:
            raise LayoutError("stored shape does not match the layout", field="shape",
                              expected=list(expected), found=list(stored.shape))
        arr = stored
        if self.packed_axis is not None:  # unpack_codes takes the container or its same-size signed int only
            container = _CONTAINERS[self.container]
            arr = unpack_codes(stored, self.bits, axis=self.stored_axes.index(self.packed_axis),
                               length=int(sizes[self.packed_axis]), container=container,
                               layout=self.packing, order=self.order, signed=signed, flip=flip)
        perm = [self.stored_axes.index(a) for a in axes]
        return np.transpose(arr, perm) if perm != list(range(len(perm))) else arr

    def to_stored(self, logical: np.ndarray, axes: Sequence[str]) -> np.ndarray:
        """Logical array (dims in ``axes`` order) -> stored array (transposed, packed), C-contiguous.

        Signed integer codes are stored as their ``bits``-wide two's-complement fields.
        """
        perm = [tuple(axes).index(a) for a in self.stored_axes]
        arr = np.transpose(logical, perm) if perm != list(range(len(perm))) else logical
        if self.packed_axis is not None:
            if arr.dtype.kind == "i":  # signed codes: store the two's-complement field
                arr = (arr.astype(np.int16) & ((1 << self.bits) - 1)).astype(np.uint8)
            words = pack_codes(np.ascontiguousarray(arr), self.bits,
                               axis=self.stored_axes.index(self.packed_axis),
                               container=_CONTAINERS[self.container], layout=self.packing, order=self.order)
            if self.container in _SIGNED_VIEW:
                words = words.view(_SIGNED_VIEW[self.container])
            return np.ascontiguousarray(words)
        return np.ascontiguousarray(arr)

    def store_codes(self, codes: "np.ndarray | PackedCodes", axes: Sequence[str]) -> np.ndarray:
        """:meth:`to_stored` for codes that may still be packed: words moved as words when the
        layouts agree (:meth:`PackedCodes.to_stored`), else unpacked and packed again."""
        if isinstance(codes, PackedCodes):
            words = codes.to_stored(self, axes)
            if words is not None:
                return words
            codes = codes.unpack()
        return self.to_stored(codes, axes)

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """JSON object as in ``schemas/layout.schema.json`` (``axis_map``)."""
        return {"stored_axes": list(self.stored_axes), "packed_axis": self.packed_axis, "bits": self.bits,
                "container": self.container, "order": list(self.order) if self.order else None,
                "packing": self.packing}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "AxisMap":
        """Inverse of :meth:`to_json`; raises LayoutError on bad fields."""
        try:
            return cls(stored_axes=tuple(obj["stored_axes"]), packed_axis=obj.get("packed_axis"),
                       bits=obj.get("bits"), container=obj.get("container"),
                       order=tuple(obj["order"]) if obj.get("order") else None,
                       packing=obj.get("packing", "stream"))
        except (KeyError, TypeError) as exc:
            raise LayoutError(f"malformed axis map: {exc}", field="axis_map") from None


# ---------------------------------------------------------------------------------------------
# fast paths: codes kept in their stored words
# ---------------------------------------------------------------------------------------------

def _order_of(m: AxisMap) -> tuple[int, ...] | None:
    """The in-word order, ``None`` when it is the identity."""
    if m.order is None or list(m.order) == list(range(len(m.order))):
        return None
    return tuple(m.order)


def _word_aligned(m: AxisMap) -> bool:
    return m.word_bits % m.bits == 0 or m.packing == "padded"


class PackedCodes:
    """Integer codes still in the words a reader found them in (unpacked only when asked).

    A :class:`~converter.tensor.QuantizedTensor` may hold a ``PackedCodes`` instead of an array of
    codes; ``t.codes`` then unpacks on first access (through :meth:`AxisMap.to_logical`), while
    writers whose storage shares the word layout copy (and at most transpose) the words
    themselves (:meth:`to_stored`): an exact repack GPTQ -> compressed-tensors moves int32 words,
    never 8 codes per word.

    Parameters
    ----------
    words : ndarray, shape ``amap.stored_shape(sizes)``
        The stored words (often a read-only memory map).
    amap : AxisMap
        How ``words`` are stored (must be packed).
    axes : tuple of str
        Logical axes of the codes, e.g. ``("out", "in")``.
    sizes : mapping axis -> int
        Logical length of each axis.
    signed : bool
        Codes are int8 (two's-complement fields) rather than uint8.
    flip : bool
        The code domain differs from the stored fields by ``2^(b-1)`` (the top bit of each field
        is inverted): :func:`converter.quant.recode.as_signed` / ``as_unsigned`` toggle it instead
        of rewriting the codes.
    """

    __slots__ = ("words", "amap", "axes", "sizes", "signed", "flip")

    def __init__(self, words: np.ndarray, amap: AxisMap, axes: Sequence[str], sizes: Mapping[str, int], *,
                 signed: bool, flip: bool = False) -> None:
        if amap.packed_axis is None:
            raise LayoutError("PackedCodes needs a packed axis map", field="packed_axis")
        if set(axes) != set(amap.stored_axes):
            raise LayoutError("logical and stored axes differ", field="stored_axes",
                              expected=sorted(axes), found=list(amap.stored_axes))
        sizes = {a: int(sizes[a]) for a in axes}
        expected = amap.stored_shape(sizes)
        if tuple(words.shape) != expected:
            raise LayoutError("stored shape does not match the layout", field="shape",
                              expected=list(expected), found=list(words.shape))
        self.words, self.amap, self.axes, self.sizes = words, amap, tuple(axes), sizes
        self.signed, self.flip = bool(signed), bool(flip)

    # -- ndarray-like facts ------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.sizes[a] for a in self.axes)

    @property
    def ndim(self) -> int:
        return len(self.axes)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int8 if self.signed else np.uint8)

    @property
    def bits(self) -> int:
        return int(self.amap.bits)

    def shifted(self) -> "PackedCodes":
        """The codes moved by ``2^(b-1)`` into the other domain (signed <-> unsigned), lazily."""
        return PackedCodes(self.words, self.amap, self.axes, self.sizes, signed=not self.signed, flip=not self.flip)

    def rows(self, start: int, stop: int) -> "PackedCodes | None":
        """Codes of logical rows ``start:stop`` of the outermost axis, still packed (a view of the
        words), or None when that axis is the packed one (rows would split words)."""
        lead = self.axes[0]
        if lead == self.amap.packed_axis:
            return None
        ax = self.amap.stored_axes.index(lead)
        idx = (slice(None),) * ax + (slice(start, stop),)
        sizes = dict(self.sizes)
        sizes[lead] = len(range(*slice(start, stop).indices(self.sizes[lead])))
        return PackedCodes(self.words[idx], self.amap, self.axes, sizes, signed=self.signed, flip=self.flip)

    # -- conversions ---------------------------------------------------------------------------
    def unpack(self) -> np.ndarray:
        """The codes as an array: logical shape, int8 (signed) or uint8, C-contiguous."""
        amap, words = self.amap, self.words
        if tuple(amap.stored_axes) != tuple(self.axes):
            # transpose the packed words (b/8 bytes per code), never the unpacked codes
            logical = AxisMap(self.axes, packed_axis=amap.packed_axis, bits=amap.bits, container=amap.container,
                              order=amap.order, packing=amap.packing)
            moved = PackedCodes(words, amap, self.axes, self.sizes, signed=False).to_stored(logical, self.axes)
            if moved is not None:
                amap, words = logical, moved
        raw = amap.to_logical(words, self.axes, self.sizes, signed=self.signed, flip=self.flip)
        return np.ascontiguousarray(raw)

    def logical_words(self) -> np.ndarray | None:
        """Words with stored dims in logical order, packed along the last logical axis, or None.

        The row-major form every blocked kernel reads: ``(..., out, packed in)``. ``None`` when
        the codes are not packed along the innermost logical axis or the in-word order is not
        the identity.
        """
        target = AxisMap(self.axes, packed_axis=self.axes[-1], bits=self.bits, container=self.amap.container,
                         packing=self.amap.packing)
        return self.to_stored(target, self.axes)

    def _movable(self, target: AxisMap) -> bool:
        """``target`` packs the same bits along the same logical axis into words of the same width,
        with the same in-word order (and, for widths that straddle words, the same packing)."""
        s = self.amap
        if (target.packed_axis != s.packed_axis or target.bits != s.bits or target.word_bits != s.word_bits
                or _order_of(target) != _order_of(s) or set(target.stored_axes) != set(s.stored_axes)):
            return False
        return not (s.word_bits % s.bits and target.packing != s.packing)  # straddling widths: same bit layout

    def equal_stored(self, target: AxisMap, axes: Sequence[str], words: np.ndarray) -> bool | None:
        """Whether ``words`` equal ``self.to_stored(target, axes)`` bit for bit, decided without
        materialising the moved words, or None when that shortcut does not apply (the caller
        compares ``to_stored``'s result itself).

        Applies when the move is a plain 2-D transpose of the words (no domain flip): then it is
        :func:`equal_transposed` of the stored words and ``words``. A shape or word-size mismatch
        is False.
        """
        if self.flip or self.words.ndim != 2 or not self._movable(target):
            return None
        perm = [self.amap.stored_axes.index(a) for a in target.stored_axes]
        if perm != [1, 0]:
            return None
        return equal_transposed(self.words, np.asarray(words))

    def to_stored(self, target: AxisMap, axes: Sequence[str]) -> np.ndarray | None:
        """The words ``target.to_stored(self.unpack(), axes)`` would produce, or None.

        Computed from the words (a blocked transpose at most, plus an XOR of every field's top
        bit when the domain was shifted) when ``target`` packs the same bits along the same
        logical axis into words of the same width, with the same in-word order and (for widths
        that straddle words) the same packing; otherwise ``None`` and the caller unpacks.
        """
        s = self.amap
        if not self._movable(target):
            return None
        words = self.words
        perm = [s.stored_axes.index(a) for a in target.stored_axes]
        if perm != list(range(len(perm))):
            if words.ndim == 2:
                words = transpose_2d(words)
            else:
                words = np.ascontiguousarray(np.transpose(words, perm))
        else:
            words = np.array(words, copy=True) if self.flip else np.ascontiguousarray(words)
        if self.flip:
            if not _word_aligned(s):
                return None
            words = words.view(_CONTAINERS[s.container])
            if not words.flags.writeable:
                words = words.copy()
            per_word = s.word_bits // s.bits
            top = 1 << (s.bits - 1)
            full = sum(top << (k * s.bits) for k in range(per_word))
            words ^= words.dtype.type(full)
            n = self.sizes[s.packed_axis]
            tail = n % per_word
            if tail:  # padding fields of the last word stay zero
                order = _order_of(s) or tuple(range(per_word))
                keep = sum(top << (k * s.bits) for k, e in enumerate(order) if e >= tail)
                ax = target.stored_axes.index(s.packed_axis)
                idx = (slice(None),) * ax + (-1,)
                words[idx] ^= words.dtype.type(keep)
        container = _SIGNED_VIEW.get(target.container, _CONTAINERS[target.container])
        return words.view(container) if words.dtype != container else words
