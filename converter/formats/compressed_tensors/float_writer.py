"""compressed-tensors ``float-quantized`` (FP8) writing: which FP8 specs it holds, the arrays of one
module, activation scales in compressed-tensors' spelling, and the ``input_activations`` a module
declares (compressed-tensors 0.20.1 ``FloatQuantizationCompressor``, ``initialize_qparams``). The
model-directory writer is :func:`converter.formats.compressed_tensors.writer.write_ct`.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from converter.codebooks import element_of
from converter.groups import Granularity
from converter.layout import IN, OUT
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec
from converter.formats import activations
from converter.formats.compressed_tensors.config_emit import DYNAMIC_TOKEN_FP8, STATIC_TENSOR_FP8
from converter.formats.compressed_tensors.int_layout import AXES
from converter.write.plan import TensorPlan, dense_plan, rows_plan


def float_target(spec: TensorSpec) -> str | None:
    """``None`` when an 8-bit float spec can be written exactly as ``float-quantized``, else the reason."""
    s, gm = spec.scheme, spec.group_map
    el = element_of(s.codebook)
    if el.name != "e4m3":
        return (f"{el.name} weights: compressed-tensors float-quantized declares only type float / num_bits 8, "
                "which its loaders create as float8_e4m3fn (QuantizationArgs.pytorch_dtype, 0.20.1)")
    if s.scale_dtype not in ("F16", "BF16", "F32"):
        return f"scale dtype {s.scale_dtype} is not a float-quantized weight_scale dtype (F16/BF16/F32)"
    if tuple(spec.axes) != AXES:
        return f"axes {list(spec.axes)}: only 2-D [out, in] weights are written"
    if gm.granularity is Granularity.CHANNEL and gm.axis != OUT:
        return "per-column (channel along in) scales have no compressed-tensors strategy"
    if gm.granularity is Granularity.BLOCK and (gm.extent(OUT) is None or gm.extent(IN) is None):
        return "a block spanning a whole axis has no block_structure [bo, bi]"
    if gm.granularity not in (Granularity.TENSOR, Granularity.CHANNEL, Granularity.BLOCK):
        return f"{gm.describe()} FP8 scales: float-quantized writes strategies tensor, channel and block"
    return None


def encode_float(t: QuantizedTensor, prefix: str) -> dict:
    """float-quantized arrays of one module: ``weight`` (the element bytes as F8) and ``weight_scale``
    (``[1]`` tensor, ``[O, 1]`` channel, ``[ceil(O/bo), ceil(I/bi)]`` block; scale dtype kept)."""
    el = element_of(t.scheme.codebook)
    scales = np.ascontiguousarray(t.scales)
    return {prefix + ".weight": np.ascontiguousarray(t.codes).view(el.numpy),
            prefix + ".weight_scale": scales.reshape(1) if t.group_map.granularity is Granularity.TENSOR else scales}


def _float_outputs(spec: TensorSpec, prefix: str) -> list:
    tensor = spec.group_map.granularity is Granularity.TENSOR
    return [(prefix + ".weight", element_of(spec.scheme.codebook).storage_dtype, tuple(spec.shape)),
            (prefix + ".weight_scale", spec.scheme.scale_dtype,
             (1,) if tensor else tuple(spec.group_map.param_shape(spec.shape, spec.axes)))]


def float_plan(spec: TensorSpec, prefix: str) -> TensorPlan:
    plan = TensorPlan(spec.name, _float_outputs(spec, prefix), lambda t, prefix=prefix: encode_float(t, prefix), [])
    gm = spec.group_map
    if gm.granularity is Granularity.TENSOR:
        return rows_plan(plan, once=[prefix + ".weight_scale"])
    if gm.granularity is Granularity.CHANNEL:
        return rows_plan(plan)
    return plan  # block scales are per block of rows: written whole


def _float_module(ckpt: Checkpoint, module: str | None) -> bool:
    """Whether ``module`` has an FP8 (float-quantized) ``<module>.weight`` in ``ckpt``."""
    w = f"{module}.weight"
    return module is not None and w in ckpt and ckpt.spec(w).kind == "quantized" \
        and ckpt.spec(w).scheme.codebook is not None


def dense_plan_of(ckpt: Checkpoint, spec: TensorSpec) -> TensorPlan:
    """A dense tensor's plan: the activation scale of an FP8 module, whatever its source spelling
    (``activation_scale``, ``qscale_act`` ...), is written as compressed-tensors' ``<p>.input_scale``
    ``[1]`` (``initialize_qparams`` in 0.20.1, per-tensor strategy); the rest passes through."""
    mod = activations.owner(spec.name) if activations.is_activation_scale(spec) else None
    if _float_module(ckpt, mod) and int(np.prod(spec.shape, dtype=np.int64)) == 1:
        return activations.activation_plan(spec, f"{mod}.input_scale", (1,))
    return dense_plan(spec)


def dynamic_args(value: Any) -> dict | None:
    """The ``input_activations`` of a ``metadata["activations"]`` value ``dynamic`` (per token) or
    ``dynamic:group:<n>`` (per token group, as compressed-tensors' ``FP8_BLOCK`` preset declares)."""
    if value == "dynamic":
        return DYNAMIC_TOKEN_FP8
    if isinstance(value, str) and value.startswith("dynamic:group:") and value.rsplit(":", 1)[1].isdigit():
        return {**DYNAMIC_TOKEN_FP8, "strategy": "group", "group_size": int(value.rsplit(":", 1)[1])}
    return None


def activation_json(ckpt: Checkpoint, prefix: str, static: Mapping[str, TensorSpec]) -> dict | None:
    """``input_activations`` of a module: static per-tensor FP8 when the source stores an activation
    scale for it (``static``: :func:`converter.formats.activations.activation_scales`, any spelling),
    dynamic FP8 when the source says its activations are dynamic (``metadata["activations"]``, filled
    by the FP8 readers: per token, or per token group), else None (weight-only)."""
    if prefix in static and int(np.prod(static[prefix].shape, dtype=np.int64)) == 1:
        return STATIC_TENSOR_FP8
    acts = (ckpt.metadata or {}).get("activations")
    return dynamic_args(acts.get(prefix)) if isinstance(acts, dict) else None
