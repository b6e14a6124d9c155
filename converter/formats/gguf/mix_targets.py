"""``--quant-type Q4_K_M`` (a llama-quantize file type) -> one requantize target per tensor.

The GGUF handler's ``requant_targets`` hook for a named file type: each tensor of the checkpoint
gets the GGUF name, row length and hyperparameters the writer will use, :func:`choose_types` of
:mod:`converter.formats.gguf.mix` picks its ggml type, and the tensor's target names that type
(``Target(quant_type="Q6_K")``), which :data:`~converter.formats.gguf.requant.GGUF_QUANTIZER`
resolves. Float weights the mix quantizes get a target too (the requantize then quantizes them
from their float32 values); tensors llama-quantize leaves alone get none (float) or keep their
own type (quantized). The file type is recorded in ``ckpt.metadata["gguf_file_type"]`` for the
writer's ``general.file_type``.
"""

from __future__ import annotations

from typing import Any

from converter.errors import NotRepresentableError, OptionValueError
from converter.formats.gguf.mix import FILE_TYPES, ModelInfo, TensorInfo, _fallback, allows_quantization, choose_types
from converter.formats.gguf.names import HF_MODEL_TYPE_TO_ARCH, hf_to_gguf
from converter.formats.ties import resolve_tied_head
from converter.formats.gguf.hf_source import config_kv

__all__ = ["mix_targets", "FILE_TYPE_KEY"]

#: ``ckpt.metadata`` key of the llama.cpp file type a mix was resolved for (read by the writer): its name, or the
#: ``general.file_type`` integer of a ``--gguf-types-from`` file (:mod:`converter.formats.gguf.types_from`).
FILE_TYPE_KEY = "gguf_file_type"


def _arch_and_kv(ckpt) -> tuple[str, dict[str, Any]]:
    kv = dict(ckpt.metadata.get("gguf_kv") or {})
    arch = kv.get("general.architecture") or HF_MODEL_TYPE_TO_ARCH.get(ckpt.config.get("model_type")) \
        or ckpt.config.get("model_type")
    if not isinstance(arch, str) or not arch:
        raise NotRepresentableError("no GGUF architecture to choose the mix by", file=ckpt.path,
                                    field="general.architecture", expected="a GGUF source or config.json model_type",
                                    found=None)
    if not kv and ckpt.config:
        kv = config_kv(ckpt.config, arch)
        experts = ckpt.config.get("num_local_experts") or ckpt.config.get("num_experts")
        if isinstance(experts, int):
            kv[f"{arch}.expert_count"] = experts
    return arch, kv


#: Float dtypes a single type quantizes from (llama-quantize reads F32 / F16 / BF16 weights).
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def _pure_float_targets(ckpt, ggml_type: str) -> dict[str, tuple[Any, str]]:
    """Targets of the float weights for one ggml type: what ``llama-quantize --pure`` quantizes.

    llama.cpp (``src/llama-quant.cpp`` of commit 0c1e57098bba, llama-cpp-python 0.3.36) with ``pure``
    gives every tensor ``tensor_allows_quantization`` accepts (:func:`~converter.formats.gguf.mix.allows_quantization`:
    2-D or more, named ``...weight``, not a norm, ``ffn_gate_inp``, position / token-type embedding ...;
    ``token_embd`` and ``output`` included) the default type, with the row-length fallback
    (:func:`~converter.formats.gguf.mix._fallback`: Q4_K -> Q5_0 for a 384-wide row); a tensor the
    fallback leaves F16 stays float. Checked against ``llama_model_quantize(pure=True)``
    (``sample_checkpoints/gguf/kquant_expected/pure.json``). Without a GGUF architecture (no GGUF
    source, no known ``config.json`` model_type) float weights are not quantized.
    """
    from converter.quant.requant import Target

    floats = [s for s in ckpt.specs() if s.kind == "dense" and s.dtype in _FLOAT_DTYPES and len(s.shape) >= 2]
    if not floats:
        return {}
    try:
        arch, _ = _arch_and_kv(ckpt)
    except NotRepresentableError:
        return {}
    names = dict(ckpt.metadata.get("gguf_names") or {}) if ckpt.format == "gguf" else {}
    drop, _, _ = resolve_tied_head(ckpt, ckpt.config or None, ckpt.names())
    out: dict[str, tuple[Any, str]] = {}
    for s in floats:
        if s.name in drop:
            continue
        info = TensorInfo(names.get(s.name) or hf_to_gguf(s.name, arch), int(s.shape[-1]), len(s.shape))
        if not allows_quantization(info):
            continue
        t = _fallback(info, ggml_type)
        if t != "F16":
            why = "" if t == ggml_type else f" (row length {info.row_len}: llama.cpp's fallback)"
            out[s.name] = (Target(quant_type=t), f"--quant-type {ggml_type} (llama-quantize --pure): "
                                                 f"{info.name} -> {t}{why}")
    return out


