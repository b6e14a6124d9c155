"""Module roles and each target's module policy: which modules a target format quantizes.

Whether an input embedding, an output head or an MoE router may be stored quantized is a fact of
the target format *and of the loaders that read it*, not of the source. A loader that does not
expect a quantized module ignores its ``qweight``/``scales`` and randomly initialises the module
(transformers with GPTQ / AWQ: the embedding is an ``nn.Embedding``, never replaced by a quantized
layer), or expects a quantized module that was never stored (compressed-tensors ``targets:
["Linear"]`` with an empty ``ignore`` covers ``lm_head``). Either way the model loads and computes
garbage. Each writable format therefore declares a *policy*: a function of a tensor's spec that
returns ``None`` (the target may store it quantized) or the reason it must stay dense.

Roles are recognised from Hugging Face module names (after a reader's renaming, e.g. GGUF
``token_embd`` -> ``model.embed_tokens``):

- ``embedding``: the input token embedding (:func:`token_embedding_name`: ``*.embed_tokens``,
  ``wte``, ``word_embeddings``, ``embed_in``, ``tok_embeddings``, ``embeddings`` (Mamba), GGUF's
  ``token_embd``, T5's top-level ``shared``) and the other ``nn.Embedding`` modules: ``*.embed_tokens``, ``wte`` /
  ``wpe``, ``word_embeddings``, ``position_embeddings``, ``token_type_embeddings``, ``embed_in``,
  ``tok_embeddings``, ``embed_positions``, ``embeddings`` (Mamba), ``embed_tokens_per_layer`` (Gemma
  3n), ``relative_attention_bias`` (T5, an ``nn.Embedding``), T5's top-level ``shared``;
- ``head``: ``lm_head``, ``embed_out`` (GPT-NeoX), ``output`` at top level, BERT's tied
  ``cls.predictions.decoder``;
- ``router``: MoE gates (``*.mlp.gate`` — DeepSeek, Qwen-MoE, Mixtral's ``block_sparse_moe.gate`` —
  ``*.router``, DBRX / GraniteMoE ``router.layer``, Qwen-MoE ``shared_expert_gate``), kept dense by
  the HF quantizers (llm-compressor's ignore lists, GPTQModel's dynamic exclusions); ``mlp.gate_proj``
  is a ``linear``;
- ``linear``: anything else with a 2-D ``.weight``.

Sources: transformers ``integrations/gptq`` / ``awq`` (only ``nn.Linear`` modules are replaced;
``lm_head`` is excluded unless the config says ``lm_head: true``), compressed-tensors
``apply_quantization_config`` (``targets`` matched by module class, ``ignore`` by name), mlx-lm
``utils.quantize_model`` (every module with ``to_quantized`` — ``Linear`` and ``Embedding`` — whose
last dimension is divisible by the group size).
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Optional

from converter.tensor import TensorSpec
from converter.formats.source import module_prefix

EMBEDDING = "embedding"
HEAD = "head"
ROUTER = "router"
LINEAR = "linear"
OTHER = "other"

#: The input token embedding (the one an output head may be tied to), by Hugging Face module name.
_TOKEN_EMBEDDING_RE = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|embed_in|tok_embeddings|embeddings"
                                 r"|token_embd)\.weight$|^shared\.weight$")
#: Every other ``nn.Embedding`` (positions, token types, per-layer inputs, T5's relative attention bias).
_OTHER_EMBEDDING_RE = re.compile(r"(^|\.)(wpe|position_embeddings|token_type_embeddings|embed_positions"
                                 r"|embed_tokens_per_layer|relative_attention_bias)\.weight$")
_HEAD_RE = re.compile(r"(^|\.)(lm_head|embed_out)\.weight$|^output\.weight$|(^|\.)cls\.predictions\.decoder\.weight$")
_ROUTER_RE = re.compile(r"\.(mlp\.gate|block_sparse_moe\.gate|router|mlp\.router|router\.layer|shared_expert_gate)"
                        r"\.weight$")

#: A policy: ``None`` when the target may store the tensor quantized, else why it stays dense.
Policy = Callable[[TensorSpec], Optional[str]]


def module_role(name: str, ndim: int | None = None) -> str:
    """The role of tensor ``name``: ``embedding``, ``head``, ``router``, ``linear`` or ``other``.

    ``ndim`` (the logical rank) separates a 2-D ``linear`` weight from 1-D norms and biases
    (``other``); when None, any ``.weight`` not matched otherwise counts as ``linear``.
    """
    if _TOKEN_EMBEDDING_RE.search(name) or _OTHER_EMBEDDING_RE.search(name):
        return EMBEDDING
    if _HEAD_RE.search(name):
        return HEAD
    if _ROUTER_RE.search(name):
        return ROUTER
    if name.endswith(".weight") and (ndim is None or ndim >= 2):
        return LINEAR
    return OTHER


def is_token_embedding(name: str) -> bool:
    """Whether tensor ``name`` is an input token embedding (the one definition; see module docstring)."""
    return _TOKEN_EMBEDDING_RE.search(name) is not None


def token_embedding_name(names: Iterable[str]) -> str | None:
    """The input token embedding among ``names`` (the first that :func:`is_token_embedding`), or None."""
    return next((n for n in names if is_token_embedding(n)), None)


def hf_linear_policy(target: str, *, quantized_head: bool = False) -> Policy:
    """The policy of a target whose Hugging Face loaders quantize ``nn.Linear`` layers only
    (GPTQ, AWQ, compressed-tensors int): embeddings and MoE routers stay dense, and the output head
    too unless ``quantized_head`` (compressed-tensors: ``targets: ["Linear"]`` covers ``lm_head``).

    GPTQ through transformers converts only the Linear layers inside the decoder blocks (optimum
    ``GPTQQuantizer.convert_model``), AWQ skips the output embedding by default
    (``get_modules_to_not_convert(add_default_skips=True)``): a quantized head would be ignored.
    ``target`` names the format in the reason (``"gptq"``, ``"awq"``, ``"compressed-tensors"``).
    """
    reasons = {
        EMBEDDING: f"input embedding: {target} loaders keep nn.Embedding dense (a quantized one is ignored "
                   f"and randomly initialised)",
        ROUTER: f"MoE router: {target} loaders keep router gates dense",
    }
    if not quantized_head:
        reasons[HEAD] = (f"output head: {target} loaders through transformers convert only the Linear layers "
                         f"of the decoder blocks (a quantized lm_head would be ignored)")

    def policy(spec: TensorSpec) -> str | None:
        role = module_role(spec.name, len(spec.shape))
        if role in reasons:
            return reasons[role]
        if role not in (LINEAR, HEAD):
            return f"not a linear weight ({role}): {target} quantizes nn.Linear weights only"
        return None
    return policy


def dense_linear_modules(specs) -> list[str]:
    """Module names (``<module>`` of ``<module>.weight``) of the dense rank-2 weights among ``specs``
    whose role is ``linear``, ``router`` or ``head``: the Linear layers a target config must name as
    not converted, or its loader replaces them with quantized layers that find no ``qweight`` and are
    randomly initialised (transformers AWQ ``modules_to_not_convert``, GPTQModel ``dynamic``)."""
    out = []
    for spec in specs:
        if spec.kind == "dense" and len(spec.shape) == 2 and spec.name.endswith(".weight") \
                and module_role(spec.name, 2) in (LINEAR, ROUTER, HEAD):
            out.append(module_prefix(spec.name))
    return sorted(out)
