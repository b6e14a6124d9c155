"""Logical FP8 tensors for the validator and audit tests: from the real-sample subset
(``data/fp8_real_subset.safetensors``, see ``data/README.md``) and from a plain numpy absmax quantizer.

The subset file is parsed here by hand (safetensors' numpy loader has no F8 dtypes), not with qckpt's
reader, so the tests' inputs do not depend on the code under test.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

import converter
from converter import codebooks
from converter.groups import GroupMap
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor

SUBSET = Path(__file__).parent / "data" / "fp8_real_subset.safetensors"
_DTYPES = {"F8_E4M3": np.uint8, "BF16": ml_dtypes.bfloat16, "F32": np.float32}
K, V = "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"
Q, DOWN = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight"


def read_subset() -> dict[str, np.ndarray]:
    """name -> array (E4M3 codes as their uint8 bytes, BF16 as ``ml_dtypes.bfloat16``)."""
    raw = SUBSET.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header, base = json.loads(raw[8:8 + n]), 8 + n
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        out[name] = np.frombuffer(raw[base + a:base + b], dtype=_DTYPES[h["dtype"]]).reshape(h["shape"]).copy()
    return out


def e4m3(scale_dtype: str = "BF16") -> QuantScheme:
    return QuantScheme(8, False, scale_dtype=scale_dtype, codebook=codebooks.E4M3)


def deepseek_tensors() -> list[QuantizedTensor]:
    """auto-round's DeepSeek-style k_proj / v_proj: 128 x 128 blocks, BF16 ``weight_scale_inv`` (a multiplier)."""
    a = read_subset()
    return [QuantizedTensor(n, ("out", "in"), a[f"deepseek/{n}"], a[f"deepseek/{n}_scale_inv"], e4m3(),
                            GroupMap.per_block(128, 128)) for n in (K, V)]


def ct_tensors() -> list[QuantizedTensor]:
    """llm-compressor's per-channel FP8 q/k/v/down_proj, rows 0..31 (BF16 ``weight_scale`` [out, 1])."""
    a = read_subset()
    return [QuantizedTensor(n, ("out", "in"), a[f"ct/{n}"], a[f"ct/{n}_scale"], e4m3(), GroupMap.per_channel("out"))
            for n in (Q, K, V, DOWN)]


def source_k() -> np.ndarray:
    """The bf16 k_proj both tools quantized (float32 copy)."""
    return read_subset()[f"source/{K}"].astype(np.float32)


def absmax_fp8(name: str, w: np.ndarray, group_map: GroupMap, scale_dtype: str = "F32") -> QuantizedTensor:
    """Plain numpy absmax E4M3 quantizer (scale = amax / 448 per group, rounded to ``scale_dtype``;
    codes = ``w / s`` cast to E4M3 by ml_dtypes), 2-D ``(out, in)``."""
    O, I = w.shape
    if group_map.granularity.value == "block":
        bo, bi = group_map.extent("out") or O, group_map.extent("in") or I
    elif group_map.granularity.value == "channel":
        bo, bi = 1, I
    else:
        bo, bi = O, I
    np_dtype = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "F16": np.float16}[scale_dtype]
    grid = (-(-O // bo), -(-I // bi))
    scales = np.zeros(grid, dtype=np.float32)
    codes = np.zeros((O, I), dtype=np.uint8)
    for i in range(grid[0]):
        for j in range(grid[1]):
            blk = w[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi].astype(np.float32)
            s = np.float32(np.abs(blk).max() / 448.0)
            s = np.float32(np.asarray(s, dtype=np_dtype).astype(np.float32))
            scales[i, j] = s
            q = (blk / s if s else blk * 0).astype(ml_dtypes.float8_e4m3fn)
            codes[i * bo:(i + 1) * bo, j * bi:(j + 1) * bi] = q.view(np.uint8)
    scales = scales.astype(np_dtype).reshape(group_map.param_shape((O, I), ("out", "in")))
    return QuantizedTensor(name, ("out", "in"), codes, scales, e4m3(scale_dtype), group_map)


def write_native(path: Path, tensors, dense: dict[str, np.ndarray] | None = None) -> Path:
    """The tensors (and dense arrays) as one qckpt native file at ``path``."""
    ts = list(tensors) + [DenseTensor(k, v) for k, v in (dense or {}).items()]
    converter.save(Checkpoint.from_tensors(ts), path, format="native")
    return path
