"""Cutting a logical tensor along its outermost axis (rows of an ``(out, in)`` matrix, whole experts of
an ``(expert, out, in)`` stack) without reading it whole: :func:`row_splittable` says whether a
tensor can be cut so, :func:`take_rows` cuts it. The row readers (:mod:`converter.rows`), the read-back
digests and the comparisons stream tensors through these."""

from __future__ import annotations

import dataclasses

import numpy as np

from converter.groups import Granularity
from converter.layout import EXPERT, PackedCodes
from converter.row_groups import as_row_groups
from converter.tensor import DenseTensor, Tensor

__all__ = ["row_splittable", "take_rows"]


def row_splittable(t: Tensor) -> bool:
    """True when :func:`take_rows` can cut ``t`` along its outermost axis without copying it whole:
    a dense tensor with a leading axis, a quantized ``(out, in)`` tensor whose parameters run
    per ``out`` row (or per tensor), or an ``(expert, out, in)`` stack whose groups run along ``in`` (or per
    ``out`` channel), cut into whole experts; in each case with codes that are an array or packed along ``in``."""
    if isinstance(t, DenseTensor):
        return t.data.ndim >= 1
    if t.group_map.granularity is Granularity.BLOCK:  # 2-D: rows as row groups; 3-D: whole experts
        return t.double_quant is None and t.packed is None and t.axes in (("out", "in"), (EXPERT, "out", "in"))
    if t.double_quant is not None:  # K-quant records run per out row: a 2-D tensor's rows cut with them
        return t.axes == ("out", "in") and t.packed is None and t.group_map.row_local(t.axes)
    if t.axes == (EXPERT, "out", "in"):  # whole experts: groups along in (no g_idx) or per out channel
        gm = t.group_map
        if not ((gm.granularity is Granularity.GROUP and gm.axis == "in" and gm.g_idx is None)
                or (gm.granularity is Granularity.CHANNEL and gm.axis == "out")):
            return False
    elif not t.group_map.row_local(t.axes, g_idx_ok=True):
        return False
    return t.packed is None or t.packed.rows(0, 0) is not None


def take_rows(t: Tensor, start: int, stop: int) -> Tensor:
    """Rows ``start:stop`` of the outermost logical axis, as a tensor of the same kind.

    Dense data and packed codes are sliced as views (nothing is read until used); scales and
    zero points are sliced per row (a per-tensor scale is kept); ``g_idx`` runs along ``in`` and
    is kept. A 2-D ``block``-tiled tensor's rows come back grouped per row
    (:func:`converter.groups.as_row_groups`: the same values, any row range); a 3-D one is cut
    into whole experts. Check :func:`row_splittable` first.
    """
    if isinstance(t, DenseTensor):
        return DenseTensor(t.name, t.data[start:stop])
    gm = t.group_map
    if gm.granularity is Granularity.BLOCK:
        codes = t.__dict__["_codes"][start:stop]
        if t.axes[0] == EXPERT:
            return t.replace(codes=codes, scales=t.scales[start:stop],
                             zero_points=None if t.zero_points is None else t.zero_points[start:stop])
        rows = slice(start, stop)
        rg, scales = as_row_groups(gm, t.scales, t.shape, t.axes, rows)
        zp = None if t.zero_points is None else as_row_groups(gm, t.zero_points, t.shape, t.axes, rows)[1]
        return t.replace(codes=codes, group_map=rg, scales=scales, zero_points=zp)
    raw = t.__dict__["_codes"]
    codes = raw.rows(start, stop) if isinstance(raw, PackedCodes) else raw[start:stop]
    per_tensor = t.group_map.granularity is Granularity.TENSOR

    def cut(a: np.ndarray | None) -> np.ndarray | None:
        return a if a is None or per_tensor else a[start:stop]
    dq = t.double_quant
    if dq is not None:  # (out, n_super) / (out, n_groups) records: the same rows
        dq = dataclasses.replace(dq, super_scales=cut(dq.super_scales), sub_scales=cut(dq.sub_scales),
                                 super_mins=cut(dq.super_mins), sub_mins=cut(dq.sub_mins))
        return t.replace(codes=codes, scales=cut(t.scales), zero_points=cut(t.zero_points), double_quant=dq)
    return t.replace(codes=codes, scales=cut(t.scales), zero_points=cut(t.zero_points))
