"""How each target wants gpt-oss experts arranged: the ``FormatHandler.arrange`` functions of the targets.

- stacked targets (GGUF ``gpt-oss``, mlx-lm ``gpt_oss``): gate and up apart, expert axis kept (:mod:`.stacked`);
- 2-D Linear targets (compressed-tensors): one Linear per expert and projection (:mod:`.linears`);
- the gpt-oss layout itself: fused and interleaved again, from either of the two.

Every function returns its argument unchanged when it holds nothing to rearrange, so a target may call it on
any source. The rearrangements move whole rows of codes and E8M0 bytes (exact; their inverses give back the
same bytes, tests/formats/test_gpt_oss_routes.py).
"""

from __future__ import annotations

from converter.tensor import Checkpoint
from converter.formats.gpt_oss import linears, stacked


def _has_linears(ckpt: Checkpoint) -> bool:
    return any(linears._LINEAR_RE.match(n) for n in ckpt.quantized_names())


def for_stacked(ckpt: Checkpoint) -> Checkpoint:
    """A source with fused gpt-oss experts as stacked ``gate_proj`` / ``up_proj`` / ``down_proj``; per-expert
    Linear weights are stacked first (fused, then split: both exact)."""
    if _has_linears(ckpt):
        ckpt = linears.fused(ckpt)
    return stacked.split(ckpt) if stacked.has_fused(ckpt) else ckpt


def for_linear(ckpt: Checkpoint) -> Checkpoint:
    """A source with gpt-oss experts (fused or stacked) as per-expert Linear weights (``experts.<e>.gate_proj``).
    In memory: :func:`.linears.linear` materialises the tensors."""
    if stacked.has_stacked(ckpt):
        ckpt = stacked.fuse(ckpt)
    return linears.linear(ckpt) if stacked.has_fused(ckpt) else ckpt


def for_gpt_oss(ckpt: Checkpoint) -> Checkpoint:
    """Stacked or per-expert Linear experts fused back into ``gate_up_proj`` / ``down_proj`` (interleaved)."""
    if _has_linears(ckpt):
        ckpt = linears.fused(ckpt)
    return stacked.fuse(ckpt) if stacked.has_stacked(ckpt) else ckpt
