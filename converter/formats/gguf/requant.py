"""Requantizing to GGUF: llama.cpp's quantizer for the legacy types, and its type choice per tensor.

- :data:`GGUF_QUANTIZER` (a :class:`~converter.quant.format_quant.FormatQuantizer`, the GGUF
  handler's ``quantizer``): every requantize target is put in GGUF's form (:func:`requant_adapt`:
  fp16 block scales, asymmetric = float minimum as in Q4_1/Q5_1, a legacy type's exact scheme at
  groups of 32 along ``in``), and a tensor that is not carried exactly is quantized to its legacy
  type by :func:`converter.formats.gguf.format.quantize_to_gguf`, byte for byte what
  ``gguf.quants.quantize`` makes of the source's float32 dequantized values.
- :func:`requant_targets` (the handler's ``requant_targets``): the output head's own type.

The output head. ``llama-quantize`` does not quantize every tensor to the requested type. In
``llama_tensor_get_type`` (llama.cpp ``src/llama-quant.cpp``), the output head ``output.weight`` —
or ``token_embd.weight`` when the model has no output tensor (a tied head, as in SmolLM2) — gets
``Q6_K``, or ``Q8_0`` when its row length is not a multiple of 256 (``QK_K``), unless ``--pure``.
A requantize to a legacy GGUF type follows that rule, so that ``qckpt convert --to gguf --bits 4
--group-size 32 --sym`` gives what ``llama-quantize ... Q4_0`` gives: the head at ``Q6_K`` (``Q8_0``
for a row length that is not a multiple of 256). Measured on SmolLM2-135M-Instruct (Q4_1 source):
with its tied embedding requantized to Q4_0 the model no longer answers ' Paris'.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from converter.errors import NotRepresentableError, UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.layout import EXPERT, IN, OUT
from converter.quant.format_quant import FormatQuantizer
from converter.quant.recode import as_groups
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor
from converter.formats.gguf.block_fields import QK_K
from converter.formats.gguf.block_fp4 import FP4_CODECS
from converter.formats.gguf.fp4 import fp4_match
from converter.formats.gguf.mix import FILE_TYPES
from converter.formats.gguf.schemes import (REQUANT_OPTIONS, WRITE_TYPES, group_size_of, kquant_type_for,
                                            quantize_to_gguf, scheme_for)
from converter.formats.ties import HEAD, embedding_name
from converter.quant.requant import Target

__all__ = ["GGUF_QUANTIZER", "legacy_type_for", "kquant_type_for", "named_type", "requant_adapt", "requant_targets",
           "output_head"]


def legacy_type_for(scheme: QuantScheme, group_map: GroupMap) -> str | None:
    """The legacy ggml type whose blocks are exactly ``scheme`` over ``group_map``, or None.

    Groups of 32 consecutive elements along ``in`` (no ``g_idx``); symmetric 4/5/8-bit codes
    (either signedness: the same values) -> Q4_0/Q5_0/Q8_0; unsigned codes with a float bias
    4/5-bit -> Q4_1/Q5_1. The scale dtype and rounding are not looked at.
    """
    gm = group_map
    if (scheme.codebook is not None or gm.granularity is not Granularity.GROUP or gm.axis != IN
            or gm.group_size != 32 or gm.g_idx is not None):
        return None
    if scheme.zero_point is ZeroPoint.NONE:
        return {4: "Q4_0", 5: "Q5_0", 8: "Q8_0"}.get(scheme.bits)
    if scheme.zero_point is ZeroPoint.FLOAT and not scheme.signed:
        return {4: "Q4_1", 5: "Q5_1"}.get(scheme.bits)
    return None


def requant_adapt(scheme: QuantScheme, group_map: GroupMap, target) -> tuple[QuantScheme, GroupMap]:
    """A resolved requantize target in GGUF's form (:attr:`FormatQuantizer.adapt`).

    - Block scales are fp16 (``ggml_half``): the scale dtype becomes F16; an explicit
      ``--scale-dtype bf16|f32`` is refused.
    - GGUF has no integer zero points: an asymmetric target (``--asym``, or an integer-zero
      source kept as is) becomes unsigned codes with a float bias, the Q4_1/Q5_1 form
      (``x = d*q + m``).
    - A target that is then a legacy type (:func:`legacy_type_for`) becomes exactly that type's
      scheme (:func:`scheme_for`: llama.cpp's codes, signedness and rounding).

    Anything else is left for :func:`check_target` to accept (as a legacy type whose blocks
    repeat the group parameters) or refuse.

    Raises
    ------
    NotRepresentableError
        ``--scale-dtype`` other than f16.
    """
    qt = getattr(target, "quant_type", None)
    if qt is not None:  # a named ggml type (a --quant-type mix resolved per tensor)
        return named_type(qt)
    sd = getattr(target, "scale_dtype", None)
    if sd not in (None, "F16"):
        raise NotRepresentableError("GGUF block scales are fp16 (ggml_half)", field="--scale-dtype",
                                    expected="f16 (or leave it out)", found=sd.lower(),
                                    hint=f"requantize to GGUF with {REQUANT_OPTIONS}")
    if scheme.codebook is not None:
        return scheme, group_map
    if scheme.zero_point is ZeroPoint.INTEGER:
        scheme = scheme.replace(zero_point=ZeroPoint.FLOAT, signed=False)
    scheme = scheme.replace(scale_dtype="F16")
    t = legacy_type_for(scheme, group_map)
    return (scheme_for(t) if t is not None else scheme), group_map


def named_type(type_name: str) -> tuple[QuantScheme, GroupMap]:
    """Scheme and groups of a ggml type named by ``--quant-type`` (a per-tensor type of a mix).

    Raises
    ------
    NotRepresentableError
        A name that is not a ggml type qckpt writes (a whole-file mix name is resolved per tensor
        by :func:`requant_targets` first).
    """
    if type_name not in WRITE_TYPES:
        raise NotRepresentableError("not a GGUF type qckpt writes", field="--quant-type",
                                    expected=list(WRITE_TYPES) + list(FILE_TYPES), found=type_name)
    return scheme_for(type_name), GroupMap.per_group(group_size_of(type_name), IN)


def fp4_type_for(scheme: QuantScheme, group_map: GroupMap) -> str | None:
    """``MXFP4`` / ``NVFP4`` when ``scheme`` over ``group_map`` is exactly that type as llama.cpp's quantizer
    makes it (E2M1, E8M0 per 32 / E4M3 per 16 along ``in``, no global scale), else None."""
    if group_map.granularity is not Granularity.GROUP or group_map.axis != IN or group_map.g_idx is not None:
        return None
    for t, codec in FP4_CODECS.items():
        if scheme == scheme_for(t) and group_map.group_size == codec.group_size:
            return t
    return None


def _same_type(spec_or_tensor, scheme: QuantScheme, group_map: GroupMap) -> bool | None:
    """K-quant targets: True when the source is stored in that very type (llama-quantize copies a
    tensor already of the target type), else False (requantized from the float values; a K-quant
    cannot be carried into from another grid). MXFP4 / NVFP4 targets: True when the source is that type as
    llama.cpp's quantizer makes it (:func:`~converter.formats.gguf.fp4.fp4_match`, no global scale: the
    target's scheme has none, so a source with one is requantized; its exact repack is ``convert`` without
    ``--quant-type``), else False. None for the legacy types (the generic carry)."""
    f = fp4_type_for(scheme, group_map)
    if f is not None:
        src_scheme = getattr(spec_or_tensor, "scheme", None)
        return bool(fp4_match(spec_or_tensor)[0] == f and src_scheme is not None and src_scheme.global_scale is None)
    t = kquant_type_for(scheme, group_map)
    if t is None:
        return None
    dq = getattr(spec_or_tensor, "double_quant", None)
    kind = getattr(dq, "kind", dq)
    return bool(kind == t and spec_or_tensor.scheme == scheme
                and spec_or_tensor.group_map.group_size == group_map.group_size)


def _requant_accepts(scheme: QuantScheme, group_map: GroupMap, shape: Sequence[int],
                     axes: Sequence[str]) -> str | None:
    """The label of llama.cpp's quantizer when :func:`quantize_to_gguf` produces this target."""
    f = fp4_type_for(scheme, group_map)
    if f is not None:
        if tuple(axes) not in ((OUT, IN), (EXPERT, OUT, IN)) or len(shape) != len(axes) or \
                shape[-1] % FP4_CODECS[f].block_size:
            return None
        return f"gguf {f}: llama.cpp quantize_row_{f.lower()}_ref, qckpt numpy port"
    k = kquant_type_for(scheme, group_map)
    if k is not None:
        if tuple(axes) not in ((OUT, IN), (EXPERT, OUT, IN)) or len(shape) != len(axes) or shape[-1] % QK_K:
            return None
        return f"gguf {k}: llama.cpp quantize_row_{k.lower()}_ref (no imatrix), qckpt numpy port"
    t = legacy_type_for(scheme, group_map)
    if (t is None or scheme != scheme_for(t) or tuple(axes) not in ((OUT, IN), (EXPERT, OUT, IN))
            or len(shape) != len(axes) or shape[-1] % 32):
        return None
    return f"gguf {t}: llama.cpp quantize_row_{t.lower()}_ref (gguf.quants.quantize)"


