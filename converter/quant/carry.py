"""The exact route of a requantization: codes carried, never recomputed (:func:`carry`).

The target grid contains every source value: per-tensor -> per-channel -> per-group and group
``G`` -> group ``G/k`` (scales repeated), symmetric -> asymmetric (zero point = the implicit
centre), more bits with the same scale (codes shifted into the wider domain), a wider scale dtype.
Every result is checked to dequantize to exactly the source's float32 values.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from converter.errors import NotRepresentableError, QuantizationError
from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT
from converter.quant.recode import (as_float_bias, as_integer_zero, as_positive_scales, as_signed, as_unsigned,
                                    exact_cast)
from converter.quant.target import _WIDER, Target, resolve
from converter.rows import Rows
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor


def _regroup_params(params: np.ndarray, src: GroupMap, dst: GroupMap, shape: Sequence[int],
                    axes: Sequence[str]) -> np.ndarray | None:
    """Source parameters on the target groups, or None when some target group holds two values."""
    p32 = params.astype(np.float32) if params.dtype.kind == "f" or params.dtype.name == "bfloat16" \
        else params.astype(np.float64)
    fast = _regroup_along_in(p32, src, dst, shape, axes)
    if fast is not None:  # (hi, lo) from the parameter array itself, without expanding to every element
        hi, lo = fast
        return hi.astype(params.dtype) if np.array_equal(hi, lo) else None
    full = src.expand(p32, shape, axes)
    if full.size == 0:
        return np.zeros(dst.param_shape(shape, axes), dtype=params.dtype)
    hi = dst.reduce(np.ascontiguousarray(full), np.maximum, axes)
    lo = dst.reduce(np.ascontiguousarray(full), np.minimum, axes)
    if not np.array_equal(hi, lo):
        return None
    return hi.astype(params.dtype)


def _regroup_along_in(p: np.ndarray, src: GroupMap, dst: GroupMap, shape: Sequence[int],
                      axes: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-target-group (max, min) of ``(out, n_groups)`` parameters grouped along ``in`` (no ``g_idx``),
    for targets that are unions of whole source groups (per channel, per tensor, or groups of a
    multiple of the source size); None otherwise. Equal to reducing the expanded parameters."""
    if (tuple(axes) != (OUT, IN) or src.granularity is not Granularity.GROUP or src.axis != IN
            or src.g_idx is not None or p.ndim != 2 or p.size == 0):
        return None
    if dst.granularity is Granularity.CHANNEL and dst.axis == OUT:
        return p.max(axis=1, keepdims=True), p.min(axis=1, keepdims=True)
    if dst.granularity is Granularity.TENSOR:
        return p.max(keepdims=True), p.min(keepdims=True)
    if (dst.granularity is Granularity.GROUP and dst.axis == IN and dst.g_idx is None
            and dst.group_size % src.group_size == 0):
        starts = np.arange(0, p.shape[1], dst.group_size // src.group_size)
        return np.maximum.reduceat(p, starts, axis=1), np.minimum.reduceat(p, starts, axis=1)
    if (dst.granularity is Granularity.GROUP and dst.axis == IN and dst.g_idx is None
            and src.group_size % dst.group_size == 0):  # finer target groups: each lies in one source group
        n_dst = dst.n_groups(shape, axes)
        sub = np.repeat(p, src.group_size // dst.group_size, axis=1)[:, :n_dst]
        return sub, sub
    return None


def carry(t: QuantizedTensor, scheme: QuantScheme, group_map: GroupMap) -> QuantizedTensor | None:
    """Carry ``t``'s codes into ``scheme`` / ``group_map`` without recomputing them, or None.

    Returns None when the data do not allow it (parameters differ within a target group, codes
    outside a narrower bit width, scales not representable in a narrower scale dtype, asym -> sym
    with a zero point other than the centre). The
    result dequantizes to exactly the same float32 values (checked; None otherwise).
    """
    s = t.scheme
    if s.codebook is not None or scheme.codebook is not None:
        return None
    if scheme.scale_dtype not in _WIDER.get(s.scale_dtype, {s.scale_dtype}):
        # a narrower scale dtype: carried only when every scale (and float bias) is representable
        dt = scheme.scale_np_dtype
        for field, arr in (("scales", t.scales),
                           ("zero_points", t.zero_points if s.zero_point is ZeroPoint.FLOAT else None)):
            if arr is not None:
                try:
                    exact_cast(arr, dt, tensor=t.name, field=field, nan_exact=False)
                except NotRepresentableError:
                    return None
    shape, axes = t.shape, t.axes
    scales = _regroup_params(t.scales, t.group_map, group_map, shape, axes)
    if scales is None:
        return None
    zps = None
    if t.zero_points is not None:
        zps = _regroup_params(t.zero_points, t.group_map, group_map, shape, axes)
        if zps is None:
            return None
    gm = group_map
    u = QuantizedTensor(t.name, axes, t.packed if t.packed is not None else t.codes, scales, s, gm,
                        zero_points=zps, stored={})  # codes still packed stay packed
    # widen the bit width in the unsigned domain: codes and zero points keep their values,
    # a symmetric centre moves from 2^(b-1) to 2^(B-1)
    u = as_unsigned(u)
    if scheme.bits != s.bits:
        # fewer bits: carried only when every code (and zero point) fits the narrower domain
        shift = (1 << (scheme.bits - 1)) - (1 << (s.bits - 1)) if u.scheme.symmetric else 0
        codes = u.codes.astype(np.int16) + shift
        hi = (1 << scheme.bits) - 1
        if codes.size and (int(codes.min()) < 0 or int(codes.max()) > hi):
            return None
        if u.scheme.zero_point is ZeroPoint.INTEGER and u.zero_points.size and int(u.zero_points.max()) > hi:
            return None
        u = u.replace(codes=codes.astype(np.uint8), scheme=u.scheme.replace(bits=scheme.bits))
    # zero-point family
    if scheme.zero_point is not u.scheme.zero_point:
        if scheme.zero_point is ZeroPoint.INTEGER:
            try:
                u = as_integer_zero(u)
            except NotRepresentableError:  # a float bias that is not an integer zero: not carried exactly
                return None
        elif scheme.zero_point is ZeroPoint.FLOAT:
            u = u.replace(scales=u.scales.astype(scheme.scale_np_dtype),
                          scheme=u.scheme.replace(scale_dtype=scheme.scale_dtype))
            u, exact = as_float_bias(u)
            if not exact:
                return None
        else:  # -> NONE: only when every zero point is the centre
            c = 1 << (scheme.bits - 1)
            if u.scheme.zero_point is not ZeroPoint.INTEGER or not np.all(u.zero_points.astype(np.int64) == c):
                return None
            u = u.replace(zero_points=None, scheme=u.scheme.replace(zero_point=ZeroPoint.NONE))
    # scale dtype (exact widening)
    if u.scheme.scale_dtype != scheme.scale_dtype:
        zp = u.zero_points
        if u.scheme.zero_point is ZeroPoint.FLOAT:
            zp = u.zero_points.astype(np.float32).astype(scheme.scale_np_dtype)
        u = u.replace(scales=u.scales.astype(np.float32).astype(scheme.scale_np_dtype), zero_points=zp,
                      scheme=u.scheme.replace(scale_dtype=scheme.scale_dtype))
    if scheme.signed and not u.scheme.signed:
        u = as_signed(u)
    u = QuantizedTensor(t.name, axes, u.packed if u.packed is not None else u.codes, u.scales, scheme, gm,
                        zero_points=u.zero_points, double_quant=None, stored={})
    if not _same_values(u, t):
        return None
    return u


def _same_values(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """``a.dequantize() == b.dequantize()`` everywhere, compared in row blocks for 2-D tensors."""
    if len(a.shape) != 2 or a.shape != b.shape:
        return bool(np.array_equal(a.dequantize(), b.dequantize()))
    ra, rb = Rows(a), Rows(b)
    step = ra.step
    return all(np.array_equal(ra[r0:r0 + step], rb[r0:r0 + step]) for r0 in range(0, a.shape[0], step))


def exact_regroup(t: QuantizedTensor, target: Target) -> QuantizedTensor:
    """Requantize ``t`` along the exact route (codes carried).

    Raises
    ------
    QuantizationError
        When the data do not allow an exact carry (the plan from :func:`classify` was not exact).
    """
    scheme, gm = resolve(t.scheme, t.group_map, target)
    out = carry(t, scheme, gm)
    if out is None:
        raise QuantizationError("target grid does not contain every source value", tensor=t.name, field="scheme",
                                expected=f"{scheme.describe()} {gm.describe()}",
                                found=f"{t.scheme.describe()} {t.group_map.describe()}",
                                hint="use requantize() (the lossy route)")
    return out


def carry_rounded_zero(t: QuantizedTensor, scheme: QuantScheme, gm: GroupMap) -> QuantizedTensor | None:
    """Float bias -> nearest integer zero ``clip(rint(-b/s))`` with codes and scales carried, or None.

    MLX ``affine_quantize`` derives its bias from an integer zero point before the fp16 cast
    (FORMATS.md section 4.2), so rounding it back keeps the grid up to the bias's fp16 rounding,
    far closer than a fresh min/max requantization.
    """
    s = t.scheme
    sc = t.scales.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.nan_to_num(np.rint(-t.zero_points.astype(np.float32) / sc))
    z = np.clip(z, s.qmin, s.qmax).astype(s.code_dtype)
    t2 = QuantizedTensor(t.name, t.axes, t.codes, t.scales, s.replace(zero_point=ZeroPoint.INTEGER), t.group_map,
                         zero_points=z, stored={})
    return carry(as_positive_scales(t2), scheme, gm)
