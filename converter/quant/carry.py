"""The exact route of a requantization: codes carried, never recomputed (:func:`carry`).

The target grid contains every source value: per-tensor -> per-channel -> per-group and group
``G`` -> group ``G/k`` (scales repeated), symmetric -> asymmetric (zero point = the implicit
centre), more bits with the same scale (codes shifted into the wider domain), a wider scale dtype;
a codebook (FP8 E4M3 ...) with its scales in another dtype; FP8 with power-of-two scales into MX
groups of 32 with E8M0 scales (:func:`as_mx_groups`, MLX ``mxfp8``).
Every result is checked to dequantize to exactly the source's float32 values.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from converter.codebooks import element_of
from converter.dtypes import float_dtype
from converter.errors import NotRepresentableError, QuantizationError
from converter.groups import Granularity, GroupMap
from converter.row_groups import as_row_groups
from converter.layout import EXPERT, IN, OUT
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


def carry(t: QuantizedTensor, scheme: QuantScheme, group_map: GroupMap, *,
          round_bias: bool = False) -> QuantizedTensor | None:
    """Carry ``t``'s codes into ``scheme`` / ``group_map`` without recomputing them, or None.

    Returns None when the data do not allow it (parameters differ within a target group, codes
    outside a narrower bit width, scales not representable in a narrower scale dtype, asym -> sym
    with a zero point other than the centre). The
    result dequantizes to exactly the same float32 values (checked; None otherwise).

    ``round_bias``: an integer zero point -> float bias (GGUF Q4_1's minimum ``m = -z*s``) is carried
    even when the cast of ``-z*s`` to the scale dtype rounds; that result then differs from the source
    by at most half an ulp of each bias (:func:`carry_rounded_bias`), every other step still exact.
    """
    s = t.scheme
    rounded = False  # the float bias -z*s rounded in the scale dtype (round_bias only)
    if s.codebook is not None or scheme.codebook is not None:
        return _carry_codebook(t, scheme, group_map)
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
            if not exact and not round_bias:
                return None
            rounded = not exact
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
    if not rounded and not _same_values(u, t):
        return None
    return u


def carry_rounded_bias(t: QuantizedTensor, scheme: QuantScheme, gm: GroupMap) -> QuantizedTensor | None:
    """Integer zero points -> float biases ``-z*s`` cast to the scale dtype (rounded to nearest), codes and
    scales carried, or None (a step other than the bias cast is not exact, or the target is no float-bias
    scheme).

    GGUF Q4_1 / Q5_1 store ``x = d*q + m`` with an fp16 ``m``: an AWQ / GPTQ / compressed-tensors group
    ``s*(q - z)`` keeps its codes and scale, and only ``m = -z*s`` rounds (at most half an fp16 ulp of
    ``m`` per element), far closer than a fresh min/max requantization.
    """
    if (t.scheme.codebook is not None or t.scheme.zero_point is not ZeroPoint.INTEGER
            or scheme.zero_point is not ZeroPoint.FLOAT or scheme.codebook is not None):
        return None
    return carry(t, scheme, gm, round_bias=True)


def _carry_codebook(t: QuantizedTensor, scheme: QuantScheme, group_map: GroupMap) -> QuantizedTensor | None:
    """The same codebook (an FP8 element, NF4 ...) on the same groups with its scales in another
    dtype, when every scale survives the cast exactly; None otherwise (another codebook, groups or
    an integer target: the lossy route)."""
    s = t.scheme
    if (s.codebook is None or scheme.codebook != s.codebook or group_map is not t.group_map
            or scheme.replace(scale_dtype=s.scale_dtype) != s):
        return None
    try:
        scales = exact_cast(t.scales, scheme.scale_np_dtype, tensor=t.name, field="scales", nan_exact=False)
    except NotRepresentableError:
        return None
    u = t.replace(scales=scales, scheme=scheme, stored={})
    return u if _same_values(u, t) else None


def _expert(t: QuantizedTensor, e: int) -> QuantizedTensor | None:
    """Expert ``e`` of an ``(expert, out, in)`` stack as an ``(out, in)`` tensor (its codes, scales
    and zero points sliced, the same scheme and group map), or None when ``t`` cannot be cut so."""
    if (tuple(t.axes) != (EXPERT, OUT, IN) or t.double_quant is not None
            or t.group_map.granularity is Granularity.FLAT_BLOCK):
        return None
    return QuantizedTensor(t.name, (OUT, IN), t.codes[e], t.scales[e], t.scheme, t.group_map,
                           zero_points=None if t.zero_points is None else t.zero_points[e], stored={})


def _same_values(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """``a.dequantize() == b.dequantize()`` everywhere (NaN equal to NaN: a NaN code decodes to NaN
    under either scale), compared expert by expert and in row blocks, never dequantized whole."""
    if a.shape != b.shape:
        return False
    if len(a.shape) == 3 and a.shape[0] and _expert(a, 0) is not None and _expert(b, 0) is not None:
        return all(_same_values(_expert(a, e), _expert(b, e)) for e in range(a.shape[0]))
    if len(a.shape) != 2:
        return bool(np.array_equal(a.dequantize(), b.dequantize(), equal_nan=True))
    ra, rb = Rows(a), Rows(b)
    step = ra.step
    return all(np.array_equal(ra[r0:r0 + step], rb[r0:r0 + step], equal_nan=True)
               for r0 in range(0, a.shape[0], step))


def nan_code_count(t: QuantizedTensor) -> int:
    """How many codes of a float-element ``t`` decode to NaN (E4M3 0x7F / 0xFF), counted per row of
    the leading axis (no full-size temporary); 0 for other schemes."""
    el = element_of(t.scheme.codebook)
    if el is None:
        return 0
    bad = np.isnan(np.asarray(el.values, dtype=np.float32))
    if not bad.any():
        return 0
    codes = t.codes
    if codes.ndim == 0:
        return int(bad[int(codes)])
    return sum(int(np.count_nonzero(bad[codes[i]])) for i in range(codes.shape[0]))


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


#: E8M0 scales (OCP MX spec section 5.4: an 8-bit exponent, bias 127, 0xFF NaN): 2^-127 .. 2^127.
E8M0_EXPONENTS = (-127, 127)


def _e8m0_refusal(t: QuantizedTensor, bad_index: tuple[int, ...], value: float, why: str) -> NotRepresentableError:
    gm = t.group_map
    idx = list(bad_index)
    where = f"scale at {idx}"
    if gm.granularity is Granularity.BLOCK:
        lead = idx[:-2]
        bo, bi = gm.extent(OUT), gm.extent(IN)
        n_out, n_in = (int(v) for v in t.shape[-2:])
        r = f"rows {idx[-2] * bo}-{min(n_out, (idx[-2] + 1) * bo) - 1}" if bo is not None else "all rows"
        c = f"columns {idx[-1] * bi}-{min(n_in, (idx[-1] + 1) * bi) - 1}" if bi is not None else "all columns"
        where = f"block {idx[-2:]}" + (f" of expert {lead[0]}" if lead else "") + f" ({r}, {c})"
    return NotRepresentableError(f"scales are not all powers of two: an E8M0 (mxfp8) scale cannot hold {why}",
                                 tensor=t.name, field="scales", expected="2^k, k in -127..127",
                                 found=f"{value!r} at {where}",
                                 hint="requantize instead (e.g. --group-size 32 --bits 8, or another --to format)")


def as_mx_groups(t: QuantizedTensor, group_size: int = 32) -> QuantizedTensor:
    """Carry an FP8 E4M3 tensor whose scales are powers of two into MX groups: ``group_size``
    consecutive elements along ``in`` per E8M0 scale (MLX ``mxfp8``: ``mlx/ops.cpp``
    ``fp_quantize``, groups of 32, E8M0 scales, E4M3 codes; OCP MX spec v1.0 section 5).

    Codes are untouched; each group takes the scale of the tile (block, row or tensor) it lies in,
    which it lies in whole when ``group_size`` divides the tile's ``in`` extent (a 128-wide block
    covers four groups; partial edge blocks are fine when ``group_size`` divides ``in``). Checked:
    the result dequantizes to exactly the source's float32 values.

    Parameters
    ----------
    t : QuantizedTensor, an 8-bit float-element scheme (E4M3), axes ``(out, in)`` or
        ``(expert, out, in)``; granularity tensor, channel(out), groups along ``in`` of a multiple of
        ``group_size`` (no ``g_idx``), or 2-D block with an ``in`` extent a multiple of it (or whole).
    group_size : elements per MX group (32).

    Returns
    -------
    QuantizedTensor
        Scheme ``QuantScheme(8, False, scale_dtype="F8_E8M0", codebook=t.scheme.codebook)``,
        ``GroupMap.per_group(group_size, "in")``, scales ``(..., out, in / group_size)``.

    Raises
    ------
    NotRepresentableError
        ``in`` not a multiple of ``group_size``, tiles that straddle groups, or a scale that is not
        a power of two in 2^-127..2^127 (names the first offending block and its value; hint:
        requantize).
    """
    s, gm = t.scheme, t.group_map
    if s.codebook is None or s.bits != 8 or tuple(t.axes[-2:]) != (OUT, IN) or len(t.axes) not in (2, 3):
        raise NotRepresentableError("MX groups carry an 8-bit float element of an (out, in) matrix", tensor=t.name,
                                    field="scheme", expected="e4m3 float on (out, in) or (expert, out, in)",
                                    found=f"{s.describe()} on {list(t.axes)}")
    n_in = int(t.shape[-1])
    if n_in % group_size:
        raise NotRepresentableError(f"in_features is not a multiple of the MX group size {group_size}", tensor=t.name,
                                    field="shape", expected=f"in % {group_size} == 0", found=n_in,
                                    hint="keep the source format, or requantize")
    g = gm.granularity
    span = {Granularity.TENSOR: None, Granularity.CHANNEL: None, Granularity.BLOCK: gm.extent(IN),
            Granularity.GROUP: gm.group_size}.get(g, -1)
    if (span == -1 or (g is Granularity.CHANNEL and gm.axis != OUT) or (g is Granularity.GROUP and
                                                                        (gm.axis != IN or gm.g_idx is not None))
            or (span is not None and span % group_size)):
        raise NotRepresentableError(f"scales do not stay constant over groups of {group_size} along in",
                                    tensor=t.name, field="group_map",
                                    expected=f"tensor, channel(out), group(in, k*{group_size}) or block with in "
                                             f"extent k*{group_size}", found=gm.describe())
    s64 = t.scales.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        mant, exp = np.frexp(s64)
    ok = np.isfinite(s64) & (mant == 0.5) & (exp - 1 >= E8M0_EXPONENTS[0]) & (exp - 1 <= E8M0_EXPONENTS[1])
    if not ok.all():
        i = tuple(int(v) for v in np.unravel_index(int(np.argmin(ok)), ok.shape))
        v = float(s64[i])
        why = "a value that is not a power of two" if np.isfinite(v) and v > 0 and mant[i] != 0.5 else \
            "a value outside 2^-127..2^127, zero, negative or non-finite"
        raise _e8m0_refusal(t, i, v, why)
    e8 = t.scales.astype(np.float32).astype(float_dtype("F8_E8M0"))
    n_groups = n_in // group_size

    def per_row(params: np.ndarray, shape) -> np.ndarray:
        """``(out, n_groups)`` scales of one matrix from its parameters."""
        if g is Granularity.BLOCK:
            _, rows = as_row_groups(gm, params, shape, (OUT, IN))
        else:
            rows = np.broadcast_to(params, (shape[0], params.shape[-1]))
        rep = n_groups if span is None else span // group_size
        return np.repeat(rows, rep, axis=1)[:, :n_groups]
    if len(t.axes) == 2:
        scales = per_row(e8, t.shape)
    else:
        scales = np.stack([per_row(e8[e], t.shape[1:]) for e in range(t.shape[0])]) if t.shape[0] else \
            np.zeros((0, t.shape[1], n_groups), dtype=e8.dtype)
    scheme = QuantScheme(8, False, scale_dtype="F8_E8M0", codebook=s.codebook)
    out = QuantizedTensor(t.name, t.axes, t.packed if t.packed is not None else t.codes,
                          np.ascontiguousarray(scales), scheme, GroupMap.per_group(group_size, IN), stored={})
    if not _same_values(out, t):  # (cannot happen for powers of two; the claim is checked, not assumed)
        nans = nan_code_count(t)
        raise NotRepresentableError("MX groups would change values", tensor=t.name, field="scales",
                                    found=f"{nans} NaN codes (compared as equal)" if nans else None,
                                    hint="requantize instead")
    return out
