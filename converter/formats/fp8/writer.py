"""fp8 writer: any FP8 block (or per-tensor) :class:`QuantizedTensor` -> ``weight`` + ``weight_scale_inv``,
and the ``quantization_config`` of the written ``config.json``.

A tensor is held exactly when its scheme is an E4M3 codebook with F32 / BF16 / F16 / F8_E8M0 scales
(E5M2 is read but not written: transformers 5.24 creates every FineGrainedFP8 weight as
``float8_e4m3fn``, ``_FP8_DTYPE`` in ``integrations/finegrained_fp8.py``, whatever ``fmt`` says),
grouped in 2-D blocks (``out`` and ``in`` extents) or one scale per tensor (per expert), whatever
format it came from (DeepSeek-style fp8, compressed-tensors ``block`` / ``tensor`` strategies ...):
the codes are written as the element bytes, the scales in their own dtype. All quantized tensors
share one element (``fmt``) and one ``weight_block_size`` (the config
holds one of each). A fused ``gate_up_proj`` expert stack with one scale per expert is written
``[expert, 2, 1]``: transformers allocates it with ``min_sf_out=2`` (``_alloc_expert_proj``), one
scale for the gate half and one for the up half, both the expert's value. Activation scales of
quantized modules are written in transformers' spelling (``<p>.activation_scale`` 0-dim,
``<x>_activation_scale`` ``[expert]``) whatever the source called them, the rename declared in the
plan notes, and the config says ``activation_scheme: "static"``.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import numpy as np

from converter.codebooks import element_of
from converter.errors import NotRepresentableError
from converter.groups import Granularity
from converter.layout import EXPERT, IN, OUT
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, opaque_reason
from converter.write.plan import TensorPlan, dense_plan, rows_plan
from converter.formats.modules import dense_linear_modules, hf_linear_policy
from converter.formats.registry import NO_OPTIONS, TargetOptions

from converter.formats import activations
from converter.formats.fp8.config import write_config
from converter.formats.fp8.names import activation_name, scale_name
from converter.formats.fp8.reader import SCALE_DTYPES, TRANSFORMERS_PARTIAL_NOTE

#: transformers fused expert parameters (``FP8Experts``): stored quantized without a ``.weight`` suffix.
_FUSED_EXPERT_RE = re.compile(r"\.experts\.(gate_up_proj|up_proj|gate_proj|down_proj)$")
_linear_policy = hf_linear_policy("fp8")


def keep_dense(spec: TensorSpec) -> str | None:
    """The fp8 module policy: transformers' FineGrainedFP8 replaces ``nn.Linear`` layers (and fused expert
    stacks, ``FP8Experts``); embeddings, MoE routers and the output head stay dense
    (:func:`~converter.formats.modules.hf_linear_policy`)."""
    if len(spec.shape) == 3 and _FUSED_EXPERT_RE.search(spec.name):
        return None
    return _linear_policy(spec)


def _halves(spec: TensorSpec) -> bool:
    """A fused gate_up_proj stack with one scale per half (``per_block(out=O/2, in=None)``: the
    ``[expert, 2, 1]`` scale transformers allocates per tensor)."""
    gm = spec.group_map
    return (len(spec.shape) == 3 and is_gate_up(spec.name) and gm.granularity is Granularity.BLOCK
            and gm.extent(IN) is None and gm.extent(OUT) is not None and 2 * gm.extent(OUT) == spec.shape[1])


def _block_of(spec: TensorSpec) -> tuple[int, int] | None:
    gm = spec.group_map
    return (gm.extent(OUT), gm.extent(IN)) if gm.granularity is Granularity.BLOCK and not _halves(spec) else None


def check_target(spec: TensorSpec, options: TargetOptions = NO_OPTIONS) -> str | None:
    """None when ``spec`` can be written as fp8 exactly, else the reason (header facts only)."""
    if spec.kind != "quantized":
        return opaque_reason(spec)
    s, gm = spec.scheme, spec.group_map
    el = element_of(s.codebook)
    if el is None:
        # wording kept byte-identical for the behaviour snapshot (only E4M3 is written: see below)
        return ("fp8 stores FP8 E4M3 / E5M2 elements; an integer scheme needs requantizing" if s.codebook is None
                else "fp8 stores FP8 E4M3 / E5M2 elements, not this codebook")
    if el.name != "e4m3":
        return (f"{el.name.upper()} weights: transformers 5.24 FineGrainedFP8 creates every FP8 weight as "
                "float8_e4m3fn (_FP8_DTYPE, integrations/finegrained_fp8.py), so only E4M3 is written")
    if s.scale_dtype not in SCALE_DTYPES:
        return f"fp8 weight scales are {' / '.join(SCALE_DTYPES)}, found {s.scale_dtype}"
    if tuple(spec.axes) not in ((OUT, IN), (EXPERT, OUT, IN)):
        return f"fp8 weights are [out, in] or [expert, out, in], found axes {spec.axes}"
    if spec.double_quant or spec.act_order:
        return "fp8 has no two-level scales or act-order groups"
    if _halves(spec):
        pass  # a fused gate_up_proj's [expert, 2, 1] scale (transformers' per-tensor allocation)
    elif gm.granularity is Granularity.BLOCK:
        if gm.extent(OUT) is None or gm.extent(IN) is None:
            return f"fp8 blocks tile both out and in (weight_block_size), found {gm.describe()}"
    elif gm.granularity is not Granularity.TENSOR:
        return f"fp8 scales are per 2-D block or per tensor, found {gm.describe()}"
    if len(spec.shape) == 2 and not spec.name.endswith(".weight"):
        return "fp8 stores a Linear's FP8 weight as '<module>.weight'"
    return None


def is_gate_up(name: str) -> bool:
    """Whether ``name`` is a fused ``gate_up_proj`` expert stack (transformers ``FP8Experts``)."""
    return name.endswith(".experts.gate_up_proj")


def _scale_shape(spec: TensorSpec) -> tuple[int, ...]:
    if spec.group_map.granularity is Granularity.TENSOR and len(spec.shape) == 2:
        return ()  # transformers' FP8Linear holds a per-tensor weight_scale_inv as a 0-d parameter
    shape = spec.group_map.param_shape(spec.shape, spec.axes)
    if len(spec.shape) == 3 and is_gate_up(spec.name) and shape[1] < 2:
        # _alloc_expert_proj(min_sf_out=2): the gate and up halves each have a scale row
        return (shape[0], 2) + tuple(shape[2:])
    return shape


def encode(spec: TensorSpec) -> TensorPlan:
    """The plan of one FP8 tensor: ``<weight>`` in the element's dtype and its scale in the scale dtype."""
    el = element_of(spec.scheme.codebook)
    sname, sshape = scale_name(spec.name), _scale_shape(spec)
    outs = [(spec.name, el.storage_dtype, tuple(spec.shape)), (sname, spec.scheme.scale_dtype, sshape)]
    notes = ["exact repack"]
    if spec.group_map.partial_blocks(spec.shape, spec.axes):
        notes.append(TRANSFORMERS_PARTIAL_NOTE)

    doubled = len(sshape) == 3 and sshape[1] == 2 and spec.group_map.param_shape(spec.shape, spec.axes)[1] == 1
    if doubled:
        notes.append("per-expert scale written [expert, 2, 1] (gate and up halves, the same value), as "
                     "transformers allocates a fused gate_up_proj scale (min_sf_out=2)")

    def produce(t: QuantizedTensor) -> dict[str, np.ndarray]:
        codes = np.ascontiguousarray(t.codes).view(el.numpy)
        lead = (t.shape[0],) + sshape[1:]
        s = np.ascontiguousarray(t.scales)
        if doubled:
            s = np.repeat(s.reshape(t.shape[0], 1, -1), 2, axis=1)
        # reshape last: np.ascontiguousarray makes a 0-dim array 1-dim
        return {spec.name: codes, sname: np.ascontiguousarray(s).reshape(sshape if t.shape == spec.shape else lead)}
    plan = TensorPlan(spec.name, outs, produce, notes)
    # an expert stack splits into whole experts (weight and block scales both lead with ``expert``)
    blocks = spec.axes[0] == EXPERT and spec.group_map.granularity is Granularity.BLOCK
    return rows_plan(plan) if blocks else plan


