"""``qckpt convert --engine ray|dask`` beside the local pool: start-up, per-task overhead, wall time and peak
memory per node, on a synthetic GPTQ checkpoint converted to compressed-tensors in several output shards.

    python benchmarks/bench_distributed.py [--layers 2] [--hidden 1024] [--shard-size 8MB] [--workers 2]
                                           [--engines ray,dask] [--noop-tasks 50]

Each conversion runs as its own ``python -m converter`` process (:mod:`peak_rss`); with an engine, qckpt
starts a local cluster of ``--workers`` slots on 127.0.0.1 and shuts it down, so the wall time includes the
cluster's start-up (reported apart from the engine section: ``startup_seconds``). The outputs must be
byte-identical to the local pool's (SHA-256 over the shards), else the script fails. Per-task overhead:
``--noop-tasks`` tasks that return at once, through qckpt's executor interface, on a cluster started in
this process (after one warm-up round). Peak memory: the coordinator process (``wait4``; a local cluster's
processes are its descendants, which ``ru_maxrss`` does not add up) and, per node, the largest worker
process peak its tasks saw (the report's ``engine.per_node``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from peak_rss import digest_safetensors, qckpt_process  # noqa: E402


def _noop(_: object) -> None:
    return None


def task_overhead(engine: str, workers: int, n: int) -> tuple[float, float]:
    """(start-up seconds, seconds per no-op task) on a local cluster started in this process."""
    from converter.distributed.executor import open_executor
    t0 = time.perf_counter()
    ex = open_executor(engine, None, workers=workers)
    startup = time.perf_counter() - t0
    try:
        list(ex.map(_noop, list(range(workers)), retries=0))  # warm-up: workers imported, functions shipped
        t0 = time.perf_counter()
        list(ex.map(_noop, list(range(n)), retries=0))
        per_task = (time.perf_counter() - t0) / n
    finally:
        ex.close()
    return startup, per_task


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--shard-size", default="8MB")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--engines", default="ray,dask")
    ap.add_argument("--noop-tasks", type=int, default=50)
    args = ap.parse_args()
    from tests.synthetic import Shape, build_gptq

    engines = [e for e in args.engines.split(",") if e]
    with tempfile.TemporaryDirectory(prefix="qckpt-bench-dist-") as tmp:
        src = Path(tmp) / "gptq"
        shape = Shape(layers=args.layers, hidden=args.hidden, mlp=args.hidden * 11 // 4, vocab=8000, group=128)
        data = build_gptq(src, shape, seed=1)
        print(f"source: synthetic GPTQ 4-bit g128, {args.layers} layers x hidden {args.hidden}, "
              f"{data / 1e6:.1f} MB; --to compressed-tensors --max-shard-size {args.shard_size}, "
              f"--workers {args.workers}")
        base = ["convert", src, None, "--to", "compressed-tensors", "--max-shard-size", args.shard_size,
                "--workers", str(args.workers), "--quiet", "--json"]
        rows = []
        ref = Path(tmp) / "local"
        secs, rss, _ = qckpt_process(ROOT, *[a if a is not None else ref for a in base])
        ref_digest = digest_safetensors(ref)
        n_shards = len(list(ref.glob("model-*.safetensors"))) or 1
        rows.append(("local pool", secs, None, None, rss, None, None))
        for engine in engines:
            dst = Path(tmp) / engine
            secs, rss, out = qckpt_process(ROOT, *[a if a is not None else dst for a in base], "--engine", engine)
            if digest_safetensors(dst) != ref_digest:
                raise SystemExit(f"--engine {engine}: output differs from the local pool's")
            eng = json.loads(out)["engine"]
            startup, per_task = task_overhead(engine, args.workers, args.noop_tasks)
            node_peaks = ", ".join(f"{r['peak_rss_bytes'] / 2**20:.0f}" for r in eng["per_node"])
            rows.append((engine, secs, eng["startup_seconds"], per_task, rss, node_peaks,
                         eng["seconds"]["total"] - eng["startup_seconds"]))
            print(f"  {engine}: {eng['tasks']} write + {eng['proof_tasks']} proof + {eng['rows_tasks']} rows tasks "
                  f"on {eng['nodes']} node(s), retries {eng['retries']}, phases "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in eng["seconds"].items())
                  + f"; in-process cluster start-up {startup:.1f} s")
        print(f"\noutput: {n_shards} shards, identical to the local pool's for every engine (SHA-256)")
        print(f"{'engine':<11} {'wall s':>7} {'x local':>8} {'start-up s':>11} {'job s':>7} {'ms/task':>8} "
              f"{'coord. MiB':>11}  node peaks MiB")
        local = rows[0][1]
        for name, secs, startup, per_task, rss, peaks, job in rows:
            print(f"{name:<11} {secs:7.2f} {secs / local:8.2f} "
                  f"{'-' if startup is None else f'{startup:.2f}':>11} {'-' if job is None else f'{job:.2f}':>7} "
                  f"{'-' if per_task is None else f'{per_task * 1e3:.1f}':>8} {rss / 2**20:11.0f}  {peaks or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