def _requant_quantize(values: np.ndarray, scheme: QuantScheme, group_map: GroupMap, axes: Sequence[str],
                      name: str) -> QuantizedTensor:
    """:func:`quantize_to_gguf` for an accepted target (rows quantized independently)."""
    t = kquant_type_for(scheme, group_map) or fp4_type_for(scheme, group_map) or legacy_type_for(scheme, group_map)
    out = quantize_to_gguf(values, t, name=name)
    if tuple(out.axes) != tuple(axes):
        raise UnsupportedError("GGUF quantizer axes differ from the target's", tensor=name, field="axes",
                               expected=list(axes), found=list(out.axes))
    return out


def _requant_stored(t: QuantizedTensor) -> QuantizedTensor:
    """``t`` as the reader returns it: parameters repeated over the 32-element blocks (``t`` itself
    when it has no such form: the writer then refuses it; K-quants are read as written)."""
    if t.double_quant is not None or t.scheme.codebook is not None:  # K-quants, MXFP4 / NVFP4: as written
        return t
    try:
        return as_groups(t, 32)
    except NotRepresentableError:
        return t


GGUF_QUANTIZER = FormatQuantizer("gguf", requant_adapt, _requant_accepts, _requant_quantize, _requant_stored,
                                 same_type=_same_type)
