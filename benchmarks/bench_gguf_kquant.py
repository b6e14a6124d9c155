"""K-quant encode throughput: qckpt's numpy port and its compiled kernels (``fast`` extra) of llama.cpp's
reference quantizers, beside gguf-py and the legacy codecs; a 7B-shaped Q4_K_M estimate, and (``--e2e``)
the real end-to-end ``qckpt convert`` of a 7B-shaped checkpoint to Q4_K_M (not a test; nothing asserted).

Run: ``python benchmarks/bench_gguf_kquant.py [--rows 256] [--cols 4096] [--repeat 2] [--workers 2]``
(``--llama-cpp``: also time llama.cpp's own ``quantize_row_*_ref`` through ctypes, when the ``llama_cpp``
package is importable, e.g. in /work/interop-venv; ``--e2e``: the end-to-end row, long).

Prints, per type, ns per weight of ``codec.encode`` on the same ``rows x cols`` float32 matrix (one
process, one thread) with the numpy path (``QCKPT_KERNELS=numpy``) and the compiled one (``numba``), the
ratio, and ``gguf.quants.quantize`` where gguf-py has the type (gguf-py 0.19 has no K-quant quantizer:
"-"); the compiled bytes are checked equal to the numpy bytes on the matrix. Then the time a 7B-shaped
LLaMA checkpoint (32 layers, hidden 4096, FFN 11008, vocab 32000) would spend encoding Q4_K_M: the
mix's types (:func:`converter.formats.gguf.mix.choose_types`) times the measured rates, divided by
``--workers``. ``--e2e`` builds (or reuses, ``--source``) the synthetic 7B GPTQ checkpoint of
``tests/synthetic.py`` and runs ``qckpt convert SRC out.gguf --to gguf --quant-type Q4_K_M --workers N``
once in a subprocess: wall time, CPU time (the process and its workers), peak RSS (sampled sum over the
process tree, and the largest single process), and the load average before and after (the machine may
be shared: wall time is only comparable at a similar load).

Measured end to end (``--e2e-only --workers 2 --source`` the synthetic 7B GPTQ checkpoint, auto kernels with
the ``fast`` extra; 2 cores shared with other jobs, hence the load averages), before -> after the row-block
stream (a K-quant tensor requantized, encoded, written and digested a block of about 1 M weights at a time;
read back and q/k-proven in row blocks; the q/k proof in the worker processes):

=====================  ==============================  ==============================
                       before (main e94eea8)           after (row blocks)
=====================  ==============================  ==============================
largest process        911 MiB (a worker: embedding /  249 MiB (a writing worker; about
                       head whole: codes, pieces and   110 MiB of it numba: import and
                       their concatenation, encoded    cached Q4_K / Q6_K kernels, 151
                       bytes, digest, mapped source);  vs 41 MiB with QCKPT_KERNELS=numpy)
                       parent 660 MiB in the q/k proof
process tree           1597 MiB                        508 MiB
wall / CPU             277 s / 286 s                   278 s / 276 s
load before -> after   1.6 -> 4.7                      2.3 -> 4.3
=====================  ==============================  ==============================

Again after the q/k proof stopped computing error figures it discarded (load 2.9 -> 5.3 -> 4.2): largest
process 247 MiB, tree 505 MiB, wall 348 s, CPU 288 s; once more (load 2.5 -> 5.2 -> 5.1): 245 MiB, 501 MiB,
413 s, 299 s. Memory holds at any load; the wall time follows the load.

Output 4.08 GB, the same bytes as before (checked on a 1-layer 7B-shaped checkpoint: identical file and
report). An earlier session measured main at 146-148 s wall on a quiet machine (largest process 862 MiB);
the after figures were taken with two other jobs running, so the 240 s wall target is not shown met here.
Phases of the after run (profiled, load about 4): writing 155 s, read-back proof 31 s, q/k proof 67 s
(it requantizes the 64 q/k tensors again, in the workers).

On the quiet machine (no other job; main 754c124, after merging the requantize speed round too), 2026-12-06
08:41 UTC, load 1.3 before / 2.1 after: **wall 115 s (target <= 240 s: met), CPU 218 s, largest process
255 MiB (target <= 512 MiB: met)**, process tree 531 MiB (the sum of the processes' resident sets: numba's
libraries and the mapped source pages count once per process), output 4.08 GB.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from converter.formats.gguf.blocks import codec_for  # noqa: E402
from converter.formats.gguf.mix import ModelInfo, TensorInfo, choose_types  # noqa: E402
from converter.kernels import compiled  # noqa: E402
from converter.runtime import run_options  # noqa: E402

TYPES = ("Q4_0", "Q5_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _llama_cpp_rates(x: np.ndarray, repeat: int) -> dict[str, float]:
    """ns per weight of llama.cpp's ``quantize_row_<type>_ref`` (C, one thread) on ``x``."""
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
        out[t] = secs / flat.size * 1e9
    return out


