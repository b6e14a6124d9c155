"""Streaming benchmark: wall time, throughput and peak RSS of qckpt commands on a synthetic checkpoint.

Run from a fresh clone (after ``pip install -e .``, or with the checkout on ``PYTHONPATH``)::

    python benchmarks/bench_streaming.py              # 4 Llama-7B-shaped layers (~1 GB), a few minutes
    python benchmarks/bench_streaming.py --size 7b    # Llama-2-7B shapes, GPTQ 4-bit g128 (~3.9 GB)

It builds a synthetic GPTQ checkpoint (``tests/synthetic.py``: 32 layers, hidden 4096, MLP
11008, vocabulary 32000 for ``7b``) in ``--workdir`` and measures, each in a fresh subprocess:

- ``inspect``, ``audit`` (and ``validate`` when the command exists): headers only;
- exact repack GPTQ -> compressed-tensors (``convert --to compressed-tensors``), against copying
  the same bytes (read + write + fsync, plain file I/O);
- requantize group 128 -> per-channel 8-bit (``convert --per-channel --bits 8``) with
  ``--workers 1`` and ``--workers 2``, against reading its input bytes and writing its output
  bytes with plain buffered file I/O (+ fsync);
- GGUF Q4_0 write (``convert --to gguf --group-size 32 --bits 4``).

Peak RSS is sampled over the whole process tree (the command and its workers, summed; every 20 ms
from ``/proc``; pages shared by forked workers count once per process, so this over-states) and
per process from ``VmHWM`` (the kernel's own peak of the largest single process). With ``--rss-check`` the
commands run again on a checkpoint with twice the layers, and the peak RSS ratio is printed.

Then kernels on one MLP matrix (11008 x 4096, ``mlp.up_proj`` of layer 0): dequantize 4-bit
group 128 -> float32 (from the packed GPTQ words) against numpy copying the same output bytes in
memory; requantize float32 -> 4-bit group 128 against the in-memory copy of its input bytes;
GGUF Q4_0 / Q8_0 decode and (bit-exact) encode against the gguf package's numpy
``quants.dequantize`` / ``quants.quantize``; unpacking the compressed-tensors words of the matrix
to int8 codes; and, when compressed-tensors (with torch) is installed, its own unpack /
dequantize / quantize on the same codes, scales and matrix (results checked equal; see
``_ct_rates``), with torch's default threads and with one. Our dequantize / quantize run a
matrix's row ranges on the cores (``converter/kernels/threads.py``; in-process, as torch does);
unpack and the GGUF codecs are single-threaded.

Figures are medians: the repack and requantize commands run ``--repeat`` times (default 3),
each run followed at once by its own baseline, and the ratios are medians of those pairs (this
kind of virtual machine's write speed drifts 2-3x over minutes). The input sits in the page
cache (as right after a download). Results also go to ``<workdir>/results-<size>.json``.
Each paired command prints its CPU time (user + system, workers included) and the load average
beside its wall time: on a shared machine the ratios move with the load, the CPU time much less.

Measured 2026-12-06 (issue 19 round, default install, 2 cores shared by 8 agents), ``--size 7b
--only repack requant --repeat 1 --no-kernels``, load 11-12.5: repack 67.4 s wall / 15.1 s CPU
(x4.68 its copy), requant w1 304.7 s / 80.6 s CPU (x18.9), w2 261.4 s / 84.1 s (x25.7); peak RSS
(process tree) 282 / 208 / 354 MiB, against 285-316 / 205 / 356-363 MiB on 4 layers (flat with 8x
the layers). At that load the ratios say nothing about the code; paired against the code before
the round (6cfd767) at load 4.3-5.2, 7b w1 took 77-157 s wall / 64.8-70.6 s CPU before and
106-111 s / 70.6-71.3 s after; on 4 layers at load 1.9-2.7 (6 pairs) 9.70 s wall / 8.57 s CPU
(x3.04 plain I/O) before and 9.40 s / 8.68 s (x2.89) after, outputs byte-identical: the
requantize kernels (about three quarters of the CPU time) set the pace.

Second round of issue 19 (same day, ``--only repack requant --repeat 3 --no-kernels``, size small, 2 cores shared
with two other sessions' benchmarks; each ratio paired with its own baseline, which drifted 1.9-4.8 s):

=====================  ==============================================  ==============================================
command                before (main e94eea8)                           after (this round)
=====================  ==============================================  ==============================================
fast extra (auto)      load 0.5-2.6                                    load 2.3-3.2
repack gptq->ct        1.90 s wall / 2.76 s CPU, x1.11 copy            1.60 s / 2.27 s CPU, x0.85 copy
requant ch8 w1         6.08 s / 6.51 s CPU, x1.68 plain I/O            5.24 s / 5.31 s CPU, x1.74 (runs 1.27-1.95)
requant ch8 w2         6.36 s / 7.27 s CPU, x2.55                      4.97 s / 6.45 s CPU, x1.22 (runs 1.20-1.38)
peak RSS (tree)        569 MiB (w2; w1 253)                            461 MiB (w2; w1 369, 320 with 3 slabs)
default install        load 4.4                                        load 2.8-3.9
requant ch8 w1         11.05 s / 9.07 s CPU, x3.03                     11.55 s / 8.26 s CPU, x2.78
requant ch8 w2         9.33 s / 8.30 s CPU, x2.96                      10.85 s / 8.36 s CPU, x2.85
=====================  ==============================================  ==============================================

A second pass at load 3.6-4.1 (the other sessions' 7B runs): fast w1 10.06 s / 6.34 s CPU x2.45, w2 9.23 s /
7.44 s CPU x1.83, repack x1.49; default install w1 15.42 s / 9.43 s CPU x3.16, w2 10.53 s / 10.77 s CPU x2.83:
at that load the ratios move with the load, and so does the CPU time (shared caches and memory bus). A third
at load 4.6-5.5 (after the slab pool was cut to 3 and released when a write ends): fast repack x1.10, w1 9.61 s /
5.84 s CPU x1.96 (peak RSS 320 MiB), w2 12.25 s / 7.52 s CPU x2.64 (tree 458 MiB); default install w1 x3.48,
w2 x3.25 (9.2 / 9.0 s CPU). Paired with main in alternating runs at load 3.3-5.3 (3 pairs each, CLI, wall / user
+ system CPU; before the slab pool was cut; fast w1 without the first pair, which compiled kernels): fast w1
10.9-13.0 / 6.7-8.0 s -> 9.6-11.2 / 6.3-6.8 s, w2 12.2-13.6 / 7.8-7.9 s -> 10.2-11.4 / 6.8-7.4 s; default
install w1 13.2-16.7 / 8.3-8.8 s -> 10.8-16.6 / 8.2-8.4 s, w2 8.9-9.5 / 8.4-8.7 s -> 8.6-9.6 / 8.2-8.3 s.

The round's final code (b280eef) in a quiet moment, load 1.0-1.8, fast extra: repack 1.81 s / 2.50 s CPU x0.99
copy (ok), w1 4.45 s / 4.88 s CPU x1.39 plain I/O (ok, <= 1.5x; runs 1.35-1.57), w2 5.28 s / 6.39 s CPU x1.68
(MISS, <= 1.2x; runs 1.33-2.17: two workers still cost 1.5 s more CPU than one and are not faster), peak RSS
tree 459 MiB (w2; w1 358); baselines copy 1.87 s, plain I/O 3.08 s (2.83-3.98). Default install at load
4.0-5.3: w1 9.65 s / 5.99 s CPU x2.13 (ok, <= 2.5x), w2 9.44 s / 6.95 s CPU x2.17 (MISS, <= 1.6x).

Merged on main (754c124, with the validator and GGUF rounds) on the quiet machine, 2026-12-06 08:43-08:45 UTC, load
1.3-1.8, ``--only requant repack --repeat 3 --no-kernels --workdir /work/bench/rq --keep``: fast extra (auto): repack
1.57 s / 2.24 s CPU, x1.02 copy (runs 0.80-1.05; copy baseline 1.50-2.98 s), requant w1 4.16 s / 4.83 s CPU x2.15
(runs 1.08-2.37 against plain I/O baselines of 1.83-3.85 s; x1.72 of the median baseline 2.42 s), w2 3.31 s / 5.12 s
CPU x1.35 (runs 1.00-1.49), peak RSS tree 469 MiB (w2; largest process 357 MiB, w1); default install (numpy): w1
4.74 s / 5.39 s CPU x2.25 (runs 2.23-2.38, ok <= 2.5x), w2 3.68 s / 6.21 s CPU x1.80 (runs 1.18-1.88, MISS <= 1.6x),
baseline 2.08 s (1.97-3.11). Two workers are now faster than one on both paths. The morning's figures for the same
commands (main e94eea8, load 0.5-2.6, fast): requant w1 6.08 s / 6.51 s CPU, w2 6.36 s / 7.27 s CPU, repack 1.90 s.

The issue's own size, ``--size 7b --only requant --no-kernels`` on main (3ab2144), quiet machine (load 0.6-2.1),
2026-12-06 09:20-09:24 UTC: fast extra (auto), 2 runs: w1 33.8 / 29.2 s wall, 41.8 s CPU (the writer and digest
threads included), w2 26.2 / 22.5 s, 37.4 s CPU, peak RSS tree 477 MiB (largest process 387, w1); default install
(numpy), 1 run: w1 36.4 s / 47.2 s CPU, w2 29.5 s / 47.7 s CPU, tree 291 MiB. The plain I/O baseline (read 3.89 GB,
write 7.00 GB, fsync) took 5.5-15.9 s (median 9.4-11.5 s): the 7 GB write-back dominates and swings 3x, so the
ratios (w1 2.3-6.1x, w2 1.5-4.3x) say little; against the median baselines: fast w1 ~3.3x, w2 ~2.6x, default
w1 ~3.2x, w2 ~2.6x: issue 19's 7B targets (2.5x / 1.6x default, 1.5x / 1.2x fast) are not met.

The table's "after" predates the last two changes of the round, measured only in-process (the load stayed at
5-7): byte-table indices through a reused intp buffer (default install, w1 CLI: system CPU 2.8-3.1 -> 2.0-2.1 s,
3 pairs) and the row reader's blocks dequantized into one reused buffer (numpy path with the CLI's fixed mmap
threshold: 4.65-4.85 -> 3.79-4.06 ns per weight, 3 alternating rounds).

What moved: two workers now run beside each other instead of each first copying a 262 MB dense tensor and
then loading numba (~0.4 s each): dense copies from the source's memory map go to the background writer without
making the caller wait and are spread among the compute tasks, and the compiled kernels are loaded once in the
parent before the fork; OpenBLAS no longer starts idle threads that spun in every process; quantize_rows works
in blocks of 2^19 values; the codes are written into reused slabs (no fresh pages zeroed per tensor). What
remains, per weight on the fast path (one thread, in-process, best of 3-5 at load 2-4): about 3.2-3.5 ns = the
source rows (GPTQ words transposed: memory-bound on this VM, ~0.75 ns per byte; a compiled transpose and a
kernel reading the word columns itself were tried, no faster) 0.3-0.6 + decode and extrema 0.9
+ codes and errors 0.5-0.6 + the error sums 1.25-1.5 (two float32 GEMMs on 8 inputs 0.35-0.45 each, chunk
squares 0.4-0.6) + ~0.2 parameters and copies; the numpy path about 3.8-4.1 ns. The command adds per weight
the kernel's copy of 1.33 bytes into the page cache (as the plain I/O baseline does), two CRC passes (write and
read-back digests, ~0.25 ns per byte each) and ~0.5 s of start-up (imports, numba and its cached kernels).
A fixed-order (reproducible in numba) definition of the chunk sums of squares was measured and not adopted:
numpy's pairwise reduce over ``v * v`` costs 0.39-0.46 ns per element against 0.17 for the einsum it would
replace (an 8-lane sequential order, 0.77-2.5 ns), so the numpy path would lose about what the compiled path
would gain (~0.5 ns per weight).

Third round (2026-12-06 10:45-10:58 UTC, main 376391c, quiet machine, load 1.3-2.2), ``--size 7b --only requant
--repeat 3 --no-kernels --floor``: fast extra w1 28.70 s / 36.89 s CPU (runs x3.21, x1.58, x1.56), w2 25.40 s /
38.57 s CPU (x1.92, x1.68, x1.38), tree 476 MiB, floor 3.35 ns per weight = 21.7 s of one core; default install
w1 37.23 s / 47.86 s CPU (x2.09, x1.74, x2.06), w2 24.50 s / 40.33 s CPU (x2.07, x1.44, x1.36), tree 295 MiB, floor
3.79 ns = 24.5 s. The plain I/O baselines of those runs took 9.2-20.2 s (the VM's write-back halved its speed from
one run to the next), so the same commands meet the ratios at slow moments (default w1 x2.06 <= 2.5, w2 x1.44 <= 1.6;
fast w1 x1.56) and miss them at fast ones (fast w1 x3.21 beside a 9.2 s baseline). Beside a 9 s baseline the
kernels alone exceed every requantize target: one worker >= 21.7 s = x2.4 (fast target 1.5), two >= (21.7 s + the
baseline's own 7.4 s of system CPU, which the command pays too) / 2 cores = 14.6 s = x1.6 (target 1.2); default
install x2.7 and x1.8 (targets 2.5 and 1.6). This round: zlib-ng's CRC-32 (w1 28.5-30.3 -> 25.3-26.9 s in
alternating pairs) and 16 x 512 transpose tiles. Tried and not kept: a worker's writes overlapping its next task
(the pass ended by one drain per worker at a barrier): w2 24.6-24.8 -> 21.2-22.4 s, but tree peak PSS 327 -> 498 MiB
and tree RSS 474 -> 640 MiB (over 512): the codes slab of a task still being written stays alive while the next
task fills another.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(ROOT / "benchmarks"))  # its sibling timing.py

from tests.synthetic import SIZES, Shape, build_gptq  # noqa: E402
from timing import median_time  # noqa: E402

MIB = 2**20
CHUNK = 16 * MIB


# --------------------------------------------------------------------------------------------- helpers

def _tree_rss(pid: int, hwm: dict | None = None) -> int:
    """Summed VmRSS (bytes) of ``pid`` and its descendants, from /proc; ``hwm`` collects each
    process's VmHWM (its own peak, kept by the kernel between samples)."""
    total, stack, seen = 0, [pid], set()
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:") and hwm is not None:
                        hwm[p] = max(hwm.get(p, 0), int(line.split()[1]) * 1024)
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    stack.extend(int(c) for c in fh.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            continue
    return total


def run_cmd(args: list[str], *, cwd: Path = ROOT) -> dict:
    """Run ``python -m converter ARGS`` once: wall time, CPU time (user + system of the command and the
    workers it reaped, ``wait4``), the 1-minute load average at its end, peak RSS (tree, sampled;
    largest process)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "converter", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = [0]
    hwm: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid, hwm))
            done.wait(0.02)
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    reader.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"qckpt {' '.join(args)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    # VmHWM, not wait4's ru_maxrss: a forked child's ru_maxrss starts from this (large) process's RSS
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "load": os.getloadavg()[0],
            "peak_rss_tree": peak[0], "peak_rss_max_process": max(hwm.values(), default=0),
            "stdout": b"".join(out_chunks)}


def data_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.suffix in (".safetensors", ".gguf"))


def nbytes(path: Path) -> int:
    return sum(p.stat().st_size for p in data_files(path)) if path.exists() else 0


def copy_baseline(src_files: list[Path], dst: Path, out_bytes: int | None = None) -> float:
    """Read every byte of ``src_files`` and write ``out_bytes`` (default: the same bytes) to ``dst``
    with plain buffered file I/O, then fsync. Returns seconds."""
    t0 = time.perf_counter()
    written = 0
    with open(dst, "wb") as out:
        for f in src_files:
            with open(f, "rb") as fh:
                while True:
                    buf = fh.read(CHUNK)
                    if not buf:
                        break
                    if out_bytes is None or written < out_bytes:
                        take = buf if out_bytes is None else buf[: out_bytes - written]
                        out.write(take)
                        written += len(take)
        if out_bytes is not None:
            pad = bytes(CHUNK)
            while written < out_bytes:
                n = min(CHUNK, out_bytes - written)
                out.write(pad[:n])
                written += n
        out.flush()
        os.fsync(out.fileno())
    dt = time.perf_counter() - t0
    dst.unlink()
    return dt


def gb(n: float) -> str:
    return f"{n / 1e9:.2f}"


def mib(n: float) -> str:
    return f"{n / MIB:.0f}"


# --------------------------------------------------------------------------------------------- commands

def has_validate() -> bool:
    out = subprocess.run([sys.executable, "-m", "converter", "--help"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    return any(line.split()[:1] == ["validate"] for line in out.stdout.splitlines())


def command_table(src: Path, work: Path, repeat: int, only: tuple[str, ...] = ()) -> tuple[list[dict], dict]:
    """Run every command; the ones with a time target ``repeat`` times, each run followed at once
    by its own baseline (copy for the repack, plain I/O for the requantizations): on a virtual
    machine whose write speed drifts by 2-3x over minutes, only ratios measured back to back mean
    anything. Returns rows (medians of the runs and of the paired ratios) and the baselines."""
    src_files = data_files(src)
    in_bytes = nbytes(src)
    rows = []
    cmds = [("inspect", ["inspect", str(src), "--json"], None),
            ("audit", ["audit", str(src), "--json"], None)]
    if has_validate():
        cmds.append(("validate", ["validate", str(src), "--json"], None))
    cmds += [
        ("repack gptq->ct", ["convert", str(src), str(work / "ct"), "--to", "compressed-tensors", "--json",
                             "--overwrite", "--quiet"], work / "ct"),
        ("requant ch8 w1", ["convert", str(src), str(work / "rq1"), "--to", "compressed-tensors", "--per-channel",
                            "--bits", "8", "--json", "--overwrite", "--quiet", "--workers", "1"], work / "rq1"),
        ("requant ch8 w2", ["convert", str(src), str(work / "rq2"), "--to", "compressed-tensors", "--per-channel",
                            "--bits", "8", "--json", "--overwrite", "--quiet", "--workers", "2"], work / "rq2"),
        ("gguf q4_0 write", ["convert", str(src), str(work / "model.gguf"), "--to", "gguf", "--group-size", "32",
                             "--bits", "4", "--json", "--overwrite", "--quiet"], work / "model.gguf"),
    ]
    if only:
        cmds = [c for c in cmds if c[0].startswith(only)]
    copies: list[float] = []
    ios: list[float] = []
    for label, args, out in cmds:
        paired = label.startswith(("repack", "requant"))
        runs, ratios = [], []
        for _ in range(repeat if paired else 1):
            if out is not None:  # every run writes a new output (no --overwrite deletion inside the timing)
                shutil.rmtree(out) if out.is_dir() else out.unlink(missing_ok=True)
            r = run_cmd(args)
            runs.append(r)
            if paired:  # its baseline, right after it
                if label.startswith("repack"):
                    base = copy_baseline(src_files, work / "copy.bin")
                    copies.append(base)
                else:
                    base = copy_baseline(src_files, work / "io.bin", nbytes(out))
                    ios.append(base)
                ratios.append(r["wall_s"] / base)
        out_b = nbytes(out) if out is not None else 0
        row = {"command": label, "args": args, "wall_s": statistics.median(r["wall_s"] for r in runs),
               "runs_s": [r["wall_s"] for r in runs], "cpu_s": statistics.median(r["cpu_s"] for r in runs),
               "loads": [round(r["load"], 1) for r in runs],
               "peak_rss_tree": max(r["peak_rss_tree"] for r in runs),
               "peak_rss_max_process": max(r["peak_rss_max_process"] for r in runs),
               "in_bytes": in_bytes if out is not None else 0, "out_bytes": out_b}
        if ratios:
            row["ratio_to_baseline"] = statistics.median(ratios)
            row["ratios"] = ratios
        if label.startswith("repack"):
            row["all_exact"] = json.loads(runs[-1]["stdout"])["summary"]["all_exact"]
        rows.append(row)
        print(f"  {label:<18s} {row['wall_s']:7.2f} s  CPU {row['cpu_s']:7.2f} s  "
              f"peak RSS {mib(row['peak_rss_tree'])} MiB"
              + (f"  (x{row['ratio_to_baseline']:.2f} its baseline; runs "
                 + ", ".join(f"x{x:.2f}" for x in ratios) + ")" if ratios else "")
              + f"  load {', '.join(map(str, row['loads']))}", flush=True)
    rq_out = next((r["out_bytes"] for r in rows if r["command"] == "requant ch8 w1"), 0)
    for out in ("ct", "rq1", "rq2", "model.gguf"):
        p = work / out
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
    def med(xs: list[float]) -> float:
        return statistics.median(xs) if xs else float("nan")
    return rows, {"copy_s": med(copies), "copy_runs_s": copies, "copy_bytes": in_bytes,
                  "io_requant_s": med(ios), "io_requant_runs_s": ios, "io_requant_out_bytes": rq_out}


# --------------------------------------------------------------------------------------------- floor

def requant_floor(src: Path, repeat: int) -> dict:
    """The requantize kernels' own cost, without any file I/O: ``requantize()`` of layer 0's GPTQ matrices (still
    packed, as the reader gives them) to 8-bit per channel with the error figures, in this process, one thread
    (``--workers 1``: what one worker computes per weight), this run's kernel path; median wall seconds over
    ``repeat`` runs per matrix. Times the checkpoint's quantized weights, it is the least CPU any requantize command
    spends on them, so ``floor_w1_s`` (one worker) and ``floor_w2_s`` (two, both cores busy with no I/O at all)
    bound the plain-I/O ratios from below."""
    from converter import load
    from converter.quant.requant import Target, requantize
    from converter.runtime import run_options

    ckpt = load(src)
    weights = sum(int(np.prod(s.shape)) for s in ckpt.specs() if s.kind == "quantized")
    target = Target(bits=8, granularity="channel")
    names = [n for n in (f"model.layers.0.{m}.weight" for m in ("self_attn.q_proj", "mlp.up_proj", "mlp.down_proj"))
             if n in ckpt]
    total_s, total_w = 0.0, 0
    with run_options(workers=1):
        requantize(ckpt[names[0]], target)  # first-call costs (kernel load) outside the timing
        for name in names:
            ts = [ckpt[name] for _ in range(max(3, repeat))]
            it = iter(ts)
            total_s += median_time(lambda it=it: requantize(next(it), target), len(ts))
            total_w += int(np.prod(ts[0].shape))
    ns = total_s / total_w * 1e9
    return {"matrices": names, "ns_per_weight": ns, "quantized_weights": weights,
            "floor_w1_s": ns * weights / 1e9, "floor_w2_s": ns * weights / 2e9}


def floor_lines(fl: dict, base: dict) -> list[str]:
    io = base["io_requant_s"]
    w1, w2 = fl["floor_w1_s"], fl["floor_w2_s"]
    return ["", f"requantize floor ({kernel_path()[1]}; requantize() in memory, one thread, of "
                f"{', '.join(n.split('.', 3)[3] for n in fl['matrices'])} of layer 0, 8-bit per channel with "
                f"the error figures): {fl['ns_per_weight']:.2f} ns per weight",
            f"  x {fl['quantized_weights'] / 1e9:.2f} G quantized weights = {w1:.1f} s of one core: "
            f"one worker >= x{w1 / io:.2f} the plain I/O baseline ({io:.2f} s), two workers >= x{w2 / io:.2f} "
            "with no I/O cost at all"]


# --------------------------------------------------------------------------------------------- kernels

def kernel_table(src: Path, repeat: int) -> dict:
    """Kernel rates on ``model.layers.0.mlp.up_proj.weight`` (11008 x 4096 for 7B shapes)."""
    import gguf
    from converter import load
    from converter.formats.gguf.blocks import codec_for
    from converter.formats.gguf.schemes import tensor_from_fields
    from converter.groups import GroupMap
    from converter.quant.quantize import quantize
    from converter.scheme import QuantScheme

    ckpt = load(src)
    name = "model.layers.0.mlp.up_proj.weight"
    res: dict = {"matrix": name}

    def packed():
        return ckpt[name]  # fresh: codes still packed in the GPTQ words
    x = packed().dequantize()
    res["shape"] = list(x.shape)
    out_bytes = x.nbytes
    dst = np.empty_like(x)
    res["numpy_copy_gbs"] = out_bytes / median_time(lambda: np.copyto(dst, x), max(3, repeat)) / 1e9
    # filling a new float32 matrix (page faults + one write): what any dequantize to new memory pays
    res["numpy_fresh_fill_gbs"] = out_bytes / median_time(lambda: np.empty_like(x).fill(1), max(3, repeat)) / 1e9
    tensors = [packed() for _ in range(max(3, repeat))]
    it = iter(tensors)
    res["dequant_4b_g128_gbs"] = out_bytes / median_time(lambda: next(it).dequantize(), len(tensors)) / 1e9
    scheme, gm = QuantScheme(4, signed=True), GroupMap.per_group(128)
    res["requant_4b_g128_gbs"] = out_bytes / median_time(lambda: quantize(x, scheme, gm, name=name),
                                                         max(3, repeat)) / 1e9
    for tname in ("Q4_0", "Q8_0"):
        qt = getattr(gguf.GGMLQuantizationType, tname)
        codec = codec_for(tname)
        raw = codec.encode(x)
        exact_enc = bool(np.array_equal(raw, gguf.quants.quantize(x, qt)))
        def decode(raw=raw, codec=codec):  # the product's read path: block fields -> QuantizedTensor -> dequantize
            return tensor_from_fields(name, codec.decode(raw), x.shape).dequantize()
        exact_dec = bool(np.array_equal(decode().view(np.uint32),
                                        gguf.quants.dequantize(raw, qt).view(np.uint32)))
        r = max(3, repeat)
        res[tname] = {
            "bit_exact_encode": exact_enc, "bit_exact_decode": exact_dec,
            "ours_decode_gbs": out_bytes / median_time(decode, r) / 1e9,
            "gguf_decode_gbs": out_bytes / median_time(lambda raw=raw, qt=qt: gguf.quants.dequantize(raw, qt), r)
            / 1e9,
            "ours_encode_gbs": out_bytes / median_time(lambda codec=codec: codec.encode(x), r) / 1e9,
            "gguf_encode_gbs": out_bytes / median_time(lambda qt=qt: gguf.quants.quantize(x, qt), r) / 1e9,
        }
    # compressed-tensors' own layout of the same codes (our writer's weight_packed / weight_scale),
    # and our kernels on it as compressed-tensors' are run on it (see _ct_rates)
    from converter.formats.compressed_tensors.reader import AXES, codes_map
    from converter.formats.compressed_tensors.writer import encode
    from converter.layout import PackedCodes
    from converter.tensor import QuantizedTensor
    ct = encode(packed(), "m", fmt="pack-quantized", version=(0, 20, 1), keep_g_idx=False)
    words, ct_scales = ct["m.weight_packed"], ct["m.weight_scale"]
    sizes = dict(zip(AXES, x.shape))

    def ct_codes():  # as our reader holds them: still packed, fields q + 8
        return PackedCodes(words, codes_map(4, "stream"), AXES, sizes, signed=True, flip=True)
    r = max(3, repeat)
    codes8 = ct_codes().unpack()
    sym = QuantScheme(4, signed=True)
    from_codes = QuantizedTensor(name, AXES, codes8, ct_scales, sym, gm)
    ours = {
        "unpack_gbs": out_bytes / median_time(lambda: ct_codes().unpack(), r) / 1e9,
        "dequant_gbs": out_bytes / median_time(from_codes.dequantize, r) / 1e9,
        "decompress_gbs": out_bytes / median_time(
            lambda: QuantizedTensor(name, AXES, ct_codes(), ct_scales, sym, gm).dequantize(), r) / 1e9,
        "dequant_equal": bool(np.array_equal(from_codes.dequantize().view(np.uint32), x.view(np.uint32))),
    }
    res["ct_layout_ours"] = ours
    try:
        import compressed_tensors  # noqa: F401
    except ImportError:
        res["compressed_tensors"] = None
    else:  # an API that moved is an error here, not "not installed"
        qt = quantize(x, scheme, gm, name=name)
        res["compressed_tensors"] = _ct_rates(x, words, ct_scales, codes8, qt.scales, qt.codes, repeat)
    return res


def _ct_api():
    """compressed-tensors' ``unpack_from_int32``, ``quantize``, ``dequantize``, ``QuantizationArgs``."""
    try:  # >= 0.20: compressors/pack_quantized/helpers.py
        from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    except ImportError:  # older releases: compressors/quantized_compressors/pack_quantized.py
        from compressed_tensors.compressors.quantized_compressors.pack_quantized import unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.lifecycle.forward import dequantize, quantize
    return unpack_from_int32, quantize, dequantize, QuantizationArgs


def _ct_rates(x: np.ndarray, words: np.ndarray, scales: np.ndarray, our_codes: np.ndarray,
              our_q_scales: np.ndarray, our_q_codes: np.ndarray, repeat: int) -> dict:
    """compressed-tensors' own kernels (torch, CPU) on the same matrix, called as its
    ``PackedQuantizationCompressor`` calls them for a symmetric 4-bit group-128 weight:

    - unpack: ``unpack_from_int32(weight_packed, 4, shape)`` -> int8 codes (vs our unpack of the
      same words, as our reader does it);
    - dequantize: ``dequantize(codes, scale, None, args)`` (``decompress``: no zero point when
      symmetric). With the fp16 scales as stored its result is float16 (computed in float16); the
      same-work comparison passes the scales widened to float32 (exact), which gives float32 values
      bit-identical to ours (``q * s`` in float32);
    - quantize: ``quantize(x, scale, None, args, dtype=torch.int8)`` (``compress``) with the scales
      our quantize chose; ours also chooses them (absmax per group), so it does more work;
    - decompress (for information): unpack + dequantize, against ours dequantizing the tensor as
      our reader holds it (codes still in ``weight_packed``).

    Ours (``kernel_table``) run on the same inputs: our unpack of the same words; our dequantize
    of the same int8 codes and fp16 scales (float32 out); our quantize of the same matrix.
    Rates are bytes of the float32 matrix per second (4 bytes per weight for every row), medians;
    with torch's default threads and again with one thread. Equality of results is checked.
    """
    import torch
    unpack_from_int32, quantize, dequantize, QuantizationArgs = _ct_api()
    args = QuantizationArgs(num_bits=4, type="int", symmetric=True, strategy="group", group_size=128)
    w = torch.from_numpy(np.array(words.view(np.int32)))  # writable copy
    shape = torch.Size(x.shape)
    s16 = torch.from_numpy(np.ascontiguousarray(scales))
    s32 = s16.to(torch.float32)
    xt = torch.from_numpy(x)
    qs16 = torch.from_numpy(np.ascontiguousarray(our_q_scales))
    q = unpack_from_int32(w, 4, shape)
    ours_x = x  # the benchmark matrix is our dequantize of these codes
    d32 = dequantize(q, s32, None, args=args)
    d16 = dequantize(q, s16, None, args=args)
    qc = quantize(xt, qs16, None, args=args, dtype=torch.int8)
    diff16 = np.abs(d16.to(torch.float32).numpy() - ours_x)
    res = {
        "version": __import__("compressed_tensors").__version__, "torch": torch.__version__,
        "unpack_codes_equal": bool(np.array_equal(q.numpy(), our_codes)),
        "dequant_f32_bit_identical": bool(np.array_equal(d32.numpy().view(np.uint32), ours_x.view(np.uint32))),
        "dequant_fp16_out_dtype": str(d16.dtype),
        "dequant_fp16_max_abs_diff": float(diff16.max()),
        "dequant_fp16_max_rel_diff": float((diff16 / np.maximum(np.abs(ours_x), np.finfo(np.float32).tiny)).max()),
        "quant_codes_equal": bool(np.array_equal(qc.numpy(), our_q_codes)),
    }
    r = max(3, repeat)
    n = x.nbytes
    default_threads = torch.get_num_threads()
    for threads in dict.fromkeys((default_threads, 1)):
        torch.set_num_threads(threads)
        res[f"threads_{threads}"] = {
            "unpack_gbs": n / median_time(lambda: unpack_from_int32(w, 4, shape), r) / 1e9,
            "dequant_gbs": n / median_time(lambda: dequantize(q, s32, None, args=args), r) / 1e9,
            "dequant_fp16_gbs": n / median_time(lambda: dequantize(q, s16, None, args=args), r) / 1e9,
            "quant_gbs": n / median_time(lambda: quantize(xt, qs16, None, args=args, dtype=torch.int8), r) / 1e9,
            "decompress_gbs": n / median_time(
                lambda: dequantize(unpack_from_int32(w, 4, shape), s32, None, args=args), r) / 1e9,
        }
    torch.set_num_threads(default_threads)
    res["default_threads"] = default_threads
    return res


# --------------------------------------------------------------------------------------------- report

#: (command, what, target ratio, the figure before issue 19's round) for the default install.
#: (command, figure, target of the default install, target with the fast extra, the issue's figure before it, 7b)
TARGETS = [("repack gptq->ct", "repack / copy", 1.0, 1.0, "0.53x"),
           ("requant ch8 w1", "requant w1 / plain I/O (full report)", 2.5, 1.5, "3.36x"),
           ("requant ch8 w2", "requant w2 / plain I/O (full report)", 1.6, 1.2, "not measured")]


def kernel_path() -> tuple[bool, str]:
    """Whether the commands ran the compiled kernels (the ``fast`` extra installed, ``QCKPT_KERNELS`` not
    ``numpy``: the requantize tensors are all above the size cut-over), and how to say so."""
    from converter.kernels import compiled
    m = compiled.mode()
    fast = m != "numpy" and compiled.available()
    return fast, (f"with the fast extra (numba, QCKPT_KERNELS={m})" if fast else f"default install (QCKPT_KERNELS={m})")


def check(ok: bool) -> str:
    return "ok  " if ok else "MISS"


def report(size: str, shape: Shape, in_bytes: int, rows: list[dict], base: dict, k: dict,
           rss2: dict | None) -> list[str]:
    lines = [f"qckpt streaming benchmark: --size {size} ({shape.layers} layers, hidden {shape.hidden}, "
             f"MLP {shape.mlp}, "
             f"vocab {shape.vocab}; GPTQ {shape.bits}-bit g{shape.group}, {gb(in_bytes)} GB), "
             f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, numpy {np.__version__}",
             "",
             f"{'command':<18s} {'wall s':>8s} {'CPU s':>7s} {'GB/s':>6s} {'in GB':>6s} {'out GB':>7s} "
             f"{'peak RSS MiB (tree / largest)':>30s}  load (1 min, each run)"]
    for r in rows:
        moved = r["in_bytes"] + r["out_bytes"]
        rate = f"{moved / r['wall_s'] / 1e9:6.2f}" if moved else "     -"
        lines.append(f"{r['command']:<18s} {r['wall_s']:8.2f} {r['cpu_s']:7.2f} {rate} {gb(r['in_bytes']):>6s} "
                     f"{gb(r['out_bytes']):>7s} {mib(r['peak_rss_tree']):>22s} / {mib(r['peak_rss_max_process']):<5s}  "
                     + ", ".join(map(str, r["loads"])))
    lines.append("(GB/s: bytes read + bytes written per second of wall time; CPU: user + system of the command"
                 " and its workers)")
    lines.append("")
    lines.append(f"baseline copy (read + write + fsync of the {gb(base['copy_bytes'])} GB input): "
                 f"median {base['copy_s']:.2f} s "
                 f"({2 * base['copy_bytes'] / base['copy_s'] / 1e9:.2f} GB/s)")
    lines.append(f"baseline requant I/O (read input, write {gb(base['io_requant_out_bytes'])} GB, fsync): "
                 f"median {base['io_requant_s']:.2f} s")
    lines.append("  (runs: copy " + ", ".join(f"{x:.2f}" for x in base["copy_runs_s"]) + " s; I/O "
                 + ", ".join(f"{x:.2f}" for x in base["io_requant_runs_s"]) + " s)")
    by = {r["command"]: r for r in rows}
    fast, path = kernel_path()
    lines += ["", f"targets, {path} (qckpt issue 19; ratio = median over the runs of each run's wall time"
              " over its own baseline, measured right after it; 'was': the issue's figure before this round, 7b):"]
    for label, what, default_target, fast_target, was in TARGETS:
        target = fast_target if fast else default_target
        r = by.get(label)
        if r is None or "ratio_to_baseline" not in r:
            continue
        x = r["ratio_to_baseline"]
        lines.append(f"  {what:<36s} {x:6.2f}x   <= {target:.1f}x  {check(x <= target)}  (was {was})"
                     + (f"  (all exact: {r.get('all_exact')})" if label.startswith("repack") else ""))
    if k is None:
        lines += _rss_lines(rows, by, rss2)
        return lines
    dq = k["dequant_4b_g128_gbs"] / k["numpy_copy_gbs"]
    rq = k["requant_4b_g128_gbs"] / k["numpy_copy_gbs"]
    lines += [f"  dequant 4b g128 -> f32 / numpy copy   {dq:6.2f}x   >= 0.25x  {check(dq >= 0.25)}"
              f"  ({k['dequant_4b_g128_gbs']:.2f} vs {k['numpy_copy_gbs']:.2f} GB/s of float32)",
              f"  requant f32 -> 4b g128 / numpy copy   {rq:6.2f}x   >= 0.20x  {check(rq >= 0.20)}"
              f"  ({k['requant_4b_g128_gbs']:.2f} GB/s of float32 in)"]
    for t in ("Q4_0", "Q8_0"):
        g = k[t]
        d = g["ours_decode_gbs"] / g["gguf_decode_gbs"]
        e = g["ours_encode_gbs"] / g["gguf_encode_gbs"]
        lines += [f"  GGUF {t} decode ours / gguf           {d:6.2f}x   >= 1.5x   {check(d >= 1.5)}"
                  f"  ({g['ours_decode_gbs']:.2f} vs {g['gguf_decode_gbs']:.2f} GB/s, "
                  f"bit-exact {g['bit_exact_decode']})",
                  f"  GGUF {t} encode ours / gguf           {e:6.2f}x   >= 1.0x   {check(e >= 1.0)}"
                  f"  ({g['ours_encode_gbs']:.2f} vs {g['gguf_encode_gbs']:.2f} GB/s, "
                  f"bit-exact {g['bit_exact_encode']})"]
    c = k.get("compressed_tensors")
    if c:
        o = k["ct_layout_ours"]
        lines.append(f"  compressed-tensors {c['version']} (torch {c['torch']}) on the same inputs ({k['matrix']}, "
                     f"{' x '.join(map(str, k['shape']))}), GB/s of the float32 matrix, ours / theirs:")
        lines.append(f"    (numpy filling a new float32 matrix of that shape, no arithmetic: "
                     f"{k['numpy_fresh_fill_gbs']:.2f} GB/s; torch threads by default: {c['default_threads']})")
        ours = {"unpack": o["unpack_gbs"], "dequant": o["dequant_gbs"], "quant": k["requant_4b_g128_gbs"]}
        same = {"unpack": f"int8 codes equal: {c['unpack_codes_equal']}",
                "dequant": f"f32 out, bit-identical: {c['dequant_f32_bit_identical'] and o['dequant_equal']}",
                "quant": f"int8 codes equal: {c['quant_codes_equal']}"}
        for threads in sorted({c["default_threads"], 1}, reverse=True):
            tr = c[f"threads_{threads}"]
            tl = f"torch {threads} thread{'s' if threads > 1 else ''}"
            for what in ("unpack", "dequant", "quant"):
                ratio = ours[what] / tr[f"{what}_gbs"]
                lines.append(f"    {what:<7s} ({tl:<15s}) {ratio:6.2f}x   >= 3.0x   {check(ratio >= 3.0)}  "
                             f"({ours[what]:.2f} vs {tr[f'{what}_gbs']:.2f}; {same[what]})")
            ratio = o["decompress_gbs"] / tr["decompress_gbs"]
            lines.append(f"    unpack+dequant from the packed words   {ratio:6.2f}x             "
                         f"({o['decompress_gbs']:.2f} vs {tr['decompress_gbs']:.2f})")
            ratio = ours["dequant"] / tr["dequant_fp16_gbs"]
            lines.append(f"    dequant vs its default fp16 output     {ratio:6.2f}x             "
                         f"({ours['dequant']:.2f} vs "
                         f"{tr['dequant_fp16_gbs']:.2f}; max |diff| {c['dequant_fp16_max_abs_diff']:.2g}, "
                         f"rel {c['dequant_fp16_max_rel_diff']:.2g}: fp16 rounding)")
    else:
        lines.append("  compressed-tensors: not installed (pip install compressed-tensors to compare its kernels)")
    lines += _rss_lines(rows, by, rss2)
    return lines


def _rss_lines(rows: list[dict], by: dict, rss2: dict | None) -> list[str]:
    peak = max(r["peak_rss_tree"] for r in rows)
    lines = [f"  peak RSS, any command (process tree)  {mib(peak):>5s} MiB  <= 512 MiB {check(peak <= 512 * MIB)}"]
    if rss2 is not None:
        worst = max(rss2[c] / max(by[c]["peak_rss_tree"], 1) for c in rss2)
        lines.append(f"  peak RSS with 2x layers / 1x (worst)  {worst:6.2f}x   <= 1.10x  {check(worst <= 1.10)}  "
                     + ", ".join(f"{c}: {mib(by[c]['peak_rss_tree'])} -> {mib(v)} MiB" for c, v in rss2.items()))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default="small",
                    help="checkpoint shape: small (default, 4 layers), 7b (3.9 GB), tiny (CI smoke)")
    ap.add_argument("--workdir", type=Path, default=None, help="where checkpoints and outputs go (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs of each command with a time target, each paired with its baseline (medians; "
                         "default 3); kernels use max(3, N)")
    ap.add_argument("--rss-check", action="store_true", help="also run on twice the layers and compare peak RSS")
    ap.add_argument("--keep", action="store_true", help="keep the synthetic checkpoints")
    ap.add_argument("--only", nargs="*", default=[],
                    help="run only the commands whose label starts with one of these (e.g. repack requant)")
    ap.add_argument("--no-kernels", action="store_true", help="skip the kernel table")
    ap.add_argument("--floor", action="store_true",
                    help="also time the requantize kernels alone (requant_floor): the least any requantize run costs")
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="qckpt-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    shape = SIZES[a.size]
    src = work / f"gptq-{a.size}"
    made = []
    try:
        if not (src / "model.safetensors").exists():
            print(f"building {src} ...", flush=True)
            build_gptq(src, shape)
            made.append(src)
        in_bytes = nbytes(src)
        print(f"commands on {src} ({gb(in_bytes)} GB):", flush=True)
        rows, base = command_table(src, work, a.repeat, tuple(a.only))
        rss2 = None
        if a.rss_check:
            from dataclasses import replace
            src2 = work / f"gptq-{a.size}-2x"
            if not (src2 / "model.safetensors").exists():
                print(f"building {src2} ...", flush=True)
                build_gptq(src2, replace(shape, layers=2 * shape.layers))
                made.append(src2)
            print(f"commands on {src2} ({gb(nbytes(src2))} GB):", flush=True)
            rows2, _ = command_table(src2, work, 1, tuple(a.only))
            rss2 = {r["command"]: r["peak_rss_tree"] for r in rows2}
        k = None
        if not a.no_kernels:
            print("kernels ...", flush=True)
            k = kernel_table(src, a.repeat)
        lines = report(a.size, shape, in_bytes, rows, base, k, rss2)
        fl = None
        if a.floor:
            print("requantize floor ...", flush=True)
            fl = requant_floor(src, a.repeat)
            lines += floor_lines(fl, base)
        print()
        print("\n".join(lines))
        doc = {"size": a.size, "in_bytes": in_bytes, "commands": rows, "baselines": base, "kernels": k,
               "rss_2x": rss2, "requant_floor": fl}
        for r in doc["commands"]:
            r.pop("stdout", None)
        (work / f"results-{a.size}.json").write_text(json.dumps(doc, indent=2) + "\n")
        print(f"\n(results: {work / f'results-{a.size}.json'})")
    finally:
        if not a.keep:
            for p in made:
                shutil.rmtree(p, ignore_errors=True)
            if a.workdir is None:
                shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
