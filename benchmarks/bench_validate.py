"""``qckpt validate`` benchmark (qckpt issue 18 item 15): wall time with 1 and 2 worker processes on a synthetic
7B-shaped GPTQ checkpoint, the reports compared, and the working memory of checking one tensor (the constant
``converter.validate.run.BYTES_PER_ELEMENT`` that caps the workers under ``--max-memory``).

Run from a checkout::

    python benchmarks/bench_validate.py                  # "small": 4 Llama-2-7B layers, 28 GPTQ tensors, ~0.9 GB
    python benchmarks/bench_validate.py --size 7b        # all 32 layers (~3.9 GB)

The checkpoint is written by ``tests/synthetic.py`` (4-bit, group 128, v1 zero points) into ``--workdir``. Each
run is a fresh ``python -m converter validate SRC --json --quiet --workers N --max-memory 4G`` subprocess; the
two JSON reports are checked identical before any figure is printed. The peak RSS is GNU time's ``%M``
(the largest resident set of the process and of each worker it waited for; not their sum). The working memory of one
tensor is the peak RSS of ``--workers 1`` on a checkpoint holding one 11008 x 4096 ``mlp.up_proj`` (and norms)
minus that of the ``tiny`` shape, over the tensor's 45.1 M elements (``--calibrate``, with and without a float16
reference).

Measured 2026-12-06 on the 2-core dev VM, shared with 7 other jobs (the speed-up depends on the load; a
first run at load average 9.3 gave 51.8 s / 47.3 s, 1.09x)::

    small: 28 quantized tensors, 0.95 GB; reports identical: True (load average 7.7)
      --workers 1:   65.92 s   peak RSS (largest process)     318 MiB
      --workers 2:   46.45 s   peak RSS (largest process)     303 MiB
      1 / 2 workers: 1.42x

    --calibrate (one 11008 x 4096 tensor, /usr/bin/time %M, --workers 1): 315 MiB vs 64 MiB (tiny), 5.8 bytes per
    element; with a float16 reference 3887 MiB vs 121 MiB, 87.6 bytes per element

Issue 19 (numpy and compiled kernels, each run beside a plain read), ``--size 7b``, 2026-12-06 04:43-04:57 UTC,
load average 5.3 at the end (8 jobs on 2 cores: two workers got no second core)::

    7b: 224 quantized tensors, 3.89 GB; reports identical across kernels and workers: True
      plain read of the same bytes (median of 5): 1.48 s (2.62 GB/s)
      numpy  --workers 1:   94.30 s     63.6x plain read   peak RSS (largest process)     172 MiB
      numpy  --workers 2:  103.69 s     69.9x plain read   peak RSS (largest process)     126 MiB
      numba  --workers 1:   58.91 s     39.7x plain read   peak RSS (largest process)     293 MiB
      numba  --workers 2:   56.29 s     37.9x plain read   peak RSS (largest process)     227 MiB

The same code in-process (``validate()``, one worker, ``small``, load average 3.8, wall / CPU seconds): before
this round (commit 6cfd767) 11.9 / 11.1, numpy kernels 5.4 / 5.2, compiled 3.7 / 3.6; a plain read 0.8 s.
The numba import and cached-kernel load cost about 0.5-1 s per process (numba adds ~140 MiB of RSS).

Issue 19's validate row, one pass over the words (``validate/word_scan.py``): two pairs of runs of this script on
the same 7B checkpoint (``--size 7b --source /work/bench/gptq-7b``), 2026-12-06 07:46-07:51 and 07:58-08:04 UTC,
2 cores shared with two other helpers' benchmarks (load average 2.7-4.3: the second worker mostly found no free
core); before = commit e94eea8, after = this branch (the second pair with its last kernel change); wall / CPU
seconds (CPU: the validate process and its workers), x the plain read of the same run (which itself swings
0.6-1.5 s with the load: compare the seconds)::

                          before (e94eea8)                      after
      pair 1: plain read  0.61 s (6.37 GB/s)                    0.80 s (4.89 GB/s)
      numpy --workers 1   69.51 / 66.93 s  113.8x  172 MiB      21.22 / 20.03 s  26.7x  136 MiB
      numpy --workers 2   51.53 / 63.42 s   84.4x  126 MiB      22.69 / 21.73 s  28.5x  108 MiB
      numba --workers 1   28.31 / 28.40 s   46.3x  280 MiB      11.86 /  9.07 s  14.9x  241 MiB
      numba --workers 2   31.15 / 33.24 s   51.0x  214 MiB      12.24 /  9.15 s  15.4x  217 MiB
      pair 2: plain read  0.65 s (5.96 GB/s)                    1.15 s (3.40 GB/s)
      numpy --workers 1   69.49 / 65.73 s  106.4x  172 MiB      24.46 / 21.29 s  21.3x  137 MiB
      numpy --workers 2   77.56 / 72.29 s  118.8x  126 MiB      32.67 / 24.13 s  28.5x  108 MiB
      numba --workers 1   32.35 / 32.71 s   49.5x  280 MiB      15.57 / 10.27 s  13.6x  241 MiB
      numba --workers 2   34.62 / 33.14 s   53.0x  214 MiB      15.49 / 11.53 s  13.5x  217 MiB
      reports identical across kernels and workers (and before / after): True

Where the time went before (cProfile of the CLI, ``--workers 1``; 7b = 6.48 G weights): the numpy checks each
scanned the unpacked codes (unpack + transpose 0.6 ns per weight, saturation mask 1.7, reductions (group any, sums)
1.3, offset sums 0.75, float32 rows + float64 squares of the nibble profile 2.4) and a third of the CPU was the
kernel page-faulting temporaries (the CLI's fixed 4 MiB mmap threshold also froze glibc's trim threshold at 128 KiB:
31 s of system time at --workers 2); the compiled checks made four passes (group saturation 1.7-2.0 ns/weight,
column squares 1.2-1.6, byte histogram 0.6, unpack + transpose 1.2); and the parent's sibling nibble-order check ran
its 224 small products on OpenBLAS's default threads: 13 s of a 27 s compiled run.

Where it goes now (CPU seconds of the first pair; per step from one 4096 x 11008 tensor timed alone, since cProfile
times C calls by the wall clock, inflated at this load): compiled, 9.1 s = the word scan 0.8-0.9 ns/weight (5.5 s:
per field a shift, mask, float32 dequantize, float64 square and add, offset sums and two range compares, on 16
lanes; its float64 squares and additions must follow column_profile's row order, so they vectorize across words
only), mapping the words (MAP_POPULATE, 1.0-1.4 s, the same order as the plain read's copy), process start-up with
the numba import and cached kernels (1.2 s), the parent's nibble-order products (0.4 s on one thread) and the
per-tensor Python (headers, scales, zero-convention hook: ~1 s). numpy, 20 s = 2.2-2.5 ns/weight in the block scan
(unpack + word transposes 0.5-0.75, float32 dequantize 0.35, float64 squares + column sums 0.5, offset sums 0.5,
range compares + group any 0.3) plus the same fixed costs. Issue 19's targets (3x / 1.5x a plain read, i.e. 2-4 s)
are not met: with the plain read at 0.6-1.5 s, 1.5x leaves 1-2 s for 6.48 G weights, less than the start-up and page
mapping alone, and 0.3 ns/weight of scan on 2 free cores.

On the quiet machine (no other job, load 1.2-1.9), 2026-12-06 08:45 UTC, main 754c124: this script
(``--size 7b --source``): plain read 0.66 s; numpy --workers 1 21.38 s (32.4x), --workers 2 11.14 s / 20.2 s CPU
(16.9x); numba --workers 1 9.12 s (13.8x), --workers 2 5.39 s / 8.9 s CPU (8.2x); reports identical. The CLI
alone, ``validate --json --quiet --workers 2 --max-memory 4G``, before (e94eea8) -> after, back to back (wall /
user + system CPU): numba 17.46 s / 31.5 s -> 5.99 s / 9.5 s; numpy 32.53 s / 63.5 s (28 s of it system time)
-> 11.31 s / 20.5 s; the JSON reports byte-identical.

With the default budget (no ``--max-memory``: 320M) ``validate --workers 2`` ran one worker on this checkpoint: its
11008 x 4096 tensors were budgeted at 8 bytes per weight (the per-check scans' working set, 360 MB) although the
word scan reads them with about 1 (``converter.validate.run.WORD_SCAN_BYTES_PER_ELEMENT``). Budgeted at 2 since
(2026-12-06 10:58 UTC, quiet, two runs each, CLI ``validate --workers 2 --quiet --json``): numba 9.5 s -> 6.3-7.4 s
wall (10.0-10.8 s CPU), numpy ~20 s -> 11.3-12.8 s (20.8-23.0 s CPU); a plain read 0.66-1.08 s; reports identical.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.synthetic import SIZES, Shape, build_gptq  # noqa: E402


def _children_cpu() -> float:
    """CPU seconds (user + system) of the waited-for child processes so far (the validate process and its workers)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _validate(path: Path, workers: int, memory: str = "4G", reference: str | None = None,
              kernels: str = "auto") -> tuple[float, int, str, float]:
    """(wall seconds, peak RSS bytes, JSON report, CPU seconds) of one fresh validate process
    (``QCKPT_KERNELS=kernels``)."""
    rss_file = tempfile.NamedTemporaryFile(suffix=".rss", delete=False)  # (beside nothing of the source's)
    rss_file.close()
    cmd = ["/usr/bin/time", "-f", "%M", "-o", rss_file.name, sys.executable, "-m", "converter", "validate",
           str(path), "--json", "--quiet", "--workers", str(workers), "--max-memory", memory,
           *(["--reference", reference] if reference else [])]
    t0, c0 = time.perf_counter(), _children_cpu()
    with tempfile.TemporaryFile() as out:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "QCKPT_KERNELS": kernels}
        code = subprocess.run(cmd, stdout=out, env=env).returncode
        wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
        out.seek(0)
        text = out.read().decode()
    if code not in (0, 1):
        raise SystemExit(f"validate failed: {text[:500]}")
    rss = int(Path(rss_file.name).read_text().split()[-1]) * 1024
    os.unlink(rss_file.name)
    return wall, rss, text, cpu


