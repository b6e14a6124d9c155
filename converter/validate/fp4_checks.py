"""FP4 checks from the data (E2M1 codes with E4M3 group scales and a global scale, NVFP4; or E8M0
group scales, MXFP4): the global-scale direction, the E8M0 exponent bias, and NaN scale bytes.

**Global-scale direction** (``global-scale-direction``). An NVFP4 tensor stores one float32 global
scale ``g`` whose direction is part of the scheme (:attr:`converter.scheme.QuantScheme.global_scale`:
ModelOpt ``weight_scale_2`` multiplies, compressed-tensors ``weight_global_scale`` divides, MLX's
``global_scale`` is the tensor amax). A writer or reader that takes the wrong one decodes every weight
``g^2`` off (``s * g`` vs ``s / g``), or ``2688`` off between ``amax`` and ``multiplier``. Two facts
of real weights decide it, and both must hold before a finding:

- *Range*: the global scale exists so that the effective group scales ``amax_group / 6`` (about
  1e-4 .. 1e-1 for LLM weights) can be stored as E4M3 values up to 448. An effective scale above
  E4M3's largest value (448, a group amax above 2688) is what no real weight needs; under the wrong
  direction the largest effective scale is ``448 / g_mult`` (2.3e5 on the real samples).
- *Magnitude*: the decoded weights must sit near the ``1 / sqrt(in)`` size their initialisation gave
  them, or near their layer's sibling tensors (the anchors of
  :mod:`converter.validate.scale_direction`, whose limits are used). The real samples sit 0.05 .. 0.98
  decades from it; with the direction flipped, 5.4 .. 5.9 decades.

**E8M0 bias** (``e8m0-bias``). Under compressed-tensors' legacy MXFP4 encoding (0.13.0) the stored
exponent byte is 2 below the OCP one, so a decode under the wrong rule is exactly 4 times off. Which
rule a file follows is the format's business: the format's ``e8m0_rule`` validation hook
(compressed-tensors: :mod:`converter.formats.compressed_tensors.e8m0_rule`, its version rule and its
data check against the dense sibling weights) reports what the version says, what the data say and
what the reader used; a contradiction is a finding.

**NaN scale bytes** (``scale-nonfinite``, FP4 form). E8M0 ``0xFF`` and E4M3 ``0x7F`` / ``0xFF`` are
NaN: every element of that group decodes to NaN. The finding names the tensor, the byte values and
the group indices (scale-array indices: ``[out, group along in]``).

**Nibble order: no reference-free FP4 check, by measurement.** Two E2M1 codes share a byte, and a
byte never straddles a group (16 or 32 elements along ``in``, both even), so reading the nibbles the
other way round permutes elements within their own group: the code histogram, every group's peak
and scale, and the E2M1 magnitude profile of each group are the same multiset. What moves is only
which of two neighbouring columns is which. Measured on the real samples and on the 30 layers of
SmolLM2-135M (``smollm2_135m_instruct_Q4_1.gguf``): the adjacent-magnitude correlation within a byte
and across bytes agree to 0.01-0.04 (q_proj 0.116 / 0.128, down_proj 0.132 / 0.129; the shared group
scale dominates both); the within-pair column detail of q/k/v/gate/up correlates with its siblings,
the input / post-attention norm weights, and the o_proj / down_proj row profiles at -0.88 .. +0.90,
with the sign varying from layer to layer. With two fields per word a swap only flips that sign
(:func:`converter.validate.nibble_order.word_detail`: the detail is negated), so neither the absolute
correlations :mod:`converter.validate.nibble_order` uses nor a signed prior can tell the orders apart
without false alarms. ``validate --reference`` does (``layout-mismatch``, "nibble order reversed",
relative error 0 on the swapped MXFP4 sample).
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from converter.codebooks import ELEMENTS
from converter.scheme import GLOBAL_SCALE_DIRECTIONS
from converter.tensor import QuantizedTensor
from converter.validate.findings import Finding, finding
from converter.validate.float_checks import float_element
from converter.validate.scale_direction import DECADES_GAIN, DECADES_LIMIT, MIN_SIBLINGS, layer_of
from converter.values import effective_scales

#: In E4M3's range, the direction is doubted only for weights this many decades (a factor 100) from
#: their anchor, and named only when another direction brings them at least AMAX_DECADES_GAIN closer:
#: the amax convention differs from the others by 2688 (3.4 decades), the real samples read right sit
#: 0.05 .. 0.98 decades off, read as amax 2.0 .. 3.4.
AMAX_DECADES_LIMIT = 2.0
AMAX_DECADES_GAIN = 1.0

#: E4M3's largest finite value: the range the effective group scales of real weights stay within.
E4M3_MAX = float(ELEMENTS["e4m3"].max_finite)
#: NaN bytes per 8-bit scale dtype (E8M0: OCP MX spec 5.4.1; E4M3 fn: S.1111.111).
NAN_BYTES = {"F8_E8M0": (0xFF,), "F8_E4M3": (0x7F, 0xFF)}
#: Group indices listed in evidence (the count is always complete).
MAX_LISTED = 8


def is_fp4(t: QuantizedTensor) -> bool:
    """True for E2M1 codes (NVFP4 / MXFP4 and every reader of them)."""
    el = float_element(t)
    return el is not None and el.name == "e2m1"


# -- global-scale direction ---------------------------------------------------------------------------
def global_scale_evidence(t: QuantizedTensor) -> dict[str, Any] | None:
    """The effective-scale range under the declared global-scale direction and each other one.

    Returns None unless ``t`` has a global scale. Otherwise ``{"direction", "global_scale",
    "max_effective"`` (largest finite effective group scale, float32 as
    :func:`converter.values.effective_scales` computes it), ``"alternatives": {direction:
    {"max_effective", "factor"}}`` (``factor``: alternative / declared effective scale, the same for
    every group: ``g^2`` or ``1 / g^2`` between multiplier and divisor)``}``.
    """
    d = t.scheme.global_scale
    if d is None or t.global_scale is None:
        return None
    g = np.asarray(t.global_scale, dtype=np.float32)
    s = np.asarray(t.scales).astype(np.float32)
    s = np.abs(s[np.isfinite(s) & (s != 0)])
    if not s.size or not np.isfinite(g) or g == 0:
        return None
    top = np.asarray([s.max()], dtype=np.float32)
    unit = np.ones(1, dtype=np.float32)
    declared = float(effective_scales(top, g, d)[0])
    base = float(effective_scales(unit, g, d)[0])
    alts = {}
    for alt in GLOBAL_SCALE_DIRECTIONS:
        if alt == d:
            continue
        m = float(effective_scales(top, g, alt)[0])
        f = float(effective_scales(unit, g, alt)[0]) / base if base else math.inf
        if math.isfinite(m) and m > 0 and math.isfinite(f) and f > 0:
            alts[alt] = {"max_effective": m, "factor": f}
    return {"direction": d, "global_scale": float(g), "max_effective": declared, "alternatives": alts}


def check_global_scale_direction(evidence: Mapping[str, Mapping[str, Any]],
                                 magnitudes: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
    """``global-scale-direction`` for each tensor whose declared direction gives effective scales beyond
    E4M3's range and weights far from their anchors, or (in range) weights more than
    :data:`AMAX_DECADES_LIMIT` decades off, while another direction fits both (module docstring).

    ``evidence``: name -> :func:`global_scale_evidence`; ``magnitudes``: name ->
    :func:`converter.validate.scale_direction.magnitude` (every float-element tensor: the siblings).
    """
    by_layer: dict[str, list[str]] = {}
    for name in magnitudes:
        by_layer.setdefault(layer_of(name), []).append(name)
    out = []
    for name, ev in evidence.items():
        m = magnitudes.get(name)
        # out of range: effective scales beyond E4M3's (a divisor read as a multiplier: g^2); in range but
        # the weights far off (a multiplier or divisor read as MLX's amax, or back: 2688x = 3.4 decades,
        # which leaves the real samples 2.0 .. 3.4 decades off, while read right they sit 0.05 .. 0.98 off)
        in_range = ev["max_effective"] <= E4M3_MAX
        if m is None or (in_range and abs(m["decades"]) <= AMAX_DECADES_LIMIT):
            continue
        limit, gain = (AMAX_DECADES_LIMIT, AMAX_DECADES_GAIN) if in_range else (DECADES_LIMIT, DECADES_GAIN)
        others = [magnitudes[o]["decades"] for o in by_layer.get(layer_of(name), []) if o != name]
        anchors = {"1/sqrt(in)": 0.0}
        if len(others) >= MIN_SIBLINGS:
            anchors["siblings"] = float(np.median(others))
        best = None
        for alt, a in ev["alternatives"].items():
            if a["max_effective"] > E4M3_MAX:
                continue
            alt_decades = m["decades"] + math.log10(a["factor"])
            for anchor, a0 in anchors.items():
                off, off_alt = abs(m["decades"] - a0), abs(alt_decades - a0)
                if off > limit and off_alt <= off - gain and (best is None or off_alt < best[3]):
                    best = (alt, anchor, a0, off_alt, off, alt_decades, a)
        if best is None:
            continue
        alt, anchor, a0, off_alt, off, alt_decades, a = best
        where = "the typical 1/sqrt(in) size" if anchor != "siblings" else "their layer's other weights"
        scales = (f"effective group scales up to {ev['max_effective']:.4g}, beyond E4M3's {E4M3_MAX:g}, and "
                  if ev["max_effective"] > E4M3_MAX else "")
        out.append(finding(
            "global-scale-direction", name,
            f"read as a {ev['direction']} the global scale {ev['global_scale']:.6g} gives {scales}"
            f"weights {off:.1f} decades from {where}; "
            f"as a {alt} the scales stay within {a['max_effective']:.4g} and the weights {off_alt:.1f} decades "
            f"away: the direction looks wrong (every weight off by {1 / a['factor']:.4g} = g^2 for multiplier vs "
            f"divisor)", direction=ev["direction"], likely_direction=alt, global_scale=ev["global_scale"],
            max_effective_scale=ev["max_effective"], alternative_max_effective_scale=a["max_effective"],
            factor=1 / a["factor"], e4m3_max=E4M3_MAX, anchor=anchor, anchor_decades=round(a0, 3),
            decades=m["decades"], alternative_decades=round(alt_decades, 3), limit=DECADES_LIMIT,
            sibling_decades=sorted(round(o, 3) for o in others)))
    return out


# -- E8M0 bias ----------------------------------------------------------------------------------------
def check_e8m0_rule(ev: Mapping[str, Any] | None) -> list[Finding]:
    """``e8m0-bias`` from the format hook's evidence ``{"rule", "by", "version_rule", "data_rule",
    "evidence", "factor", "tensors"}``: an error when the data contradict the encoding the file declares
    (the bytes follow the other rule: a loader going by the declaration decodes every weight ``factor``
    times off); info when neither the declaration nor the data decide (the rule was assumed)."""
    if not ev:
        return []
    tensors = list(ev.get("tensors") or [])
    first = tensors[0] if tensors else None
    common = {k: ev.get(k) for k in ("rule", "by", "version_rule", "data_rule", "factor")}
    vr, dr = ev.get("version_rule"), ev.get("data_rule")
    if vr is not None and dr is not None and vr != dr:
        return [finding("e8m0-bias", first,
                        f"the file declares the {vr} E8M0 exponent encoding but the decoded magnitudes fit only the "
                        f"{dr} one ({ev.get('evidence')}): under the declared rule every weight of the "
                        f"{len(tensors)} MXFP4 tensor(s) decodes {ev.get('factor', 4)} times off; qckpt decoded "
                        f"with the {ev.get('rule')} rule", tensors=tensors[:MAX_LISTED], count=len(tensors),
                        evidence_text=ev.get("evidence"), **common)]
    if ev.get("by") == "default":
        return [finding("e8m0-bias", first,
                        f"nothing decides the E8M0 exponent encoding ({ev.get('evidence')}): the {ev.get('rule')} "
                        f"rule was assumed; under the other one every weight is {ev.get('factor', 4)} times off",
                        severity="info", tensors=tensors[:MAX_LISTED], count=len(tensors),
                        evidence_text=ev.get("evidence"), **common)]
    return []


# -- NaN scale bytes ----------------------------------------------------------------------------------
def check_nan_scale_bytes(t: QuantizedTensor) -> list[Finding]:
    """``scale-nonfinite`` for FP4 group scales holding a NaN byte (E8M0 0xFF, E4M3 0x7F / 0xFF), naming
    the tensor, the byte values, their count and the first group indices (scale-array indices)."""
    if not is_fp4(t):
        return []
    nan_bytes = NAN_BYTES.get(t.scheme.scale_dtype)
    s = np.asarray(t.scales)
    if nan_bytes is None or s.dtype.itemsize != 1:
        return []
    raw = s.view(np.uint8)
    mask = np.isin(raw, nan_bytes)
    k = int(np.count_nonzero(mask))
    if not k:
        return []
    idx = np.argwhere(mask)[:MAX_LISTED].tolist()
    by_byte = {f"0x{b:02X}": int(np.count_nonzero(raw == b)) for b in nan_bytes if np.any(raw == b)}
    return [finding("scale-nonfinite", t.name,
                    f"{k} of {raw.size} {t.scheme.scale_dtype} group scales are NaN bytes "
                    f"({', '.join(f'{b}: {n}' for b, n in by_byte.items())}); first at group index {idx[0]} "
                    f"({t.group_map.describe()}, scale array {list(raw.shape)}): every element of those groups "
                    f"decodes to NaN", count=k, bytes=by_byte, first_index=idx[0], groups=idx,
                    scale_dtype=t.scheme.scale_dtype, scale_shape=list(raw.shape))]
