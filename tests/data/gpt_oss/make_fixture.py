"""Build ``tiny_mxfp4/``: a tiny gpt-oss MXFP4 checkpoint whose expert bytes are the real compressed-tensors sample's.

No tool writes the gpt-oss MXFP4 layout on CPU (transformers' ``Mxfp4Quantize`` needs the Triton kernels
fetched at run time), so the expert tensors here are a *relabelling* of bytes that a real tool wrote:
llm-compressor 0.14 / compressed-tensors 0.19.0 ``mxfp4-pack-quantized`` (``sample_checkpoints/ct_mxfp4_smollm2``).
Both layouts store E2M1 codes two per byte, the even element in the low nibble, and one E8M0 exponent byte
(``2^(b - 127)``) per 32 consecutive inputs of a row; compressed-tensors 0.19.0 uses the standard E8M0
encoding (``converter/formats/compressed_tensors/e8m0_rule.py``: >= 0.14.0), so the scale bytes are copied
unchanged. Only rows and whole groups are selected and stacked; no byte is altered.

Mapping (``H`` = hidden 64 = 2 groups, ``I`` = intermediate 64, ``E`` = 2 experts, layers ``L`` = 0, 1; the
first ``2 * 16`` packed bytes / 2 scale bytes of each CT row = its first 64 inputs):

- ``model.layers.L.mlp.experts.gate_up_proj_blocks[e, 2j]`` (gate row ``j``) = CT ``q_proj`` row ``(2L + e) * 64 + j``;
  ``[e, 2j + 1]`` (up row ``j``) = CT ``k_proj`` (``e`` = 0) / ``v_proj`` (``e`` = 1) row ``64 L + j``;
- ``model.layers.L.mlp.experts.down_proj_blocks[e, r]`` = CT ``down_proj`` row ``(2L + e) * 64 + r``;
- ``*_scales`` the matching CT ``weight_scale`` bytes; blocks reshaped ``[E, O, G, 16]``.

Every other tensor (attention, router, norms, embeddings, head, expert biases) is BF16 from a seeded numpy
generator (they only make the model loadable; ``modules_to_not_convert`` keeps them BF16).

Run from the repository root: ``python tests/data/gpt_oss/make_fixture.py`` (numpy, ml_dtypes and qckpt's
safetensors writer; no torch).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from converter.formats.safetensors_io import open_safetensors  # noqa: E402
from converter.write.safetensors import write_safetensors  # noqa: E402

CT = ROOT / "sample_checkpoints" / "ct_mxfp4_smollm2"
OUT = Path(__file__).resolve().parent / "tiny_mxfp4"
H, I, E, LAYERS, VOCAB, HEADS, KV, HEAD_DIM = 64, 64, 2, 2, 128, 4, 2, 16
GROUPS_H, GROUPS_I = H // 32, I // 32

CONFIG = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
    "attention_dropout": 0.0, "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": H,
    "initializer_range": 0.02, "intermediate_size": I, "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 131072, "num_attention_heads": HEADS, "num_experts_per_tok": 2,
    "num_hidden_layers": LAYERS, "num_key_value_heads": KV, "num_local_experts": E, "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                        "original_max_position_embeddings": 4096, "rope_theta": 150000.0},
    "router_aux_loss_coef": 0.001, "sliding_window": 8, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "use_cache": True, "vocab_size": VOCAB, "dtype": "bfloat16",
    "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
}


def ct_rows(f, module: str, rows: range, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Packed bytes ``[len(rows), groups, 16]`` and scale bytes ``[len(rows), groups]`` of CT ``module``."""
    packed = np.asarray(f.get(f"model.layers.0.{module}.weight_packed"))
    scale = np.asarray(f.get(f"model.layers.0.{module}.weight_scale"))
    sel = np.asarray(list(rows))
    return (packed[sel, :16 * groups].reshape(len(sel), groups, 16).copy(), scale[sel, :groups].copy())


def main() -> None:
    version = json.loads((CT / "config.json").read_text())["quantization_config"]["version"]
    assert tuple(int(v) for v in version.split(".")[:2]) >= (0, 14), "standard E8M0 encoding expected"
    rng = np.random.default_rng(15)
    bf16 = ml_dtypes.bfloat16

    def dense(*shape: int, std: float = 0.05) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32).astype(bf16)

    f = open_safetensors(CT / "model.safetensors")
    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": dense(VOCAB, H, std=0.5),
                                      "lm_head.weight": dense(VOCAB, H, std=0.2),
                                      "model.norm.weight": np.ones(H, bf16)}
    for L in range(LAYERS):
        p = f"model.layers.{L}"
        attn = {"q_proj": (HEADS * HEAD_DIM, H), "k_proj": (KV * HEAD_DIM, H), "v_proj": (KV * HEAD_DIM, H),
                "o_proj": (H, HEADS * HEAD_DIM)}
        for proj, shape in attn.items():
            tensors[f"{p}.self_attn.{proj}.weight"] = dense(*shape)
            tensors[f"{p}.self_attn.{proj}.bias"] = dense(shape[0])
        tensors.update({
            f"{p}.input_layernorm.weight": np.ones(H, bf16), f"{p}.post_attention_layernorm.weight": np.ones(H, bf16),
            f"{p}.self_attn.sinks": dense(HEADS, std=0.5),
            f"{p}.mlp.router.weight": dense(E, H, std=0.5), f"{p}.mlp.router.bias": dense(E),
            f"{p}.mlp.experts.gate_up_proj_bias": dense(E, 2 * I, std=0.02),
            f"{p}.mlp.experts.down_proj_bias": dense(E, H, std=0.02),
        })
        gu_blocks = np.empty((E, 2 * I, GROUPS_H, 16), np.uint8)
        gu_scales = np.empty((E, 2 * I, GROUPS_H), np.uint8)
        dn_blocks = np.empty((E, H, GROUPS_I, 16), np.uint8)
        dn_scales = np.empty((E, H, GROUPS_I), np.uint8)
        for e in range(E):
            gate = ct_rows(f, "self_attn.q_proj", range((2 * L + e) * I, (2 * L + e + 1) * I), GROUPS_H)
            up = ct_rows(f, ("self_attn.k_proj", "self_attn.v_proj")[e], range(L * I, (L + 1) * I), GROUPS_H)
            gu_blocks[e, 0::2], gu_scales[e, 0::2] = gate
            gu_blocks[e, 1::2], gu_scales[e, 1::2] = up
            dn_blocks[e], dn_scales[e] = ct_rows(f, "mlp.down_proj", range((2 * L + e) * H, (2 * L + e + 1) * H),
                                                 GROUPS_I)
        tensors.update({f"{p}.mlp.experts.gate_up_proj_blocks": gu_blocks,
                        f"{p}.mlp.experts.gate_up_proj_scales": gu_scales,
                        f"{p}.mlp.experts.down_proj_blocks": dn_blocks,
                        f"{p}.mlp.experts.down_proj_scales": dn_scales})
    OUT.mkdir(exist_ok=True)
    write_safetensors(OUT / "model.safetensors", dict(sorted(tensors.items())), {"format": "pt"})
    (OUT / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")


if __name__ == "__main__":
    main()
