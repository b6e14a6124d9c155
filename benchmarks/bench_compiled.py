"""Compiled (``fast`` extra, numba) vs numpy requantize: ns per weight, wall and CPU, same run.

The lossy route of ``qckpt convert <GPTQ g128> --per-channel --bits 8`` on single tensors: the
library's ``requantize`` (unpack + dequantize the GPTQ 4-bit group-128 codes, int8 per-channel
scales and codes, the error report's sums) of a ``4096 x 11008`` (down_proj) and a ``4096 x 4096``
(q_proj) tensor of a synthetic GPTQ checkpoint (``tests/synthetic.py``: random codes, fp16 scales,
v1 zeros 8), in the kernel's own thread (``--workers 1``: one kernel thread, as in a worker
process), each path on the same matrices, alternating within each round, median of ``--repeat`` rounds. Beside them: a
numpy copy of the same tensor's float32 values (the memory-traffic floor of one pass), and the
compiled kernels' first-call seconds in this process (a compile, or a load from numba's on-disk
cache) and in a fresh process with an empty cache (``NUMBA_CACHE_DIR`` set to a new folder: the
first-run compile time a new install pays once).

Also checks, in the same run, that the two paths give identical codes, scales and error figures.

With ``--cli``: also the whole one-layer checkpoint through ``qckpt convert ... --per-channel --bits 8
--workers 1``, ``QCKPT_KERNELS=numpy`` vs ``auto``, outputs compared byte for byte.

Usage: ``python benchmarks/bench_compiled.py [--scale 1.0] [--repeat 5] [--cli]``

Measured (full size, ``--repeat 5 --cli``, numba 0.68.1, 2 cores shared with other jobs, load
average 7.0 / 9.6 / 8.8 at the start): ns/weight wall / CPU numpy -> compiled: 4096 x 11008
13.59 / 5.82 -> 8.87 / 4.34 (1.53x / 1.34x), 4096 x 4096 11.88 / 5.89 -> 8.09 / 4.04 (1.47x /
1.46x), identical codes, scales and figures; ``qckpt convert`` of the one-layer checkpoint 6.37 s
-> 5.51 s (1.16x), byte-identical; first run with an empty cache: 4.4 s + 1.8 s of compile, a
cached load 0.43 s. (``--scale
0.25``: quarter-size matrices, for a quick look on a shared machine).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout

from converter import load  # noqa: E402
from converter.kernels import compiled  # noqa: E402
from converter.quant.requant import Target, requantize  # noqa: E402
from converter.runtime import run_options  # noqa: E402
from tests.synthetic import Shape, build_gptq  # noqa: E402


def _paired_times(fns: dict, repeat: int) -> dict[str, tuple[float, float]]:
    """Median wall and median process CPU seconds of each ``fns[label]()``, the labels alternating
    within each of ``repeat`` rounds (a load change on the shared machine hits both)."""
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for label, fn in fns.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[label].append(time.perf_counter() - t0)
            cpu[label].append(time.process_time() - c0)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in fns}


def _requantize_with(t, target, kernels: str):
    def run():
        with run_options(kernels=kernels):
            return requantize(t, target)
    return run


def _cold_compile_seconds() -> dict[str, float]:
    """First-call seconds of the requantize kernels in a fresh process with an empty numba cache."""
    code = textwrap.dedent("""
        import json, numpy as np
        from converter.kernels import compiled
        from converter.kernels.rtn import quantize_rows
        from converter.kernels.error_sums import ErrorSums
        from converter.runtime import run_options
        from converter.scheme import QuantScheme
        x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
        with run_options(kernels="numba"):
            quantize_rows(x, QuantScheme(8, True), group_size=None, compare=ErrorSums(64, 256))
        print(json.dumps(compiled.compile_seconds()))
    """)
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def _same(a, b) -> bool:
    """Identical codes, scales and error figures."""
    ta, tb = a.tensor, b.tensor
    same = np.array_equal(ta.codes, tb.codes) and np.array_equal(ta.scales.view(np.uint8), tb.scales.view(np.uint8))
    return bool(same and a.vs_source.to_json() == b.vs_source.to_json())


def _cli(src: Path, work: Path, repeat: int) -> None:
    """End to end: the CLI requantize of the whole one-layer checkpoint, ``QCKPT_KERNELS=numpy`` vs the
    default ``auto`` with numba installed (a fresh process each run: ``auto`` includes numba's import
    and the cached kernels' load), outputs compared byte for byte."""
    import filecmp

    times: dict[str, list[float]] = {"numpy": [], "auto": []}  # auto: compiled on tensors of 2^20 values or more
    for i in range(repeat):
        for kernels in times:
            dst = work / f"cli-{kernels}-{i}"
            env = dict(os.environ, QCKPT_KERNELS=kernels, PYTHONPATH=str(ROOT))
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "converter", "convert", str(src), str(dst), "--to",
                            "compressed-tensors", "--per-channel", "--bits", "8", "--workers", "1", "--quiet"],
                           env=env, check=True, capture_output=True)
            times[kernels].append(time.perf_counter() - t0)
    a, b = work / "cli-numpy-0", work / "cli-auto-0"
    names = sorted(p.name for p in a.iterdir())
    same = names == sorted(p.name for p in b.iterdir()) and all(
        filecmp.cmp(a / n, b / n, shallow=False) for n in names)
    nw, cw = statistics.median(times["numpy"]), statistics.median(times["auto"])
    print(f"qckpt convert (whole checkpoint, --workers 1, fresh process, median of {repeat}): "
          f"QCKPT_KERNELS=numpy {nw:.2f} s, auto (compiled from 2^20 values) {cw:.2f} s, ratio {nw / cw:.2f}x; "
          f"outputs byte-identical: {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="matrix sides times this (0.25: a quick look)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cli", action="store_true",
                    help="also time `qckpt convert SRC DST --to compressed-tensors --per-channel --bits 8 "
                         "--workers 1` on the one-layer checkpoint, QCKPT_KERNELS=numpy vs auto, and compare "
                         "the outputs byte for byte")
    args = ap.parse_args()
    if not compiled.available():
        sys.exit("numba is not installed: pip install 'qckpt[fast]'")
    hidden = max(128, int(4096 * args.scale) // 128 * 128)
    mlp = max(128, int(11008 * args.scale) // 128 * 128)
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"({os.cpu_count()} cores)")
    cold = _cold_compile_seconds()
    print("first run, empty numba cache (fresh process): "
          + ", ".join(f"{k.rsplit('.', 1)[-1]} {v:.2f} s" for k, v in cold.items()))
    with tempfile.TemporaryDirectory() as work:
        src = Path(work) / "gptq"
        build_gptq(src, Shape(1, hidden, mlp, 256))
        ckpt = load(src)
        tensors = {f"{hidden} x {mlp}": ckpt["model.layers.0.mlp.down_proj.weight"],
                   f"{hidden} x {hidden}": ckpt["model.layers.0.self_attn.q_proj.weight"]}
        target = Target(bits=8, granularity="channel")
        print(f"requantize GPTQ 4-bit g128 -> int8 per channel with the error sums, 1 kernel thread, "
              f"median of {args.repeat}")
        print(f"{'matrix':>14} {'numpy wall/CPU':>17} {'compiled wall/CPU':>19} {'ratio wall/CPU':>15} "
              f"{'f32 copy':>9}  same")
        with run_options(workers=1):
            for label, t in tensors.items():
                numel = t.shape[0] * t.shape[1]
                res = {}
                for kernels in ("numpy", "numba"):  # warm-up: caches, pools, the compile / cache load
                    with run_options(kernels=kernels):
                        res[kernels] = requantize(t, target)
                first = compiled.compile_seconds()
                values = res["numpy"].values if res["numpy"].values is not None else t.dequantize()
                buf = np.empty_like(values)
                per = _paired_times({"numpy": _requantize_with(t, target, "numpy"),
                                     "numba": _requantize_with(t, target, "numba"),
                                     "copy": functools.partial(np.copyto, buf, values)}, args.repeat)
                copy = per["copy"][0]
                (nw, nc), (cw, cc) = per["numpy"], per["numba"]
                ns = 1e9 / numel
                print(f"{label:>14} {nw * ns:7.2f} / {nc * ns:5.2f}  {cw * ns:7.2f} / {cc * ns:5.2f}    "
                      f"{nw / cw:5.2f}x / {nc / cc:4.2f}x {copy * ns:7.2f}  {_same(res['numpy'], res['numba'])}")
        if args.cli:
            _cli(src, Path(work), args.repeat)
    print("first call in this process (compile or cache load): "
          + ", ".join(f"{k.rsplit('.', 1)[-1]} {v:.2f} s" for k, v in first.items()))
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")


if __name__ == "__main__":
    main()
