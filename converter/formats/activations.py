"""Static activation scales: their stored spellings, which module each belongs to, and the plan that writes
one under a target's spelling.

An activation scale is a dense tensor whose stored role is ``activation_scale``
(:data:`converter.spec.ROLES`): one float per module (per expert for fused expert stacks) that the
runtime divides the input by before casting it to FP8. Its value is never applied to the weight, so
a writer only has to store it under its own target's name and shape, and declare the activations
static in its config. Spellings after ``<p>.`` for a Linear module ``<p>``:

- ``activation_scale``: DeepSeek-V3 / transformers 5.24 FineGrainedFP8 (``FP8Linear.activation_scale``,
  0-dim F32, ``integrations/finegrained_fp8.py``; ``quantizer_finegrained_fp8.py`` ``serialized_names``);
- ``input_scale``: compressed-tensors (``[1]``, ``initialize_qparams``), ModelOpt (0-dim), vLLM / AutoFP8;
- ``qscale_act``: Mistral consolidated checkpoints (vLLM remaps it to ``input_scale``);
- ``scale_input``: ComfyUI ``scaled_fp8``.

A fused expert parameter ``<x>`` (transformers ``FP8Experts``: ``...mlp.experts.gate_up_proj``) has
``<x>_activation_scale`` ``[expert]``.
"""

from __future__ import annotations

import numpy as np

from converter.tensor import Checkpoint, TensorSpec
from converter.write.plan import TensorPlan

#: activation-scale suffixes after ``<p>.``.
ACT_SUFFIXES = ("activation_scale", "input_scale", "qscale_act", "scale_input")
#: a fused expert parameter's activation-scale suffix (``<x>_activation_scale``).
EXPERT_ACT = "_activation_scale"
ROLE = "activation_scale"


def is_activation_scale(spec: TensorSpec) -> bool:
    """Whether ``spec`` is an activation scale: a dense tensor stored in role ``activation_scale`` (what the
    FP8 readers mark), or a dense tensor without a stored role (an in-memory checkpoint) spelled like one
    (:func:`owner`). Writers rename one only beside a quantized weight of the module it names."""
    if spec.kind != "dense":
        return False
    roles = {a.role for a in spec.stored}
    return ROLE in roles or (roles <= {"dense"} and owner(spec.name) is not None)


def owner(name: str) -> str | None:
    """The module ``<p>`` (or fused expert parameter ``<x>``) an activation scale called ``name`` belongs to."""
    if name.endswith(EXPERT_ACT):
        return name[: -len(EXPERT_ACT)]
    head, _, suffix = name.rpartition(".")
    return head if head and suffix in ACT_SUFFIXES else None


def activation_scales(ckpt: Checkpoint) -> dict[str, TensorSpec]:
    """``{module: spec}`` of every activation scale of ``ckpt`` (whatever its spelling)."""
    out = {}
    for spec in ckpt.specs():
        if is_activation_scale(spec):
            mod = owner(spec.name)
            if mod is not None:
                out.setdefault(mod, spec)
    return out


def activation_plan(spec: TensorSpec, name: str, shape: tuple[int, ...]) -> TensorPlan:
    """Write the activation scale ``spec`` as ``name`` with ``shape`` (its values and dtype bit-exact).

    Every rename and reshape is declared in the plan's notes (the convert report shows them), so a
    read-back that finds the same bytes under another name or shape is never reported as a silent
    pass-through.
    """
    notes = []
    if name != spec.name:
        notes.append(f"activation scale renamed {spec.name} -> {name} (the target's spelling)")
    if tuple(shape) != tuple(spec.shape):
        notes.append(f"activation scale reshaped {list(spec.shape)} -> {list(shape)} (values exact)")
    return TensorPlan(spec.name, [(name, spec.dtype, tuple(shape))],
                      lambda t: {name: np.ascontiguousarray(t.data).reshape(shape)}, notes or ["passed through"])


def declare(summary: dict, plans: list[TensorPlan]) -> dict:
    """Add to a writer's ``summary`` the notes of every activation-scale plan that renames or reshapes
    (``summary["notes"][source]``) and ``summary["renamed"]`` (``{source name: written name}``, which
    the convert proof reads the tensor back under). Returns ``summary``."""
    notes = summary.setdefault("notes", {})
    renamed = {}
    for p in plans:
        if p.notes and p.notes[0].startswith("activation scale "):
            notes[p.source] = list(p.notes)
            if p.outputs[0][0] != p.source:
                renamed[p.source] = p.outputs[0][0]
    if renamed:
        summary["renamed"] = renamed
    return summary