def _gguf_py_ns(x: np.ndarray, t: str, repeat: int) -> float | None:
    import gguf

    qt = gguf.GGMLQuantizationType[t]
    try:
        gguf.quants.quantize(x[:1], qt)
    except NotImplementedError:
        return None
    return _best(lambda: gguf.quants.quantize(x, qt), repeat) / x.size * 1e9


def seven_b() -> list[tuple[TensorInfo, int]]:
    """LLaMA-2-7B's weight matrices as (GGUF tensor, element count)."""
    h, f, v, n = 4096, 11008, 32000, 32
    ts = [(TensorInfo("token_embd.weight", h, 2), v * h), (TensorInfo("output.weight", h, 2), v * h)]
    for i in range(n):
        for name, rl, rows in (("attn_q", h, h), ("attn_k", h, h), ("attn_v", h, h), ("attn_output", h, h),
                               ("ffn_gate", h, f), ("ffn_up", h, f), ("ffn_down", f, h)):
            ts.append((TensorInfo(f"blk.{i}.{name}.weight", rl, 2), rl * rows))
    return ts


def kernel_rows(a) -> dict[str, dict[str, float | None]]:
    x = (np.random.default_rng(0).standard_normal((a.rows, a.cols)) * 0.02).astype(np.float32)
    print(f"matrix {a.rows}x{a.cols} float32, best of {a.repeat}, one process, one thread; "
          f"load average {os.getloadavg()[0]:.1f} (2 cores here)")
    c_rates = _llama_cpp_rates(x, a.repeat) if a.llama_cpp else {}
    head = f"{'type':5} {'numpy':>8} {'compiled':>9} {'np/comp':>8} {'gguf-py':>8} {'gguf/comp':>9}"
    print(head + (f" {'llama.cpp C':>11} {'C/comp':>7}" if c_rates else "") + "   (ns per weight)")
    rates: dict[str, dict[str, float | None]] = {}
    for t in TYPES:
        codec = codec_for(t)
        with run_options(kernels="numpy"):
            ref = codec.encode(x)
            numpy_ns = _best(lambda codec=codec: codec.encode(x), a.repeat) / x.size * 1e9
        comp_ns = None
        if compiled.available():
            with run_options(kernels="numba"):
                t0 = time.perf_counter()
                same = np.array_equal(codec.encode(x), ref)
                first = time.perf_counter() - t0
                comp_ns = _best(lambda codec=codec: codec.encode(x), a.repeat) / x.size * 1e9
            if not same:
                raise SystemExit(f"{t}: compiled bytes differ from numpy")
        g = _gguf_py_ns(x, t, a.repeat)
        rates[t] = {"numpy": numpy_ns, "compiled": comp_ns, "gguf": g, "c": c_rates.get(t)}
        best = comp_ns or numpy_ns
        line = (f"{t:5} {numpy_ns:8.1f} " + (f"{comp_ns:9.1f} {numpy_ns / comp_ns:7.2f}x" if comp_ns else
                                            f"{'-':>9} {'-':>8}")
                + (f" {g:8.1f} {g / best:8.2f}x" if g else f" {'-':>8} {'-':>9}"))
        if c_rates:
            line += f" {c_rates[t]:11.1f} {c_rates[t] / best:6.2f}x"
        if comp_ns:
            line += f"   (first call {first:.2f} s incl. compile / cache load)"
        print(line)
    return rates


