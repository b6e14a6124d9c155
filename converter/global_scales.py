"""Re-expressing an NVFP4 global scale in another direction, exactly or not at all.

A global scale read in one convention (:data:`converter.scheme.GLOBAL_SCALE_DIRECTIONS`) can be
written in another only when every group scale decodes to the same float32 effective scale both
ways. Whether it does is not argued from a formula: :func:`equivalent_global_scale` derives the
candidate value, then checks :func:`converter.values.effective_scales` bit for bit on every finite
value the group-scale dtype can hold (256 E4M3 codes), so "exact" means proven.

Which pairs are exact (from the formulas; the check decides each case):

- ``amax`` -> ``multiplier``: always (MLX's ``s * fp32(g / 2688)`` is ``s * w`` with ``w = fp32(g / 2688)``).
- ``divisor`` <-> ``multiplier``: when ``g`` is a power of two (``s / g == s * (1 / g)``); the
  compressed-tensors default ``448 * 6 / amax`` rarely is (936.0 on the real SmolLM2 down_proj).
- ``multiplier`` -> ``amax``: when some float32 ``g'`` has ``fp32(g' / 2688) == w``.
"""

from __future__ import annotations

import numpy as np

from converter.codebooks import ELEMENTS
from converter.dtypes import float_dtype
from converter.scheme import AMAX_DENOMINATOR, GLOBAL_SCALE_DIRECTIONS
from converter.values import effective_scales


def _all_scales(scale_dtype: str) -> np.ndarray:
    """Every finite value of the group-scale dtype (all 256 bytes for an 8-bit float), float32."""
    if scale_dtype == "F8_E4M3":
        v = np.asarray(ELEMENTS["e4m3"].values, dtype=np.float32)
    else:
        np_dtype = float_dtype(scale_dtype)
        width = np.dtype(np_dtype).itemsize
        if width != 1:  # wider scale dtypes: a spread of values incl. extremes (not exhaustive)
            v = np.geomspace(1e-30, 1e30, 4097, dtype=np.float32).astype(np_dtype).astype(np.float32)
            v = np.concatenate([v, -v])
        else:
            v = np.arange(256, dtype=np.uint8).view(np_dtype).astype(np.float32)
    return v[np.isfinite(v)]


def _candidate(g: np.float32, src: str, dst: str) -> np.float32 | None:
    d = np.float32(AMAX_DENOMINATOR)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        multiplier = {"multiplier": g, "divisor": np.float32(1) / g, "amax": g / d}[src]
        out = {"multiplier": multiplier, "divisor": np.float32(1) / multiplier, "amax": multiplier * d}[dst]
    out = np.float32(out)
    return out if np.isfinite(out) and out != 0 else None


def equivalent_global_scale(g, src: str, dst: str, scale_dtype: str = "F8_E4M3") -> np.ndarray | None:
    """The global scale that gives, in direction ``dst``, the same effective scales as ``g`` in ``src``.

    Parameters
    ----------
    g : float32 scalar (shape ``()``), the stored global scale.
    src, dst : directions, :data:`converter.scheme.GLOBAL_SCALE_DIRECTIONS`.
    scale_dtype : storage dtype of the group scales (``F8_E4M3`` for NVFP4).

    Returns
    -------
    ndarray of float32, shape ``()``, when every finite group scale ``s`` of ``scale_dtype`` gives a
    bit-identical float32 effective scale both ways; ``None`` when no such value exists (the write
    must then requantize or refuse). ``g`` itself when ``src == dst``.
    """
    if src not in GLOBAL_SCALE_DIRECTIONS or dst not in GLOBAL_SCALE_DIRECTIONS:
        raise ValueError(f"unknown direction {src!r} -> {dst!r}")
    g = np.float32(g)
    if src == dst:
        return np.array(g, dtype=np.float32)
    cand = _candidate(g, src, dst)
    if cand is None or not np.isfinite(g):
        return None
    s = _all_scales(scale_dtype)
    a = effective_scales(s, np.float32(g), src)
    b = effective_scales(s, cand, dst)
    same = np.array_equal(a.view(np.uint32), b.view(np.uint32))
    return np.array(cand, dtype=np.float32) if same else None
