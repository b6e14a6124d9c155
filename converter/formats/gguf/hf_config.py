"""Hugging Face ``config.json`` for a GGUF file, from its llama.cpp key/values and tensor names.

A GGUF carries no ``config.json``: its hyperparameters are ``{arch}.*`` keys (gguf-py
``gguf/constants.py`` ``Keys.LLM`` / ``Keys.Attention`` / ``Keys.Rope``). The mapping below is the
one transformers' own GGUF loader applies (``transformers/integrations/ggml.py``
``GGUF_CONFIG_MAPPING`` and ``modeling_gguf_pytorch_utils.load_gguf_checkpoint``, transformers
5.24), written for the architectures whose tensors :mod:`converter.formats.gguf.names` maps:

==============================================  ==========================================
GGUF key (``{arch}.`` prefix)                    config.json
==============================================  ==========================================
``block_count``                                 ``num_hidden_layers``
``context_length``                              ``max_position_embeddings``
``embedding_length``                            ``hidden_size``
``feed_forward_length``                         ``intermediate_size``
``attention.head_count`` / ``head_count_kv``    ``num_attention_heads`` / ``num_key_value_heads``
``attention.key_length`` (else hidden/heads)    ``head_dim`` (``rope.dimension_count`` must equal it)
``attention.layer_norm_rms_epsilon``            ``rms_norm_eps``
``rope.freq_base`` (llama.cpp default 10000)    ``rope_parameters.rope_theta`` and ``rope_theta``
``rope.scaling.*`` (linear, yarn)               ``rope_parameters`` and ``rope_scaling``
``vocab_size`` (else len(tokenizer.ggml.tokens)) ``vocab_size``
no ``output.weight`` tensor                     ``tie_word_embeddings: true`` (llama.cpp writes the
                                                head only when it is not the embedding)
``tokenizer.ggml.{bos,eos,padding}_token_id``   ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id``
==============================================  ==========================================

RoPE is written twice on purpose: transformers 5 reads ``rope_parameters`` (``{"rope_type",
"rope_theta", ...}``), while mlx_lm 0.32 (``mlx_lm/models/llama.py`` ``ModelArgs``: fields
``rope_theta: float = 10000`` and ``rope_scaling``; ``BaseModelArgs.from_dict`` drops unknown keys)
reads only the top-level ``rope_theta`` / ``rope_scaling`` and would silently use 10000.

Float32 key values (every llama.cpp float hyperparameter) are written as the shortest decimal that
rounds to the same float32 (``9.999999747378752e-06`` -> ``1e-05``): the model computes with the
float32 either way, and the decimal is the one the original config.json had.

Architectures: ``llama`` (``LlamaForCausalLM``; llama.cpp also converts Mistral as ``llama`` and
runs it without a sliding window, which is what LlamaForCausalLM computes; transformers' own
``llama`` -> ``mistral`` switch only fires for a file whose ``general.name`` is exactly
``"mistral"``), ``qwen2`` (``Qwen2ForCausalLM``) and ``qwen3`` (``Qwen3ForCausalLM``: per-head q/k RMS norms,
one ``attention_bias`` flag), ``gemma2`` / ``gemma3`` (``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM``, text only:
:func:`_gemma`). Anything else (``deepseek2`` included: its ``kv_b_proj`` is read back as llama.cpp's
``k_b`` / ``v_b`` pair, and its MoE has no mapping here), and the variants these classes
cannot express (experts, per-layer head counts, partial rotary, llama3 RoPE stored as a
``rope_freqs`` tensor, partial attention biases), raises :class:`UnsupportedError` with the reason.
``torch_dtype`` / ``dtype`` are left to the writer (the dtype it actually writes).
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping

import numpy as np

from converter.errors import ErrorKind, FormatError, UnsupportedError

__all__ = ["hf_config_from_gguf", "ARCHITECTURES", "f32_decimal"]

ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
    "gpt-oss": ("gpt_oss", "GptOssForCausalLM"),
    "gemma2": ("gemma2", "Gemma2ForCausalLM"),
    "gemma3": ("gemma3_text", "Gemma3ForCausalLM"),
}
"""``general.architecture`` -> (``model_type``, ``architectures[0]``)."""

DEFAULT_ROPE_THETA = 10000.0
"""llama.cpp's ``rope_freq_base`` when the key is absent (``llama_model_loader`` default)."""

