"""Write ``smollm2_mlx_mxfp4.safetensors``: MLX's own MXFP4 encoding of two real bf16 weights.

Run with the interop venv (mlx 0.32.4): ``python tests/data/fp4/make_mlx.py``. For the k_proj and
v_proj bf16 weights of ``smollm2_fp4_fixture.safetensors``, ``mx.quantize(w, group_size=32, bits=4,
mode="mxfp4")`` gives ``<name>.mlx.packed`` (its uint32 words viewed as bytes, U8 ``[out, in/2]``)
and ``<name>.mlx.scale`` (E8M0 bytes, U8 ``[out, in/32]``).
"""

import hashlib
from pathlib import Path

import mlx.core as mx
import numpy as np
from safetensors.numpy import load_file

from make_fixture import write_raw

HERE = Path(__file__).parent
NAMES = ["model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"]


def main() -> None:
    fx = load_file(str(HERE / "smollm2_fp4_fixture.safetensors"))
    out = {}
    for n in NAMES:
        bits = fx[f"{n}.bf16"]
        w = mx.array(bits.astype(np.uint32) << 16).view(mx.float32).astype(mx.bfloat16)
        wq, sc = mx.quantize(w, group_size=32, bits=4, mode="mxfp4")[:2]
        out[f"{n}.mlx.packed"] = np.array(wq).view(np.uint8).reshape(bits.shape[0], -1)
        out[f"{n}.mlx.scale"] = np.array(sc).astype(np.uint8)
    dst = HERE / "smollm2_mlx_mxfp4.safetensors"
    write_raw(dst, out)
    print(dst, mx.__version__, hashlib.sha256(dst.read_bytes()).hexdigest(), dst.stat().st_size)


if __name__ == "__main__":
    main()
