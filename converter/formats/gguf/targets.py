"""Which checkpoint tensors GGUF holds exactly (no requantization): the legacy-type and K-quant match.

A quantized tensor is written to GGUF as it is only when its scheme *is* a legacy ggml type
(Q4_0/Q5_0/Q8_0 symmetric, Q4_1/Q5_1 float bias) in 32-element blocks along ``in`` (or a
per-tensor / per-channel / 32k-group scale that each block repeats exactly), or a K-quant whose
super-block fields it carries (a K-quant source, or llama.cpp's quantizer's output), or FP4 E2M1
with E8M0 scales per 32 (``MXFP4``) or E4M3 scales per 16 (``NVFP4``) along ``in``
(:func:`converter.formats.gguf.fp4.fp4_match`). :func:`check_target` is the handler's answer,
:func:`exact_type` the type.
"""

from __future__ import annotations

from converter.formats.gguf.blocks import CODECS, KQuantCodec
from converter.formats.gguf.fp4 import fp4_match
from converter.formats.gguf.schemes import DENSE_TYPES, REQUANT_OPTIONS, kquant_type_for
from converter.formats.registry import NO_OPTIONS, TargetOptions
from converter.groups import Granularity
from converter.layout import EXPERT, IN, OUT
from converter.scheme import ZeroPoint
from converter.tensor import TensorSpec, opaque_reason

__all__ = ["check_target", "legacy_match", "kquant_match", "exact_type"]

#: Why a static activation scale is not written to GGUF (the convert report's ``dropped`` reason).
ACT_SCALE_DROPPED = ("activation scale not written: llama.cpp quantizes activations at run time (its "
                     "convert_hf_to_gguf.py writes <name>.input_scale, which llama.cpp loads but does not compute "
                     "with; transformers' GGUF loader fails on one)")


def kquant_match(spec: TensorSpec) -> str | None:
    """The K-quant type ``spec`` is stored as (a K-quant source's own super-blocks, or a K-quant
    requantize target), or None. Its super-block fields are packed as they are at write time."""
    if spec.scheme is None or spec.group_map is None or spec.axes is None or spec.act_order:
        return None
    t = kquant_type_for(spec.scheme, spec.group_map)
    if t is None or spec.double_quant not in (None, t) or tuple(spec.axes) not in ((OUT, IN), (EXPERT, OUT, IN)):
        return None
    return t if spec.shape[-1] % 256 == 0 else None


def _k_quant_note(spec: TensorSpec) -> str | None:
    for n in spec.notes:
        if n.startswith("ggml_type="):
            t = n.split("=", 1)[1]
            if isinstance(CODECS.get(t), KQuantCodec):
                return t
    return None


def legacy_match(spec: TensorSpec) -> tuple[str | None, str | None]:
    """``(type_name, None)`` when the spec is a legacy ggml type (or, E2M1, MXFP4 / NVFP4) exactly, else
    ``(None, reason)``."""
    s, gm = spec.scheme, spec.group_map
    if s is None or gm is None or spec.axes is None:
        return None, "tensor has no supported quantization scheme (" + "; ".join(spec.notes) + ")"
    kq = _k_quant_note(spec)
    if kq:
        return None, (f"{kq} K-quant (two-level scales) is written only as {kq} itself (from its super-block "
                      "fields): d*sc is generally not one fp16 block scale; requantize to a legacy type, or "
                      "pass --quant-type")
    if s.codebook is not None:
        fp4, why = fp4_match(spec)
        if fp4 is not None:
            return fp4, None
        return None, why or ("codebook schemes other than E2M1 (NF4, bitsandbytes FP4, FP8 elements) have no "
                             "GGUF block type")
    # per-tensor, per-output-channel or groups of 32k along in: each 32-block repeats its scale
    # (converter.quant.recode.as_groups), an exact re-expression
    regroupable = (gm.granularity is Granularity.TENSOR or (gm.granularity is Granularity.CHANNEL and gm.axis == OUT)
                   or (gm.granularity is Granularity.GROUP and gm.axis == IN and gm.group_size % 32 == 0))
    if not regroupable or spec.act_order:
        return None, (f"GGUF legacy blocks are 32 consecutive elements along 'in' (or a parameter shared by "
                      f"whole 32-blocks); the tensor has {gm.describe()}"
                      f"{' with act-order g_idx' if spec.act_order else ''}")
    axes = tuple(spec.axes)
    if axes not in ((OUT, IN), (EXPERT, OUT, IN)):
        return None, f"GGUF quantized tensors are (out, in) or (expert, out, in); found axes {list(axes)}"
    if spec.shape[-1] % 32:
        return None, f"'in' = {spec.shape[-1]} is not a multiple of the 32-element block"
    if s.scale_dtype not in ("F16", "BF16", "F32"):
        return None, f"{s.scale_dtype} scales cannot be stored as fp16 block scales exactly"
    if s.zero_point is ZeroPoint.NONE:
        t = {4: "Q4_0", 5: "Q5_0", 8: "Q8_0"}.get(s.bits)
        if t is None:
            return None, f"no symmetric GGUF legacy type has {s.bits}-bit codes (Q4_0, Q5_0, Q8_0)"
        return t, None
    if s.zero_point is ZeroPoint.FLOAT:
        if s.signed:
            return None, "signed codes with float biases: Q4_1/Q5_1 store unsigned codes (x = d*q + m)"
        t = {4: "Q4_1", 5: "Q5_1"}.get(s.bits)
        if t is None:
            return None, f"no affine GGUF legacy type has {s.bits}-bit codes (Q4_1, Q5_1)"
        return t, None
    return None, ("integer zero points: Q4_1/Q5_1 store a float minimum m = -z*s in fp16 (x = d*q + m), "
                  "which rounds -z*s unless it is an fp16 value (not bit-exact in general). Requantize: --asym "
                  "carries codes and scales (exact for a tensor whose every -z*s is an fp16 value), or "
                  f"{REQUANT_OPTIONS}")


def exact_type(spec: TensorSpec) -> str | None:
    """The ggml type a quantized ``spec`` is written as without requantizing (K-quant, FP4 or legacy), or None."""
    return kquant_match(spec) or legacy_match(spec)[0]


def check_target(spec: TensorSpec, options: TargetOptions = NO_OPTIONS) -> str | None:
    """None if ``spec`` can be written to GGUF without requantizing, else the reason.

    Dense tensors: F32/F16/BF16/F64/I8..I64 pass through. Quantized: exactly a legacy type (group
    32 along ``in``), a K-quant type (:func:`kquant_match`: written from its super-block fields), or
    MXFP4 / NVFP4 (codes and scale bytes relaid; an NVFP4 global scale must be an exact multiplier,
    checked at write time).
    Legacy types: F16 scales are exact; F32/BF16 scales are cast to fp16 and every value is checked
    at write time (NotRepresentableError when a cast would round).
    """
    if spec.kind == "opaque":
        return opaque_reason(spec)
    if spec.kind == "dense":
        return None if spec.dtype in DENSE_TYPES else f"dtype {spec.dtype} has no GGUF tensor type"
    if kquant_match(spec) is not None:
        return None
    return legacy_match(spec)[1]