_ATTN = ("attn_q", "attn_k", "attn_v", "attn_output")
_MLP = ("ffn_gate", "ffn_up", "ffn_down")


def f32_decimal(value: float) -> float:
    """The shortest decimal that rounds to the same float32 as ``value`` (``repr`` of numpy float32)."""
    return float(str(np.float32(value)))


def _int(kv: Mapping[str, Any], key: str, *, required: bool = True) -> int | None:
    v = kv.get(key)
    if v is None:
        if required:
            raise FormatError("GGUF hyperparameter missing: cannot build config.json", field=key,
                              expected="an integer", found=None, kind=ErrorKind.CONFIG_MISMATCH)
        return None
    if isinstance(v, list):
        raise UnsupportedError("per-layer values cannot be written to a Hugging Face config", field=key,
                               expected="one integer", found=f"a list of {len(v)}", kind=ErrorKind.CONFIG_MISMATCH)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise FormatError("GGUF hyperparameter is not a non-negative integer", field=key,
                          expected="an integer >= 0", found=v)
    return int(v)


def _float(kv: Mapping[str, Any], key: str, types: Mapping[str, Any], default: float | None = None) -> float | None:
    v = kv.get(key, default)
    if v is None:
        return None
    try:
        f = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
    except OverflowError:  # an integer past the float range
        f = None
    if f is None or not math.isfinite(f):
        raise FormatError("GGUF hyperparameter is not a finite number", field=key, expected="a float", found=v)
    if types.get(key) == "FLOAT64":
        return f
    if not abs(f) <= float(np.finfo(np.float32).max):
        raise FormatError("GGUF float hyperparameter outside the float32 range", field=key, expected="a float32",
                          found=v)
    return f32_decimal(f)


_BIAS = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.bias$")


def _biased_blocks(names: set[str], stems: tuple[str, ...], suffix: str = ".bias") -> dict[str, set[int]]:
    """Per stem, the block indices with a ``blk.N.<stem><suffix>`` tensor (default: the biases; from the names:
    no loop over a file-stated block count, which may be huge)."""
    out: dict[str, set[int]] = {s: set() for s in stems}
    pattern = _BIAS if suffix == ".bias" else re.compile(r"^blk\.(\d+)\.([a-z_]+)" + re.escape(suffix) + "$")
    for n in names:
        m = pattern.match(n)
        if m and m.group(2) in out:
            out[m.group(2)].add(int(m.group(1)))
    return out


def _every_block(blocks: set[int], layers: int) -> bool:
    return len(blocks) == layers and all(b < layers for b in blocks)


def _bias_flag(names: set[str], stems: tuple[str, ...], layers: int, what: str) -> bool:
    """True when every block has a ``.bias`` for every stem, False when none has one."""
    found = _biased_blocks(names, stems)
    count = sum(len(b) for b in found.values())
    if not count:
        return False
    if all(_every_block(b, layers) for b in found.values()):
        return True
    raise UnsupportedError(f"{what} biases on only some projections: no Hugging Face config flag says so",
                           field=f"blk.*.{{{','.join(stems)}}}.bias", expected=f"all {layers * len(stems)} or none",
                           found=count, kind=ErrorKind.CONFIG_MISMATCH)


