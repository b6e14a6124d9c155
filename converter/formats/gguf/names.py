"""Tensor-name mapping between llama.cpp GGUF names and Hugging Face names, per architecture.

GGUF names (``blk.N.attn_q.weight``) come from gguf-py ``gguf/constants.py`` (``MODEL_TENSORS``,
``TENSOR_NAMES``); the Hugging Face side is the canonical name that llama.cpp's converter maps
from (gguf-py ``gguf/tensor_mapping.py`` ``TensorNameMap``; one HF spelling is chosen per tensor:
``encoder.layer.N.*`` for BERT, as in ``sample_checkpoints/MANIFEST.json``, and
``model.layers.N.*`` for LLaMA-family decoders). Unknown architectures and unmatched names keep
their names unchanged in both directions.

The LLaMA converter also row-permutes ``q_proj`` / ``k_proj`` (weights and biases) to turn
rotate-half RoPE pairing into ggml's interleaved pairing (``convert_hf_to_gguf.py``
``LlamaModel.permute``: rows reshaped ``(n_head, 2, head_dim/2)`` and the two inner axes swapped;
``k_proj`` uses ``n_head_kv``). :func:`llama_row_permutation` gives that permutation as an index
array so readers undo it and writers apply it (exact: whole rows move, blocks never cross rows).
"""

from __future__ import annotations

import re

import numpy as np

from converter.errors import FormatError

__all__ = ["ARCH_TABLES", "PERMUTED_ARCHS", "HF_MODEL_TYPE_TO_ARCH", "NORM_OFFSET_ARCHS", "norm_offset",
           "gguf_to_hf", "hf_to_gguf",
           "permute_heads_key", "llama_row_permutation"]

_BERT = (
    ("token_embd", "embeddings.word_embeddings"),
    ("token_types", "embeddings.token_type_embeddings"),
    ("position_embd", "embeddings.position_embeddings"),
    ("token_embd_norm", "embeddings.LayerNorm"),
    ("blk.{bid}.attn_q", "encoder.layer.{bid}.attention.self.query"),
    ("blk.{bid}.attn_k", "encoder.layer.{bid}.attention.self.key"),
    ("blk.{bid}.attn_v", "encoder.layer.{bid}.attention.self.value"),
    ("blk.{bid}.attn_output", "encoder.layer.{bid}.attention.output.dense"),
    ("blk.{bid}.attn_output_norm", "encoder.layer.{bid}.attention.output.LayerNorm"),
    ("blk.{bid}.ffn_up", "encoder.layer.{bid}.intermediate.dense"),
    ("blk.{bid}.ffn_down", "encoder.layer.{bid}.output.dense"),
    ("blk.{bid}.layer_output_norm", "encoder.layer.{bid}.output.LayerNorm"),
)

_LLAMA = (
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
    ("blk.{bid}.attn_norm", "model.layers.{bid}.input_layernorm"),
    ("blk.{bid}.attn_q", "model.layers.{bid}.self_attn.q_proj"),
    ("blk.{bid}.attn_k", "model.layers.{bid}.self_attn.k_proj"),
    ("blk.{bid}.attn_v", "model.layers.{bid}.self_attn.v_proj"),
    ("blk.{bid}.attn_output", "model.layers.{bid}.self_attn.o_proj"),
    ("blk.{bid}.ffn_norm", "model.layers.{bid}.post_attention_layernorm"),
    ("blk.{bid}.ffn_gate", "model.layers.{bid}.mlp.gate_proj"),
    ("blk.{bid}.ffn_up", "model.layers.{bid}.mlp.up_proj"),
    ("blk.{bid}.ffn_down", "model.layers.{bid}.mlp.down_proj"),
)

