"""Data-driven checks that need no reference: code saturation by grouping, zero offset, scale anomalies
(the in-word nibble order: :mod:`converter.validate.nibble_order`).

Saturation (DESIGN.md section 4, FORMATS.md section 12). A range-fitting quantizer (symmetric
absmax, asymmetric min-max, bitsandbytes absmax blocks) puts at least one code of every group at
the end of its range: ``|q - c| >= 2^(b-1) - 1`` around a centre zero point, ``q = 0`` or
``q = 2^b - 1`` for an asymmetric grid, ``|codebook[q]| = max |codebook|`` for a codebook. The
fraction of groups that contain such a code is therefore close to 1 under the declared grouping;
under a grouping along the other axis, on transposed codes, or with sequential groups instead of a
real ``g_idx``, the saturated codes are scattered and the fraction falls to about ``1 - 1/e`` (one
saturated code per group, placed at random). A checkpoint whose declared grouping saturates
markedly less than an alternative one has its codes or groups on the wrong axis.

Zero offset. Weight matrices are close to zero-mean, so the mean code offset ``mean(q - z)`` (in
code units) is near 0 under the right zero point and near -1 or +1 when the zero points are off
by one (GPTQ v1 read as v2 or the reverse, CASES.md B01/B06).

Thresholds were calibrated on every real checkpoint in ``sample_checkpoints/`` (see
``tests/validate/``): the declared grouping saturates in every group (fraction 1.0) on all of
them, while the alternatives reach 0.11-0.99 (a per-column grouping of a tall 1536 x 384 matrix
still catches a saturated code in most columns). A fault is therefore flagged when the declared
grouping leaves at least :data:`SATURATION_MIN_UNSATURATED` of its groups unsaturated and an
alternative leaves at most :data:`SATURATION_RATIO` times as many: transposed codes of a square
384 x 384 layer leave 8-18 % of the declared groups unsaturated and 0 % of the right ones.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from converter.codebooks import ELEMENTS, element_of
from converter.groups import Granularity, GroupMap
from converter.layout import EXPERT
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor
from converter.validate import code_scans
from converter.validate.findings import Finding, finding
from converter.validate.word_scan import WordScan

#: The declared grouping is suspicious when at least this fraction of its groups lacks a saturated code ...
SATURATION_MIN_UNSATURATED = 0.03
#: ... and an alternative grouping leaves at most this share of that many groups unsaturated.
SATURATION_RATIO = 0.25
#: |mean(q - z)| in code units above which the zero points look off by one.
ZERO_OFFSET_LIMIT = 0.5
#: ... and above this fraction of the codes' spread (std of q - z).
ZERO_OFFSET_RATIO = 0.15
#: Zero scales are an error (scales misread) above this fraction of a tensor's scales, a warning above
#: the next (more all-zero groups than real weights have), info below (an all-zero group, a K-quant
#: sub-block scale llama.cpp quantized to 0: MiniLM output.dense has 1 of 4608).
SCALE_ZERO_ERROR_FRACTION = 0.5
SCALE_ZERO_WARNING_FRACTION = 0.01
#: Fewer groups than this give no statistics worth reporting.
MIN_GROUPS = 16
#: Fewer elements than this give no mean offset worth reporting (standard error std / 32).
MIN_ELEMENTS = 1024


def _other(axis: str, axes: tuple[str, ...]) -> str | None:
    rest = [a for a in axes if a not in (axis, EXPERT)]
    return rest[0] if rest else None


def saturated_mask(t: QuantizedTensor) -> np.ndarray:
    """Boolean mask, logical shape: codes at the end of their group's range (see module docstring)."""
    s = t.scheme
    q = t.codes
    if q.dtype.itemsize == 1:  # one table look-up per code (no int16 copies, no intermediate masks)
        ends, values, use_zero = code_scans.byte_tables(t)
        mask = ends.astype(bool)[q.view(np.uint8)]
        if not use_zero:
            return mask
        z = t.group_map.expand(t.zero_points.astype(np.int16), t.shape, t.axes)
        return mask | ((z == int(s.center)) & (np.abs(values[q.view(np.uint8)] - z) >= (1 << (s.bits - 1)) - 1))
    if s.codebook is not None:  # the largest finite magnitude (E5M2's inf is not a quantizer's code)
        cb = np.abs(np.asarray(s.codebook, dtype=np.float32))
        return np.isin(q, np.flatnonzero(cb == np.max(cb[np.isfinite(cb)])))
    ends = (q == s.qmin) | (q == s.qmax)
    half = (1 << (s.bits - 1)) - 1
    if s.zero_point is ZeroPoint.NONE:
        return ends | (np.abs(q.astype(np.int16) - int(s.center)) >= half)
    if s.zero_point is ZeroPoint.INTEGER:
        z = t.group_map.expand(t.zero_points.astype(np.int16), t.shape, t.axes)
        centred = z == int(s.center)
        return ends | (centred & (np.abs(q.astype(np.int16) - z) >= half))
    return ends