def _rope(kv: Mapping[str, Any], arch: str, types: Mapping[str, Any], names: set[str]) -> dict[str, Any]:
    """``rope_parameters`` (transformers 5 form) from ``{arch}.rope.*``."""
    if "rope_freqs.weight" in names:
        raise UnsupportedError("RoPE frequency factors are stored as a 'rope_freqs' tensor (llama.cpp's form of "
                               "llama3 RoPE scaling); its low/high frequency parameters are not recoverable",
                               field="rope_freqs.weight")
    theta = _float(kv, f"{arch}.rope.freq_base", types, DEFAULT_ROPE_THETA)
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": theta}
    p = f"{arch}.rope.scaling."
    # llama_model_loader: the type defaults to "linear"; the factor is rope.scaling.factor, else the
    # older rope.scale_linear; a factor of 0 or 1 means no scaling
    kind = kv.get(p + "type", "linear")
    kind = kind if isinstance(kind, str) else repr(kind)
    factor = _float(kv, p + "factor", types)
    if factor is None:
        factor = _float(kv, f"{arch}.rope.scale_linear", types)
    if kind == "none" or (kind == "linear" and factor in (None, 0.0, 1.0)):
        return params
    if kind == "linear":
        params.update(rope_type="linear", factor=factor)
        return params
    if kind == "yarn":
        unmapped = [k for k in ("attn_factor", "yarn_log_multiplier", "yarn_ext_factor", "yarn_attn_factor")
                    if p + k in kv]
        if unmapped:
            raise UnsupportedError("YaRN keys without an exact transformers equivalent", field=p + unmapped[0],
                                   found=kv[p + unmapped[0]])
        if factor is None:
            raise FormatError("YaRN RoPE scaling without a factor", field=p + "factor", expected="a float")
        params.update(rope_type="yarn", factor=factor)
        orig = _int(kv, p + "original_context_length", required=False)
        if orig is not None:
            params["original_max_position_embeddings"] = orig
        for src, dst in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            v = _float(kv, p + src, types)
            if v is not None:
                params[dst] = v
        return params
    raise UnsupportedError("RoPE scaling type has no mapping to transformers", field=p + "type",
                           expected="none, linear or yarn", found=kind)


def _gpt_oss(kv: Mapping[str, Any], a: str, layers: int) -> dict[str, Any]:
    """``GptOssConfig`` fields from a llama.cpp ``gpt-oss`` GGUF (``convert_hf_to_gguf.py`` ``GptOssModel``):
    ``intermediate_size`` is the expert FFN size (``expert_feed_forward_length``), the experts from
    ``expert_count`` / ``expert_used_count``, the sliding window from ``attention.sliding_window``; llama.cpp's
    gpt-oss alternates sliding and full attention from layer 0 (``set_swa_pattern(2)``), transformers' default
    ``layer_types``; q/k/v/o carry biases (``attention_bias``). transformers' gpt-oss YaRN is not truncated
    (``convert_gpt_oss_weights_to_hf.py`` writes ``"truncate": false``), which the GGUF keys do not say."""
    fields = {"intermediate_size": a + "expert_feed_forward_length", "num_local_experts": a + "expert_count",
              "num_experts_per_tok": a + "expert_used_count", "sliding_window": a + "attention.sliding_window"}
    out: dict[str, Any] = {k: _int(kv, key) for k, key in fields.items()}
    out["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    out["attention_bias"] = True
    return out


#: llama.cpp's 27B Gemma 2 / Gemma 3 (``llama-model.cpp``: by block count) scale attention by
#: ``1 / sqrt(n_embd / n_head)``, every other size by ``1 / sqrt(head_dim)`` (``f_attention_scale``): transformers'
#: ``query_pre_attn_scalar``.
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


def _gemma(kv: Mapping[str, Any], arch: str, types: Mapping[str, Any], layers: int, hidden: int, heads: int,
           head_dim: int, rope: dict[str, Any]) -> dict[str, Any]:
    """``Gemma2Config`` / ``Gemma3TextConfig`` fields as llama.cpp runs a ``gemma2`` / ``gemma3`` GGUF
    (``llama-model.cpp``): GELU (tanh) MLP, the soft-capping values (gemma2: llama.cpp's defaults 50 / 30 when the
    keys are absent), the sliding window with llama.cpp's layer pattern (gemma2: every other layer from layer 0,
    ``set_swa_pattern(2)``; gemma3: five sliding layers then one full, ``set_swa_pattern(6)``; transformers' default
    ``layer_types`` are the same), ``query_pre_attn_scalar`` from the attention scale llama.cpp uses, and for
    gemma3 the RoPE per layer type (``rope.freq_base`` / scaling for full attention, ``rope.freq_base_swa``,
    default 10000, for sliding). Norm weights are read back as ``w`` (llama.cpp stores ``1 + w``)."""
    a = f"{arch}."
    window = _int(kv, a + "attention.sliding_window")
    pattern = 2 if arch == "gemma2" else 6
    scalar = hidden // heads if layers == _GEMMA_27B_LAYERS[arch] else head_dim
    out: dict[str, Any] = {"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": scalar,
                           "sliding_window": window, "attention_bias": False, "attention_dropout": 0.0,
                           "layer_types": ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                           for i in range(layers)]}
    final = _float(kv, a + "final_logit_softcapping", types, 30.0 if arch == "gemma2" else None)
    out["final_logit_softcapping"] = final
    if arch == "gemma2":
        out["attn_logit_softcapping"] = _float(kv, a + "attn_logit_softcapping", types, 50.0)
        out["rope_parameters"] = rope
    else:
        out["attn_logit_softcapping"] = None
        swa = _float(kv, a + "rope.freq_base_swa", types, DEFAULT_ROPE_THETA)
        out["rope_parameters"] = {"full_attention": rope,
                                  "sliding_attention": {"rope_type": "default", "rope_theta": swa}}
    return out