_GPT_OSS = (
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
    ("blk.{bid}.attn_norm", "model.layers.{bid}.input_layernorm"),
    ("blk.{bid}.post_attention_norm", "model.layers.{bid}.post_attention_layernorm"),
    ("blk.{bid}.attn_q", "model.layers.{bid}.self_attn.q_proj"),
    ("blk.{bid}.attn_k", "model.layers.{bid}.self_attn.k_proj"),
    ("blk.{bid}.attn_v", "model.layers.{bid}.self_attn.v_proj"),
    ("blk.{bid}.attn_output", "model.layers.{bid}.self_attn.o_proj"),
    ("blk.{bid}.ffn_gate_inp", "model.layers.{bid}.mlp.router"),
    ("blk.{bid}.ffn_gate_exps", "model.layers.{bid}.mlp.experts.gate_proj"),
    ("blk.{bid}.ffn_up_exps", "model.layers.{bid}.mlp.experts.up_proj"),
    ("blk.{bid}.ffn_down_exps", "model.layers.{bid}.mlp.experts.down_proj"),
)
"""llama.cpp ``gpt-oss`` (gguf-py ``MODEL_TENSORS[MODEL_ARCH.GPT_OSS]``; ``convert_hf_to_gguf.py`` ``GptOssModel``
writes the experts split into ``<p>.experts.{gate,up,down}_proj.{weight,bias}``, the arrangement of
:mod:`converter.formats.gpt_oss.stacked`; ``post_attention_layernorm`` is ``ATTN_POST_NORM`` for this arch)."""

_QWEN3 = _LLAMA + (
    ("blk.{bid}.attn_q_norm", "model.layers.{bid}.self_attn.q_norm"),
    ("blk.{bid}.attn_k_norm", "model.layers.{bid}.self_attn.k_norm"),
)
"""llama.cpp ``qwen3`` (gguf-py ``MODEL_TENSORS[MODEL_ARCH.QWEN3]``): LLaMA's tensors plus per-head RMS norms of q and
k (``ATTN_Q_NORM`` / ``ATTN_K_NORM``); ``Qwen3Model`` does not permute q/k."""

_PHI3 = (
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
    ("blk.{bid}.attn_norm", "model.layers.{bid}.input_layernorm"),
    ("blk.{bid}.attn_qkv", "model.layers.{bid}.self_attn.qkv_proj"),
    ("blk.{bid}.attn_output", "model.layers.{bid}.self_attn.o_proj"),
    ("blk.{bid}.ffn_norm", "model.layers.{bid}.post_attention_layernorm"),
    ("blk.{bid}.ffn_up", "model.layers.{bid}.mlp.gate_up_proj"),
    ("blk.{bid}.ffn_down", "model.layers.{bid}.mlp.down_proj"),
)
"""llama.cpp ``phi3`` (``MODEL_TENSORS[MODEL_ARCH.PHI3]``): Phi-3 keeps its fused ``qkv_proj`` (``ATTN_QKV``: q, k, v
rows stacked) and ``gate_up_proj`` (``FFN_UP`` with ``2 * intermediate_size`` rows, gate first; llama.cpp splits it
at run time), so the names map one to one and no rows move."""

_MOE_FFN = (
    ("blk.{bid}.ffn_gate_inp", "model.layers.{bid}.mlp.gate"),
    ("blk.{bid}.ffn_gate_exps", "model.layers.{bid}.mlp.experts.gate_proj"),
    ("blk.{bid}.ffn_up_exps", "model.layers.{bid}.mlp.experts.up_proj"),
    ("blk.{bid}.ffn_down_exps", "model.layers.{bid}.mlp.experts.down_proj"),
)
_QWEN2MOE = _LLAMA[:9] + _MOE_FFN + (
    ("blk.{bid}.ffn_gate_inp_shexp", "model.layers.{bid}.mlp.shared_expert_gate"),
    ("blk.{bid}.ffn_gate_shexp", "model.layers.{bid}.mlp.shared_expert.gate_proj"),
    ("blk.{bid}.ffn_up_shexp", "model.layers.{bid}.mlp.shared_expert.up_proj"),
    ("blk.{bid}.ffn_down_shexp", "model.layers.{bid}.mlp.shared_expert.down_proj"),
)
"""llama.cpp ``qwen2moe`` (``MODEL_TENSORS[MODEL_ARCH.QWEN2MOE]``): LLaMA's attention and norms, the router
``ffn_gate_inp``, the stacked experts ``ffn_*_exps`` (:mod:`converter.formats.gguf.experts` stacks per-expert
weights) and the shared expert with its sigmoid gate ``ffn_gate_inp_shexp``."""
_QWEN3MOE = _QWEN3[:9] + _QWEN3[12:] + _MOE_FFN
"""llama.cpp ``qwen3moe``: Qwen3's attention (q/k norms), the router and the stacked experts (no shared expert)."""

