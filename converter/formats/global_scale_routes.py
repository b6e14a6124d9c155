"""Which weight-only FP4 targets hold a tensor's global scale exactly: the routes a refusal hint may name.

Each FP4 format with a global scale fixes its direction (:data:`converter.scheme.GLOBAL_SCALE_DIRECTIONS`):
compressed-tensors' ``weight_global_scale`` divides, GGUF NVFP4's ``<name>.scale`` multiplies (as ModelOpt's
``weight_scale_2``, which is W4A4 and needs an ``input_scale`` besides), MLX nvfp4's ``global_scale`` is the tensor
amax. A global scale moves to another direction only when an exactly equal value exists
(:func:`converter.global_scales.equivalent_global_scale`); a hint names only the targets where it does, so following
it does not end in the same refusal.
"""

from __future__ import annotations

from typing import Iterable

from converter.global_scales import equivalent_global_scale
from converter.tensor import Checkpoint

__all__ = ["WEIGHT_ONLY_DIRECTIONS", "exact_targets", "exact_targets_text", "global_scales_of"]

#: ``--to`` name -> the direction of its global scale (weight-only FP4 targets that need no activation scale).
WEIGHT_ONLY_DIRECTIONS = {"compressed-tensors": "divisor", "gguf": "multiplier", "mlx": "amax"}


def global_scales_of(ckpt: Checkpoint) -> list:
    """Every quantized tensor's global scale value (tensors read; only on a refusal's path)."""
    return [ckpt[s.name].global_scale for s in ckpt.specs()
            if s.kind == "quantized" and s.scheme is not None and s.scheme.global_scale is not None]


def exact_targets(direction: str | None, scale_dtype: str, global_scales: Iterable = (), *,
                  exclude: str = "") -> list[str]:
    """``--to`` names (of :data:`WEIGHT_ONLY_DIRECTIONS`, but ``exclude``) that hold the global scales exactly:
    the target of the source's own ``direction`` (or every target without a global scale), and a target of another
    direction when each value of ``global_scales`` (every one of the checkpoint's: :func:`global_scales_of`) has an
    exact equivalent there; with no values given, only the source's own direction is named."""
    values = list(global_scales)
    out = []
    for to, dst in WEIGHT_ONLY_DIRECTIONS.items():
        if to == exclude:
            continue
        if direction is None or direction == dst or (values and all(
                equivalent_global_scale(g, direction, dst, scale_dtype) is not None for g in values)):
            out.append(to)
    return out


def exact_targets_text(direction: str | None, scale_dtype: str, global_scales: Iterable = (), *,
                       exclude: str = "") -> str:
    """``"--to gguf or --to mlx keeps the codes and scales exactly"`` (empty when none does)."""
    names = exact_targets(direction, scale_dtype, global_scales, exclude=exclude)
    if not names:
        return ""
    return " or ".join(f"--to {n}" for n in names) + " keeps the codes and scales exactly"
