"""Start-up benchmark (qckpt issue 18 item 13): the wall time of a fresh ``qckpt`` process for ``--version``,
``--help`` and ``inspect`` of a small sample, against the targets (0.3 s, 0.3 s, 1 s on the 2-core dev VM).

Run from a checkout::

    python benchmarks/bench_startup.py                     # this checkout, median of 7 runs each
    python benchmarks/bench_startup.py --before HEAD~3     # also the tree of a git revision, same run

Each figure is the median wall time of ``--runs`` fresh ``python -m converter ...`` subprocesses (the
interpreter, every import, the command; files in the page cache). Two reference lines are measured in the same
run, because the VM is shared and absolute times drift with its load: ``python -c pass`` (the interpreter's
floor) and ``python -c "import numpy, ml_dtypes"`` (what any command that reads tensors imports: ml_dtypes 0.7.0's C
extension took 0.5-0.7 s to initialise here, 0.6.0's 0.08 s, hence the pin ``ml_dtypes<0.7`` in pyproject.toml).
``--before REV`` extracts that revision's tree with ``git archive`` into a temporary directory and times it
alternately with this checkout.

Measured 2026-12-06 on the 2-core dev VM, ``--before 984fca0 --runs 5`` (shared with 7 other jobs, load
average 12: every absolute figure is 2-4x its idle value; the ratios hold)::

    python -c pass             this checkout           0.086 s  (min 0.081)
    import numpy, ml_dtypes    this checkout           2.536 s  (min 1.976)
    --version                  before (984fca0)        2.911 s  (min 2.532)
    --version                  this checkout           0.316 s  (min 0.256)
    --help                     before (984fca0)        3.720 s  (min 2.595)
    --help                     this checkout           0.242 s  (min 0.206)
    inspect                    before (984fca0)        3.898 s  (min 3.244)
    inspect                    this checkout           3.572 s  (min 3.373)

A second run at load average 7.3: ``--version`` 2.856 -> 0.350 s, ``--help`` 2.375 -> 0.212 s, ``inspect``
3.104 -> 2.540 s, ``import numpy, ml_dtypes`` 2.539 s.

``inspect`` still imports numpy and ml_dtypes (the storage dtype table, converter/dtypes.py, and every
format module through the registry), so it cannot start faster than the second reference line. ``perf record``
of ``import ml_dtypes`` (ml_dtypes 0.7.0, numpy 2.4.6): ~75% of the samples in numpy's ``PyUFunc_AddLoop`` and
the tuple comparisons of its linear search, i.e. registering ml_dtypes' ufunc loops one by one.

With ``ml_dtypes`` 0.6.0 (the pin), at load average 0.6, ``--runs 9``: ``import numpy, ml_dtypes`` 0.096 s,
``--version`` 0.082 s, ``--help`` 0.068 s, ``inspect`` 0.399 s (0.999 s with ml_dtypes 0.7.0 at load 0.5).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_checkpoints" / "gptq_w4_g128_sym"
TARGETS = {"--version": 0.3, "--help": 0.3, "inspect": 1.0}


def _wall(cmd: list[str], tree: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def _commands() -> dict[str, list[str]]:
    py = sys.executable
    return {"python -c pass": [py, "-c", "pass"],
            "import numpy, ml_dtypes": [py, "-c", "import numpy, ml_dtypes"],
            "--version": [py, "-m", "converter", "--version"],
            "--help": [py, "-m", "converter", "--help"],
            "inspect": [py, "-m", "converter", "inspect", str(SAMPLE)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per command (median reported)")
    ap.add_argument("--before", default=None, metavar="REV", help="also time this git revision's tree")
    args = ap.parse_args()
    trees = {"this checkout": ROOT}
    with tempfile.TemporaryDirectory() as tmp:
        if args.before:
            before = Path(tmp) / "before"
            before.mkdir()
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before], check=True,
                                     capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
            trees = {f"before ({args.before})": before, **trees}
        times: dict[tuple[str, str], list[float]] = {}
        for name, cmd in _commands().items():
            for _ in range(args.runs):  # alternate the trees so load drifts hit both alike
                for label, tree in trees.items():
                    if name.startswith("python") or name.startswith("import"):
                        if label != "this checkout":
                            continue
                    times.setdefault((name, label), []).append(_wall(cmd, tree))
    print(f"median wall time of {args.runs} fresh processes (load average {os.getloadavg()[0]:.1f})")
    for (name, label), ts in times.items():
        med = statistics.median(ts)
        target = TARGETS.get(name)
        verdict = "" if target is None else f"  target {target:.1f} s: {'met' if med < target else 'NOT met'}"
        print(f"  {name:<26} {label:<22} {med:6.3f} s  (min {min(ts):.3f}){verdict}")
    if args.before:
        for name in TARGETS:
            old = statistics.median(times[(name, f"before ({args.before})")])
            new = statistics.median(times[(name, "this checkout")])
            print(f"  {name:<26} before / now: {old / new:.2f}x")


if __name__ == "__main__":
    main()