_GEMMA2 = _LLAMA[:8] + (  # LLaMA's embedding, head, attention; Gemma's four norms; LLaMA's MLP
    ("blk.{bid}.post_attention_norm", "model.layers.{bid}.post_attention_layernorm"),
    ("blk.{bid}.ffn_norm", "model.layers.{bid}.pre_feedforward_layernorm"),
    ("blk.{bid}.post_ffw_norm", "model.layers.{bid}.post_feedforward_layernorm"),
) + _LLAMA[9:12]
"""llama.cpp ``gemma2`` (``MODEL_TENSORS[MODEL_ARCH.GEMMA2]``): a norm before and after both attention and
feed-forward (``ATTN_NORM`` / ``ATTN_POST_NORM`` / ``FFN_PRE_NORM`` (``ffn_norm``) / ``FFN_POST_NORM``); every norm
weight is stored as ``1 + w`` (:data:`NORM_OFFSET_ARCHS`); the head is always the embedding (``Gemma2Model``
drops ``lm_head.weight``)."""
_GEMMA3 = _GEMMA2 + (
    ("blk.{bid}.attn_q_norm", "model.layers.{bid}.self_attn.q_norm"),
    ("blk.{bid}.attn_k_norm", "model.layers.{bid}.self_attn.k_norm"),
)
"""llama.cpp ``gemma3`` (text): Gemma 2's tensors plus per-head q/k RMS norms (also stored ``1 + w``)."""

_DEEPSEEK2 = _LLAMA[:4] + (
    ("blk.{bid}.attn_q", "model.layers.{bid}.self_attn.q_proj"),
    ("blk.{bid}.attn_q_a", "model.layers.{bid}.self_attn.q_a_proj"),
    ("blk.{bid}.attn_q_a_norm", "model.layers.{bid}.self_attn.q_a_layernorm"),
    ("blk.{bid}.attn_q_b", "model.layers.{bid}.self_attn.q_b_proj"),
    ("blk.{bid}.attn_kv_a_mqa", "model.layers.{bid}.self_attn.kv_a_proj_with_mqa"),
    ("blk.{bid}.attn_kv_a_norm", "model.layers.{bid}.self_attn.kv_a_layernorm"),
    ("blk.{bid}.attn_k_b", "model.layers.{bid}.self_attn.k_b_proj"),
    ("blk.{bid}.attn_v_b", "model.layers.{bid}.self_attn.v_b_proj"),
    ("blk.{bid}.attn_output", "model.layers.{bid}.self_attn.o_proj"),
    ("blk.{bid}.ffn_norm", "model.layers.{bid}.post_attention_layernorm"),
    ("blk.{bid}.ffn_gate", "model.layers.{bid}.mlp.gate_proj"),
    ("blk.{bid}.ffn_up", "model.layers.{bid}.mlp.up_proj"),
    ("blk.{bid}.ffn_down", "model.layers.{bid}.mlp.down_proj"),
) + _MOE_FFN + (
    ("blk.{bid}.ffn_gate_shexp", "model.layers.{bid}.mlp.shared_experts.gate_proj"),
    ("blk.{bid}.ffn_up_shexp", "model.layers.{bid}.mlp.shared_experts.up_proj"),
    ("blk.{bid}.ffn_down_shexp", "model.layers.{bid}.mlp.shared_experts.down_proj"),
)
"""llama.cpp ``deepseek2`` (``MODEL_TENSORS[MODEL_ARCH.DEEPSEEK2]``, ``DeepseekV2Model``): multi-head latent
attention (q directly or through the ``q_a`` / ``q_a_layernorm`` / ``q_b`` low-rank pair; the joint ``kv_a``
projection with the rope key and its norm; ``kv_b_proj`` cut per head into ``k_b`` and ``v_b``, see
:mod:`converter.formats.gguf.mla`), dense leading blocks, then the router, stacked experts and shared experts."""

