"""Architecture-specific GGUF hyperparameters for gemma2, gemma3 and deepseek2, as llama.cpp's converter writes them.

Each function returns ``(values, drop)``: key (without the ``{arch}.`` prefix) -> value with its Python type giving
the GGUF type (int: UINT32, float: FLOAT32, bool: BOOL), and the keys of the generic set
(:func:`converter.formats.gguf.hf_source.config_kv`) the architecture's converter does not write. ``vocab_size`` is
left to :func:`~converter.formats.gguf.hf_source.source_kv` (dropped when a vocabulary is written, kept for a file
without one, which llama.cpp then loads as ``tokenizer.ggml.model 'none'``).
Sources: llama.cpp ``conversion/gemma.py`` (``Gemma2Model`` / ``Gemma3Model.set_gguf_parameters``) and
``conversion/deepseek.py`` (``DeepseekV2Model.set_gguf_parameters``), with ``TextModel.set_gguf_parameters``
(``conversion/base.py``) where they call it.
"""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["arch_kv"]


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _gemma2(config: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``Gemma2Model.set_gguf_parameters`` replaces TextModel's: no RoPE base; key / value
    length = ``head_dim``; the two soft-capping values and the sliding window."""
    out: dict[str, Any] = {}
    for key, field in (("attn_logit_softcapping", "attn_logit_softcapping"),
                       ("final_logit_softcapping", "final_logit_softcapping")):
        if _num(config.get(field)):
            out[key] = float(config[field])
    if _num(config.get("sliding_window")):
        out["attention.sliding_window"] = int(config["sliding_window"])
    if config.get("num_key_value_heads") is None and _num(config.get("num_attention_heads")):
        out["attention.head_count_kv"] = int(config["num_attention_heads"])
    return out, ("rope.freq_base", "expert_count", "expert_used_count")


def _gemma3(config: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``Gemma3Model.set_gguf_parameters``: TextModel's keys, then defaults where config.json has none (context
    131072, 8 heads, 4 kv heads, rms eps 1e-6, head_dim 256, RoPE base 1e6 of ``full_attention``), the final
    logit soft-capping when set and the sliding window unless ``sliding_window_pattern`` is 1."""
    head_dim = config.get("head_dim", 256)
    out: dict[str, Any] = {"context_length": int(config.get("max_position_embeddings", 131072)),
                           "attention.head_count": int(config.get("num_attention_heads", 8)),
                           "attention.head_count_kv": int(config.get("num_key_value_heads", 4)),
                           "attention.layer_norm_rms_epsilon": float(config.get("rms_norm_eps", 1e-6)),
                           "attention.key_length": int(head_dim), "attention.value_length": int(head_dim)}
    rp = config.get("rope_parameters") or {}
    full = rp.get("full_attention", rp) if isinstance(rp, Mapping) else {}
    theta = full.get("rope_theta", config.get("rope_theta", 1_000_000.0)) if isinstance(full, Mapping) else None
    if _num(theta):
        out["rope.freq_base"] = float(theta)
    if config.get("final_logit_softcapping"):
        out["final_logit_softcapping"] = float(config["final_logit_softcapping"])
    if config.get("sliding_window_pattern") != 1 and _num(config.get("sliding_window")):
        out["attention.sliding_window"] = int(config["sliding_window"])
    return out, ()


def _deepseek2(config: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``DeepseekV2Model.set_gguf_parameters``: MLA as MQA (``head_count_kv`` 1, key length ``kv_lora_rank +
    qk_rope_head_dim``, value length ``kv_lora_rank``, and the per-head ``key_length_mla`` / ``value_length_mla``),
    the leading dense blocks, the vocabulary size, the expert keys (expert feed-forward length, shared experts,
    routed scaling, top-k normalisation, groups) and ``rope.dimension_count = qk_rope_head_dim``."""
    out: dict[str, Any] = {"attention.head_count_kv": 1}
    if not _num(config.get("rms_norm_eps")):
        out["attention.layer_norm_rms_epsilon"] = 1e-6
    has_moe = config.get("n_routed_experts") is not None
    dense = config.get("first_k_dense_replace")
    if dense is None:
        dense = config.get("num_hidden_layers") if not has_moe else 0
    if _num(dense):
        out["leading_dense_block_count"] = int(dense)
    if _num(config.get("vocab_size")):
        out["vocab_size"] = int(config["vocab_size"])
    if _num(config.get("q_lora_rank")):
        out["attention.q_lora_rank"] = int(config["q_lora_rank"])
    rank, rope = config.get("kv_lora_rank", 512), config.get("qk_rope_head_dim")
    nope, v = config.get("qk_nope_head_dim"), config.get("v_head_dim")
    out["attention.kv_lora_rank"] = int(rank)
    if _num(rope):
        out["attention.key_length"] = int(rank) + int(rope)
        out["rope.dimension_count"] = int(rope)
        if _num(nope):
            out["attention.key_length_mla"] = int(nope) + int(rope)
    out["attention.value_length"] = int(rank)
    if _num(v):
        out["attention.value_length_mla"] = int(v)
    ff = config.get("moe_intermediate_size", config.get("intermediate_size"))
    if _num(ff):
        out["expert_feed_forward_length"] = int(ff)
    if has_moe:
        out["expert_count"] = int(config["n_routed_experts"])
    out["expert_shared_count"] = int(config.get("n_shared_experts") or 0)
    if _num(config.get("routed_scaling_factor")):
        out["expert_weights_scale"] = float(config["routed_scaling_factor"])
    if config.get("norm_topk_prob"):
        out["expert_weights_norm"] = True
    for key, field in (("expert_group_count", "n_group"), ("expert_group_used_count", "topk_group")):
        if _num(config.get(field)):
            out[key] = int(config[field])
    gating = {"softmax": 1, "sigmoid": 2}  # gguf-py ExpertGatingFuncType (TextModel: scoring_func)
    if config.get("scoring_func") in gating:
        out["expert_gating_func"] = gating[config["scoring_func"]]
    rp = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if isinstance(rp, Mapping) and _num(rp.get("mscale_all_dim")):
        out["rope.scaling.yarn_log_multiplier"] = 0.1 * float(rp["mscale_all_dim"])
    return out, ("expert_shared_feed_forward_length",)


_ARCHS = {"gemma2": _gemma2, "gemma3": _gemma3, "deepseek2": _deepseek2}


def arch_kv(config: Mapping[str, Any], arch: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``(values, drop)`` for ``arch`` (see the module docstring); ``({}, ())`` for another architecture."""
    fn = _ARCHS.get(arch)
    return fn(config) if fn is not None else ({}, ())
