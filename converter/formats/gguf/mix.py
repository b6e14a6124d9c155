"""llama-quantize's per-tensor type choice for the K-quant file types (Q2_K ... Q6_K mixes).

A file type such as ``Q4_K_M`` is not one ggml type: ``llama_tensor_get_type`` (llama.cpp
``src/llama-quant.cpp``, the version vendored in llama-cpp-python 0.3.36, commit 0c1e57098bba)
picks each tensor's type from its GGUF name, layer index, the layer count and the architecture,
then falls back to a 32-block type when the row length ``ne[0]`` is not a multiple of 256.
:func:`choose_types` reproduces it for the file types of :data:`FILE_TYPES` without an importance
matrix, ``--pure``, ``--output-tensor-type`` or tensor-type overrides; the results were checked
against ``llama_model_quantize`` of that build (``sample_checkpoints/gguf/kquant_expected/mixes.json``).

Rules (for these file types):

- Only tensors ``tensor_allows_quantization`` accepts are quantized: 2-D or more, the name ends in
  ``weight`` and is none of the excluded names (norms, ``ffn_gate_inp``, position / token-type
  embeddings, small RWKV / Mamba / T5 / vision tensors); the others keep their type.
- ``output.weight``, and ``token_embd.weight`` when the file has no ``output.weight`` (tied head):
  ``Q6_K`` (``Q8_0`` when ``ne[0]`` is not a multiple of 256, or for Falcon).
- ``attn_v`` (also ``attn_qkv``, ``attn_kv_b``): Q2_K -> Q3_K (Q4_K when ``n_head / n_head_kv >= 4``);
  Q3_K_M -> Q5_K for the first two, else Q4_K; Q3_K_L -> Q5_K; Q4_K_M / Q5_K_M -> Q6_K when
  :func:`use_more_bits`; Q4_K_S -> Q5_K for the first four; a LLaMA-70B-shaped model (80 layers,
  grouped KV heads) lifts Q3_K / Q4_K to Q5_K; 8 experts -> Q8_0.
- ``ffn_down`` (layer ``i`` of ``n``): Q2_K -> Q3_K; Q3_K_M -> Q5_K if ``i < n/16`` else Q4_K
  (Falcon: Q3_K unless :func:`use_more_bits`); Q3_K_L -> Q5_K (Falcon Q4_K); Q4_K_M -> Q6_K when
  :func:`use_more_bits` (Falcon: Q6_K / Q5_K / Q4_K); Q5_K_M -> Q6_K when :func:`use_more_bits`;
  Q4_K_S -> Q5_K for ``i < n/8`` (not Falcon).
- ``attn_output`` (not Falcon): Q2_K -> Q3_K, Q3_K_M -> Q4_K, Q3_K_L -> Q5_K; with 8 experts
  Q2_K / Q3_K_S / Q3_K_M / Q4_K_S / Q4_K_M -> Q5_K. Falcon: Q3_K_L -> Q4_K.
- ``attn_qkv`` / ``attn_kv_b`` take the ``attn_v`` branch (llama.cpp tests ``category_is_attn_v``
  first, so its later ``attn_qkv`` branch is never reached).
- ``attn_k`` with 8 experts: Q8_0.
- Fallback when ``ne[0] % 256``: Q2_K / Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0
  (F16 when ``ne[0]`` is not a multiple of 32 either). MiniLM's 384-wide rows: Q4_K -> Q5_0.

The counters ``i_attention_wv`` / ``i_ffn_down`` run over the tensors in llama.cpp's weight order
(by layer number, tensors outside ``blk.N.`` first, then by name).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from converter.errors import NotRepresentableError

__all__ = ["FILE_TYPES", "TensorInfo", "ModelInfo", "choose_types", "use_more_bits", "allows_quantization"]

#: llama.cpp ``llama_ftype`` values of the file types written here -> their default ggml type.
FILE_TYPES: dict[str, tuple[int, str]] = {
    "Q2_K": (10, "Q2_K"), "Q3_K_S": (11, "Q3_K"), "Q3_K_M": (12, "Q3_K"), "Q3_K_L": (13, "Q3_K"),
    "Q4_K_S": (14, "Q4_K"), "Q4_K_M": (15, "Q4_K"), "Q5_K_S": (16, "Q5_K"), "Q5_K_M": (17, "Q5_K"),
    "Q6_K": (18, "Q6_K"),
}

_K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_EXCLUDED_PARTS = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
                   "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
                   "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
                   "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
                   "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
                   "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
                   "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
                   "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
_EXCLUDED_NAMES = ("position_embd.weight", "token_types.weight")
_LAYER = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as llama-quantize sees it: GGUF ``name``, ``ne[0]`` (row length) and dims."""

    name: str
    row_len: int
    n_dims: int