ARCH_TABLES: dict[str, tuple[tuple[str, str], ...]] = {"bert": _BERT, "llama": _LLAMA, "qwen2": _LLAMA,
                                                       "qwen3": _QWEN3, "qwen2moe": _QWEN2MOE,
                                                       "qwen3moe": _QWEN3MOE, "phi3": _PHI3, "gpt-oss": _GPT_OSS,
                                                       "gemma2": _GEMMA2, "gemma3": _GEMMA3, "deepseek2": _DEEPSEEK2}
"""Per architecture: ``(gguf_stem, hf_stem)`` pairs; ``{bid}`` is the block index. Suffixes
(``.weight``, ``.bias``) are carried over unchanged."""

PERMUTED_ARCHS: frozenset[str] = frozenset({"llama"})
"""Architectures whose converter row-permutes q/k (``LlamaModel.permute``); Qwen2 does not."""

HF_MODEL_TYPE_TO_ARCH: dict[str, str] = {"bert": "bert", "llama": "llama", "mistral": "llama", "qwen2": "qwen2",
                                         "qwen3": "qwen3", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe",
                                         "phi3": "phi3", "gpt_oss": "gpt-oss", "gemma2": "gemma2",
                                         "gemma3_text": "gemma3", "deepseek_v2": "deepseek2",
                                         "deepseek_v3": "deepseek2"}
"""``config.json`` ``model_type`` -> ``general.architecture`` (llama.cpp converts Mistral as llama, ``LlamaModel`` is
registered for ``MistralForCausalLM``; gpt-oss is ``MODEL_ARCH.GPT_OSS``, ``"gpt-oss"``; transformers'
``Gemma3ForCausalLM`` is ``gemma3_text``; ``DeepseekV2Model`` converts DeepSeek-V2 and -V3 alike as ``deepseek2``)."""

NORM_OFFSET_ARCHS: dict[str, float] = {"gemma2": 1.0, "gemma3": 1.0}
"""Architectures whose norm weights llama.cpp stores with an offset: Gemma's RMSNorm computes ``x * (1 + w)``
(transformers ``Gemma2RMSNorm`` / ``Gemma3RMSNorm``) and ``convert_hf_to_gguf.py`` (``Gemma2Model.modify_tensors``,
``Gemma3Model.norm_shift``) writes ``w + 1`` for every tensor whose Hugging Face name ends in ``norm.weight``,
computed in the source's dtype; llama.cpp multiplies by the stored value. Writers add the offset, readers subtract
it (:func:`norm_offset`)."""


def norm_offset(hf_name: str, arch: str | None) -> float | None:
    """The offset llama.cpp's converter adds to Hugging Face tensor ``hf_name`` for ``arch`` (None: none)."""
    off = NORM_OFFSET_ARCHS.get(arch or "")
    return off if off is not None and hf_name.endswith("norm.weight") else None

WHOLE_NAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "gpt-oss": (("blk.{bid}.attn_sinks.weight", "model.layers.{bid}.self_attn.sinks"),),
    "deepseek2": (("blk.{bid}.exp_probs_b.bias",
                   "model.layers.{bid}.mlp.gate.e_score_correction_bias"),),
}
"""Whole names mapped as they are (the Hugging Face side has no ``.weight`` suffix): gpt-oss's attention sinks,
``GptOssModel.filter_tensors`` appends ``.weight`` to ``sinks`` before mapping it to ``ATTN_SINKS``; DeepSeek's
router score correction (``FFN_EXP_PROBS_B``, gguf-py ``tensor_mapping``: ``mlp.gate.e_score_correction``, suffix
``_bias``)."""


