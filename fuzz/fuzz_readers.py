"""Long fuzzing run of every reader over mutated real samples.

Usage::

    python -m fuzz.fuzz_readers --cases 10000 --seed 0 [--save-crashes DIR] [--json]

Each case copies one small real checkpoint (see :func:`fuzz.harness.build_corpus`), applies one to
three random mutations (bytes, safetensors header fields, config / quantize_config / index JSON,
shard files and symlinks) and reads it with :func:`fuzz.harness.exercise` (auto-detect and every
registered format; every tensor loaded and dequantized). Anything but a ``ConverterError`` is an
*unexpected exception*; the run continues and prints a summary grouped by exception type and the
place it was raised. Exit status 1 if any unexpected exception occurred.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

from fuzz.harness import RandomDraw, build_corpus, copy_case, exercise, mutate_case


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-crashes", type=Path, default=None, help="Copy each crashing input here.")
    ap.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    rng = random.Random(args.seed)
    draw = RandomDraw(rng)
    outcomes: collections.Counter[str] = collections.Counter()
    crashes: dict[str, dict] = {}
    n_unexpected = 0
    slowest = (0.0, -1)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qckpt-fuzz-") as tmp:
        tmp = Path(tmp)
        corpus = build_corpus(tmp / "corpus")
        for i in range(args.cases):
            case = copy_case(draw.choice(corpus), tmp / "work")
            outside = tmp / "outside.bin"
            desc = mutate_case(draw, case, outside)
            t1 = time.perf_counter()
            try:
                for key, value in exercise(case).items():
                    outcomes[f"{key}:{value}"] += 1
            except Exception as exc:  # noqa: BLE001 - counting unexpected exceptions is the point
                n_unexpected += 1
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                sig = f"{type(exc).__name__} at {Path(frame.filename).name}:{frame.lineno}"
                entry = crashes.setdefault(sig, {"count": 0, "first_case": i, "message": str(exc)[:300],
                                                 "input": case.name, "mutations": desc})
                entry["count"] += 1
                if args.save_crashes and entry["count"] == 1:
                    dst = args.save_crashes / f"case{i}-{case.name}"
                    args.save_crashes.mkdir(parents=True, exist_ok=True)
                    if case.is_dir():
                        shutil.copytree(case, dst, symlinks=True)
                    else:
                        shutil.copy(case, dst)
            dt = time.perf_counter() - t1
            if dt > slowest[0]:
                slowest = (dt, i)
            if (i + 1) % 1000 == 0 and not args.json:
                print(f"{i + 1} cases, {n_unexpected} unexpected, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    summary = {"cases": args.cases, "seed": args.seed, "unexpected_exceptions": n_unexpected,
               "seconds": round(time.perf_counter() - t0, 1), "slowest_case_seconds": round(slowest[0], 3),
               "crash_signatures": crashes, "outcomes": dict(sorted(outcomes.items()))}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"cases: {args.cases}  unexpected exceptions: {n_unexpected}  time: {summary['seconds']} s  "
              f"slowest case: {summary['slowest_case_seconds']} s")
        for sig, e in sorted(crashes.items(), key=lambda kv: -kv[1]["count"]):
            print(f"  {e['count']:5d} x {sig}: {e['message']} [{e['input']}: {e['mutations']}, case {e['first_case']}]")
    return 1 if n_unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