@dataclass(frozen=True)
class ModelInfo:
    """The hyperparameters the rules read (GGUF ``{arch}.block_count``, ``attention.head_count``,
    ``attention.head_count_kv``, ``expert_count``)."""

    arch: str
    n_layer: int
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0

    @property
    def n_gqa(self) -> int:
        """``n_head / n_head_kv`` (0 when unknown)."""
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        """llama.cpp's ``LLM_TYPE_70B``: a LLaMA with 80 layers and grouped KV heads."""
        return self.arch == "llama" and self.n_layer == 80 and self.n_head != self.n_head_kv

    @classmethod
    def from_kv(cls, kv: Mapping, arch: str) -> "ModelInfo":
        """From GGUF key/values (missing counts are 0; ``head_count_kv`` defaults to ``head_count``)."""
        def first(key):
            v = kv.get(f"{arch}.{key}")
            return int(v[0] if isinstance(v, (list, tuple)) and v else v or 0)
        n_head = first("attention.head_count")
        return cls(arch, first("block_count"), n_head, first("attention.head_count_kv") or n_head,
                   first("expert_count"))


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth of the layers, and every third between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def allows_quantization(t: TensorInfo) -> bool:
    """``tensor_allows_quantization`` with default parameters (see the module notes)."""
    if t.n_dims < 2 or not t.name.endswith("weight"):
        return False
    return not (any(p in t.name for p in _EXCLUDED_PARTS) or t.name in _EXCLUDED_NAMES)


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for key, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"), ("attn_v.weight", "attn_v"),
                     ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                     ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                     ("ffn_down", "ffn_down")):
        if key in name:
            return cat
    return "other"


def _order_key(name: str) -> tuple[int, str]:
    m = _LAYER.match(name)
    return (int(m.group(1)) if m else -1, name)


class _State:
    def __init__(self, tensors: Sequence[TensorInfo], model: ModelInfo):
        cats = [_category(t.name) for t in tensors]
        self.n_attention_wv = sum(c in ("attn_v", "attn_qkv", "attn_kv_b") for c in cats)
        self.tied = "output" not in cats
        self.i_attention_wv = self.i_ffn_down = 0
        self.model = model

    def layer(self, counter: int, name: str) -> tuple[int, int]:
        n = self.model.n_layer
        if max(1, self.model.n_expert) > 1:
            m = _LAYER.match(name)
            if m is None or not 0 <= int(m.group(1)) < n:
                raise NotRepresentableError("llama.cpp cannot place this expert tensor in a layer", tensor=name,
                                            field="name", expected=f"blk.N. with N in [0, {n})", found=name)
            return int(m.group(1)), n
        return counter, n


