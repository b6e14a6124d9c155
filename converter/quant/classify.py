"""Exact or lossy: the plan of a requantization, decided from the spec alone (:func:`classify`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from converter.codebooks import element_of
from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT
from converter.quant.format_quant import FormatQuantizer
from converter.quant.widen import widens
from converter.quant.target import _WIDER, Target, resolve
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor, TensorSpec


def _refines(src: GroupMap, dst: GroupMap, shape: Sequence[int], axes: Sequence[str]) -> tuple[bool, str]:
    """Whether every target group lies inside one source group (from the group maps and shape)."""
    S, D = src.granularity, dst.granularity
    axes = tuple(axes)

    def one_group_per_row(gm: GroupMap) -> bool:
        return gm.granularity is Granularity.GROUP and gm.axis == IN and gm.g_idx is None and \
            gm.n_groups(shape, axes) == 1

    if src.g_idx is not None or dst.g_idx is not None:
        if dst is src or (dst.g_idx is not None and src.g_idx is not None and dst.group_size == src.group_size
                          and np.array_equal(dst.g_idx, src.g_idx)):
            return True, "same act-order groups"
        return False, "act-order (g_idx) groups regrouped in column order"
    if S is Granularity.TENSOR:
        if D is Granularity.FLAT_BLOCK:
            return True, "per-tensor scale repeated per block"
        return True, "per-tensor scale repeated"
    if S is Granularity.CHANNEL and src.axis == OUT:
        if D is Granularity.CHANNEL and dst.axis == OUT:
            return True, "same per-channel groups"
        if D is Granularity.GROUP and dst.axis == IN:
            return True, "per-channel scale repeated across groups"
        if D is Granularity.TENSOR:
            return False, "per-channel -> per-tensor merges channels"
    if S is Granularity.GROUP and src.axis == IN:
        if D is Granularity.GROUP and dst.axis == IN:
            if src.group_size == dst.group_size:
                return True, "same groups"
            if src.group_size % dst.group_size == 0:
                return True, f"group {src.group_size} -> {dst.group_size}: scales repeated"
            if one_group_per_row(src):
                return True, "one source group per row"
            return False, f"group {src.group_size} -> {dst.group_size} merges or straddles groups"
        if one_group_per_row(src) and D is Granularity.CHANNEL and dst.axis == OUT:
            return True, "one source group per row = per-channel"
        if D is Granularity.CHANNEL:
            return False, "per-group -> per-channel merges groups"
        if D is Granularity.TENSOR:
            return False, "per-group -> per-tensor merges groups"
    if S is D and src.axis == dst.axis and src.group_size == dst.group_size:
        return True, "same groups"
    return False, f"{src.describe()} -> {dst.describe()} regroups"


def classify(spec_or_tensor: "TensorSpec | QuantizedTensor", target: Target,
             fmt: FormatQuantizer | None = None) -> tuple[str, str]:
    """Decide, from the spec alone, whether requantizing to ``target`` is exact or lossy.

    Parameters
    ----------
    spec_or_tensor : TensorSpec or QuantizedTensor (only shape, axes, scheme, group map are read;
        a spec's group map carries no ``g_idx``, ``act_order`` says whether one is stored).
    target : Target
    fmt : FormatQuantizer of the target format, optional (see :func:`resolve`).

    Returns
    -------
    (``"exact"`` | ``"lossy"``, reason)
    """
    s, gm, shape, axes = spec_or_tensor.scheme, spec_or_tensor.group_map, spec_or_tensor.shape, spec_or_tensor.axes
    act = bool(getattr(spec_or_tensor, "act_order", False)) or gm.g_idx is not None
    ts, tgm = resolve(s, gm, target, fmt)
    if act and target.granularity is not None:
        return "lossy", "act-order (g_idx) groups regrouped in column order"
    if target.scale_search == "mse":
        return "lossy", "--scale-search mse recomputes every scale"
    same = fmt.same_type(spec_or_tensor, ts, tgm) if fmt is not None and fmt.same_type is not None else None
    if same is not None:
        return ("exact", "stored in the target type already") if same else \
            ("lossy", "requantized by the target format's own quantizer")
    reasons: list[str] = []
    if target.scale_search == "none" and widens(s, gm, ts, tgm):
        return "exact", (f"{s.describe()} codes widened to {ts.describe()} (every E2M1 value is an E4M3 value), "
                         f"scales carried as {ts.scale_dtype}")
    if ts.codebook is not None and s.codebook is None:  # --fp8: integer codes re-rounded to the element
        return "lossy", f"requantized to {ts.describe()} with absmax scales"
    if s.codebook is not None:
        if ts == s and tgm is gm:
            return "exact", "unchanged codebook scheme"
        if ts.codebook == s.codebook and tgm is gm:  # the same codebook, the scales re-stored
            if ts.scale_dtype in _WIDER.get(s.scale_dtype, {s.scale_dtype}):
                return "exact", f"same {s.describe()} codes, wider scale dtype ({s.scale_dtype} -> {ts.scale_dtype})"
            return "lossy", f"narrower scale dtype ({s.scale_dtype} -> {ts.scale_dtype})"
        if element_of(s.codebook) is not None:  # a float element (E4M3 ...): name it
            return "lossy", f"{s.describe()} (codebook) values are not on an integer grid"
        return "lossy", "codebook (NF4/FP4) values are not on an integer grid"
    if act:
        ok, why = True, "same act-order groups"
    else:
        ok, why = _refines(gm, tgm, shape, axes)
    if not ok:
        return "lossy", why
    reasons.append(why)
    if ts.bits < s.bits:
        return "lossy", f"fewer bits ({s.bits} -> {ts.bits})"
    if ts.bits > s.bits:
        reasons.append(f"more bits ({s.bits} -> {ts.bits}), same scale")
    if ts.scale_dtype not in _WIDER.get(s.scale_dtype, {s.scale_dtype}):
        return "lossy", f"narrower scale dtype ({s.scale_dtype} -> {ts.scale_dtype})"
    if ts.scale_dtype != s.scale_dtype:
        reasons.append(f"wider scale dtype ({s.scale_dtype} -> {ts.scale_dtype})")
    if s.zero_point is not ts.zero_point:
        if ts.zero_point is ZeroPoint.NONE:
            return "lossy", "asym -> sym drops the zero points"
        if s.zero_point is ZeroPoint.FLOAT:
            return "lossy", "float bias -> integer zero point"
        if s.zero_point is ZeroPoint.NONE and ts.zero_point is ZeroPoint.INTEGER:
            reasons.append("sym -> asym: zero point = centre")
        elif ts.zero_point is ZeroPoint.FLOAT:
            if ts.scale_dtype == "F32" and s.scale_dtype in ("F16", "BF16"):
                reasons.append("bias = -z*s exact in F32")
            else:
                return "lossy", f"bias = -z*s may round in {ts.scale_dtype}"
    return "exact", "; ".join(reasons)