def _quantized_owner(ckpt: Checkpoint, module: str) -> str | None:
    """The quantized weight of ``module`` (``<p>.weight``, or the fused expert parameter itself)."""
    for w in (module + ".weight", module):
        if w in ckpt and ckpt.spec(w).kind == "quantized":
            return w
    return None


def dense_plan_of(ckpt: Checkpoint, spec: TensorSpec) -> TensorPlan:
    """A dense tensor's plan: an activation scale of a quantized module is written under transformers'
    name (0-dim for a Linear, ``[expert]`` for an expert stack), everything else passes through."""
    mod = activations.owner(spec.name) if activations.is_activation_scale(spec) else None
    w = _quantized_owner(ckpt, mod) if mod is not None else None
    if w is None:
        return dense_plan(spec)
    shape = () if w.endswith(".weight") else tuple(spec.shape)
    return activations.activation_plan(spec, activation_name(w), shape)


def _scale_fmt(ckpt: Checkpoint, q: list[TensorSpec]) -> str | None:
    """``scale_fmt``: ``"ue8m0"`` when the scales are E8M0 (transformers ``FineGrainedFP8Config.scale_fmt``;
    DeepSeek-V3.1's config, whose power-of-two scales are stored F32), else the source fp8 config's value
    (None: left out, transformers' default ``"float"``)."""
    if q and all(s.scheme.scale_dtype == "F8_E8M0" for s in q):
        return "ue8m0"
    src = ((ckpt.config or {}).get("quantization_config") or {}) if ckpt.format == "fp8" else {}
    value = src.get("scale_fmt") if isinstance(src, dict) else None
    return value if isinstance(value, str) else None


