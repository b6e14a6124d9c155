"""Make ``reference.safetensors``: llama.cpp's own MXFP4 / NVFP4 quantize and dequantize of small inputs.

Run: ``python make_fixture.py HARNESS`` where HARNESS is a program built with gcc from ggml's C functions
(PROVENANCE.json: which functions, which commit, the command). Its interface: ``HARNESS q|d mxfp4|nvfp4 N``;
``q`` reads N float32 from stdin and writes ``quantize_row_<type>_ref``'s blocks, ``d`` reads the blocks of
N elements and writes ``dequantize_row_<type>``'s float32. Nothing of ggml is kept in this repository.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file, save_file

HERE = Path(__file__).resolve().parent
FP4_FIXTURE = HERE.parent / "fp4" / "smollm2_fp4_fixture.safetensors"
BLOCK = {"mxfp4": 32, "nvfp4": 64}


def run(harness: str, mode: str, kind: str, n: int, data: bytes) -> bytes:
    return subprocess.run([harness, mode, kind, str(n)], input=data, capture_output=True, check=True).stdout


def hard_cases(kind: str) -> np.ndarray:
    """64 rows x 256: ties between E2M1 steps, block maxima at and around powers of two, E4M3 rounding
    and clamp points, zero / tiny blocks, mixed signs (seeded, so re-running gives the same bytes)."""
    rng = np.random.default_rng(15)
    b = BLOCK[kind]
    rows = []
    for r in range(64):
        x = rng.standard_normal(256).astype(np.float32) * np.float32(2.0 ** rng.integers(-12, 12))
        kind_r = r % 8
        if kind_r == 1:  # exact half-steps: ties of best_index_mxfp4 (first index wins)
            x = (rng.integers(-24, 25, 256) / 4).astype(np.float32) * np.float32(2.0 ** rng.integers(-4, 4))
        elif kind_r == 2:  # block maxima just below / at / above a power of two (floor(log2) edges)
            p = np.float32(2.0 ** rng.integers(-20, 20))
            for j, m in enumerate((np.nextafter(p, np.float32(0)), p, np.nextafter(p, np.float32(np.inf)), p * 3)):
                x[j * b] = m if j < 256 // b else x[j * b]
        elif kind_r == 3:  # a zero block, then a block of one tiny value
            x[:b] = 0
            x[b:2 * b] = 0
            x[b] = np.float32(1e-30)
        elif kind_r == 4:  # NVFP4 scales near E4M3 subnormals (amax/6 < 2^-6) and above 448 (clamp)
            x[:b] *= np.float32(1e-3) / np.abs(x[:b]).max()
            x[b:2 * b] *= np.float32(6 * 500) / np.abs(x[b:2 * b]).max()
        elif kind_r == 5:  # negative zeros and the E2M1 grid itself
            x[:16] = np.float32(-0.0)
            x[16:32] = np.array([0, .5, 1, 1.5, 2, 3, 4, 6] * 2, np.float32) * np.float32(-1) ** np.arange(16)
        rows.append(x)
    return np.stack(rows).astype(np.float32)


def main(harness: str) -> None:
    real = load_file(str(FP4_FIXTURE))
    k_bf16 = real["model.layers.0.self_attn.k_proj.weight.bf16"].view(ml_dtypes.bfloat16).astype(np.float32)
    out = {}
    for kind in BLOCK:
        for tag, x in (("hard", hard_cases(kind)), ("k_proj", k_bf16)):
            x = np.ascontiguousarray(x, dtype=np.float32)
            q = run(harness, "q", kind, x.size, x.tobytes())
            d = run(harness, "d", kind, x.size, q)
            out[f"{kind}.{tag}.input"] = x
            out[f"{kind}.{tag}.blocks"] = np.frombuffer(q, np.uint8).reshape(x.shape[0], -1).copy()
            out[f"{kind}.{tag}.dequant"] = np.frombuffer(d, np.float32).reshape(x.shape).copy()
    for kind in BLOCK:  # the bf16 k_proj is read from ../fp4 by the tests; its bytes are the check
        del out[f"{kind}.k_proj.input"], out[f"{kind}.k_proj.dequant"]
    save_file(out, str(HERE / "reference.safetensors"))


if __name__ == "__main__":
    main(sys.argv[1])
