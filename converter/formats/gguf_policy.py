"""GGUF's per-module requantize targets: what llama.cpp's quantizer gives the output head.

``llama-quantize`` does not quantize every tensor to the requested type. In
``llama_tensor_get_type`` (llama.cpp ``src/llama-quant.cpp``), the output head ``output.weight`` —
or ``token_embd.weight`` when the model has no output tensor (a tied head, as in SmolLM2) — gets
``Q6_K``, or ``Q8_0`` when its row length is not a multiple of 256 (``QK_K``), unless ``--pure``.
A requantize to a legacy GGUF type follows that rule, so that ``qckpt convert --to gguf --bits 4
--group-size 32 --sym`` gives what ``llama-quantize ... Q4_0`` gives: the head at ``Q8_0``
(qckpt writes no K-quants yet, so a 256-divisible head gets ``Q8_0`` where llama.cpp writes
``Q6_K``: more bytes, never less precision). Measured on SmolLM2-135M-Instruct (Q4_1 source):
with its tied embedding requantized to Q4_0 the model no longer answers ' Paris'.
"""

from __future__ import annotations

from typing import Any

from .ties import HEAD, embedding_name

#: the output head's target when requantizing to a legacy type below 8 bits: Q8_0
HEAD_TARGET = {"bits": 8, "granularity": "group", "group_size": 32, "symmetric": True}


def output_head(ckpt) -> str | None:
    """The tensor llama.cpp treats as the output head: ``lm_head.weight``, else (tied) the embedding."""
    if HEAD in ckpt:
        return HEAD
    return embedding_name(ckpt)


def requant_targets(ckpt, target) -> dict[str, tuple[Any, str]]:
    """``{name: (Target, reason)}``: the output head (or tied embedding) at Q8_0 when ``target``
    asks for fewer than 8 bits; empty when there is no quantized head or it gets 8 bits anyway."""
    from ..quant.requant import Target  # the quant layer builds targets; formats only name them
    name = output_head(ckpt)
    if name is None or ckpt.spec(name).kind != "quantized":
        return {}
    bits = target.bits if target.bits is not None else ckpt.spec(name).scheme.bits
    if bits >= 8:
        return {}
    width = int(ckpt.spec(name).shape[-1])
    kind = "output head" if name == HEAD else "token embedding tied to the output head"
    why = ("its row length %d is not a multiple of 256" % width if width % 256 else
           "llama.cpp writes Q6_K, which qckpt does not write yet: Q8_0, more precise")
    reason = (f"{kind}: llama.cpp's quantizer (llama_tensor_get_type) keeps it above the requested type, "
              f"requantized to Q8_0 ({why})")
    return {name: (Target(**HEAD_TARGET, scale_dtype=None), reason)}
