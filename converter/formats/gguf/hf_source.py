"""GGUF key/values for a Hugging Face source (config.json, no GGUF key/values), after llama.cpp's
``convert_hf_to_gguf.py``: the hyperparameters it writes, the F32 rule for 1-D tensors, and the warning
when the file written has no vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from converter.tensor import Checkpoint

__all__ = ["config_kv", "yarn_kv", "rope_theta", "tokenizer_warning", "no_vocab_kv", "NO_TOKENIZER", "NO_VOCAB_KV",
           "NO_VOCAB_WARNING", "WIDENED_1D"]


def rope_theta(config: Mapping[str, Any]) -> Any:
    """RoPE base frequency: top-level ``rope_theta``, else ``rope_parameters["rope_theta"]`` (transformers 5
    writes only the nested one; ``convert_hf_to_gguf.py`` ``TextModel.set_gguf_parameters`` reads
    ``rope_params.get("rope_theta")`` into ``add_rope_freq_base``)."""
    v = config.get("rope_theta")
    rp = config.get("rope_parameters")
    if v is None and isinstance(rp, Mapping):
        v = rp.get("rope_theta")
    return v


def config_kv(config: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """Hyperparameter key/values from a Hugging Face config.json (no tokenizer keys).

    Conventions of llama.cpp ``convert_hf_to_gguf.py`` (``TextModel.set_gguf_parameters``;
    ``LlamaModel.set_gguf_parameters`` adds ``{arch}.vocab_size``, gguf-py ``constants.py``
    ``Keys.LLM.VOCAB_SIZE``): ``{arch}.rope.freq_base`` from ``rope_theta`` or
    ``rope_parameters.rope_theta``; ``{arch}.vocab_size`` from ``vocab_size`` (without it, and without
    ``tokenizer.ggml.tokens``, transformers' GGUF loader builds a 32000-row embedding); the MoE keys
    ``{arch}.expert_count`` / ``expert_used_count`` (``num_local_experts`` / ``num_experts_per_tok``),
    ``attention.key_length`` / ``value_length`` (``head_dim``) and ``attention.sliding_window`` when the config
    has them, and gpt-oss's ``expert_feed_forward_length`` (``GptOssModel.set_gguf_parameters``).
    """
    pairs = {"block_count": "num_hidden_layers", "context_length": "max_position_embeddings",
             "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
             "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
             "attention.layer_norm_rms_epsilon": "rms_norm_eps", "attention.layer_norm_epsilon": "layer_norm_eps",
             "vocab_size": "vocab_size", "expert_count": "num_local_experts",
             "expert_used_count": "num_experts_per_tok", "attention.key_length": "head_dim",
             "attention.value_length": "head_dim", "attention.sliding_window": "sliding_window"}
    values = {k: config.get(ck) for k, ck in pairs.items()}
    values["rope.freq_base"] = rope_theta(config)
    if arch == "gpt-oss":  # GptOssModel.set_gguf_parameters: add_expert_feed_forward_length(intermediate_size)
        values["expert_feed_forward_length"] = config.get("intermediate_size")
    out = {}
    for k, v in values.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{arch}.{k}"] = float(v) if ("epsilon" in k or "freq" in k) else int(v)
    out.update(yarn_kv(config, arch))
    return out


#: ``rope_parameters`` field -> GGUF ``{arch}.rope.scaling.*`` key of a YaRN RoPE, with its type.
_YARN = (("factor", "factor", float), ("original_max_position_embeddings", "original_context_length", int),
         ("extrapolation_factor", "yarn_ext_factor", float), ("attention_factor", "yarn_attn_factor", float),
         ("beta_fast", "yarn_beta_fast", float), ("beta_slow", "yarn_beta_slow", float))


def yarn_kv(config: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The YaRN RoPE keys ``convert_hf_to_gguf.py`` ``TextModel.set_gguf_parameters`` writes when
    ``rope_parameters`` (or ``rope_scaling``) has ``rope_type: "yarn"`` and a ``factor``: ``rope.scaling.type``
    ``"yarn"``, ``factor``, ``original_context_length`` and, when given, ``yarn_ext_factor`` /
    ``yarn_attn_factor`` (``attention_factor``) / ``yarn_beta_fast`` / ``yarn_beta_slow`` (gpt-oss: factor 32,
    4096, beta 32 / 1). Nothing for another RoPE."""
    rp = config.get("rope_parameters") or config.get("rope_scaling")
    if not isinstance(rp, Mapping) or rp.get("rope_type", rp.get("type")) != "yarn" or rp.get("factor") is None:
        return {}
    out: dict[str, Any] = {f"{arch}.rope.scaling.type": "yarn"}
    for field, key, cast in _YARN:
        v = rp.get(field)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{arch}.rope.scaling.{key}"] = cast(v)
    return out


NO_TOKENIZER = ("warning: no tokenizer: llama.cpp cannot load this GGUF without tokenizer.ggml.* keys; convert "
                "a GGUF that has them, or make one from a model folder with tokenizer files (llama.cpp "
                "convert_hf_to_gguf.py)")
"""The writer's warning (``side_files_skipped["tokenizer.ggml.*"]``) when the output has no
``tokenizer.ggml.tokens`` and no vocabulary size to declare it vocabulary-less: llama.cpp's
``llm_load_vocab`` needs ``tokenizer.ggml.model``."""

NO_VOCAB_KV = {"tokenizer.ggml.model": "none"}
"""What llama.cpp writes for a model without a vocabulary: ``convert_hf_to_gguf.py`` ``_set_vocab_none``
(``add_tokenizer_model("none")``). ``llama-vocab.cpp`` (llama-cpp-python 0.3.36's) loads ``"none"`` (or
``"no_vocab"``) as ``LLAMA_VOCAB_TYPE_NONE`` with ``{arch}.vocab_size`` placeholder tokens; with no
``tokenizer.ggml.model`` key at all it refuses the file ("error loading model vocabulary: key not found in
model: tokenizer.ggml.model")."""

NO_VOCAB_WARNING = ("warning: no tokenizer: written as tokenizer.ggml.model 'none' (llama.cpp's model without a "
                    "vocabulary, as convert_hf_to_gguf.py writes one): llama.cpp loads it and runs token ids, but "
                    "cannot tokenize text; for text, convert a GGUF that has a vocabulary, or make one from a model "
                    "folder with tokenizer files (llama.cpp convert_hf_to_gguf.py)")
"""The writer's warning when it declared the output vocabulary-less (:data:`NO_VOCAB_KV`)."""

TOKENIZER_FILES_NOT_CONVERTED = " (the source's tokenizer files are not converted: qckpt builds no GGUF vocabulary)"

_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def no_vocab_kv(kv: Mapping[str, Any], arch: str) -> dict[str, str]:
    """:data:`NO_VOCAB_KV` when ``kv`` has no ``tokenizer.ggml.model`` but declares ``{arch}.vocab_size`` (what
    llama.cpp sizes the placeholder vocabulary and the logits by), else ``{}``."""
    if "tokenizer.ggml.model" in kv or not isinstance(kv.get(f"{arch}.vocab_size"), int):
        return {}
    return dict(NO_VOCAB_KV)


def tokenizer_warning(ckpt: Checkpoint, kv: Mapping[str, Any]) -> dict[str, str]:
    """``{"tokenizer.ggml.*": warning}`` when the GGUF written has no vocabulary, else ``{}``."""
    if "tokenizer.ggml.tokens" in kv:
        return {}
    has_files = any(Path(str(f)).name in _HF_TOKENIZER_FILES for f in ckpt.extra_files)
    text = NO_VOCAB_WARNING if kv.get("tokenizer.ggml.model") == NO_VOCAB_KV["tokenizer.ggml.model"] else NO_TOKENIZER
    return {"tokenizer.ggml.*": text + (TOKENIZER_FILES_NOT_CONVERTED if has_files else "")}


WIDENED_1D = ("F16", "BF16")
"""Float dtypes of 1-D tensors written as F32 (exact widening): ``convert_hf_to_gguf.py``
``ModelBase.prepare_tensors`` sets ``data_qtype = F32`` when ``n_dims <= 1`` ("Most of the codebase that
takes in 1D tensors or norms only handles F32 tensors"); ggml's CPU ``binary_op`` aborts on an F32 x BF16
norm multiply."""
