"""Tiny synthetic Hugging Face decoders (seeded tensors and config.json per model_type) for the GGUF writer tests
and ``interop/gguf_from_hf_archs.py`` (no pytest import: the interop venv has none)."""

from __future__ import annotations

import numpy as np

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FF, LAYERS, VOCAB = 64, 4, 2, 16, 96, 2, 40
EXPERTS, USED, MOE_FF, SHARED_FF = 4, 2, 32, 48


def _tensors(model_type: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32)
    out = {"model.embed_tokens.weight": w(VOCAB, HIDDEN), "model.norm.weight": w(HIDDEN),
           "lm_head.weight": w(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = w(HIDDEN)
        out[p + "post_attention_layernorm.weight"] = w(HIDDEN)
        out[p + "self_attn.o_proj.weight"] = w(HIDDEN, HEADS * HEAD_DIM)
        out[p + "mlp.down_proj.weight"] = w(HIDDEN, FF)
        if model_type == "phi3":
            out[p + "self_attn.qkv_proj.weight"] = w((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN)
            out[p + "mlp.gate_up_proj.weight"] = w(2 * FF, HIDDEN)
            continue
        if model_type in ("qwen2_moe", "qwen3_moe"):
            for x in ("q", "k", "v"):
                n = HEADS if x == "q" else KV_HEADS
                out[p + f"self_attn.{x}_proj.weight"] = w(n * HEAD_DIM, HIDDEN)
                if model_type == "qwen2_moe":
                    out[p + f"self_attn.{x}_proj.bias"] = w(n * HEAD_DIM)
            if model_type == "qwen3_moe":
                out[p + "self_attn.q_norm.weight"] = w(HEAD_DIM)
                out[p + "self_attn.k_norm.weight"] = w(HEAD_DIM)
            out.pop(p + "mlp.down_proj.weight")
            out[p + "mlp.gate.weight"] = w(EXPERTS, HIDDEN)
            for e in range(EXPERTS):
                out[p + f"mlp.experts.{e}.gate_proj.weight"] = w(MOE_FF, HIDDEN)
                out[p + f"mlp.experts.{e}.up_proj.weight"] = w(MOE_FF, HIDDEN)
                out[p + f"mlp.experts.{e}.down_proj.weight"] = w(HIDDEN, MOE_FF)
            if model_type == "qwen2_moe":
                out[p + "mlp.shared_expert_gate.weight"] = w(1, HIDDEN)
                out[p + "mlp.shared_expert.gate_proj.weight"] = w(SHARED_FF, HIDDEN)
                out[p + "mlp.shared_expert.up_proj.weight"] = w(SHARED_FF, HIDDEN)
                out[p + "mlp.shared_expert.down_proj.weight"] = w(HIDDEN, SHARED_FF)
            continue
        out[p + "self_attn.q_proj.weight"] = w(HEADS * HEAD_DIM, HIDDEN)
        out[p + "self_attn.k_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN)
        out[p + "self_attn.v_proj.weight"] = w(KV_HEADS * HEAD_DIM, HIDDEN)
        out[p + "mlp.gate_proj.weight"] = w(FF, HIDDEN)
        out[p + "mlp.up_proj.weight"] = w(FF, HIDDEN)
        if model_type == "qwen2":
            for x, n in (("q", HEADS), ("k", KV_HEADS), ("v", KV_HEADS)):
                out[p + f"self_attn.{x}_proj.bias"] = w(n * HEAD_DIM)
        if model_type == "qwen3":
            out[p + "self_attn.q_norm.weight"] = w(HEAD_DIM)
            out[p + "self_attn.k_norm.weight"] = w(HEAD_DIM)
    return out


def _config(model_type: str) -> dict:
    cfg = {"model_type": model_type, "hidden_size": HIDDEN, "num_attention_heads": HEADS,
           "num_key_value_heads": KV_HEADS, "intermediate_size": FF, "num_hidden_layers": LAYERS,
           "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "vocab_size": VOCAB,
           "tie_word_embeddings": False, "sliding_window": 4096}
    if model_type in ("qwen3", "qwen3_moe"):
        cfg["head_dim"] = HEAD_DIM
    if model_type in ("qwen2_moe", "qwen3_moe"):
        cfg.update(num_experts=EXPERTS, num_experts_per_tok=USED, moe_intermediate_size=MOE_FF)
    if model_type == "qwen2_moe":
        cfg["shared_expert_intermediate_size"] = SHARED_FF
    if model_type == "phi3":
        cfg.update(original_max_position_embeddings=256, sliding_window=None)
    return cfg
