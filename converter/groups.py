"""Group maps: which elements share one scale (and zero point).

Granularities (no ``group_size = -1`` sentinel; compressed-tensors' ``strategy`` and GPTQ's
``group_size`` are translated at the reader boundary):

- ``tensor``: one scale for the whole matrix (one per expert for stacked tensors).
- ``channel``: one scale per index along ``axis`` (``"out"``: per row / output channel;
  ``"in"``: per column).
- ``group``: groups of ``group_size`` consecutive elements along ``axis``, separately for every
  index of the other axes (``axis="in"`` is the usual per-group scheme). The final group may be
  partial (``ceil(n / group_size)`` groups, all counted). With ``g_idx`` (GPTQ act-order), element
  ``i`` along ``axis`` belongs to group ``g_idx[i]`` instead of ``i // group_size``
  (AutoGPTQ ``GPTQ.fasterquant``; FORMATS.md section 1.5).
- ``flat_block``: blocks of ``group_size`` over the row-major flattened tensor, straddling rows
  (bitsandbytes 4-bit, FORMATS.md section 6.2).
- ``block``: 2-D tiles with an extent per named axis, e.g. ``{"out": 128, "in": 128}`` (DeepSeek-V3
  ``weight_block_size``, compressed-tensors ``block_structure``): ``ceil(n / extent)`` blocks along
  each tiled axis, the last one partial when the extent does not divide the axis (all counted),
  separately for every expert. An axis the block does not name is covered whole.

A parameter array (scales, zero points) has the *parameter shape*: the logical shape with the
group axis replaced by the number of groups, and collapsed axes replaced by 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping, Sequence

import numpy as np

from converter.errors import LayoutError
from converter.layout import EXPERT, check_axes


#: Largest group size accepted (int32 index arithmetic; far beyond any real checkpoint's axis).
MAX_GROUP_SIZE = 2**31 - 1

class Granularity(str, Enum):
    """How elements share quantization parameters."""

    TENSOR = "tensor"
    CHANNEL = "channel"
    GROUP = "group"
    FLAT_BLOCK = "flat_block"
    BLOCK = "block"


@dataclass(frozen=True, eq=False)
class GroupMap:
    """Which elements share a scale.

    Parameters
    ----------
    granularity : Granularity
    axis : str, optional
        ``channel``: the axis with one scale per index. ``group``: the axis groups run along.
        ``None`` for ``tensor`` and ``flat_block``.
    group_size : int, optional
        Elements per group (``group`` and ``flat_block`` only).
    g_idx : ndarray of int32, shape ``(n_axis,)``, optional
        Group of each index along ``axis`` (``group`` only); ``None`` means ``i // group_size``.
    block : tuple of (axis, extent) pairs, optional
        ``block`` only: the tile extent along each tiled axis (``(("out", 128), ("in", 128))``).

    Raises
    ------
    LayoutError
        On inconsistent fields (checked at construction; ``g_idx`` range checked by
        :meth:`check_shape`).
    """

    granularity: Granularity
    axis: str | None = None
    group_size: int | None = None
    g_idx: np.ndarray | None = None
    block: tuple[tuple[str, int], ...] | None = None

    def __post_init__(self) -> None:
        g = Granularity(self.granularity)
        object.__setattr__(self, "granularity", g)
        self._check_block(g)
        if g in (Granularity.CHANNEL, Granularity.GROUP):
            if self.axis is None:
                raise LayoutError(f"{g.value} granularity needs an axis", field="group_map.axis")
            if self.axis == EXPERT:
                raise LayoutError("the expert axis cannot carry groups", field="group_map.axis", found=self.axis)
        elif self.axis is not None:
            raise LayoutError(f"{g.value} granularity takes no axis", field="group_map.axis", found=self.axis)
        if g in (Granularity.GROUP, Granularity.FLAT_BLOCK):
            if not isinstance(self.group_size, (int, np.integer)) or not 1 <= self.group_size <= MAX_GROUP_SIZE:
                raise LayoutError("group size must be a positive integer", field="group_map.group_size",
                                  expected=f"1 ..= {MAX_GROUP_SIZE}", found=self.group_size)
        elif self.group_size is not None:
            raise LayoutError(f"{g.value} granularity takes no group size", field="group_map.group_size",
                              found=self.group_size)
        if self.g_idx is not None:
            if g is not Granularity.GROUP:
                raise LayoutError("g_idx needs group granularity", field="g_idx", found=g.value)
            gi = np.asarray(self.g_idx)
            if gi.ndim != 1 or gi.dtype.kind not in "iu":
                raise LayoutError("g_idx must be a 1-D integer array", field="g_idx",
                                  found=f"{gi.dtype} {list(gi.shape)}")
            object.__setattr__(self, "g_idx", gi.astype(np.int32, copy=False))

    def _check_block(self, g: Granularity) -> None:
        if g is not Granularity.BLOCK:
            if self.block is not None:
                raise LayoutError(f"{g.value} granularity takes no block extents", field="group_map.block",
                                  found=self.block)
            return
        if self.block is None or self.axis is not None or self.group_size is not None:
            raise LayoutError("block granularity takes block extents only", field="group_map.block",
                              expected="((axis, extent), ...)", found=self.block)
        try:
            pairs = tuple((str(a), int(n)) for a, n in (self.block.items() if isinstance(self.block, Mapping)
                                                       else self.block))
        except (TypeError, ValueError):
            raise LayoutError("block extents must be (axis, extent) pairs", field="group_map.block",
                              found=repr(self.block)) from None
        names = [a for a, _ in pairs]
        if not pairs or len(set(names)) != len(names) or not set(names) <= {"out", "in"}:
            raise LayoutError("block extents name each of out / in at most once", field="group_map.block",
                              expected="out and/or in", found=names)
        bad = [n for _, n in pairs if not 1 <= n <= MAX_GROUP_SIZE]
        if bad:
            raise LayoutError("block extent must be a positive integer", field="group_map.block",
                              expected=f"1 ..= {MAX_GROUP_SIZE}", found=bad[0])
        object.__setattr__(self, "block", tuple(sorted(pairs, key=lambda p: ("out", "in").index(p[0]))))

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def per_tensor(cls) -> "GroupMap":
        return cls(Granularity.TENSOR)

    @classmethod
    def per_channel(cls, axis: str = "out") -> "GroupMap":
        return cls(Granularity.CHANNEL, axis=axis)

    @classmethod
    def per_group(cls, group_size: int, axis: str = "in", g_idx: np.ndarray | None = None) -> "GroupMap":
        return cls(Granularity.GROUP, axis=axis, group_size=int(group_size), g_idx=g_idx)

    @classmethod
    def per_block(cls, out: int | None = 128, in_: int | None = 128) -> "GroupMap":
        """Tiles of ``out`` x ``in_`` elements (either may be None: that axis is covered whole)."""
        pairs = tuple((a, int(n)) for a, n in (("out", out), ("in", in_)) if n is not None)
        return cls(Granularity.BLOCK, block=pairs)

    def extent(self, axis: str) -> int | None:
        """``block``: the tile extent along ``axis`` (None when the block covers it whole)."""
        return dict(self.block or ()).get(axis)

    # -- shapes -------------------------------------------------------------------------------
    def n_groups(self, shape: Sequence[int], axes: Sequence[str]) -> int:
        """Number of groups along the group axis (``ceil(n / group_size)``; partial tail counted)."""
        if self.granularity is Granularity.GROUP:
            n = int(shape[list(axes).index(self.axis)])
            if self.g_idx is not None and self.g_idx.size:
                return max(-(-n // self.group_size), int(self.g_idx.max()) + 1)
            return -(-n // self.group_size)
        if self.granularity is Granularity.FLAT_BLOCK:
            return -(-int(np.prod(shape, dtype=object)) // self.group_size)
        if self.granularity is Granularity.BLOCK:  # blocks per matrix (per expert)
            sizes = dict(zip(axes, shape))
            count = 1
            for a, b in self.block:
                count *= -(-int(sizes[a]) // b)
            return count
        return 1

    def partial_blocks(self, shape: Sequence[int], axes: Sequence[str]) -> int:
        """``block``: blocks per matrix that are partial along some tiled axis (0 when every extent
        divides its axis); other granularities: 1 when the final group is partial, else 0."""
        if self.granularity is not Granularity.BLOCK:
            return int(bool(self.partial_tail(shape, axes)))
        sizes = dict(zip(axes, shape))
        full = 1
        for a, b in self.block:
            full *= int(sizes[a]) // b
        return self.n_groups(shape, axes) - full

    def partial_tail(self, shape: Sequence[int], axes: Sequence[str]) -> int:
        """Length of a partial final group, 0 when every group is full.

        ``block``: the partial extent along the last tiled axis (``in``) only, 0 when ``in`` divides
        even if ``out`` leaves partial blocks; count partial blocks with :meth:`partial_blocks`."""
        if self.granularity is Granularity.GROUP:
            n = int(shape[list(axes).index(self.axis)])
        elif self.granularity is Granularity.FLAT_BLOCK:
            n = int(np.prod(shape, dtype=object))
        elif self.granularity is Granularity.BLOCK:  # the partial extent along ``in`` (or ``out``)
            sizes = dict(zip(axes, shape))
            a, b = self.block[-1]
            return int(sizes[a]) % b
        else:
            return 0
        return n % self.group_size

    def param_shape(self, shape: Sequence[int], axes: Sequence[str]) -> tuple[int, ...]:
        """Shape of the scale / zero-point array for a tensor of logical ``shape``."""
        axes = tuple(axes)
        g = self.granularity
        if g is Granularity.FLAT_BLOCK:
            return (self.n_groups(shape, axes),)
        out = []
        for a, n in zip(axes, shape):
            if a == EXPERT:
                out.append(int(n))
            elif g is Granularity.TENSOR:
                out.append(1)
            elif g is Granularity.CHANNEL:
                out.append(int(n) if a == self.axis else 1)
            elif g is Granularity.BLOCK:
                b = self.extent(a)
                out.append(1 if b is None else -(-int(n) // b))
            else:  # GROUP: every other axis keeps its size, the group axis has n_groups
                out.append(self.n_groups(shape, axes) if a == self.axis else int(n))
        return tuple(out)

    def row_local(self, axes: Sequence[str], *, g_idx_ok: bool = False) -> bool:
        """True when a block of rows of a 2-D ``(out, in)`` tensor carries its own parameters.

        Groups per tensor (one parameter set, shared by every block), per ``out`` channel, or
        along ``in`` in column order: row-blocked kernels (dequantize, quantize, error sums) and
        row slicing apply. ``g_idx_ok``: groups along ``in`` with an act-order ``g_idx`` count too
        (slicing rows keeps the ``g_idx``; the blocked kernels need column order).
        """
        if tuple(axes) != ("out", "in"):
            return False
        g = self.granularity
        if g is Granularity.TENSOR:
            return True
        if g is Granularity.CHANNEL:
            return self.axis == "out"
        if g is Granularity.GROUP:
            return self.axis == "in" and (g_idx_ok or self.g_idx is None)
        return False

    def group_count(self, shape: Sequence[int], axes: Sequence[str]) -> int:
        """Total number of parameter sets (elements of the parameter array)."""
        return int(np.prod(self.param_shape(shape, axes), dtype=np.int64))

    def check_shape(self, shape: Sequence[int], axes: Sequence[str]) -> None:
        """Check the map fits a tensor: axis present, ``g_idx`` length and range.

        Raises
        ------
        LayoutError
        """
        axes = check_axes(axes)
        if self.axis is not None and self.axis not in axes:
            raise LayoutError("group axis is not an axis of the tensor", field="group_map.axis",
                              expected=list(axes), found=self.axis)
        for a, _ in self.block or ():
            if a not in axes:
                raise LayoutError("block axis is not an axis of the tensor", field="group_map.block",
                                  expected=list(axes), found=a)
        if self.g_idx is not None:
            n = int(shape[axes.index(self.axis)])
            if self.g_idx.shape != (n,):
                raise LayoutError("g_idx length differs from the group axis", field="g_idx",
                                  expected=n, found=self.g_idx.shape[0])
            if n and (int(self.g_idx.min()) < 0):
                raise LayoutError("g_idx has negative group indices", field="g_idx",
                                  expected=">= 0", found=int(self.g_idx.min()))

    def is_trivial_g_idx(self, n: int) -> bool:
        """True when ``g_idx`` is absent or equals ``arange(n) // group_size``."""
        if self.g_idx is None:
            return True
        return bool(np.array_equal(self.g_idx, np.arange(n, dtype=np.int64) // self.group_size))

    # -- element <-> parameter ----------------------------------------------------------------
    def expand(self, params: np.ndarray, shape: Sequence[int], axes: Sequence[str]) -> np.ndarray:
        """Broadcast a parameter array to element shape (read-only view where possible).

        Parameters
        ----------
        params : ndarray, shape ``param_shape(shape, axes)``
        shape, axes : logical shape and axis names of the tensor.

        Returns
        -------
        ndarray, shape ``shape``, dtype of ``params``.
        """
        axes = tuple(axes)
        shape = tuple(int(s) for s in shape)
        g = self.granularity
        if g is Granularity.FLAT_BLOCK:
            n = int(np.prod(shape, dtype=np.int64))
            # never repeat past the element count (a hostile group size must not allocate)
            return np.repeat(params, min(self.group_size, max(n, 1)))[:n].reshape(shape)
        if g is Granularity.BLOCK:  # full size: for whole-tensor fallbacks only (see as_row_groups)
            for a, b in self.block:
                ax = axes.index(a)
                params = np.repeat(params, min(b, max(shape[ax], 1)), axis=ax)[(slice(None),) * ax
                                                                                 + (slice(0, shape[ax]),)]
            return np.broadcast_to(params, shape)
        if g is Granularity.GROUP:
            ax = axes.index(self.axis)
            if self.g_idx is not None:
                return np.take(params, self.g_idx, axis=ax)
            rep = np.repeat(params, min(self.group_size, max(shape[ax], 1)), axis=ax)
            return rep.take(np.arange(shape[ax]), axis=ax) if rep.shape[ax] != shape[ax] else rep
        return np.broadcast_to(params, shape)

    def reduce(self, values: np.ndarray, ufunc: np.ufunc, axes: Sequence[str]) -> np.ndarray:
        """Reduce element values to the parameter shape with ``ufunc`` (``np.maximum`` ...).

        Groups follow ``g_idx`` when present (act-order membership, not column order).

        Returns
        -------
        ndarray, shape ``param_shape(values.shape, axes)``.
        """
        axes = tuple(axes)
        g = self.granularity
        if g is Granularity.FLAT_BLOCK:
            flat = values.reshape(-1)
            return ufunc.reduceat(flat, np.arange(0, flat.size, self.group_size)) if flat.size else flat[:0]
        if g is Granularity.BLOCK:
            out = values
            if values.size == 0:
                return np.zeros(self.param_shape(values.shape, axes), dtype=values.dtype)
            for i, a in enumerate(axes):
                b = self.extent(a)
                if b is not None:
                    out = ufunc.reduceat(out, np.arange(0, out.shape[i], b), axis=i)
                elif a != EXPERT:
                    out = ufunc.reduce(out, axis=i, keepdims=True)
            return out
        keep = [i for i, a in enumerate(axes) if a == EXPERT or (g is Granularity.CHANNEL and a == self.axis)
                or (g is Granularity.GROUP and a != self.axis)]
        if g is Granularity.GROUP:
            ax = axes.index(self.axis)
            n = values.shape[ax]
            if n == 0:
                return np.zeros(self.param_shape(values.shape, axes), dtype=values.dtype)
            if self.g_idx is None:
                return ufunc.reduceat(values, np.arange(0, n, self.group_size), axis=ax)
            order = np.argsort(self.g_idx, kind="stable")
            counts = np.bincount(self.g_idx, minlength=self.n_groups(values.shape, axes))
            if (counts == 0).any():
                raise LayoutError("g_idx leaves a group without members", field="g_idx",
                                  found=f"empty groups {np.flatnonzero(counts == 0)[:8].tolist()}")
            starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
            return ufunc.reduceat(np.take(values, order, axis=ax), starts, axis=ax)
        red = tuple(i for i in range(values.ndim) if i not in keep)
        if values.size == 0:
            return np.zeros(self.param_shape(values.shape, axes), dtype=values.dtype)
        return ufunc.reduce(values, axis=red, keepdims=True)

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self, shape: Sequence[int] | None = None, axes: Sequence[str] | None = None) -> dict[str, Any]:
        """JSON object (``group_map`` in ``schemas/layout.schema.json``); counts added when shape given."""
        obj: dict[str, Any] = {"granularity": self.granularity.value, "axis": self.axis,
                               "group_size": self.group_size, "g_idx": self.g_idx is not None}
        if self.block is not None:
            obj["block"] = dict(self.block)
        if shape is not None and axes is not None:
            obj["n_groups"] = self.n_groups(shape, axes)
            obj["partial_tail"] = self.partial_tail(shape, axes)
            if self.granularity is Granularity.BLOCK:
                obj["partial_blocks"] = self.partial_blocks(shape, axes)
        return obj

    @classmethod
    def from_json(cls, obj: Mapping[str, Any], g_idx: np.ndarray | None = None) -> "GroupMap":
        try:
            block = obj.get("block")
            return cls(Granularity(obj["granularity"]), axis=obj.get("axis"),
                       group_size=obj.get("group_size"), g_idx=g_idx,
                       block=tuple(block.items()) if isinstance(block, Mapping) else block)
        except (KeyError, ValueError, TypeError) as exc:
            if isinstance(exc, LayoutError):
                raise
            raise LayoutError(f"malformed group map: {exc}", field="group_map") from None

    def describe(self) -> str:
        """Short human label: ``tensor``, ``channel(out)``, ``group(in, 128)``, ``+g_idx``."""
        g = self.granularity
        if g is Granularity.TENSOR:
            return "tensor"
        if g is Granularity.CHANNEL:
            return f"channel({self.axis})"
        if g is Granularity.FLAT_BLOCK:
            return f"flat_block({self.group_size})"
        if g is Granularity.BLOCK:
            return "block(" + " x ".join(f"{a} {b}" for a, b in self.block) + ")"
        return f"group({self.axis}, {self.group_size})" + ("+g_idx" if self.g_idx is not None else "")
