"""Apply a target format's module policy before planning a write (:mod:`converter.formats.modules`).

Every quantized source tensor the target must store dense (``FormatHandler.keep_dense`` gives the
reason: an input embedding for GPTQ / AWQ / compressed-tensors, an output head, an MoE router) is
replaced, in a lazy view of the checkpoint, by its exact float32 dequantization; the writers then
store it as a dense tensor, and the read-back proof checks its values bit for bit (mode
``dequantized``). Nothing is dropped and nothing is requantized silently: each module's decision
(``quantized``, ``dequantized`` or ``kept dense``) and its reason go into the report.
"""

from __future__ import annotations

from typing import Any

from converter.formats.modules import OTHER, module_role
from converter.formats.source import module_prefix
from converter.ops.compare import compare_tensors
from converter.tensor import Checkpoint, DenseTensor, StoredArray, TensorSpec

QUANTIZED = "quantized"
DEQUANTIZED = "dequantized"
KEPT_DENSE = "kept dense"


def _dense_spec(spec: TensorSpec) -> TensorSpec:
    """Header-only spec of ``spec``'s float32 dequantization (logical shape, ``F32``)."""
    n = 1
    for d in spec.shape:
        n *= int(d)
    return TensorSpec(spec.name, "dense", tuple(spec.shape),
                      (StoredArray(spec.name, "dense", "F32", tuple(spec.shape), 4 * n),), dtype="F32",
                      notes=spec.notes)


def decide(ckpt: Checkpoint, handler: Any) -> list[dict[str, Any]]:
    """Per module (every quantized tensor and every dense weight of rank >= 2): the decision and why.

    Returns
    -------
    list of dict ``{"module", "tensor", "role", "decision", "reason"}``, in ``ckpt`` order;
    ``decision`` is ``quantized`` (stored quantized in the target), ``dequantized`` (quantized in
    the source, written dense: the target's loaders keep it dense) or ``kept dense`` (dense in the
    source and written as it is).
    """
    policy = getattr(handler, "keep_dense", None)
    out = []
    for spec in ckpt.specs():
        role = module_role(spec.name, len(spec.shape))
        if spec.kind == "quantized":
            reason = policy(spec) if policy is not None else None
            decision = DEQUANTIZED if reason else QUANTIZED
            reason = reason or f"{handler.name} stores and its loaders read this {role} weight quantized"
        elif spec.kind == "dense" and role != OTHER and len(spec.shape) >= 2:
            decision, reason = KEPT_DENSE, "dense in the source (a conversion never quantizes a dense tensor)"
        else:
            continue
        out.append({"module": module_prefix(spec.name), "tensor": spec.name, "role": role, "decision": decision,
                    "reason": reason})
    return out


def apply_module_policy(ckpt: Checkpoint, handler: Any) -> tuple[Checkpoint, list[dict[str, Any]]]:
    """A view of ``ckpt`` in which the tensors ``handler``'s policy keeps dense are dequantized.

    Parameters
    ----------
    ckpt : Checkpoint
        The source (not modified; tensors still load one at a time).
    handler : FormatHandler
        The target format (its ``keep_dense`` policy, or none).

    Returns
    -------
    (view, decisions)
        ``view`` is ``ckpt`` itself when nothing changes; otherwise a Checkpoint with the same
        format, config, metadata and side files whose dequantized tensors are dense float32
        ``(out, in)`` arrays equal to ``ckpt[name].dequantize()``. ``decisions`` as :func:`decide`.
    """
    decisions = decide(ckpt, handler)
    dense = {d["tensor"] for d in decisions if d["decision"] == DEQUANTIZED}
    if not dense:
        return ckpt, decisions
    specs = {s.name: (_dense_spec(s) if s.name in dense else s) for s in ckpt.specs()}

    def load(name: str):
        t = ckpt[name]
        return DenseTensor(name, t.dequantize()) if name in dense else t

    view = Checkpoint(specs, load, format=ckpt.format, path=ckpt.path, config=ckpt.config,
                      metadata=dict(ckpt.metadata), files=ckpt.files, extra_files=ckpt.extra_files,
                      side_files=ckpt.side_files)
    return view, decisions


def verify_dequantized(source: Checkpoint, out: Checkpoint, decisions: list[dict[str, Any]]) -> None:
    """Set ``readback_bit_exact`` on each ``dequantized`` decision: the dense tensor read back from
    ``out`` (the staged output, through the target's reader) holds float32 values equal to the
    source tensor's dequantization, bit for bit (:func:`converter.ops.compare.compare_tensors`;
    one tensor in memory at a time)."""
    for d in decisions:
        if d["decision"] != DEQUANTIZED:
            continue
        name = d["tensor"]
        back = out[name] if name in out else None
        d["readback_bit_exact"] = isinstance(back, DenseTensor) and compare_tensors(source[name], back)["bit_exact"]


def summarize_decisions(decisions: list[dict[str, Any]]) -> dict[str, int]:
    """Counts by decision (``quantized``, ``dequantized``, ``kept dense``)."""
    counts = {QUANTIZED: 0, DEQUANTIZED: 0, KEPT_DENSE: 0}
    for d in decisions:
        counts[d["decision"]] += 1
    return counts
