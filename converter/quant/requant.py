"""Requantize a QuantizedTensor to another granularity, bit width, symmetry or scale dtype.

Two routes, chosen per tensor *before any data moves* by :func:`classify` (from the spec alone):

- **exact**: the target grid contains every source value, so codes are carried, never recomputed:
  per-tensor -> per-channel -> per-group and group ``G`` -> group ``G/k`` (scales repeated),
  symmetric -> asymmetric (zero point = the implicit centre), more bits with the same scale (codes
  shifted into the wider domain), a wider scale dtype (F16/BF16 -> F32 ...).
- **lossy**: everything else (per-group -> per-channel, group 32 -> 128, fewer bits, asym -> sym,
  a narrower scale dtype, act-order groups to a target without ``g_idx``): unpack, dequantize in
  float32 (bf16/fp16 scales widened first, CASES.md B24/B25), requantize with round-half-to-even
  through :func:`converter.quant.quantize.choose_params` / :func:`~converter.quant.quantize.codes_for`
  (the one RTN quantizer), optionally with an MSE clipping search (:func:`mse_scale_search`).
  A target format that defines its types by a reference quantizer (GGUF: llama.cpp's) supplies a
  :class:`~converter.quant.format_quant.FormatQuantizer`; its ``quantize`` then replaces the RTN
  step for the targets it accepts, on the same float32 source values.

When a lossy plan meets data whose parameters happen to be constant within every target group
(e.g. per-channel -> group -> per-channel), the codes are still carried and the result is exact;
the report shows the plan and the measured error side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from converter.errors import NotRepresentableError, QuantizationError, UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.quant.quantize import _safe_cast_scales, choose_params, codes_for
from converter.quant.recode import as_positive_scales, as_float_bias, exact_cast, as_integer_zero, as_signed, as_unsigned
from converter.vocabulary import GRANULARITIES, SCALE_DTYPE_CHOICES, float_dtype_name, group_map_for

# Scale dtype widenings that are exact for every finite value of the source dtype.
_WIDER = {
    "F16": {"F16", "F32"},
    "BF16": {"BF16", "F32"},
    "F32": {"F32"},
    "F8_E4M3": {"F8_E4M3", "F16", "BF16", "F32"},
    "F8_E8M0": {"F8_E8M0", "BF16", "F32"},
}

#: default clipping ratios of the MSE scale search (1.0 = plain absmax / min-max, tried first).
DEFAULT_RATIOS = tuple(np.round(np.linspace(1.0, 0.5, 26), 4).tolist())


@dataclass(frozen=True)
class Target:
    """A requantization target; ``None`` fields keep the source's value.

    Parameters
    ----------
    bits : int, optional
        Bits per code (2..8).
    granularity : ``"tensor" | "channel" | "group"``, optional
        ``channel`` = one scale per output channel; ``group`` = groups of ``group_size`` along ``in``
        (in column order, no ``g_idx``).
    group_size : int, optional
        Required with ``granularity="group"``.
    symmetric : bool, optional
        True: implicit centre, no zero point. False: integer zero points (a float-bias source
        stays float-bias only when ``symmetric`` is left out).
    scale_dtype : ``"F16" | "BF16" | "F32"``, optional
    scale_search : ``"none" | "mse"``
        ``mse``: per group, the clipping ratio minimising the squared error (lossy path only).
    float_bias : ``"keep" | "integer" | "symmetric"``
        With ``symmetric`` left out, what a float-bias source tensor (GGUF Q4_1, MLX affine) becomes:
        ``keep`` its float biases (targets that store them), ``integer`` zero points (GPTQ, AWQ:
        asymmetric with integer zero points), or ``symmetric`` (compressed-tensors, whose asymmetric
        layout transformers 5.24 cannot load). Set from the target format, not by the user.
    """

    bits: int | None = None
    granularity: str | None = None
    group_size: int | None = None
    symmetric: bool | None = None
    scale_dtype: str | None = None
    scale_search: str = "none"
    float_bias: str = "keep"

    def __post_init__(self) -> None:
        if self.granularity is None and self.group_size is not None:
            object.__setattr__(self, "granularity", "group")
        if self.granularity is not None and self.granularity not in GRANULARITIES:
            raise UnsupportedError("unknown granularity", field="granularity",
                                   expected=list(GRANULARITIES), found=self.granularity)
        if self.granularity == "group" and not self.group_size:
            raise UnsupportedError("group granularity needs a group size", field="--group-size", expected=">= 1",
                                   found=self.group_size)
        if self.granularity in ("tensor", "channel") and self.group_size is not None:
            raise UnsupportedError(f"{self.granularity} granularity takes no group size", field="--group-size",
                                   found=self.group_size)
        if self.bits is not None and not 2 <= int(self.bits) <= 8:
            raise UnsupportedError("bits out of range", field="--bits", expected="2..8", found=self.bits)
        if self.scale_dtype is not None:
            sd = float_dtype_name(self.scale_dtype)
            if sd is None:
                raise UnsupportedError("unknown scale dtype", field="--scale-dtype", expected=list(SCALE_DTYPE_CHOICES),
                                       found=self.scale_dtype)
            object.__setattr__(self, "scale_dtype", sd)
        if self.scale_search not in ("none", "mse"):
            raise UnsupportedError("unknown scale search", field="--scale-search", expected=["none", "mse"],
                                   found=self.scale_search)

    def is_identity(self) -> bool:
        """True when no field asks for a change (only a repack)."""
        return (self.bits is None and self.granularity is None and self.symmetric is None
                and self.scale_dtype is None and self.scale_search == "none")

    def to_json(self) -> dict:
        return {"bits": self.bits, "granularity": self.granularity, "group_size": self.group_size,
                "symmetric": self.symmetric, "scale_dtype": self.scale_dtype, "scale_search": self.scale_search}


def resolve(scheme: QuantScheme, group_map: GroupMap, target: Target, fmt=None) -> tuple[QuantScheme, GroupMap]:
    """The concrete target scheme and group map for a source ``scheme`` / ``group_map``.

    Left-out options keep the source's value. A codebook source (NF4/FP4) has no affine grid: its
    target is a signed symmetric integer scheme unless ``--asym`` is given.
    The lossy route rounds half to even, so the target's ``rounding`` is ``half_even``
    when anything but the layout changes, unless a format quantizer produces the target.
    ``fmt`` (a :class:`converter.quant.format_quant.FormatQuantizer` of the target format) then
    adapts the result to the format's own form, or refuses it (NotRepresentableError naming the
    option).
    """
    bits = int(target.bits) if target.bits is not None else scheme.bits
    sd = target.scale_dtype or scheme.scale_dtype
    if scheme.codebook is not None:
        if target.is_identity():
            return scheme, group_map
        sym = True if target.symmetric is None else target.symmetric
        zp, signed = (ZeroPoint.NONE, True) if sym else (ZeroPoint.INTEGER, False)
    else:
        sym = scheme.symmetric if target.symmetric is None else target.symmetric
        if target.symmetric is None and scheme.zero_point is ZeroPoint.FLOAT and target.float_bias == "symmetric":
            sym = True
        if sym:
            zp, signed = ZeroPoint.NONE, scheme.signed if scheme.symmetric else True
        elif target.symmetric is None and not (target.float_bias == "integer" and scheme.zero_point is ZeroPoint.FLOAT):
            zp, signed = scheme.zero_point, scheme.signed  # asymmetric source kept as is (integer zero or float bias)
        elif scheme.zero_point is ZeroPoint.INTEGER:
            zp, signed = ZeroPoint.INTEGER, scheme.signed
        else:  # --asym: integer zero points (a float-bias source is re-expressed or requantized)
            zp, signed = ZeroPoint.INTEGER, False
    if sd not in ("F16", "BF16", "F32") and (sd != scheme.scale_dtype or bits != scheme.bits):
        sd = "F32"  # an F8 source scale dtype is kept only by an exact carry; requantized scales go to F32
    new = QuantScheme(bits, signed=signed, zero_point=zp, scale_dtype=sd, rounding=scheme.rounding)
    gm = group_map if target.granularity is None else group_map_for(target.granularity, target.group_size)
    if fmt is not None:
        new, gm = fmt.adapt(new, gm, target)
    return new, gm


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


def classify(spec_or_tensor, target: Target, fmt=None) -> tuple[str, str]:
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
    reasons: list[str] = []
    if s.codebook is not None:
        if ts == s and tgm is gm:
            return "exact", "unchanged codebook scheme"
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


# ----------------------------------------------------------------------------------------------
# exact route
# ----------------------------------------------------------------------------------------------

def _regroup_params(params: np.ndarray, src: GroupMap, dst: GroupMap, shape, axes) -> np.ndarray | None:
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


def _regroup_along_in(p: np.ndarray, src: GroupMap, dst: GroupMap, shape, axes):
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


def carry(t, scheme: QuantScheme, group_map: GroupMap):
    """Carry ``t``'s codes into ``scheme`` / ``group_map`` without recomputing them, or None.

    Returns None when the data do not allow it (parameters differ within a target group, codes
    outside a narrower bit width, scales not representable in a narrower scale dtype, asym -> sym
    with a zero point other than the centre). The
    result dequantizes to exactly the same float32 values (checked; None otherwise).
    """
    from converter.tensor import QuantizedTensor
    s = t.scheme
    if s.codebook is not None or scheme.codebook is not None:
        return None
    if scheme.scale_dtype not in _WIDER.get(s.scale_dtype, {s.scale_dtype}):
        # a narrower scale dtype: carried only when every scale (and float bias) is representable
        dt = scheme.scale_np_dtype
        for field, arr in (("scales", t.scales), ("zero_points", t.zero_points if s.zero_point is ZeroPoint.FLOAT else None)):
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


def _same_values(a, b) -> bool:
    """``a.dequantize() == b.dequantize()`` everywhere, compared in row blocks for 2-D tensors."""
    if len(a.shape) != 2 or a.shape != b.shape:
        return bool(np.array_equal(a.dequantize(), b.dequantize()))
    from converter.kernels.blocked import Rows
    ra, rb = Rows(a), Rows(b)
    step = ra.step
    return all(np.array_equal(ra[r0:r0 + step], rb[r0:r0 + step]) for r0 in range(0, a.shape[0], step))


def exact_regroup(t, target: Target):
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


# ----------------------------------------------------------------------------------------------
# lossy route
# ----------------------------------------------------------------------------------------------

def _group_sse(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, zps, scheme: QuantScheme, gm: GroupMap,
               axes) -> np.ndarray:
    """Squared reconstruction error per group (float64, parameter shape)."""
    from converter.quant.quantize import dequantize
    from converter.tensor import QuantizedTensor
    zp = zps.astype(scheme.code_dtype) if zps is not None and scheme.zero_point is ZeroPoint.INTEGER else zps
    t = QuantizedTensor("search", tuple(axes), codes, scales, scheme, gm, zero_points=zp, stored={})
    e = dequantize(t) - x
    return gm.reduce((e.astype(np.float64)) ** 2, np.add, axes)


def mse_scale_search(values: np.ndarray, scheme: QuantScheme, group_map: GroupMap, axes: Sequence[str], *,
                     ratios: Sequence[float] = DEFAULT_RATIOS, tensor: str | None = None):
    """Per group, the clipped scale that minimises the squared error (vectorized over groups).

    For each clipping ratio ``r`` (a loop over the few ratios, never over groups) the absmax
    (symmetric) or min/max (asymmetric) scale is multiplied by ``r``, cast to the scale dtype,
    codes are computed with :func:`codes_for` (clamped, half-to-even) and the squared error of every
    group is compared with the best so far. Ratio 1.0 comes first and wins ties, so the result is
    never worse than plain absmax. Idea from llama.cpp ``make_qx_quants`` (ggml-quants.c), which
    searches a grid of inverse scales around ``nmax / max`` per block.

    Parameters
    ----------
    values : ndarray of float32, logical shape.
    scheme, group_map, axes : the target.
    ratios : clipping ratios in (0, 1].

    Returns
    -------
    scales : ndarray, parameter shape, scheme's scale dtype
    zero_points : ndarray or None (int16 integer zero points or scale-dtype biases)
    info : dict with ``absmax_sse``, ``search_sse`` (float, totals) and ``ratio_hist`` counts.
    """
    x = np.asarray(values, dtype=np.float32)
    base_s, base_z = choose_params(x, scheme, group_map, axes, tensor=tensor)
    s32 = base_s.astype(np.float32)
    if scheme.symmetric:
        lo = None
    else:
        lo = np.minimum(group_map.reduce(x, np.minimum, axes), 0).astype(np.float32)
    best_s, best_z, best_e, best_r = base_s, base_z, None, None
    levels = np.float32((1 << scheme.bits) - 1)
    ratios = [1.0] + [float(r) for r in ratios if float(r) != 1.0]
    for i, r in enumerate(ratios):
        if i == 0:
            sc, zp = base_s, base_z
        else:
            raw = (s32 * np.float32(r)).astype(np.float32)
            raw = np.where(raw > 0, raw, s32)
            sc = _safe_cast_scales(raw, scheme, tensor=tensor)
            zp = None
            if not scheme.symmetric:
                c32 = sc.astype(np.float32)
                with np.errstate(divide="ignore", invalid="ignore"):
                    z = np.clip(np.nan_to_num(np.rint(-lo / c32)), 0, levels)
                if scheme.zero_point is ZeroPoint.INTEGER:
                    zp = (z - np.float32(1 << (scheme.bits - 1)) if scheme.signed else z).astype(np.int16)
                else:
                    zp = (-z * c32).astype(scheme.scale_np_dtype)
        zc = zp.astype(scheme.code_dtype) if zp is not None and scheme.zero_point is ZeroPoint.INTEGER else zp
        codes = codes_for(x, sc, zc, scheme, group_map, axes)
        err = _group_sse(x, codes, sc, zp, scheme, group_map, axes)
        if best_e is None:
            best_e, base_e = err, err
            best_r = np.zeros(err.shape, dtype=np.int16)
            continue
        better = err < best_e
        if better.any():
            best_e = np.where(better, err, best_e)
            best_s = np.where(better, sc, best_s).astype(sc.dtype)
            if zp is not None:
                best_z = np.where(better, zp, best_z).astype(zp.dtype)
            best_r = np.where(better, i, best_r)
    hist = np.bincount(best_r.reshape(-1), minlength=len(ratios))
    info = {"absmax_sse": float(base_e.sum()), "search_sse": float(best_e.sum()),
            "ratios_chosen": {f"{ratios[k]:g}": int(c) for k, c in enumerate(hist) if c}}
    return best_s, best_z, info


def requantize(t, target: Target, *, allow_carry: bool = True, fmt=None):
    """Requantize ``t`` to ``target`` (exact carry when possible, else unpack -> float32 -> RTN).

    Parameters
    ----------
    t : QuantizedTensor (any scheme; bf16/fp16 scales are widened to float32 before arithmetic).
    target : Target
    allow_carry : carry codes whenever the data allow it (also under a lossy plan).
    fmt : FormatQuantizer of the target format, optional. The target is adapted to the format
        (:func:`resolve`); when the data are not carried, the format's own quantizer produces
        the targets it accepts (:func:`converter.quant.format_quant.quantize_with`: from the
        source's float32 dequantized values), unless ``--scale-search mse`` is asked for.

    Returns
    -------
    (QuantizedTensor, info) : info has ``route`` (``"carried"`` | ``"requantized"``), for
        ``--scale-search mse`` the search totals, and ``quantizer`` (the format quantizer's label)
        when one produced the result.

    Raises
    ------
    QuantizationError
        Non-finite source values, or a scale that overflows the target scale dtype (names the
        group; hint: a wider ``--scale-dtype``).
    """
    from converter.tensor import QuantizedTensor
    scheme, gm = resolve(t.scheme, t.group_map, target, fmt)
    if allow_carry and target.scale_search == "none":
        out = carry(t, scheme, gm)
        if out is not None:  # carry() checked the values identical
            return out, {"route": "carried", "_identical": True}
    label = fmt.accepts(scheme, gm, tuple(t.shape), tuple(t.axes)) \
        if fmt is not None and target.scale_search == "none" else None
    if label is not None:  # the format's own quantizer defines this target
        from converter.quant.format_quant import quantize_with
        gm.check_shape(t.shape, t.axes)
        out, info = quantize_with(fmt, t, scheme, gm)
        info["quantizer"] = label
        return out, info
    scheme = scheme.replace(rounding="half_even")
    alt = None
    if (allow_carry and target.scale_search == "none" and t.scheme.zero_point is ZeroPoint.FLOAT
            and scheme.zero_point is ZeroPoint.INTEGER):
        alt = _carry_rounded_zero(t, scheme, gm)
    gm.check_shape(t.shape, t.axes)
    info: dict = {"route": "requantized"}
    from converter.kernels.blocked import Rows, quantize_blocked
    # choose_params + codes_for in cache-sized row blocks (bit-identical), the source dequantized
    # block by block as it goes: the float32 matrix is never held whole
    from converter.quant.error_report import ErrorSums, blocked_applicable
    fast = sums = None
    if target.scale_search != "mse" and len(t.shape) == 2:
        # the error figures are summed inside the same blocks (no second pass over the tensor)
        sums = ErrorSums(*t.shape, gm.granularity.value, gm.group_size) \
            if blocked_applicable(gm, t.axes, t.shape) else None
        fast = quantize_blocked(Rows(t), scheme, gm, t.axes, tensor=t.name, stats=info, compare=sums)
    x = None
    if fast is not None:
        scales, zps, codes = fast
        if sums is not None:
            info["_vs_source"] = sums.figures()  # for tensor_report
    else:
        x = t.dequantize()
        if target.scale_search == "mse":
            scales, zps, search = mse_scale_search(x, scheme, gm, t.axes, tensor=t.name)
            info["scale_search"] = search
        else:
            scales, zps = choose_params(x, scheme, gm, t.axes, tensor=t.name)
        if zps is not None and scheme.zero_point is ZeroPoint.INTEGER:
            zps = zps.astype(scheme.code_dtype)
        codes = codes_for(x, scales, zps, scheme, gm, t.axes)
    out = QuantizedTensor(t.name, t.axes, codes, scales, scheme, gm, zero_points=zps, stored={})
    if fast is None:
        info["_values"] = x  # for the error report (converter.quant.error_report.tensor_report pops it)
        amax = gm.reduce(np.abs(x), np.maximum, t.axes)
        info["degenerate_groups"] = int(np.count_nonzero(amax == 0))
    if alt is not None:
        x = x if x is not None else t.dequantize()
        e_rtn = float(np.sum((out.dequantize() - x).astype(np.float64) ** 2))
        e_alt = float(np.sum((alt.dequantize() - x).astype(np.float64) ** 2))
        if e_alt <= e_rtn:
            info["route"] = "carried"
            info.pop("_vs_source", None)
            info["note"] = "float biases rounded to the nearest integer zero point; codes and scales carried"
            return alt, info
    return out, info


def _carry_rounded_zero(t, scheme: QuantScheme, gm: GroupMap):
    """Float bias -> nearest integer zero ``clip(rint(-b/s))`` with codes and scales carried, or None.

    MLX ``affine_quantize`` derives its bias from an integer zero point before the fp16 cast
    (FORMATS.md section 4.2), so rounding it back keeps the grid up to the bias's fp16 rounding,
    far closer than a fresh min/max requantization.
    """
    from converter.tensor import QuantizedTensor
    s = t.scheme
    sc = t.scales.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.nan_to_num(np.rint(-t.zero_points.astype(np.float32) / sc))
    z = np.clip(z, s.qmin, s.qmax).astype(s.code_dtype)
    t2 = QuantizedTensor(t.name, t.axes, t.codes, t.scales, s.replace(zero_point=ZeroPoint.INTEGER), t.group_map,
                         zero_points=z, stored={})
    return carry(as_positive_scales(t2), scheme, gm)


def target_probe(spec, target: Target, fmt=None):
    """A zero-filled QuantizedTensor with the target's scheme / groups for ``spec`` (shape only;
    ``fmt``: the target format's quantizer, see :func:`resolve`)."""
    from converter.tensor import QuantizedTensor
    gm_src = spec.group_map
    scheme, gm = resolve(spec.scheme, gm_src, target, fmt)
    if spec.act_order and target.granularity is None:
        n = spec.shape[list(spec.axes).index(gm.axis)]
        gm = GroupMap.per_group(gm.group_size, gm.axis, g_idx=np.arange(n, dtype=np.int32) // gm.group_size)
    ps = gm.param_shape(spec.shape, spec.axes)
    zp = None
    if scheme.zero_point is ZeroPoint.INTEGER:
        zp = np.zeros(ps, scheme.code_dtype)
    elif scheme.zero_point is ZeroPoint.FLOAT:
        zp = np.zeros(ps, scheme.scale_np_dtype)
    fill = scheme.center if scheme.codebook is None and not scheme.signed else 0
    return QuantizedTensor(spec.name, tuple(spec.axes), np.full(spec.shape, fill, scheme.code_dtype),
                           np.ones(ps, scheme.scale_np_dtype), scheme, gm, zero_points=zp, stored={})