def _rules(st: _State, ft: str, new: str, t: TensorInfo, cat: str) -> str:
    """``llama_tensor_get_type_impl`` for the K-quant file types."""
    m, arch = st.model, st.model.arch
    if cat == "output" or (st.tied and cat == "token_embd"):
        if arch == "falcon" or t.row_len % 256:
            return "Q8_0"
        return "Q6_K" if new != "Q8_0" else new
    if cat == "token_embd":
        return new
    if cat in ("attn_v", "attn_qkv", "attn_kv_b"):
        i, n = st.i_attention_wv, st.n_attention_wv
        if ft == "Q2_K":
            new = "Q4_K" if m.n_gqa >= 4 else "Q3_K"
        elif ft == "Q3_K_M":
            new = "Q5_K" if i < 2 else "Q4_K"
        elif ft == "Q3_K_L":
            new = "Q5_K"
        elif ft in ("Q4_K_M", "Q5_K_M") and use_more_bits(i, n):
            new = "Q6_K"
        elif ft == "Q4_K_S" and i < 4:
            new = "Q5_K"
        if m.is_70b and new in ("Q3_K", "Q4_K"):
            new = "Q5_K"
        if m.n_expert == 8:
            new = "Q8_0"
        st.i_attention_wv += 1
        return new
    if cat == "attn_k":
        return "Q8_0" if m.n_expert == 8 else new
    if cat == "ffn_down":
        i, n = st.layer(st.i_ffn_down, t.name)
        if ft == "Q2_K":
            new = "Q3_K"
        elif ft == "Q3_K_M":
            new = ("Q5_K" if i < n // 16 else "Q4_K" if arch != "falcon" or use_more_bits(i, n) else "Q3_K")
        elif ft == "Q3_K_L":
            new = "Q4_K" if arch == "falcon" else "Q5_K"
        elif ft == "Q4_K_M":
            if arch == "falcon":
                new = "Q6_K" if i < n // 16 else "Q5_K" if use_more_bits(i, n) else "Q4_K"
            elif use_more_bits(i, n):
                new = "Q6_K"
        elif ft == "Q5_K_M" and use_more_bits(i, n):
            new = "Q6_K"
        elif ft == "Q4_K_S" and arch != "falcon" and i < n // 8:
            new = "Q5_K"
        st.i_ffn_down += 1
        return new
    if cat == "attn_output":
        if arch != "falcon":
            if m.n_expert == 8:
                if ft in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M"):
                    new = "Q5_K"
            else:
                new = {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(ft, new)
        elif ft == "Q3_K_L":
            new = "Q4_K"
        return new
    return new


def _fallback(t: TensorInfo, new: str) -> str:
    """``tensor_type_fallback``: a 32-block type when ``ne[0]`` is not a multiple of the type's block."""
    block = 256 if new in _K_TYPES else 64 if new == "NVFP4" else 32
    if t.row_len % block == 0:
        return new
    if new not in _FALLBACK:
        raise NotRepresentableError(f"llama.cpp has no fallback type for {new}", tensor=t.name, field="ne[0]",
                                    expected=f"a multiple of {block}", found=t.row_len)
    new = _FALLBACK[new]
    return new if t.row_len % 32 == 0 else "F16"


def choose_types(file_type: str, tensors: Sequence[TensorInfo], model: ModelInfo) -> dict[str, str | None]:
    """The ggml type llama-quantize gives each tensor for ``file_type`` (``"Q4_K_M"`` ...).

    Parameters
    ----------
    file_type : str
        A key of :data:`FILE_TYPES`.
    tensors : sequence of TensorInfo
        Every tensor of the output file (GGUF names).
    model : ModelInfo

    Returns
    -------
    dict
        GGUF name -> ggml type name, or None for a tensor that keeps its own type (not quantized).

    Raises
    ------
    NotRepresentableError
        Unknown file type, or a tensor llama.cpp itself would refuse (no fallback type).
    """
    if file_type not in FILE_TYPES:
        raise NotRepresentableError("unknown GGUF K-quant file type", field="file_type",
                                    expected=list(FILE_TYPES), found=file_type)
    default = FILE_TYPES[file_type][1]
    st = _State(tensors, model)
    out: dict[str, str | None] = {}
    for t in sorted(tensors, key=lambda t: _order_key(t.name)):
        if not allows_quantization(t):
            out[t.name] = None
            continue
        out[t.name] = _fallback(t, _rules(st, file_type, default, t, _category(t.name)))
    return out