def plain_read(path: Path) -> float:
    """Seconds to read every byte of the checkpoint's files once (buffered, 16 MiB at a time, page cache warm):
    the baseline of issue 19's validate target."""
    buf = bytearray(16 << 20)
    view = memoryview(buf)
    t0 = time.perf_counter()
    for f in sorted(path.iterdir()):
        if f.is_file():
            with open(f, "rb", buffering=0) as fh:
                while fh.readinto(view):
                    pass
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small", choices=sorted(SIZES))
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--source", default=None,
                    help="validate this existing checkpoint directory instead of building one (--size is then only a "
                         "label), e.g. one tests/synthetic.py wrote")
    ap.add_argument("--kernels", default="numpy,numba",
                    help="kernel paths to time (QCKPT_KERNELS values, comma-separated; default numpy,numba: the "
                         "default install and the fast extra, in one run)")
    ap.add_argument("--calibrate", action="store_true",
                    help="also measure the working memory of one tensor (BYTES_PER_ELEMENT; ~4 GB peak with a "
                         "reference)")
    args = ap.parse_args()
    from converter.kernels.compiled import available
    kernels = [k for k in args.kernels.split(",") if k != "numba" or available()]
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        if args.source:  # an existing checkpoint (read only), e.g. one build_gptq wrote before
            src = Path(args.source)
            nbytes = sum(f.stat().st_size for f in src.iterdir() if f.is_file())
        else:
            src = Path(tmp) / "ckpt"
            nbytes = build_gptq(src, SIZES[args.size])
        plain_read(src)  # into the page cache
        runs: dict[tuple[str, int], tuple[float, int, str, float]] = {}
        reads = []
        for k in kernels:
            for n in (1, 2):
                reads.append(plain_read(src))  # a baseline beside every run (the load drifts)
                runs[k, n] = _validate(src, n, kernels=k)
                print(f"  ({k} --workers {n}: {runs[k, n][0]:.2f} s wall, {runs[k, n][3]:.2f} s CPU, load average "
                      f"{os.getloadavg()[0]:.1f})", flush=True)
        reads.append(plain_read(src))
        docs = {key: json.loads(r[2]) for key, r in runs.items()}
        first = next(iter(docs.values()))
        same = all(d == first for d in docs.values())
        read = statistics.median(reads)
        print(f"{args.source or args.size}: {first['summary']['tensors_checked']} quantized tensors, "
              f"{nbytes / 1e9:.2f} GB; reports identical across kernels and workers: {same} (load average "
              f"{os.getloadavg()[0]:.1f})")
        print(f"  plain read of the same bytes (median of {len(reads)}): {read:.2f} s "
              f"({nbytes / read / 1e9:.2f} GB/s)")
        for (k, n), (wall, rss, _, cpu) in runs.items():
            print(f"  {k:<6s} --workers {n}: {wall:7.2f} s wall {cpu:7.2f} s CPU  {wall / read:6.1f}x plain read   "
                  f"peak RSS (largest process) {rss / 2**20:7.0f} MiB")
        for k in kernels:
            print(f"  {k}: 1 / 2 workers {runs[k, 1][0] / runs[k, 2][0]:.2f}x")
        if "numpy" in kernels and "numba" in kernels:
            for n in (1, 2):
                print(f"  --workers {n}: numpy / numba {runs['numpy', n][0] / runs['numba', n][0]:.2f}x")
        if not same:
            raise SystemExit("the reports differ")
        if args.calibrate:
            _calibrate(Path(tmp))


def _calibrate(tmp: Path) -> None:
    """Working memory of checking one tensor: a one-layer checkpoint (largest tensor 11008 x 4096) vs the tiny
    shape, peak RSS difference per element of that tensor, without and with a float16 reference (written by
    ``qckpt dequantize``)."""
    big, tiny = tmp / "one_layer", tmp / "tiny"
    build_gptq(big, Shape(1, 4096, 11008, 8))
    build_gptq(tiny, SIZES["tiny"])
    elements = 11008 * 4096
    for p in (big, tiny):
        subprocess.run([sys.executable, "-m", "converter", "dequantize", str(p), f"{p}_ref.safetensors", "--dtype",
                        "f16", "--quiet"], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                       stdout=subprocess.DEVNULL)
    for ref in (False, True):
        rss = [_validate(p, 1, reference=f"{p}_ref.safetensors" if ref else None)[1] for p in (big, tiny)]
        print(f"  one 11008 x 4096 tensor{' with a reference' if ref else ''}: peak RSS {rss[0] / 2**20:.0f} MiB vs "
              f"{rss[1] / 2**20:.0f} MiB (tiny): {(rss[0] - rss[1]) / elements:.1f} bytes per element")


if __name__ == "__main__":
    main()