"""GGUF's format quantizer: legacy types requantized with llama.cpp's reference quantizer."""

#: the output head's target when requantizing to a legacy type below 8 bits: Q8_0
HEAD_TARGET = {"bits": 8, "granularity": "group", "group_size": 32, "symmetric": True}


def output_head(ckpt) -> str | None:
    """The tensor llama.cpp treats as the output head: ``lm_head.weight``, else (tied) the embedding."""
    if HEAD in ckpt:
        return HEAD
    return embedding_name(ckpt)


def requant_targets(ckpt, target) -> dict[str, tuple[Any, str]]:
    """``{name: (Target, reason)}``: with ``--gguf-types-from FILE`` each tensor's type in FILE
    (:func:`converter.formats.gguf.types_from.types_from_targets`); with ``--quant-type`` every tensor's type of the
    mix (:func:`converter.formats.gguf.mix_targets.mix_targets`); else the output head (or tied
    embedding) at Q8_0 when ``target`` asks for fewer than 8 bits (empty when there is no
    quantized head or it gets 8 bits anyway)."""
    if getattr(target, "types_from", None) is not None:
        from converter.formats.gguf.types_from import types_from_targets
        return types_from_targets(ckpt, target.types_from)
    if getattr(target, "quant_type", None) is not None:
        from converter.formats.gguf.mix_targets import mix_targets
        return mix_targets(ckpt, target.quant_type)
    name = output_head(ckpt)
    if name is None or ckpt.spec(name).kind != "quantized":
        return {}
    bits = target.bits if target.bits is not None else ckpt.spec(name).scheme.bits
    if bits >= 8:
        return {}
    width = int(ckpt.spec(name).shape[-1])
    kind = "output head" if name == HEAD else "token embedding tied to the output head"
    if width % 256 == 0:  # a whole number of K-quant super-blocks per row: Q6_K, as llama.cpp writes it
        return {name: (Target(quant_type="Q6_K"), f"{kind}: llama.cpp's quantizer (llama_tensor_get_type) keeps "
                                                   "it above the requested type, requantized to Q6_K")}
    reason = (f"{kind}: llama.cpp's quantizer (llama_tensor_get_type) keeps it above the requested type, "
              f"requantized to Q8_0 (its row length {width} is not a multiple of 256)")
    return {name: (Target(**HEAD_TARGET, scale_dtype=None), reason)}
