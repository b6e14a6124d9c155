"""The gpt-oss gate / up interleave: a fused projection's ``out`` rows split into its parts, and fused back exactly.

``GptOssExperts.gate_up_proj`` computes gate and up in one matrix product and separates them by row parity
(transformers 5.24 ``models/gpt_oss/modeling_gpt_oss.py`` line 83, ``_apply_gate``: ``gate, up =
gate_up[..., ::2], gate_up[..., 1::2]``; openai/gpt-oss ``gpt_oss/torch/model.py`` ``swiglu``: ``x_glu, x_linear
= x[..., ::2], x[..., 1::2]``). Logical row ``2j`` of ``gate_up_proj`` (axes ``(expert, out, in)``) is gate row
``j``, row ``2j + 1`` up row ``j``; the bias ``gate_up_proj_bias`` ``[E, 2I]`` interleaves the same way.
llm-compressor de-interleaves the same rows into separate ``gate_proj`` / ``up_proj`` Linear modules
(``modeling/gpt_oss.py`` ``LinearExperts.copy_from_fused_weights``: ``Wi[:, 0::2]`` / ``Wi[:, 1::2]``).

:class:`Interleave` is that fact as data (recorded in ``Checkpoint.metadata["fused"]`` by the reader and in
the spec's notes), so :func:`split` and :func:`fuse` are exact inverses: the codes (still packed: rows are
cut whole, the packed axis is ``in``) and the per-row scales move, nothing is re-encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from converter.errors import LayoutError
from converter.layout import OUT, PackedCodes
from converter.tensor import QuantizedTensor


@dataclass(frozen=True)
class Interleave:
    """Parts fused along ``axis`` by row interleave: part ``k`` holds rows ``k::len(parts)``.

    Attributes
    ----------
    parts : tuple of str
        Module names of the parts, in row order (``("gate_proj", "up_proj")``).
    axis : str
        The logical axis the parts are interleaved along (``out``).
    """

    parts: tuple[str, ...] = ("gate_proj", "up_proj")
    axis: str = OUT

    @property
    def stride(self) -> int:
        return len(self.parts)

    def to_json(self) -> dict[str, Any]:
        return {"layout": "interleaved", "axis": self.axis, "parts": list(self.parts), "stride": self.stride}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Interleave":
        if obj.get("layout") != "interleaved" or not obj.get("parts"):
            raise LayoutError("not an interleave record", field="fused", expected="layout interleaved", found=obj)
        return cls(tuple(obj["parts"]), obj.get("axis", OUT))

    def note(self) -> str:
        names = ", ".join(f"{p} rows {k}::{self.stride}" for k, p in enumerate(self.parts))
        return f"fused along {self.axis}, interleaved: {names} (GptOssExperts._apply_gate)"


#: gpt-oss ``gate_up_proj``.
GATE_UP = Interleave()


def _take(a: np.ndarray, ax: int, k: int, n: int) -> np.ndarray:
    idx = [slice(None)] * a.ndim
    idx[ax] = slice(k, None, n)
    return np.ascontiguousarray(a[tuple(idx)])


def split(t: QuantizedTensor, names: Sequence[str], rec: Interleave = GATE_UP) -> list[QuantizedTensor]:
    """The parts of fused ``t``, named ``names`` (one per ``rec.parts``), each with ``out / stride`` rows.

    Raises
    ------
    LayoutError
        ``rec.axis`` is not an axis of ``t``, its length is not a multiple of the stride, or the scales are
        not per row along it (a per-tensor scale would be shared, not split).
    """
    n = rec.stride
    if len(names) != n:
        raise LayoutError("one name per interleaved part", field="names", expected=n, found=len(names))
    if rec.axis not in t.axes:
        raise LayoutError("interleave axis is not an axis of the tensor", tensor=t.name, field="axis",
                          expected=list(t.axes), found=rec.axis)
    ax = t.axes.index(rec.axis)
    rows = t.shape[ax]
    if rows % n:
        raise LayoutError("fused rows are not a multiple of the interleave stride", tensor=t.name, field="shape",
                          expected=f"{rec.axis} % {n} == 0", found=rows)
    if t.scales.shape[ax] != rows:
        raise LayoutError("scales are not per row along the interleave axis", tensor=t.name, field="scales",
                          expected=f"{rows} along {rec.axis}", found=list(t.scales.shape))
    packed = t.packed
    out = []
    for k, name in enumerate(names):
        if packed is not None and rec.axis != packed.amap.packed_axis:
            wax = packed.amap.stored_axes.index(rec.axis)
            sizes = dict(packed.sizes)
            sizes[rec.axis] = rows // n
            codes: Any = PackedCodes(_take(packed.words, wax, k, n), packed.amap, packed.axes, sizes,
                                     signed=packed.signed, flip=packed.flip)
        else:
            codes = _take(t.codes, ax, k, n)
        zp = None if t.zero_points is None else _take(t.zero_points, ax, k, n)
        out.append(t.replace(name=name, codes=codes, scales=_take(t.scales, ax, k, n), zero_points=zp))
    return out


def fuse(parts: Sequence[QuantizedTensor], name: str, rec: Interleave = GATE_UP) -> QuantizedTensor:
    """The inverse of :func:`split`: ``parts`` (same axes, scheme, group map and shape) interleaved along ``rec.axis``.

    Raises
    ------
    LayoutError
        The parts disagree in axes, shape, scheme or grouping, or are not ``rec.stride`` many.
    """
    n = rec.stride
    if len(parts) != n:
        raise LayoutError("one tensor per interleaved part", tensor=name, field="parts", expected=n, found=len(parts))
    first = parts[0]
    for p in parts[1:]:
        if (p.axes, p.shape, p.scheme, p.group_map.describe()) != (first.axes, first.shape, first.scheme,
                                                                   first.group_map.describe()):
            raise LayoutError("interleaved parts must agree in axes, shape, scheme and grouping", tensor=p.name,
                              field="parts", expected=f"{first.axes} {first.shape} {first.scheme.describe()}",
                              found=f"{p.axes} {p.shape} {p.scheme.describe()}")
        if p.global_scale is not None or p.double_quant is not None:
            raise LayoutError("interleaved parts cannot carry per-tensor scales", tensor=p.name, field="global_scale")
    ax = first.axes.index(rec.axis)

    def weave(arrays: Sequence[np.ndarray], axis: int) -> np.ndarray:
        stacked = np.stack(arrays, axis=axis + 1)
        shape = list(arrays[0].shape)
        shape[axis] *= n
        return np.ascontiguousarray(stacked.reshape(shape))

    packs = [p.packed for p in parts]
    if all(pk is not None and pk.amap == packs[0].amap and pk.axes == packs[0].axes and not pk.flip
           and pk.amap.packed_axis != rec.axis for pk in packs):
        wax = packs[0].amap.stored_axes.index(rec.axis)
        sizes = dict(packs[0].sizes)
        sizes[rec.axis] *= n
        codes: Any = PackedCodes(weave([pk.words for pk in packs], wax), packs[0].amap, packs[0].axes, sizes,
                                 signed=packs[0].signed)
    else:
        codes = weave([p.codes for p in parts], ax)
    zp = None if first.zero_points is None else weave([p.zero_points for p in parts], ax)
    return first.replace(name=name, codes=codes, scales=weave([p.scales for p in parts], ax), zero_points=zp)


def split_rows(a: np.ndarray, axis: int, rec: Interleave = GATE_UP) -> list[np.ndarray]:
    """A dense array (the fused bias ``[E, 2I]``, ``axis`` = -1) split into its interleaved parts."""
    ax = axis % a.ndim
    if a.shape[ax] % rec.stride:
        raise LayoutError("fused rows are not a multiple of the interleave stride", field="shape",
                          expected=f"% {rec.stride} == 0", found=a.shape[ax])
    return [_take(a, ax, k, rec.stride) for k in range(rec.stride)]


def fuse_rows(parts: Sequence[np.ndarray], axis: int, rec: Interleave = GATE_UP) -> np.ndarray:
    """The inverse of :func:`split_rows`."""
    if len(parts) != rec.stride or len({p.shape for p in parts}) != 1:
        raise LayoutError("interleaved dense parts must be stride many, of one shape", field="parts",
                          expected=rec.stride, found=[list(p.shape) for p in parts])
    ax = axis % parts[0].ndim
    stacked = np.stack(parts, axis=ax + 1)
    shape = list(parts[0].shape)
    shape[ax] *= rec.stride
    return np.ascontiguousarray(stacked.reshape(shape))
