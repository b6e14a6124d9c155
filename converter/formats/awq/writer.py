"""AWQ writer: logical tensors -> the GEMM layout (the one every AWQ loader accepts) and its config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import ConverterError, NotRepresentableError, UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT
from converter.scheme import ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, opaque_reason, spec_of
from converter.formats.modules import dense_linear_modules
from converter.write.plan import TensorPlan, dense_plan
from converter.formats.base import write_directory
from converter.formats.registry import NO_OPTIONS, TargetOptions
from converter.formats.awq.layout import (AXES, BITS, FORMAT, GEMM_QWEIGHT, GEMM_QZEROS, GEMM_SCALES, PACK,
    WEIGHT_SUFFIX)

from converter.quant.recode import as_integer_zero, as_unsigned


def check_target(spec: TensorSpec, options: TargetOptions = NO_OPTIONS) -> str | None:
    """``None`` when ``spec`` can be written as AWQ GEMM exactly, else the reason.

    Accepted: 4-bit affine-grid codes (signed or unsigned; symmetric or integer zero; float
    bias is accepted here and checked exactly per group when encoding, see
    :func:`converter.quant.recode.as_integer_zero`), float16 scales, logical ``(out, in)``,
    groups along ``in`` with ``in % G == 0`` (or per output channel / per tensor, written as
    ``G = in``), ``out % 8 == 0`` (``WQLinear_GEMM.__init__`` asserts both), no act-order.
    """
    if spec.kind != "quantized":
        return opaque_reason(spec)  # None for dense tensors
    s, gm = spec.scheme, spec.group_map
    if tuple(spec.axes or ()) != AXES:
        return f"AWQ stores 2-D (out, in) Linear weights only, not axes {list(spec.axes or ())}"
    if s.codebook is not None:
        return "AWQ codes are an affine integer grid; a codebook (NF4/FP4) scheme is not representable"
    if s.bits != BITS:
        return f"AWQ stores 4-bit codes only, not {s.bits}-bit"
    if s.scale_dtype != "F16":
        return f"AWQ kernels take float16 scales; {s.scale_dtype} scales would be rounded (requantize)"
    if spec.act_order:
        return "AWQ has no g_idx: act-order (desc_act) group membership is not representable"
    out, inp = spec.shape
    if out % PACK:
        return f"AWQ GEMM packs 8 output channels per int32: out_features={out} is not a multiple of 8"
    g = gm.granularity
    if g is Granularity.GROUP:
        if gm.axis != IN:
            return f"AWQ groups run along in, not {gm.axis}"
        if inp % gm.group_size:
            return f"AWQ needs in_features % group_size == 0 (in={inp}, group_size={gm.group_size})"
    elif g is Granularity.CHANNEL:
        if gm.axis != OUT:
            return "per-input-channel scales are not representable in AWQ (scales are per out channel and group)"
    elif g is not Granularity.TENSOR:
        return f"{gm.describe()} blocks are not representable in AWQ (groups along in)"
    return None


def check_model(specs) -> str | None:
    """The model-wide rule (``FormatHandler.check_model``): one ``group_size`` in config.json for every
    quantized layer (a per-channel layer fits only when its ``in`` equals that group size). None, or the reason."""
    quantized = [s for s in specs if s.kind == "quantized" and s.group_map is not None]
    explicit = sorted({s.group_map.group_size for s in quantized if s.group_map.granularity is Granularity.GROUP})
    if len(explicit) > 1:
        return f"AWQ config has one group_size for the model; the layers have {explicit}"
    if explicit:
        bad = [s for s in quantized if s.group_map.granularity is not Granularity.GROUP and s.shape[-1] != explicit[0]]
        if bad:
            return (f"AWQ config has one group_size for the model: per-channel {bad[0].name} (in {bad[0].shape[-1]}) "
                    f"does not fit group_size {explicit[0]}")
    return None


def _group_size_for(ckpt: Checkpoint) -> int:
    """The single ``group_size`` of config.json for every quantized tensor (-1 = per channel)."""
    explicit = {s.group_map.group_size for s in ckpt.specs()
                if s.kind == "quantized" and s.group_map.granularity is Granularity.GROUP}
    if len(explicit) > 1:
        raise NotRepresentableError("AWQ config has one group_size for the model", file=ckpt.path,
                                    field="quantization_config.group_size", expected="one group size",
                                    found=sorted(explicit), hint="requantize to a single group size")
    if not explicit:
        return -1
    g = explicit.pop()
    for s in ckpt.specs():
        if s.kind == "quantized" and s.group_map.granularity is not Granularity.GROUP and s.shape[1] != g:
            raise NotRepresentableError("a per-channel tensor does not fit the model's group size", file=ckpt.path,
                                        tensor=s.name, field="quantization_config.group_size",
                                        expected=f"in_features = {g}", found=s.shape[1],
                                        hint="requantize to a single group size")
    return g


def _unsigned_integer(t: QuantizedTensor) -> QuantizedTensor:
    """Re-express ``t`` exactly as unsigned codes with integer zero points (AWQ's model)."""
    if t.scheme.signed:
        t = as_unsigned(t)
    if t.scheme.zero_point is not ZeroPoint.INTEGER:
        t = as_integer_zero(t)
    return t


def encode_gemm(t: QuantizedTensor, group_size: int) -> dict[str, np.ndarray]:
    """Logical tensor -> ``{<p>.qweight, <p>.qzeros, <p>.scales}`` GEMM arrays.

    Returns
    -------
    dict: ``qweight`` int32 ``[I, O/8]``, ``qzeros`` int32 ``[nG, O/8]``, ``scales`` float16 ``[nG, O]``.

    Raises
    ------
    NotRepresentableError
        When :func:`check_target` refuses the tensor's spec, or a float bias is not an exact
        integer zero.
    """
    gm = t.group_map
    if gm.g_idx is not None and gm.is_trivial_g_idx(t.shape[1]):  # sequential g_idx: plain groups
        t = t.replace(group_map=GroupMap(gm.granularity, gm.axis, gm.group_size))
    reason = check_target(spec_of(t))
    if reason:
        raise NotRepresentableError(reason, tensor=t.name, field="scheme", hint="requantize to AWQ's scheme")
    t = _unsigned_integer(t)
    out, inp = t.shape
    g = inp if group_size == -1 else group_size
    n_groups = inp // g
    gm = t.group_map
    if gm.granularity is Granularity.GROUP:
        scales, zeros = t.scales, t.zero_points
    else:  # per channel (out, 1) or per tensor (1, 1): the one group spans all of in; exact broadcast
        scales = np.broadcast_to(t.scales, (out, 1))
        zeros = np.broadcast_to(t.zero_points, (out, 1))
    if scales.shape != (out, n_groups):
        raise NotRepresentableError("scale count does not match the AWQ group size", tensor=t.name, field="scales",
                                    expected=[out, n_groups], found=list(scales.shape))
    prefix = t.name[:-len(WEIGHT_SUFFIX)]
    return {prefix + ".qweight": GEMM_QWEIGHT.to_stored(t.codes.astype(np.uint8, copy=False), AXES),
            prefix + ".qzeros": GEMM_QZEROS.to_stored(np.asarray(zeros).astype(np.uint8), AXES),
            prefix + ".scales": GEMM_SCALES.to_stored(np.asarray(scales, dtype=np.float16), AXES)}


def _plan(spec: TensorSpec, group_size: int) -> TensorPlan:
    if spec.kind == "dense":
        return dense_plan(spec)
    if not spec.name.endswith(WEIGHT_SUFFIX):
        raise NotRepresentableError("AWQ names quantized tensors <module>.weight", tensor=spec.name, field="name",
                                    expected="<module>.weight", found=spec.name)
    reason = check_target(spec)
    if reason:
        raise NotRepresentableError(reason, tensor=spec.name, field="scheme", hint="requantize to AWQ's scheme")
    out, inp = spec.shape
    n_groups = inp // (inp if group_size == -1 else group_size)
    prefix = spec.name[:-len(WEIGHT_SUFFIX)]
    outputs = [(prefix + ".qweight", "I32", GEMM_QWEIGHT.stored_shape({IN: inp, OUT: out})),
               (prefix + ".qzeros", "I32", GEMM_QZEROS.stored_shape({IN: n_groups, OUT: out})),
               (prefix + ".scales", "F16", GEMM_SCALES.stored_shape({IN: n_groups, OUT: out}))]
    notes = ["exact repack to AWQ GEMM"]
    if spec.scheme.zero_point is ZeroPoint.NONE:
        notes.append("symmetric scheme written as explicit qzeros = 8 (AutoAWQ cannot load GEMM without zeros)")
    if spec.scheme.signed:
        notes.append("signed codes shifted by +8 to AWQ's unsigned domain")
    return TensorPlan(spec.name, outputs, lambda t: encode_gemm(t, group_size), notes)


_UNSET = object()


def awq_config(ckpt: Checkpoint, group_size: int, modules_to_not_convert: Any = _UNSET) -> dict:
    """config.json for the output: the source config with an AWQ GEMM ``quantization_config``.

    Keys follow AutoAWQ ``AwqConfig.to_transformers_dict`` (``awq/models/_config.py``).
    ``zero_point`` is always true: zeros are written explicitly, symmetric ones as 8.
    ``modules_to_not_convert`` is the given value, else every dense Linear-like module of ``ckpt``
    (:func:`converter.formats.modules.dense_linear_modules`: an MoE router or a layer the source left
    dense; transformers' AWQ loader matches the full names, from the start at a module boundary)
    together with the source's list when the source was AWQ, else ``None`` (as AutoAWQ writes it).
    """
    if modules_to_not_convert is _UNSET:
        names = set(dense_linear_modules(ckpt.specs()))
        if ckpt.format == FORMAT:
            names |= set((ckpt.metadata.get("quantization_config") or {}).get("modules_to_not_convert") or ())
        modules_to_not_convert = sorted(names) or None
    cfg = {k: v for k, v in (ckpt.config or {}).items() if k not in ("quantization_config", "quantization")}
    cfg["quantization_config"] = {"quant_method": "awq", "bits": BITS, "group_size": group_size,
                                  "zero_point": True, "version": "gemm",
                                  "modules_to_not_convert": modules_to_not_convert}
    return cfg


def write_awq(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, version: str = "gemm",
              max_shard_bytes: int | None = None, modules_to_not_convert: Any = _UNSET, **_: Any) -> dict:
    """Write ``ckpt`` as an AWQ GEMM model directory (``model.safetensors`` + ``config.json``).

    Every plan is made (and every tensor checked with :func:`check_target`) before any data
    moves; dense tensors (biases, norms, embeddings) pass through bit-exact. Packing is ours
    (vectorized), so ``out % 8 == 0`` suffices; AutoAWQ's own ``from_linear`` would need
    ``out % 32 == 0`` (it sizes the buffer as ``O // 32 * 4``; FORMATS.md section 11.13).
    Pass ``modules_to_not_convert=[...]`` to name Linear modules left dense.

    Raises
    ------
    UnsupportedError
        ``version`` other than ``"gemm"``.
    NotRepresentableError
        A tensor AWQ cannot hold exactly, or tensors needing different group sizes.
    """
    ckpt.refuse_opaque("awq")
    if str(version).lower() != "gemm":
        raise UnsupportedError("the AWQ writer produces the GEMM layout only", field="version",
                               expected="gemm", found=version)
    group_size = _group_size_for(ckpt)
    plans = []
    for spec in ckpt.specs():
        try:
            plans.append(_plan(spec, group_size))
        except ConverterError as exc:
            exc.with_context(file=ckpt.path, tensor=spec.name)
            raise
    config = awq_config(ckpt, group_size, modules_to_not_convert)
    return write_directory(ckpt, dst, plans, config=config, max_shard_bytes=max_shard_bytes, overwrite=overwrite)
