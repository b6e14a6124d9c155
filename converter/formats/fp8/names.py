"""The stored names of an FP8 weight's scale and of its activation scale, per producer.

For a Linear module ``<p>`` (weight ``<p>.weight``) and a fused expert parameter ``<x>``
(transformers ``FP8Experts``: ``<x>`` = ``...mlp.experts.gate_up_proj`` / ``down_proj``):

============================ =================================== ====================================
producer                     weight scale (a multiplier)          activation scale (metadata)
============================ =================================== ====================================
DeepSeek-V3 / transformers   ``<p>.weight_scale_inv``             ``<p>.activation_scale``
transformers fused experts   ``<x>_scale_inv``                    ``<x>_activation_scale``
vLLM / AutoFP8 per-tensor    ``<p>.weight_scale``                 ``<p>.input_scale``
Mistral (consolidated)       ``<p>.qscale_weight``                ``<p>.qscale_act``
ComfyUI ``scaled_fp8`` (bare) ``<p>.scale_weight``                 ``<p>.scale_input``
============================ =================================== ====================================

Every weight scale multiplies: ``w = fp8 * scale``. Sources: DeepSeek-V3 ``inference/kernel.py``
``weight_dequant`` (``y = x * s`` per 128x128 block) and ``inference/fp8_cast_bf16.py``; transformers
5.24 ``integrations/finegrained_fp8.py`` ``Fp8Dequantize._dequantize_one`` (``q * s``) and
``quantizers/quantizer_finegrained_fp8.py`` ``update_weight_conversions`` (renames Mistral's
``.qscale_weight`` to ``.weight_scale_inv``: the same multiplier); vLLM ``fp8.py``
(``weight_scale`` per tensor, ``weight_scale_inv`` per block, both multipliers) and its Mistral
consolidated-checkpoint remapping (``.qscale_act`` -> ``.input_scale``, ``.qscale_weight`` ->
``.weight_scale``); transformers' Mistral conversion maps ``qscale_act`` to ``activation_scale``;
ComfyUI ``comfy/ops.py`` ``scaled_fp8_ops`` (``weight * scale_weight``; ``scale_input`` is the
activation scale).
"""

from __future__ import annotations

from converter.formats.activations import ACT_SUFFIXES, EXPERT_ACT
from converter.formats.source import module_prefix

#: weight-scale suffixes after ``<p>.`` (config fp8 checkpoints), in order of precedence.
SCALE_SUFFIXES = ("weight_scale_inv", "qscale_weight", "weight_scale")
#: weight-scale suffixes of a bare FP8 file (no config).
BARE_SCALE_SUFFIXES = ("scale_weight", "weight_scale")
#: fused expert parameter suffix: ``<x>_scale_inv`` (``<x>_activation_scale``: :mod:`converter.formats.activations`).
EXPERT_SCALE = "_scale_inv"
#: ComfyUI's marker tensor of a ``scaled_fp8`` checkpoint (its dtype names the FP8 type).
COMFY_MARKER = "scaled_fp8"


def scale_candidates(weight: str, *, bare: bool = False) -> list[str]:
    """The stored names the weight scale of ``weight`` may have, in order of precedence."""
    if weight.endswith(".weight"):
        p = module_prefix(weight)
        return [f"{p}.{s}" for s in (BARE_SCALE_SUFFIXES if bare else SCALE_SUFFIXES)]
    return [weight + EXPERT_SCALE]


def activation_candidates(weight: str) -> list[str]:
    """The stored names the activation scale of ``weight``'s module may have."""
    if weight.endswith(".weight"):
        p = module_prefix(weight)
        return [f"{p}.{s}" for s in ACT_SUFFIXES]
    return [weight + EXPERT_ACT]


def activation_name(weight: str) -> str:
    """The name a writer gives the activation scale of ``weight``'s module (transformers' spelling:
    ``<p>.activation_scale``, ``<x>_activation_scale``)."""
    return activation_candidates(weight)[0]


def scale_name(weight: str) -> str:
    """The name a writer gives the scale of ``weight`` (transformers' spelling)."""
    return scale_candidates(weight)[0]


def is_scale_name(name: str) -> bool:
    """Whether ``name`` is spelled like the weight scale of a config fp8 checkpoint (a module's or a fused
    expert parameter's)."""
    return name.endswith(EXPERT_SCALE) or any(name.endswith("." + s) for s in SCALE_SUFFIXES)


def weight_of_scale(name: str) -> list[str]:
    """The weight names a scale called ``name`` may belong to (no repeats)."""
    out = []
    for s in SCALE_SUFFIXES:
        if name.endswith("." + s):
            out.append(name[: -len(s)] + "weight")
    if name.endswith(EXPERT_SCALE):
        out.append(name[: -len(EXPERT_SCALE)])
    return list(dict.fromkeys(out))
