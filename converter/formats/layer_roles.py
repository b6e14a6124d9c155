"""A weight's transformer layer and its role in the block (q / k / v / o / gate / up / down), from its name.

Used to lay out per-layer error tables and plots (``--plot``: error against layer index, one line per
role). Names as readers present them: Hugging Face module names (LLaMA / Mistral / Qwen ``self_attn.q_proj``
... ``mlp.down_proj``; BERT ``attention.self.query`` / ``attention.output.dense`` / ``intermediate.dense`` /
``output.dense``; GPT-2 ``attn.c_attn`` (fused q, k, v) / ``attn.c_proj`` / ``mlp.c_fc`` / ``mlp.c_proj``;
Mixtral experts ``w1`` / ``w3`` / ``w2``; fused ``qkv_proj`` / ``query_key_value`` / ``gate_up_proj``) and
llama.cpp's GGUF names (``blk.N.attn_q`` ... ``ffn_down``; gguf-py ``tensor_mapping.py``).
"""

from __future__ import annotations

import re

#: The roles in block order, as plots and tables list them.
ROLES = ("q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "down")

_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|layer|h|blk|blocks|block|decoder\.layers|encoder\.layer)\.(\d+)\.")

# (pattern on the module path without its .weight, role); the first match wins.
_ROLE_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), r) for p, r in (
    (r"(\.|^)(qkv_proj|query_key_value|c_attn|attn_qkv|Wqkv|qkv)$", "qkv"),
    (r"(\.|^)(gate_up_proj|ffn_gate_up)$", "gate_up"),
    (r"(\.|^)(q_proj|query|attn_q|wq)$", "q"),
    (r"(\.|^)(k_proj|key|attn_k|wk)$", "k"),
    (r"(\.|^)(v_proj|value|attn_v|wv)$", "v"),
    (r"(\.|^)(o_proj|out_proj|attn_output|wo|attention\.output\.dense|attn\.c_proj|self_attn\.dense"
     r"|attention\.dense)$", "o"),
    (r"(\.|^)(gate_proj|ffn_gate|ffn_gate_exps|w1)$", "gate"),
    (r"(\.|^)(up_proj|ffn_up|ffn_up_exps|w3|intermediate\.dense|c_fc|fc1|dense_h_to_4h)$", "up"),
    (r"(\.|^)(down_proj|ffn_down|ffn_down_exps|w2|output\.dense|mlp\.c_proj|fc2|dense_4h_to_h)$", "down"),
))


def layer_index(name: str) -> int | None:
    """The block index in ``name`` (``model.layers.12.mlp.up_proj.weight`` -> 12, ``blk.3.attn_q.weight``
    -> 3), None for a tensor outside the repeated blocks (embedding, head, pooler)."""
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


def linear_role(name: str) -> str | None:
    """The role of a weight in its block (one of :data:`ROLES`), None when it has none of them."""
    base = re.sub(r"\.(weight|qweight|weight_packed|bias)$", "", name)
    base = re.sub(r"\.experts(\.\d+)?", "", base)  # MoE experts keep their projection's role
    for pattern, role in _ROLE_RULES:
        if pattern.search(base):
            return role
    return None
