"""Checks against a float reference checkpoint (``qckpt validate --reference FLOAT_CKPT``).

Per quantized tensor ``W`` with a same-named, same-shaped reference ``W_ref``:

- the weight error of the declared decode, as a relative RMS ``||W - W_ref|| / ||W_ref||`` and in
  quantization steps ``rms(W - W_ref) / rms(step)`` (a right decode of a range-fitting quantizer
  sits near ``1/sqrt(12) = 0.29`` steps; clipping adds a little);
- ``dequant(W) @ x`` against ``W_ref @ x`` for a small seeded random batch ``x`` (``in x 8``,
  float32), before anyone runs a large multiply;
- every alternative interpretation (:mod:`converter.validate.interpretations`): if one matches
  the reference clearly better than the declared one, the finding ``layout-mismatch`` names it.

Thresholds (calibrated on ``sample_checkpoints/`` against ``minilm_fp16.safetensors``, where the
declared decodes sit at 0.14-0.34 steps and the closest alternative has at least 1.55 times the
declared relative error): ``layout-mismatch`` when an alternative's relative error is below
:data:`ALT_RATIO` times the declared one; otherwise ``reference-mismatch`` above
:data:`STEP_LIMIT` steps or a matmul error above :data:`MATMUL_FACTOR` times the weight-noise
prediction ``(rms step / sqrt(12)) / rms(W_ref)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.rows import pieces
from converter.tensor import QuantizedTensor
from converter.values import with_effective_scales
from converter.validate.findings import Finding, finding
from converter.validate.float_checks import float_element
from converter.validate.interpretations import lazy_alternatives

STEP_LIMIT = 0.5
ALT_RATIO = 0.5
MATMUL_FACTOR = 2.0
MATMUL_FLOOR = 0.02
BATCH = 8
SEED = 20240607


def float_steps(values) -> np.ndarray:
    """Per code of a float element: the mean gap to its neighbouring finite values (one-sided at the
    ends; NaN / inf codes 0): the local rounding step, ``2^(e - mantissa bits)`` for a normal value."""
    v = np.asarray(values, dtype=np.float64)
    levels = np.unique(v[np.isfinite(v)])
    out = np.zeros(v.shape, dtype=np.float64)
    for c in np.flatnonzero(np.isfinite(v)):
        k = int(np.searchsorted(levels, v[c]))
        gaps = [levels[j + 1] - levels[j] for j in (k - 1, k) if 0 <= j < len(levels) - 1]
        out[c] = float(np.mean(gaps)) if gaps else 0.0
    return out


def step_rms(t: QuantizedTensor) -> float:
    """RMS of the quantization step per element: the scale (integer grids); scale x the local gap of
    each element's code (float elements, whose steps grow with the magnitude: a right decode then sits
    near 0.29 steps, 0.295 on the real FP8 samples); scale x median codebook gap (other codebooks)."""
    el = float_element(t)
    if el is not None:  # piece by piece (experts, row blocks): no full-size step or scale array
        table = float_steps(el.values).astype(np.float32)
        total = 0.0
        for p in pieces(t):
            steps = table[p.codes]
            steps *= np.abs(p.group_map.expand(p.scales.astype(np.float32), p.shape, p.axes))
            total += float(np.sum(np.square(steps, dtype=np.float64)))
        return float(np.sqrt(total / t.numel)) if t.numel else 0.0
    s = np.abs(t.group_map.expand(t.scales.astype(np.float32), t.shape, t.axes)).astype(np.float64)
    if t.scheme.codebook is not None:
        cb = np.unique(np.asarray(t.scheme.codebook, dtype=np.float64))
        cb = cb[np.isfinite(cb)]
        s = s * (float(np.median(np.diff(cb))) if cb.size > 1 else 1.0)
    return float(np.sqrt(np.mean(s * s))) if s.size else 0.0


#: Elements per chunk of the sums below (float64 temporaries of about 8 MB).
CHUNK = 1 << 20


def _chunks(*arrays: np.ndarray):
    """Aligned flat chunks of :data:`CHUNK` elements of same-shaped arrays (views where the arrays are contiguous)."""
    flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    n = flat[0].size
    for i in range(0, n, CHUNK):
        yield tuple(f[i:i + CHUNK] for f in flat)


def _sumsq(x: np.ndarray) -> float:
    """``sum(x^2)`` in float64, chunk by chunk."""
    total = 0.0
    for (c,) in _chunks(x):
        c64 = c.astype(np.float64)
        total += float(np.dot(c64, c64))
    return total


def _norm(x: np.ndarray) -> float:
    return float(np.sqrt(_sumsq(x))) if np.size(x) else 0.0


def _diff_sumsq(a: np.ndarray, ref: np.ndarray) -> float:
    """``sum((a - ref)^2)``: the difference in float32, squares summed in float64, chunk by chunk (no full-size
    difference array)."""
    total = 0.0
    for ca, cr in _chunks(a, ref):
        d = np.subtract(ca, cr, dtype=np.float32).astype(np.float64)
        total += float(np.dot(d, d))
    return total


def _rel(a: np.ndarray, ref: np.ndarray, ref_norm: float | None = None) -> float:
    """``||a - ref|| / ||ref||`` (float32 difference, float64 accumulation)."""
    d = float(np.sqrt(_diff_sumsq(a, ref))) if np.size(a) else 0.0
    n = _norm(ref) if ref_norm is None else ref_norm
    return d / n if n else (0.0 if d == 0 else float("inf"))


def _error_stats(deq: np.ndarray, ref32: np.ndarray) -> tuple[float, float, float]:
    """``(rms, max |error|, mean square of ref)`` of ``deq - ref`` (differences in float64), chunk by chunk."""
    sq = mx = rsq = 0.0
    for cd, cr in _chunks(deq, ref32):
        r64 = cr.astype(np.float64)
        e = cd.astype(np.float64) - r64
        sq += float(np.dot(e, e))
        mx = max(mx, float(np.max(np.abs(e))))
        rsq += float(np.dot(r64, r64))
    n = deq.size
    return (float(np.sqrt(sq / n)), mx, rsq / n) if n else (0.0, 0.0, 0.0)


def compare(t: QuantizedTensor, ref: np.ndarray) -> tuple[list[Finding], dict[str, Any]]:
    """Findings and statistics of ``t`` against the float reference ``ref`` (same logical shape).

    A global scale (NVFP4) is folded into the group scales first (:func:`converter.values.with_effective_scales`):
    steps, the matmul prediction and every alternative are then in the decoded values' units.
    """
    t = with_effective_scales(t)
    ref32 = np.asarray(ref, dtype=np.float32)
    ref_norm = _norm(ref32)
    deq = t.dequantize()
    rms, max_err, ref_ms = _error_stats(deq, ref32)  # chunked: no float64 copy of the tensor
    step = step_rms(t)
    steps = rms / step if step else (0.0 if rms == 0 else float("inf"))
    rel = _rel(deq, ref32, ref_norm)
    stats: dict[str, Any] = {"rel_rms": rel, "rms_steps": steps, "max_abs_error": max_err}
    findings: list[Finding] = []
    if t.codes.ndim == 2:
        rng = np.random.default_rng(SEED)
        x = rng.standard_normal((t.shape[1], BATCH)).astype(np.float32)
        x64 = x.astype(np.float64)
        rows = max(1, CHUNK // max(1, t.shape[1]))
        y_ref = np.concatenate([ref32[r:r + rows].astype(np.float64) @ x64 for r in range(0, t.shape[0], rows)]) \
            if t.shape[0] else np.zeros((0, BATCH))
        mm = _rel(deq @ x, y_ref)
        stats["matmul_rel_error"] = mm
        ref_rms = float(np.sqrt(ref_ms))
        predicted = (step / np.sqrt(12.0)) / ref_rms if ref_rms else 0.0
        stats["matmul_predicted"] = predicted
        mm_limit = max(MATMUL_FLOOR, MATMUL_FACTOR * predicted)
    else:
        mm, mm_limit = None, None
    del deq  # the alternatives are compared one at a time, without the declared decode beside them
    alts = {name: _rel(make(), ref32, ref_norm) for name, make in lazy_alternatives(t).items()}
    stats["alternatives_rel_rms"] = {k: round(v, 4) for k, v in alts.items()}
    best = min(alts.items(), key=lambda kv: kv[1]) if alts else None
    if best is not None and best[1] < ALT_RATIO * rel:
        findings.append(finding("layout-mismatch", t.name,
                                f"'{best[0]}' reproduces the reference (relative error {best[1]:.3g}) far better than "
                                f"the declared interpretation ({rel:.3g}): the stored arrays are laid out differently "
                                f"than declared", declared_rel_rms=rel, declared_rms_steps=steps,
                                best_alternative=best[0],
                                alternative_rel_rms=best[1], alternatives=stats["alternatives_rel_rms"]))
    elif steps > STEP_LIMIT or (mm is not None and mm > mm_limit):
        findings.append(finding("reference-mismatch", t.name,
                                f"the dequantized weights differ from the reference by {steps:.2f} quantization steps "
                                f"RMS (relative {rel:.3g}); dequant(W) @ x differs by "
                                f"{mm if mm is not None else 0:.3g} "
                                f"relative: the decode is wrong", rms_steps=steps, step_limit=STEP_LIMIT, rel_rms=rel,
                                matmul_rel_error=mm, matmul_limit=mm_limit, best_alternative=best[0] if best else None,
                                alternative_rel_rms=best[1] if best else None))
    return findings, stats