def estimate(rates, workers: int) -> None:
    tensors = seven_b()
    types = choose_types("Q4_K_M", [t for t, _ in tensors], ModelInfo("llama", 32, 32, 32))
    total = sum(n for _, n in tensors)
    by_type: dict[str, int] = {}
    for t, n in tensors:
        by_type[types[t.name]] = by_type.get(types[t.name], 0) + n
    print(f"7B-shaped Q4_K_M: {total / 1e9:.2f} G weights, types "
          + ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(by_type.items())))
    for path in ("numpy", "compiled"):
        if rates["Q4_K"][path] is None:
            continue
        secs = sum(n * rates[types[t.name]][path] * 1e-9 for t, n in tensors)
        print(f"  encode alone, {path:8}: {secs:6.0f} s in one process, {secs / workers:6.0f} s with {workers} "
              f"workers (target for the whole convert: <= 240 s)")


def e2e(a) -> None:
    from bench_streaming import run_cmd
    from tests.synthetic import SIZES, build_gptq

    work = Path(a.workdir or tempfile.mkdtemp(prefix="qckpt-kquant-e2e-"))
    src = Path(a.source) if a.source else work / "gptq-7b"
    made = not (src / "model.safetensors").exists()
    try:
        if made:
            print(f"building {src} (synthetic GPTQ 4-bit g128, Llama-2-7B shapes) ...", flush=True)
            build_gptq(src, SIZES["7b"])
        dst = work / "q4_k_m.gguf"
        os.environ[compiled.KERNELS_ENV] = a.kernels
        load0 = os.getloadavg()
        print(f"qckpt convert {src} {dst} --to gguf --quant-type Q4_K_M --workers {a.workers} "
              f"(QCKPT_KERNELS={a.kernels}); load average before {load0[0]:.1f} / {load0[1]:.1f} / {load0[2]:.1f}",
              flush=True)
        r = run_cmd(["convert", str(src), str(dst), "--to", "gguf", "--quant-type", "Q4_K_M", "--workers",
                     str(a.workers), "--overwrite", "--quiet"])
        load1 = os.getloadavg()
        size = dst.stat().st_size
        print(f"7B Q4_K_M end to end: wall {r['wall_s']:.0f} s (target <= 240 s), CPU {r['cpu_s']:.0f} s, "
              f"peak RSS tree {r['peak_rss_tree'] / 2**20:.0f} MiB, largest process "
              f"{r['peak_rss_max_process'] / 2**20:.0f} MiB (target <= 512), output {size / 1e9:.2f} GB; "
              f"load average after {load1[0]:.1f} / {load1[1]:.1f} / {load1[2]:.1f}")
        dst.unlink()
    finally:
        if made and not a.keep:
            shutil.rmtree(src, ignore_errors=True)
        if a.workdir is None and not a.keep:
            shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--cols", type=int, default=4096)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--llama-cpp", action="store_true")
    p.add_argument("--e2e", action="store_true", help="also run the 7B-shaped Q4_K_M convert end to end (long)")
    p.add_argument("--e2e-only", action="store_true", help="only the end-to-end row")
    p.add_argument("--kernels", choices=compiled.MODES, default="auto", help="QCKPT_KERNELS for the end-to-end row")
    p.add_argument("--source", default=None, help="an existing 7B-shaped checkpoint for --e2e (default: build one)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep", action="store_true", help="keep the built checkpoint")
    a = p.parse_args()
    if not a.e2e_only:
        rates = kernel_rows(a)
        estimate(rates, a.workers)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"  peak RSS of this benchmark process: {rss:.0f} MiB")
    if a.e2e or a.e2e_only:
        e2e(a)


if __name__ == "__main__":
    main()