def _fraction(hit: int, n: int) -> float:
    """``hit / n`` (exactly what ``mean`` of ``n`` flags with ``hit`` ones gives), 1.0 for no groups."""
    return hit / n if n else 1.0


def saturation_fraction(mask: np.ndarray, gm: GroupMap, axes: tuple[str, ...]) -> tuple[float, int]:
    """(fraction of groups holding a saturated code, number of groups) under ``gm``."""
    if gm.granularity is Granularity.GROUP and gm.g_idx is None and mask.size:
        # consecutive groups: ``any`` over a reshaped axis (the whole groups) and over the partial tail, the
        # same flags as the reduceat below; 100x faster when the groups run along rows (axis 0)
        ax = tuple(axes).index(gm.axis)
        n_codes, size = mask.shape[ax], gm.group_size
        whole = n_codes // size * size
        head = mask[(slice(None),) * ax + (slice(0, whole),)]
        hit = int(np.count_nonzero(head.reshape(mask.shape[:ax] + (n_codes // size, size) + mask.shape[ax + 1:])
                                   .any(axis=ax + 1)))
        groups = -(-n_codes // size) * (mask.size // n_codes)
        if whole < n_codes:
            hit += int(np.count_nonzero(mask[(slice(None),) * ax + (slice(whole, None),)].any(axis=ax)))
        return _fraction(hit, groups), groups
    per_group = gm.reduce(mask.astype(np.uint8), np.maximum, axes)
    n = int(per_group.size)
    return (float(per_group.mean()) if n else 1.0), n


def alternative_maps(t: QuantizedTensor) -> dict[str, tuple[GroupMap, bool]]:
    """name -> (group map, on the transposed matrix) of the groupings a swapped layout would produce."""
    gm, axes = t.group_map, t.axes
    out: dict[str, tuple[GroupMap, bool]] = {}
    g = gm.granularity
    if g is Granularity.TENSOR or len(axes) < 2:
        return out
    if g is Granularity.GROUP:
        other = _other(gm.axis, axes)
        if other is not None and t.shape[axes.index(other)] >= gm.group_size:
            out[f"groups along {other}"] = (GroupMap.per_group(gm.group_size, other), False)
        if gm.g_idx is not None:
            out["sequential groups (g_idx ignored)"] = (GroupMap.per_group(gm.group_size, gm.axis), False)
    elif g is Granularity.CHANNEL:
        other = _other(gm.axis, axes)
        if other is not None:
            out[f"one scale per {other} index"] = (GroupMap.per_channel(other), False)
    elif g is Granularity.FLAT_BLOCK and len(axes) == 2:
        out["flat blocks over the transposed matrix"] = (gm, True)
    return out


def alternative_groupings(t: QuantizedTensor, mask: np.ndarray | None = None) -> dict[str, tuple[np.ndarray, GroupMap]]:
    """name -> (mask, group map) of the groupings a swapped layout would produce, for saturation.

    ``mask`` is :func:`saturated_mask` of ``t`` when the caller has it already (computed otherwise).
    """
    maps = alternative_maps(t)
    if maps and mask is None:
        mask = saturated_mask(t)
    return {name: (np.ascontiguousarray(mask.T) if transposed else mask, gm)
            for name, (gm, transposed) in maps.items()}


def saturation_profile(t: QuantizedTensor, scan: WordScan | None = None) -> dict[str, Any]:
    """Saturation fractions under the declared grouping and each alternative (``scan``: the counts of
    :func:`converter.validate.word_scan.scan`, taken instead of scanning the codes)."""
    maps = alternative_maps(t)
    if scan is not None:
        counts = dict(scan.saturation)
    else:
        counts = None if any(tr for _, tr in maps.values()) else code_scans.saturation_counts(
            t, {"": t.group_map, **{name: gm for name, (gm, _) in maps.items()}})
    if counts is not None:  # the word scan or the compiled scans: the same integer counts, the same quotients
        hit, n = counts.pop("")
        return {"declared": round(_fraction(hit, n), 4), "groups": n,
                "alternatives": {name: round(_fraction(*c), 4) for name, c in counts.items()}}
    mask = saturated_mask(t)
    declared, n = saturation_fraction(mask, t.group_map, t.axes)
    alts = {}
    for name, (m, gm) in alternative_groupings(t, mask).items():
        alts[name] = round(saturation_fraction(m, gm, t.axes)[0], 4)
    return {"declared": round(declared, 4), "groups": n, "alternatives": alts}


def check_saturation(t: QuantizedTensor, scan: WordScan | None = None) -> tuple[list[Finding], dict[str, Any]]:
    """``axis-swap`` when an alternative grouping saturates markedly more often than the declared one."""
    prof = saturation_profile(t, scan)
    if prof["groups"] < MIN_GROUPS or not prof["alternatives"]:
        return [], prof
    best_name, best = max(prof["alternatives"].items(), key=lambda kv: kv[1])
    unsat, unsat_alt = 1.0 - prof["declared"], 1.0 - best
    if unsat >= SATURATION_MIN_UNSATURATED and unsat_alt <= SATURATION_RATIO * unsat:
        return [finding("axis-swap", t.name,
                        f"codes saturate their range in {prof['declared']:.0%} of the declared "
                        f"{t.group_map.describe()} groups but in {best:.0%} under '{best_name}': the codes or the "
                        f"groups are on the wrong axis", declared_grouping=t.group_map.describe(),
                        declared_saturation=prof["declared"], best_alternative=best_name,
                        alternative_saturation=best, alternatives=prof["alternatives"], groups=prof["groups"])], prof
    return [], prof


def _centred_sums(t: QuantizedTensor) -> tuple[int, int]:
    """``(sum(r), sum(r^2))`` of ``r = q - centre`` over one-byte codes, exact integers."""
    values = code_scans.byte_tables(t)[1].astype(np.int64) - int(t.scheme.center)  # per byte value: r
    counts = code_scans.offset_histogram(t)
    if counts is not None:  # the compiled histogram (fast extra)
        return int(counts @ values), int(counts @ (values * values))
    # sum(q) and sum(q^2) in int64 over 1M-code chunks (q^2 <= 65025 fits 16 bits), then
    # r = q - c: sum(r) = sum(q) - n c, sum(r^2) = sum(q^2) - 2 c sum(q) + n c^2
    flat = t.codes.reshape(-1)
    wide = np.int16 if flat.dtype == np.int8 else np.uint16
    q1 = q2 = 0
    for i in range(0, flat.size, 1 << 20):
        chunk = flat[i:i + (1 << 20)]
        q1 += int(chunk.sum(dtype=np.int64))
        q2 += int(np.multiply(chunk, chunk, dtype=wide).sum(dtype=np.int64))
    c, n = int(t.scheme.center), int(flat.size)
    return q1 - n * c, q2 - 2 * c * q1 + n * c * c


def _offset_sums(t: QuantizedTensor) -> tuple[int, int]:
    """``(sum(q - z), sum((q - z)**2))`` over the codes (``z`` the zero points, or the centre), exact integers."""
    # exact integer sums of r = q - z (and r^2) over row blocks, instead of float64 copies of the
    # whole tensor (8 bytes per code, twice): the mean is the same exact quotient numpy forms
    # (sums of small integers are exact in float64); the spread agrees to rounding
    s = t.scheme
    codes = t.codes
    s1 = s2 = 0
    if s.zero_point is ZeroPoint.NONE or codes.ndim < 2:
        if s.zero_point is ZeroPoint.NONE:
            s1, s2 = _centred_sums(t)
        else:
            r = codes.astype(np.int64) - t.group_map.expand(t.zero_points.astype(np.int64), t.shape, t.axes)
            s1, s2 = int(r.sum()), int((r * r).sum())
    elif (sums := code_scans.offset_sums(t)) is not None:  # the compiled scan (fast extra)
        s1, s2 = sums
    else:
        step = max(1, (1 << 20) // max(1, int(np.prod(codes.shape[1:]))))
        z = t.group_map.expand(t.zero_points.astype(np.int16), t.shape, t.axes) \
            if t.group_map.granularity.value == "tensor" else None
        for r0 in range(0, codes.shape[0], step):
            sub = t.replace(codes=codes[r0:r0 + step],
                            scales=t.scales if z is not None else t.scales[r0:r0 + step],
                            zero_points=t.zero_points if z is not None else t.zero_points[r0:r0 + step])
            zz = z[r0:r0 + step] if z is not None else sub.group_map.expand(sub.zero_points.astype(np.int16),
                                                                            sub.shape, sub.axes)
            r = sub.codes.astype(np.int32) - zz
            s1 += int(r.sum(dtype=np.int64))
            r64 = r.astype(np.int64).reshape(-1)
            s2 += int(r64 @ r64)
    return s1, s2


def zero_offset(t: QuantizedTensor, scan: WordScan | None = None) -> tuple[float, float] | None:
    """(mean, std) of ``q - z`` in code units over the tensor; None for float-bias and codebook schemes
    (``scan``: the sums of :func:`converter.validate.word_scan.scan`, taken instead of scanning the codes)."""
    s = t.scheme
    if s.codebook is not None or s.zero_point is ZeroPoint.FLOAT or not t.numel:
        return None
    n = t.numel
    if scan is not None:
        s1, s2 = scan.offset_sums
    else:
        s1, s2 = _offset_sums(t)
    mean = s1 / n
    var = max(0.0, (s2 - s1 * s1 / n) / n) if n else 0.0
    return float(mean), float(np.sqrt(var))


def check_zero_offset(t: QuantizedTensor,
                      scan: WordScan | None = None) -> tuple[list[Finding], dict[str, float] | None]:
    """``zero-offset`` when the mean code offset is about one step away from the declared zero.

    Both limits must be passed: ``|mean| > ZERO_OFFSET_LIMIT`` code units and ``|mean| / std >
    ZERO_OFFSET_RATIO`` (8-bit grids have so many steps that a real weight mean of -1 step is
    ordinary: the intermediate.dense samples sit at -1.01 steps with a spread of about 20).
    """
    res = zero_offset(t, scan)
    if res is None:
        return [], None
    m, sd = res
    stats = {"mean_code_offset": round(m, 4), "std_code_offset": round(sd, 4)}
    if t.numel < MIN_ELEMENTS or abs(m) <= ZERO_OFFSET_LIMIT or abs(m) <= ZERO_OFFSET_RATIO * sd:
        return [], stats
    kind = "zero points" if t.scheme.zero_point is ZeroPoint.INTEGER else f"implicit centre {t.scheme.center}"
    return [finding("zero-offset", t.name,
                    f"codes sit {m:+.2f} steps from the declared {kind} on average (near-zero-mean weights give "
                    f"about 0): the zero points look off by {round(m):+d}",
                    **stats, limit=ZERO_OFFSET_LIMIT, ratio_limit=ZERO_OFFSET_RATIO,
                    suggested_zero_shift=int(round(m)))], stats


def check_scales(t: QuantizedTensor, *, negative_ok: bool) -> list[Finding]:
    """Scale anomalies: NaN/inf, zero, negative (unless the format allows it), subnormal in the scale dtype."""
    out: list[Finding] = []
    s = np.asarray(t.scales)
    s32 = s.astype(np.float32)
    n = int(s32.size)

    def where(mask: np.ndarray) -> list[int]:
        return [int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape)] if mask.ndim else []

    blocks = t.group_map.granularity is Granularity.BLOCK

    def at(mask: np.ndarray) -> str:  # 2-D blocks: the scale index is the block index, named in the message
        return f" (first at block {where(mask)}, {t.group_map.describe()})" if blocks else ""

    def listed(mask: np.ndarray) -> dict[str, Any]:
        return {"blocks": np.argwhere(mask)[:8].tolist()} if blocks else {}

    bad = ~np.isfinite(s32)
    if bad.any():
        out.append(finding("scale-nonfinite", t.name, f"{int(bad.sum())} of {n} scales are NaN or infinite{at(bad)}",
                           count=int(bad.sum()), first_index=where(bad), first_value=float(s32[bad].flat[0]),
                           scale_dtype=t.scheme.scale_dtype, **listed(bad)))
    zero = s32 == 0
    if zero.any() and t.scheme.scale_dtype != "F8_E8M0":
        if t.double_quant is not None:  # a sub-block scale quantized to 0 (llama.cpp K-quants): lossy, not a fault
            out.append(finding("scale-zero", t.name, f"{int(zero.sum())} of {n} effective scales are zero: "
                               f"{t.double_quant.kind} sub-block scales quantized to 0 (those groups decode to their "
                               f"offset only)", severity="info", count=int(zero.sum()), first_index=where(zero),
                               double_quant=t.double_quant.kind))
        else:
            # a few zero scales are what an absmax quantizer writes for an all-zero group, and what a
            # K-quant sub-block scale quantized to 0 becomes once repacked without its super-block:
            # those groups decode to 0 in every loader. Mostly zero scales mean misread scales.
            k = int(zero.sum())
            many = k > SCALE_ZERO_ERROR_FRACTION * n
            some = k > SCALE_ZERO_WARNING_FRACTION * n
            out.append(finding("scale-zero", t.name, f"{k} of {n} scales are zero{at(zero)}: those groups decode to 0"
                               + ("" if many else " (an all-zero group, or a K-quant sub-block scale quantized to 0 "
                                  "and repacked; wrong only if the source groups were not zero)"),
                               severity=None if many else "warning" if some else "info", count=k,
                               first_index=where(zero), **listed(zero)))
    neg = s32 < 0
    if neg.any() and not negative_ok:
        # s * (q - z) decodes the same in every loader whatever the sign of s, and exact repacks of
        # GGUF (d < 0 when the largest magnitude is negative) or MLX keep their signs: unusual for the
        # format's own quantizers, not a wrong decode. A whole tensor negated looks the same: only a
        # reference tells (--reference: reference-mismatch).
        out.append(finding("scale-negative", t.name, f"{int(neg.sum())} of {n} scales are negative{at(neg)}: the "
                           f"format's own quantizers write positive scales, but s*(q-z) decodes either sign (exact "
                           f"repacks of GGUF or MLX keep theirs); compare against a reference to rule out negated "
                           f"weights",
                           severity="info", count=int(neg.sum()), first_index=where(neg),
                           first_value=float(s32[neg].flat[0]), **listed(neg)))
    try:
        tiny = float(ml_dtypes.finfo(t.scheme.scale_np_dtype).smallest_normal)
    except (ValueError, TypeError):
        tiny = 0.0
    sub = np.isfinite(s32) & (s32 != 0) & (np.abs(s32) < tiny)
    if sub.any():
        # NVFP4's E4M3 group scales (mx.quantize nvfp4 writes amax / 6 directly; ModelOpt and
        # compressed-tensors under a global scale) reach E4M3's subnormal range for small groups by
        # design: exact values every NVFP4 decoder handles, routine output of those tools (35% of the
        # real SmolLM2 v_proj scales under mx.quantize), so info; elsewhere a warning.
        # With a global scale (ModelOpt, compressed-tensors) the group scales are stretched into E4M3's
        # normal range (0 subnormal in the real samples): many subnormal ones there mean a wrong global
        # scale, so only a few (< 1%) stay info (a global scale of exactly 1, as qckpt writes for a
        # source without one, stretches nothing).
        nvfp4 = t.scheme.scale_dtype == "F8_E4M3" and element_of(t.scheme.codebook) is ELEMENTS["e2m1"]
        stretched = t.global_scale is not None and float(t.global_scale) != 1.0  # a global scale of 1 is none
        routine = nvfp4 and (not stretched or sub.sum() < 0.01 * n)
        out.append(finding("scale-subnormal", t.name, f"{int(sub.sum())} of {n} scales are subnormal in "
                           f"{t.scheme.scale_dtype}" + (" (routine for NVFP4 E4M3 group scales of small groups: "
                                                         "exact, decoded by every NVFP4 kernel)" if routine else ""),
                           severity="info" if routine else None, count=int(sub.sum()), first_index=where(sub),
                           smallest_normal=tiny))
    if t.scheme.zero_point is ZeroPoint.FLOAT and t.zero_points is not None:
        zb = ~np.isfinite(np.asarray(t.zero_points, dtype=np.float32))
        if zb.any():
            out.append(finding("zero-range", t.name, f"{int(zb.sum())} float biases are NaN or infinite",
                               count=int(zb.sum()), first_index=where(zb)))
    return out


def check_degenerate(t: QuantizedTensor, scan: WordScan | None = None) -> list[Finding]:
    """``degenerate`` when every element decodes to one value (all-zero codes after a packing bug, B17)
    (``scan``: whether :func:`converter.validate.word_scan.scan` found every code equal, and the first code)."""
    if t.numel < 2:
        return []
    if scan is not None:
        same, first = scan.all_equal, scan.first_code
    else:
        q = t.codes
        same = code_scans.all_codes_equal(t)
        if same is None:  # a differing code in the first 4096 settles it without a full-size comparison
            flat = q.reshape(-1)
            same = bool(np.all(flat[:4096] == flat[0])) and bool(np.all(q == flat[0]))
        first = int(q.flat[0])
    if same:
        return [finding("degenerate", t.name, f"all {t.numel} codes equal {first}: the tensor decodes to "
                        f"one value per group (an empty pack loop, CASES.md B17)", code_value=first,
                        numel=t.numel)]
    return []