def _compile(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{bid\}", r"(?P<bid>\d+)") + r"(?P<suffix>\.[A-Za-z0-9_]+)$")


_PATTERNS: dict[str, list[tuple[re.Pattern, str, re.Pattern, str]]] = {
    arch: [(_compile(g), h, _compile(h), g) for g, h in table] for arch, table in ARCH_TABLES.items()
}


def _whole(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{bid\}", r"(?P<bid>\d+)") + "$")


_WHOLE: dict[str, list[tuple[re.Pattern, str, re.Pattern, str]]] = {
    arch: [(_whole(g), h, _whole(h), g) for g, h in table] for arch, table in WHOLE_NAMES.items()
}


def _map(name: str, arch: str | None, forward: bool) -> str:
    for g_pat, h_tpl, h_pat, g_tpl in _WHOLE.get(arch or "", ()):
        pat, tpl = (g_pat, h_tpl) if forward else (h_pat, g_tpl)
        m = pat.match(name)
        if m:
            return tpl.replace("{bid}", m.group("bid"))
    for g_pat, h_tpl, h_pat, g_tpl in _PATTERNS.get(arch or "", ()):
        pat, tpl = (g_pat, h_tpl) if forward else (h_pat, g_tpl)
        m = pat.match(name)
        if m:
            bid = m.groupdict().get("bid")
            return tpl.replace("{bid}", bid or "") + m.group("suffix")
    return name


def gguf_to_hf(name: str, arch: str | None) -> str:
    """``blk.0.attn_q.weight`` -> ``encoder.layer.0.attention.self.query.weight`` (bert) /
    ``model.layers.0.self_attn.q_proj.weight`` (llama); unknown arch or name: unchanged."""
    return _map(name, arch, True)


def hf_to_gguf(name: str, arch: str | None) -> str:
    """Inverse of :func:`gguf_to_hf` (unknown arch or name: unchanged)."""
    return _map(name, arch, False)


_QK = re.compile(r"^blk\.\d+\.attn_(q|k)\.(weight|bias)$")


def permute_heads_key(gguf_name: str, arch: str | None) -> str | None:
    """For a LLaMA q/k tensor return which head count permutes it (``"q"`` -> ``head_count``,
    ``"k"`` -> ``head_count_kv``); None when the tensor is not permuted."""
    if arch not in PERMUTED_ARCHS:
        return None
    m = _QK.match(gguf_name)
    return m.group(1) if m else None


def llama_row_permutation(n_rows: int, n_head: int, *, tensor: str | None = None) -> np.ndarray:
    """Row order of ``LlamaModel.permute``: ``gguf_rows = hf_rows[perm]``.

    ``permute(w, n_head)`` reshapes the ``n_rows`` rows to ``(n_head, 2, n_rows/n_head/2)``, swaps
    the two inner axes and flattens; applying the same to ``arange(n_rows)`` gives ``perm``.
    Undo with ``hf_rows = gguf_rows[argsort(perm)]``.

    Parameters
    ----------
    n_rows : int
        ``out`` of the q (``n_head*head_dim``) or k (``n_head_kv*head_dim``) projection.
    n_head : int
        ``head_count`` for q, ``head_count_kv`` for k.

    Returns
    -------
    ndarray of int64, shape (n_rows,)

    Raises
    ------
    FormatError
        ``n_rows`` not a multiple of ``2*n_head``.
    """
    if n_head <= 0 or n_rows % (2 * n_head):
        raise FormatError("q/k rows are not a whole number of (2 x head_dim/2) RoPE pairs per head",
                          tensor=tensor, field="head_count", expected=f"rows multiple of 2*{n_head}", found=n_rows)
    idx = np.arange(n_rows, dtype=np.int64)
    return idx.reshape(n_head, 2, n_rows // n_head // 2).swapaxes(1, 2).reshape(n_rows)