def _one(values: set, what: str, spec_names: dict) -> Any:
    if len(values) > 1:
        raise NotRepresentableError(f"fp8 holds one {what} per checkpoint, the tensors have several",
                                    tensor=next(iter(spec_names.values())), field=what,
                                    expected="one value", found=sorted(map(str, values)),
                                    hint="requantize the tensors to a common layout")
    return next(iter(values)) if values else None


def fp8_config(ckpt: Checkpoint) -> dict:
    """``config.json`` for the written model: the source's without its quantization keys, plus an fp8
    ``quantization_config`` (``fmt``, ``weight_block_size``, ``activation_scheme`` — static when activation
    scales are stored — and ``modules_to_not_convert``: every dense Linear weight).

    Raises
    ------
    NotRepresentableError
        Tensors with different elements, or both block and per-tensor scales, or several block sizes
        (one config holds one of each); raised before any data moves.
    """
    q = [s for s in ckpt.specs() if s.kind == "quantized"]
    elements = {element_of(s.scheme.codebook).name for s in q}
    blocks = {_block_of(s) for s in q}
    fmt = _one(elements, "fmt", {s.name: s.name for s in q}) or "e4m3"
    block = _one(blocks, "weight_block_size", {s.name: s.name for s in q})
    static = any(_quantized_owner(ckpt, m) for m in activations.activation_scales(ckpt))
    cfg = {k: copy.deepcopy(v) for k, v in (ckpt.config or {}).items()
           if k not in ("quantization_config", "quantization", "compression_config")}
    cfg["quantization_config"] = write_config(fmt, block, "static" if static else "dynamic",
                                              dense_linear_modules(ckpt.specs()), scale_fmt=_scale_fmt(ckpt, q))
    return cfg
