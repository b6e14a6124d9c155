"""Synthetic Llama-style GPTQ checkpoints for the tests (``conftest.gptq_dir``) and the streaming
benchmark (``benchmarks/bench_streaming.py``).

The tensors have the names, dtypes and shapes AutoGPTQ / GPTQModel write for a Llama model
(``model.layers.{i}.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj`` as ``qweight`` /
``qzeros`` / ``scales`` / ``g_idx``; embeddings, ``lm_head`` and norms in fp16), 4-bit, group
size 128, symmetric, ``checkpoint_format "gptq"`` (v1: stored zero points are ``z - 1 = 7``,
i.e. the word ``0x77777777``). Codes are uniform random, scales random in ``[1e-3, 1.1e-2)``.
The data is generated block by block, so building a 7B-shaped checkpoint needs little memory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from converter.write.safetensors import SafetensorsWriter


@dataclass(frozen=True)
class Shape:
    """Model dimensions (Llama naming)."""

    layers: int
    hidden: int
    mlp: int
    vocab: int
    group: int = 128
    bits: int = 4


#: Named sizes. ``7b``: Llama-2-7B (about 3.9 GB as GPTQ 4-bit g128); ``7b-2x``: the same with
#: twice the layers (peak RSS must not grow); ``small``: four 7B-shaped layers (default, ~1 GB).
SIZES = {
    "tiny": Shape(2, 512, 1408, 4000),
    "small": Shape(4, 4096, 11008, 32000),
    "7b": Shape(32, 4096, 11008, 32000),
    "7b-2x": Shape(64, 4096, 11008, 32000),
}

PROJ = (("self_attn.q_proj", "h", "h"), ("self_attn.k_proj", "h", "h"), ("self_attn.v_proj", "h", "h"),
        ("self_attn.o_proj", "h", "h"), ("mlp.gate_proj", "m", "h"), ("mlp.up_proj", "m", "h"),
        ("mlp.down_proj", "h", "m"))


def _entries(s: Shape) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype, shape) of every stored tensor."""
    dims = {"h": s.hidden, "m": s.mlp}
    per_word = 32 // s.bits
    out = [("model.embed_tokens.weight", "F16", (s.vocab, s.hidden)),
           ("model.norm.weight", "F16", (s.hidden,)),
           ("lm_head.weight", "F16", (s.vocab, s.hidden))]
    for i in range(s.layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", "F16", (s.hidden,)),
                (p + "post_attention_layernorm.weight", "F16", (s.hidden,))]
        for mod, o, n in PROJ:
            O, I = dims[o], dims[n]
            ng = -(-I // s.group)
            out += [(p + mod + ".qweight", "I32", (I // per_word, O)),
                    (p + mod + ".qzeros", "I32", (ng, O // per_word)),
                    (p + mod + ".scales", "F16", (ng, O)),
                    (p + mod + ".g_idx", "I32", (I,))]
    return out


def _fill(rng: np.random.Generator, name: str, dtype: str, shape: tuple[int, ...], s: Shape) -> np.ndarray:
    if name.endswith(".qweight"):
        return rng.integers(0, 1 << 32, size=shape, dtype=np.uint32).view(np.int32)
    if name.endswith(".qzeros"):
        return np.full(shape, 0x77777777, dtype=np.int32)
    if name.endswith(".g_idx"):
        return (np.arange(shape[0], dtype=np.int32) // s.group)
    if name.endswith(".scales"):
        return (rng.random(shape, dtype=np.float32) * 0.01 + 0.001).astype(np.float16)
    if name.endswith("norm.weight"):
        return (1.0 + 0.01 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float16)
    return (0.02 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float16)


def build_gptq(dst: Path, s: Shape, *, seed: int = 0) -> int:
    """Write the checkpoint directory ``dst`` (``model.safetensors`` + configs); returns its data bytes."""
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    entries = _entries(s)
    rng = np.random.default_rng(seed)
    with SafetensorsWriter(dst / "model.safetensors", entries, {"format": "pt"}) as w:
        for name, dtype, shape in entries:
            if len(shape) == 2 and shape[0] * shape[1] > (1 << 24):  # large: fill in row blocks
                arr = np.empty(shape, dtype={"F16": np.float16, "I32": np.int32}[dtype])
                step = max(1, (1 << 22) // shape[1])
                for r in range(0, shape[0], step):
                    arr[r:r + step] = _fill(rng, name, dtype, (min(step, shape[0] - r), shape[1]), s)
                w.write(name, arr)
                del arr
            else:
                w.write(name, _fill(rng, name, dtype, shape, s))
    qc = {"quant_method": "gptq", "bits": s.bits, "group_size": s.group, "desc_act": False, "sym": True,
          "checkpoint_format": "gptq", "static_groups": False, "true_sequential": True, "damp_percent": 0.01}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": s.hidden,
              "intermediate_size": s.mlp, "num_hidden_layers": s.layers, "num_attention_heads": s.hidden // 128,
              "num_key_value_heads": s.hidden // 128, "vocab_size": s.vocab, "rms_norm_eps": 1e-5,
              "torch_dtype": "float16", "quantization_config": qc}
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (dst / "quantize_config.json").write_text(json.dumps(qc, indent=2) + "\n")
    return (dst / "model.safetensors").stat().st_size



# -- independent packing helpers for hand-built checkpoints (no converter.kernels.packing) ---------
def lsb_words(fields, bits: int) -> list[int]:
    """One LSB-first bit stream of ``fields`` cut into 32-bit words (pure Python)."""
    acc = 0
    for k, v in enumerate(int(x) for x in fields):
        acc |= (v & ((1 << bits) - 1)) << (k * bits)
    return [(acc >> (32 * w)) & 0xFFFFFFFF for w in range(-(-len(fields) * bits // 32))]


def rows_u32(codes: np.ndarray, bits: int) -> np.ndarray:
    """[r, n] codes -> [r, n*bits/32] uint32 words packed along the row (MLX layout)."""
    return np.array([lsb_words(row, bits) for row in codes], dtype=np.uint64).astype(np.uint32)


def mlx_dir(path: Path, tensors: dict, quant: dict, **cfg) -> Path:
    path.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "quantization": quant,
                                                  "quantization_config": quant, **cfg}))
    return path

if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dst", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    a = ap.parse_args()
    print(build_gptq(a.dst, SIZES[a.size]))