def mix_targets(ckpt, file_type: str) -> dict[str, tuple[Any, str]]:
    """``{name: (Target, reason)}`` for llama-quantize file type ``file_type`` (or one ggml type).

    Raises
    ------
    NotRepresentableError
        Unknown file type, no architecture, or a tensor the mix would make F16 from a quantized
        source (row length not a multiple of 32).
    """
    from converter.quant.requant import Target
    from converter.formats.gguf.schemes import WRITE_TYPES

    if file_type not in FILE_TYPES:
        if file_type in WRITE_TYPES:  # one type for every quantized tensor and float weight (llama-quantize --pure)
            out = {s.name: (Target(quant_type=file_type), f"--quant-type {file_type}")
                   for s in ckpt.specs() if s.kind == "quantized" or s.decoded_by}
            out.update(_pure_float_targets(ckpt, file_type))
            return out
        raise OptionValueError("unknown GGUF quantization type", field="--quant-type",
                               expected=", ".join(dict.fromkeys([*FILE_TYPES, *WRITE_TYPES])), found=file_type)
    arch, kv = _arch_and_kv(ckpt)
    names = dict(ckpt.metadata.get("gguf_names") or {}) if ckpt.format == "gguf" else {}
    drop, _, _ = resolve_tied_head(ckpt, ckpt.config or None, ckpt.names())
    # a type known by its values only (GGUF IQ* / TQ*, decoded_by) is requantized like a quantized tensor
    specs = [s for s in ckpt.specs() if s.name not in drop and (s.kind in ("dense", "quantized") or s.decoded_by)]
    gname = {s.name: names.get(s.name) or hf_to_gguf(s.name, arch) for s in specs}
    infos = [TensorInfo(gname[s.name], int(s.shape[-1]) if s.shape else 1, len(s.shape)) for s in specs]
    types = choose_types(file_type, infos, ModelInfo.from_kv(kv, arch))
    ckpt.metadata[FILE_TYPE_KEY] = file_type
    out: dict[str, tuple[Any, str]] = {}
    for s in specs:
        t = types[gname[s.name]]
        if s.decoded_by and t in (None, "F16"):
            raise NotRepresentableError(f"llama-quantize {file_type} keeps this tensor as stored ({s.dtype}), a type "
                                        "qckpt reads by its values only and cannot write", tensor=s.name,
                                        field="--quant-type", expected="a type llama-quantize gives it",
                                        found=s.dtype, hint="requantize with one type (e.g. --quant-type Q8_0)")
        if t is None:
            if s.kind == "quantized":
                out[s.name] = (Target(), f"llama-quantize {file_type}: not quantized by llama.cpp (kept)")
            continue
        if t == "F16":
            if s.kind == "quantized":
                raise NotRepresentableError("llama-quantize would store this tensor as F16 (row length not a "
                                            "multiple of 32); qckpt does not dequantize it to F16 here",
                                            tensor=s.name, field="shape", expected="a multiple of 32",
                                            found=list(s.shape))
            continue
        if s.kind == "dense" and s.dtype not in ("F32", "F16", "BF16", "F64"):
            continue
        out[s.name] = (Target(quant_type=t), f"llama-quantize {file_type} (llama_tensor_get_type): {gname[s.name]} "
                                             f"-> {t}")
    return out
