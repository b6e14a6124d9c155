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

from .errors import LayoutError
from .quant.packing import pack_codes, packed_length, unpack_codes

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
                   signed: bool = False) -> np.ndarray:
        """Stored array -> logical array with dims in ``axes`` order (unpacked, transposed).

        Parameters
        ----------
        stored : ndarray, shape ``stored_shape(sizes)``
        axes : logical axis order wanted, e.g. ``("out", "in")``.
        sizes : logical length of each axis (needed to drop packing padding).
        signed : bool
            Sign-extend packed fields (two's complement) into int8.

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
                               layout=self.packing, order=self.order, signed=signed)
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
