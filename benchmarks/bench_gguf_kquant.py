"""K-quant encode throughput (qckpt's numpy port of llama.cpp's reference quantizers) beside the
legacy codecs, and a 7B-shaped Q4_K_M extrapolation (not a test; no timing is asserted anywhere).

Run: ``python benchmarks/bench_gguf_kquant.py [--rows 1024] [--cols 4096] [--repeat 2] [--workers 2]``
(``--llama-cpp``: also time llama.cpp's own ``quantize_row_*_ref`` through ctypes, when the
``llama_cpp`` package is importable, e.g. in /work/venvs/interop).

Prints, per type, the best-of-N seconds and million elements per second of ``codec.encode`` on a
``rows x cols`` float32 matrix (one process, one thread), then the time a 7B-shaped LLaMA
checkpoint (32 layers, hidden 4096, FFN 11008, vocab 32000) would take as Q4_K_M: the mix's
types (:func:`converter.formats.gguf.mix.choose_types`) times the measured rates, divided by
``--workers`` (tensors are independent; the write engine runs them in worker processes), and the
peak RSS of this process (a row-block encode holds one block of float32 values and its bytes).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from converter.formats.gguf.blocks import codec_for  # noqa: E402
from converter.formats.gguf.mix import ModelInfo, TensorInfo, choose_types  # noqa: E402

TYPES = ("Q4_0", "Q5_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _llama_cpp_rates(x: np.ndarray, repeat: int) -> dict[str, float]:
    try:
        import ctypes
        import llama_cpp
    except ImportError:
        return {}
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    sizes = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q4_0": 18, "Q5_0": 22, "Q8_0": 34}
    out = {}
    flat = np.ascontiguousarray(x).reshape(-1)
    for t, size in sizes.items():
        fn = getattr(lib, f"quantize_row_{t[0].lower()}{t[1:]}_ref")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        block = 256 if t.endswith("_K") else 32
        buf = np.zeros(flat.size // block * size, np.uint8)
        secs = _best(lambda fn=fn, buf=buf: fn(flat.ctypes.data, buf.ctypes.data, flat.size), repeat)
        out[t] = flat.size / secs / 1e6
    return out


def seven_b() -> list[tuple[TensorInfo, int]]:
    """LLaMA-2-7B's weight matrices as (GGUF tensor, element count)."""
    h, f, v, n = 4096, 11008, 32000, 32
    ts = [(TensorInfo("token_embd.weight", h, 2), v * h), (TensorInfo("output.weight", h, 2), v * h)]
    for i in range(n):
        for name, rl, rows in (("attn_q", h, h), ("attn_k", h, h), ("attn_v", h, h), ("attn_output", h, h),
                               ("ffn_gate", h, f), ("ffn_up", h, f), ("ffn_down", f, h)):
            ts.append((TensorInfo(f"blk.{i}.{name}.weight", rl, 2), rl * rows))
    return ts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--llama-cpp", action="store_true")
    a = p.parse_args()
    x = (np.random.default_rng(0).standard_normal((a.rows, a.cols)) * 0.02).astype(np.float32)
    print(f"matrix {a.rows}x{a.cols} float32, best of {a.repeat}, one process")
    rates = {}
    for t in TYPES:
        codec = codec_for(t)
        s = _best(lambda codec=codec: codec.encode(x), a.repeat)
        rates[t] = x.size / s / 1e6
        print(f"{t:5} qckpt encode {s:8.3f} s {rates[t]:8.2f} Melem/s")
    if a.llama_cpp:
        for t, r in _llama_cpp_rates(x, a.repeat).items():
            print(f"{t:5} llama.cpp quantize_row_{t[0].lower()}{t[1:]}_ref {r:8.1f} Melem/s (C, one thread)")
    tensors = seven_b()
    types = choose_types("Q4_K_M", [t for t, _ in tensors], ModelInfo("llama", 32, 32, 32))
    total = sum(n for _, n in tensors)
    secs = sum(n / (rates[types[t.name]] * 1e6) for t, n in tensors)
    by_type: dict[str, int] = {}
    for t, n in tensors:
        by_type[types[t.name]] = by_type.get(types[t.name], 0) + n
    print(f"7B-shaped Q4_K_M: {total / 1e9:.2f} G weights, types "
          + ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(by_type.items())))
    print(f"  encode time extrapolated: {secs:.0f} s in one process, {secs / a.workers:.0f} s with {a.workers} "
          f"workers (target: <= 240 s); reading F16 and writing not included")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"  peak RSS of this benchmark process: {rss:.0f} MiB (matrix {x.nbytes / 2**20:.0f} MiB; target <= 512)")


if __name__ == "__main__":
    main()
