"""Scale direction from the data: a divisor read as a multiplier (or the reverse) in float-element weights.

Some formats store the reciprocal of the multiplier (``1 / s``) and some store ``s`` under a name that
says otherwise: DeepSeek-V3's ``weight_scale_inv`` is a multiplier (``w = fp8 * scale_inv``,
``inference/fp8_cast_bf16.py``); compressed-tensors NVFP4 ``weight_global_scale`` is a divisor. A reader
that takes the wrong one decodes ``codebook[q] / s`` instead of ``codebook[q] * s``: every weight is off
by ``1 / s^2``, orders of magnitude for FP8 (``s`` = block amax / 448, about 1e-3 to 1e-2).

The check needs no reference. Linear weights sit near the size their initialisation gave them,
``rms(W) ~ 1 / sqrt(in)`` (LeCun / Kaiming / Xavier ``std = gain / sqrt(fan_in)``), so the magnitude
``a = log10(rms(W) * sqrt(in))`` (decades from that size) is small for real weights. The real samples
(``deepseek_fp8_block_smollm2tiny``, ``ct_fp8_channel_smollm2``) sit at ``a`` = 0.05 .. 0.98 as
declared, and at 5.2 .. 6.4 when their scales are used as divisors. ``scale-direction`` fires when
the declared decode is more than :data:`DECADES_LIMIT` decades off (absolutely, or from the median
of at least two sibling tensors of the same layer) and the reciprocal scales bring it at least
:data:`DECADES_GAIN` decades closer: both are needed, so weights that are merely large or small (and
scales near 1, where both readings agree) never fire.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

import numpy as np

from converter.values import effective_scales

from converter.tensor import QuantizedTensor
from converter.validate.float_checks import float_element, reduce_codes
from converter.validate.findings import Finding, finding

#: Decades between the declared magnitude and its anchor (1 / sqrt(in), or the siblings' median) that are suspicious ...
DECADES_LIMIT = 3.0
#: ... when the reciprocal scales are at least this many decades closer to the anchor.
DECADES_GAIN = 2.0
#: Sibling tensors (same layer) needed besides the tensor for the sibling anchor.
MIN_SIBLINGS = 2

_LAYER = re.compile(r"^(.*?\.(?:layers|layer|h|blocks|block)\.\d+)\.")


def layer_of(name: str) -> str:
    """The layer a weight belongs to (``model.layers.3``), or its module's parent when unnumbered."""
    m = _LAYER.match(name)
    return m.group(1) if m else name.rsplit(".", 2)[0]


def magnitude(t: QuantizedTensor) -> dict[str, Any] | None:
    """Declared and reciprocal-scale magnitudes of a float-element ``t`` (None otherwise, or when it decodes to 0).

    ``rms`` is the RMS of ``codebook[q] * s``, ``rms_reciprocal`` of ``codebook[q] / s`` (per group:
    the sum of ``codebook[q]^2`` times ``s^2`` or ``1 / s^2``; NaN codes, zero and non-finite scales left
    out); ``decades`` / ``decades_reciprocal`` are ``log10(rms * sqrt(in))``.
    """
    el = float_element(t)
    if el is None or t.numel == 0 or "in" not in t.axes:
        return None
    sq = np.nan_to_num(np.square(np.asarray(el.values, dtype=np.float32)), nan=0.0, posinf=0.0)
    per_group = reduce_codes(t, sq, np.add).astype(np.float64)  # in row blocks: no full-size temporary
    # the effective group scales (an NVFP4 global scale applied in its direction), as the decode uses them
    s = effective_scales(t.scales, t.global_scale, t.scheme.global_scale).astype(np.float64)
    ok = np.isfinite(s) & (s != 0)
    s2 = np.where(ok, s * s, 1.0)
    decl = float(np.sum(np.where(ok, per_group * s2, 0.0)))
    recip = float(np.sum(np.where(ok, per_group / s2, 0.0)))
    if decl <= 0 or recip <= 0:
        return None
    n_in = int(t.shape[t.axes.index("in")])
    rms, rms_r = math.sqrt(decl / t.numel), math.sqrt(recip / t.numel)
    return {"rms": rms, "rms_reciprocal": rms_r, "in": n_in,
            "decades": round(math.log10(rms * math.sqrt(n_in)), 3),
            "decades_reciprocal": round(math.log10(rms_r * math.sqrt(n_in)), 3)}


def check_scale_direction(magnitudes: Mapping[str, Mapping[str, Any]]) -> list[Finding]:
    """``scale-direction`` per tensor whose declared magnitude is implausible and whose reciprocal fits
    (module docstring). ``magnitudes``: tensor name -> :func:`magnitude`."""
    by_layer: dict[str, list[str]] = {}
    for name in magnitudes:
        by_layer.setdefault(layer_of(name), []).append(name)
    out = []
    for name, m in magnitudes.items():
        others = [magnitudes[o]["decades"] for o in by_layer[layer_of(name)] if o != name]
        anchors = {"1/sqrt(in)": 0.0}
        if len(others) >= MIN_SIBLINGS:
            anchors["siblings"] = float(np.median(others))
        for anchor, a0 in anchors.items():
            off, off_r = abs(m["decades"] - a0), abs(m["decades_reciprocal"] - a0)
            if off > DECADES_LIMIT and off_r <= off - DECADES_GAIN:
                out.append(finding(
                    "scale-direction", name,
                    f"the weights decode with RMS {m['rms']:.3g}, {off:.1f} decades from "
                    + ("the typical 1/sqrt(in) size" if anchor != "siblings" else "their layer's other weights")
                    + f"; with the scales as divisors they would be {m['rms_reciprocal']:.3g} ({off_r:.1f} decades): "
                      "the scales look inverted (a divisor such as a *_scale_inv or global scale read as a "
                      "multiplier, or the reverse)",
                    anchor=anchor, anchor_decades=round(a0, 3), limit=DECADES_LIMIT, **m,
                    sibling_decades=sorted(round(o, 3) for o in others)))
                break
    return out