def hf_config_from_gguf(kv: Mapping[str, Any], tensor_names: Iterable[str], *,
                        kv_types: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``config.json`` (dict) of a GGUF model (see the module table).

    Parameters
    ----------
    kv : mapping
        The file's key/values as plain values (``Checkpoint.metadata["gguf_kv"]``).
    tensor_names : iterable of str
        GGUF tensor names (``blk.0.attn_q.weight`` ...): tied head, attention / MLP biases.
    kv_types : mapping, optional
        GGUF value types (``metadata["gguf_kv_types"]``); a ``FLOAT64`` value is kept as is,
        other floats are float32 (:func:`f32_decimal`).

    Returns
    -------
    dict
        ``architectures``, ``model_type``, shape fields, ``rms_norm_eps``, ``rope_parameters`` and
        ``rope_theta`` (+ ``rope_scaling`` when scaled), ``vocab_size``, ``tie_word_embeddings``,
        special token ids, ``hidden_act``, bias flags. No ``dtype`` (the writer's).

    Raises
    ------
    UnsupportedError
        An architecture or variant with no faithful Hugging Face config (the message says which).
    FormatError
        A required hyperparameter is missing or not a number.
    """
    types = kv_types or {}
    names = set(tensor_names)
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise UnsupportedError("no Hugging Face config mapping for this GGUF architecture",
                               field="general.architecture", expected=sorted(ARCHITECTURES), found=arch,
                               kind=ErrorKind.CONFIG_MISMATCH)
    model_type, cls = ARCHITECTURES[arch]
    a = f"{arch}."
    if kv.get(a + "expert_count") and arch != "gpt-oss":
        raise UnsupportedError(f"mixture-of-experts '{arch}' GGUF files are not mapped to a Hugging Face config",
                               field=a + "expert_count", found=kv[a + "expert_count"], kind=ErrorKind.CONFIG_MISMATCH)
    layers = _int(kv, a + "block_count")
    hidden = _int(kv, a + "embedding_length")
    heads = _int(kv, a + "attention.head_count")
    kv_heads = _int(kv, a + "attention.head_count_kv", required=False)
    kv_heads = heads if kv_heads is None else kv_heads
    if not heads or not kv_heads or heads % kv_heads:
        raise FormatError("head counts do not group: head_count must be a positive multiple of head_count_kv",
                          field=a + "attention.head_count_kv", expected=f"a divisor of {heads}", found=kv_heads)
    head_dim = _int(kv, a + "attention.key_length", required=False)
    if head_dim is None:
        if hidden % heads:
            raise FormatError("embedding_length is not a whole number of heads and no key_length is given",
                              field=a + "attention.key_length", expected=f"a divisor of {hidden}", found=heads)
        head_dim = hidden // heads
    value_dim = _int(kv, a + "attention.value_length", required=False)
    if value_dim not in (None, head_dim):
        raise UnsupportedError("key and value head sizes differ", field=a + "attention.value_length",
                               expected=head_dim, found=value_dim)
    rot = _int(kv, a + "rope.dimension_count", required=False)
    if rot not in (None, head_dim):
        raise UnsupportedError("partial rotary embedding (rope.dimension_count < head size) is not mapped",
                               field=a + "rope.dimension_count", expected=head_dim, found=rot)
    vocab = _int(kv, a + "vocab_size", required=False)
    if vocab is None:
        tokens = kv.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list):
            raise FormatError("vocabulary size unknown: no vocab_size key and no tokenizer.ggml.tokens",
                              field=a + "vocab_size")
        vocab = len(tokens)
    rope = _rope(kv, arch, types, names)
    eps = _float(kv, a + "attention.layer_norm_rms_epsilon", types)
    if eps is None:
        raise FormatError("GGUF hyperparameter missing: cannot build config.json",
                          field=a + "attention.layer_norm_rms_epsilon", expected="a float", found=None,
                          kind=ErrorKind.CONFIG_MISMATCH)
    cfg: dict[str, Any] = {
        "architectures": [cls],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": _int(kv, a + "feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": _int(kv, a + "context_length"),
        "rms_norm_eps": eps,
        "vocab_size": vocab,
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in names,
        "rope_parameters": rope,
        "rope_theta": rope["rope_theta"],
    }
    if rope["rope_type"] != "default":
        cfg["rope_scaling"] = dict(rope)
    if arch in _GEMMA_27B_LAYERS:
        if "output.weight" in names:
            raise UnsupportedError("Gemma ties its head to the embedding; this file has an output.weight",
                                   field="output.weight", kind=ErrorKind.CONFIG_MISMATCH)
        cfg.pop("hidden_act")
        cfg.pop("rope_scaling", None)
        cfg.pop("rope_theta")
        cfg.update(_gemma(kv, arch, types, layers, hidden, heads, head_dim, rope))
    elif arch == "gpt-oss":
        cfg.update(_gpt_oss(kv, a, layers))
        cfg["rope_parameters"] = rope = {**rope, "truncate": False} if rope["rope_type"] == "yarn" else rope
        cfg.pop("rope_scaling", None)
    elif arch == "llama":
        cfg["attention_bias"] = _bias_flag(names, _ATTN, layers, "attention")
        cfg["mlp_bias"] = _bias_flag(names, _MLP, layers, "MLP")
    elif arch == "qwen3":  # Qwen3Attention: one attention_bias flag for q/k/v/o, per-head q/k RMS norms always;
        cfg["attention_bias"] = _bias_flag(names, _ATTN, layers, "attention")  # Qwen3MLP has no bias
        norms = _biased_blocks(names, ("attn_q_norm", "attn_k_norm"), suffix=".weight")
        missing = [f"blk.*.{stem}.weight" for stem, blocks in norms.items() if not _every_block(blocks, layers)]
        mlp_bias = sorted(n for n in names if n.endswith((".ffn_gate.bias", ".ffn_up.bias", ".ffn_down.bias")))
        if missing or mlp_bias:
            raise UnsupportedError("Qwen3 has q/k norms in every block and no MLP bias; this file differs",
                                   field=(missing or mlp_bias)[0], expected="attn_q_norm / attn_k_norm per block",
                                   found=f"missing: {missing}; MLP biases: {mlp_bias[:3]}")
        cfg["use_sliding_window"] = False
    else:  # qwen2: q/k/v biases are built in (Qwen2Attention bias=True), o_proj and the MLP have none
        qkv = _biased_blocks(names, _ATTN[:3])
        missing = [f"blk.*.{stem}.bias" for stem, blocks in qkv.items() if not _every_block(blocks, layers)]
        extra = sorted(n for n in names if n.endswith((".attn_output.bias", ".ffn_gate.bias", ".ffn_up.bias",
                                                       ".ffn_down.bias")))
        if missing or extra:
            raise UnsupportedError("Qwen2 has q/k/v biases (one per block) and no other Linear bias; this file differs",
                                   field=(missing or extra)[0], expected="q/k/v biases only",
                                   found=f"incomplete: {missing}; extra: {extra[:3]}")
        cfg["use_sliding_window"] = False
    for field, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("pad_token_id", "padding_token_id")):
        v = _int(kv, f"tokenizer.ggml.{key}", required=False)
        if v is not None:
            if v >= vocab:
                raise FormatError("special token id outside the vocabulary", field=f"tokenizer.ggml.{key}",
                                  expected=f"< {vocab}", found=v)
            cfg[field] = v
    return cfg
