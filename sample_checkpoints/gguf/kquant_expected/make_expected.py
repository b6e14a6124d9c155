"""Make the K-quant test matrices and llama.cpp's bytes for them (run in /work/venvs/interop).

Inputs (``inputs.npz``, key ``x``: float32 (N, 256), one super-block per row): random blocks of
several distributions and scales (normal, Student-t, Laplace with outliers, offsets, all-positive,
all-negative, sparse, constant, tiny (below GROUP_MAX_EPS), large, a zero sub-block) and real
weights (MiniLM ``blk.0.ffn_down.weight`` rows of ``minilm_gguf_F16.gguf``, widened to float32).
Expected bytes (``expected.npz``, one uint8 array per type): llama.cpp's
``quantize_row_{q2,q3,q4,q5,q6}_K_ref`` from the ``libggml-base.so`` of PyPI llama-cpp-python 0.3.36
(llama.cpp commit 0c1e57098bba), called through ctypes on those float32 values.
"""

import ctypes
import glob
import pathlib

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
SIZES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def inputs() -> np.ndarray:
    rng = np.random.default_rng(20240616)
    f = np.float32
    parts = [rng.standard_normal((24, 256)).astype(f) * rng.lognormal(-3, 1.5, (24, 1)).astype(f),
             (rng.standard_t(2, (8, 256)) * 0.02).astype(f),
             (rng.standard_normal((8, 256)) * 0.01 + rng.uniform(-0.05, 0.05, (8, 1))).astype(f),
             np.abs(rng.standard_normal((4, 256))).astype(f), -np.abs(rng.standard_normal((4, 256))).astype(f),
             (rng.integers(-8, 8, (4, 256)) * 0.125).astype(f),
             np.where(rng.random((4, 256)) < 0.9, 0, rng.standard_normal((4, 256))).astype(f),
             np.full((1, 256), 0.5, f), np.full((1, 256), -3.0, f), np.zeros((1, 256), f),
             (rng.standard_normal((2, 256)) * 1e-17).astype(f), (rng.standard_normal((2, 256)) * 1e4).astype(f)]
    lap = rng.laplace(0, 0.03, (8, 256)).astype(f)
    lap[rng.random((8, 256)) < 0.01] *= 50
    parts.append(lap)
    x = np.concatenate(parts)
    x[0, 16:48] = 0  # a zero sub-block of 16 and of 32
    import gguf
    r = gguf.GGUFReader(str(HERE.parent / "minilm_gguf_F16.gguf"))
    down = next(t for t in r.tensors if t.name == "blk.0.ffn_down.weight")
    real = np.asarray(down.data, dtype=np.float32).reshape(-1, 256)[:48]
    return np.ascontiguousarray(np.concatenate([x, real]), dtype=np.float32)


def reference(type_name: str, x: np.ndarray) -> np.ndarray:
    lib_path = glob.glob(str(pathlib.Path(__import__("llama_cpp").__file__).parent / "lib" / "libggml-base.so"))[0]
    lib = ctypes.CDLL(lib_path)
    fn = getattr(lib, f"quantize_row_{type_name[0].lower()}{type_name[1]}_K_ref")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.zeros(flat.size // 256 * SIZES[type_name], dtype=np.uint8)
    fn(flat.ctypes.data, out.ctypes.data, flat.size)
    return out.reshape(x.shape[0], SIZES[type_name])


if __name__ == "__main__":
    x = inputs()
    np.savez_compressed(HERE / "inputs.npz", x=x)
    np.savez_compressed(HERE / "expected.npz", **{t: reference(t, x) for t in SIZES})
    print(x.shape)
