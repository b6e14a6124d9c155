"""DeepSeek-V2 multi-head latent attention as llama.cpp stores it: ``kv_b_proj`` cut into ``k_b`` and ``v_b``.

``convert_hf_to_gguf.py`` ``DeepseekV2Model.modify_tensors`` (llama.cpp's MLA with the absorption optimisation):
the Hugging Face ``<p>.self_attn.kv_b_proj.weight`` ``(head * (qk_nope + v), kv_lora_rank)`` is viewed as
``(head, qk_nope + v, kv_lora_rank)`` (per head, the ``qk_nope_head_dim`` key rows first, then the ``v_head_dim``
value rows), split along that axis, and written as

- ``<p>.self_attn.k_b_proj.weight`` ``(head, kv_lora_rank, qk_nope)``: the key rows transposed per head
  (``blk.N.attn_k_b``), and
- ``<p>.self_attn.v_b_proj.weight`` ``(head, v, kv_lora_rank)`` (``blk.N.attn_v_b``).

Whole values move (exact). Only a float ``kv_b_proj`` is cut: a quantized one (its groups run along
``kv_lora_rank``, which the transpose turns into rows) is refused when written. Reading a GGUF back gives the two
tensors under these names (no ``kv_b_proj``; see :mod:`converter.formats.gguf.hf_config`, which writes no
config.json for ``deepseek2``).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from converter.errors import NotRepresentableError
from converter.tensor import Checkpoint, DenseTensor

__all__ = ["split_kv_b", "mtp_layers", "MLA_MODEL_TYPES"]

MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
"""config.json ``model_type`` values whose ``kv_b_proj`` is cut (llama.cpp ``deepseek2``)."""

_KV_B = re.compile(r"^(?P<p>.+)\.kv_b_proj\.weight$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")

MTP_DROPPED = ("a multi-token-prediction layer (index >= num_hidden_layers): llama.cpp's deepseek2 has no place for it "
               "(DeepseekV2Model.skip_mtp drops it)")


def mtp_layers(ckpt: Checkpoint, arch: str) -> dict[str, str]:
    """``{tensor: reason}`` for the tensors of DeepSeek's multi-token-prediction layers (``model.layers.N.*`` with
    ``N >= num_hidden_layers``, e.g. DeepSeek-V3's layer 61), which ``convert_hf_to_gguf.py`` leaves out of a
    ``deepseek2`` GGUF; ``{}`` for another architecture."""
    n = (ckpt.config or {}).get("num_hidden_layers")
    if arch != "deepseek2" or not isinstance(n, int):
        return {}
    return {name: MTP_DROPPED for name in ckpt.names() if (m := _LAYER.match(name)) and int(m.group(1)) >= n}


def _dims(ckpt: Checkpoint, name: str, rows: int) -> tuple[int, int, int]:
    """``(head, qk_nope, v)`` of ``kv_b_proj`` ``name`` with ``rows`` rows, from config.json."""
    cfg = ckpt.config or {}
    nope, v, heads = cfg.get("qk_nope_head_dim"), cfg.get("v_head_dim"), cfg.get("num_attention_heads")
    if not all(isinstance(x, int) and x > 0 for x in (nope, v, heads)) or rows != heads * (nope + v):
        raise NotRepresentableError("kv_b_proj rows are not heads x (qk_nope_head_dim + v_head_dim) of config.json",
                                    tensor=name, field="shape",
                                    expected=f"{heads} x ({nope} + {v}) rows", found=rows,
                                    hint="config.json needs num_attention_heads, qk_nope_head_dim and v_head_dim")
    return heads, nope, v


def split_kv_b(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` with each ``kv_b_proj`` as llama.cpp's ``k_b_proj`` / ``v_b_proj`` pair; the checkpoint itself when
    its ``model_type`` is not in :data:`MLA_MODEL_TYPES` or it has no ``kv_b_proj``.

    Raises
    ------
    NotRepresentableError
        A quantized ``kv_b_proj``; rows that are not ``heads * (qk_nope + v)`` of config.json.
    """
    if (ckpt.config or {}).get("model_type") not in MLA_MODEL_TYPES:
        return ckpt
    targets = [s for s in ckpt.specs() if _KV_B.match(s.name)]
    if not targets:
        return ckpt
    specs, make = {}, {}
    for spec in ckpt.specs():
        m = _KV_B.match(spec.name)
        if not m:
            specs[spec.name] = spec
            continue
        if spec.kind != "dense" or len(spec.shape) != 2:
            raise NotRepresentableError("a quantized kv_b_proj is not cut into llama.cpp's k_b / v_b (the key half is "
                                        "transposed per head; only float weights are)", tensor=spec.name,
                                        field="kind", expected="dense 2-D", found=spec.kind,
                                        hint="dequantize the model first, then convert it to GGUF")
        heads, nope, v = _dims(ckpt, spec.name, int(spec.shape[0]))
        rank = int(spec.shape[1])
        k_name, v_name = f"{m['p']}.k_b_proj.weight", f"{m['p']}.v_b_proj.weight"
        specs[k_name] = replace(spec, name=k_name, shape=(heads, rank, nope),
                                notes=spec.notes + (f"key rows of {spec.name} per head, transposed",))
        specs[v_name] = replace(spec, name=v_name, shape=(heads, v, rank),
                                notes=spec.notes + (f"value rows of {spec.name} per head",))

        def per_head(src=spec.name, heads=heads, nope=nope, v=v, rank=rank):
            return np.asarray(ckpt[src].data).reshape(heads, nope + v, rank)
        make[k_name] = lambda per_head=per_head, k_name=k_name, nope=nope: DenseTensor(
            k_name, np.ascontiguousarray(per_head()[:, :nope].transpose(0, 2, 1)))
        make[v_name] = lambda per_head=per_head, v_name=v_name, nope=nope: DenseTensor(
            v_name, np.ascontiguousarray(per_head()[:, nope:]))

    def load(name: str):
        return make[name]() if name in make else ckpt[name]
    return Checkpoint(specs, load, format=ckpt.format, path=ckpt.path, config=ckpt.config, metadata=ckpt.metadata,
                      files=ckpt.files, extra_files=ckpt.extra_files, side_files=ckpt.side_files)
