"""Requantize called as a library (not through the CLI): ns per weight of one 4096 x 4096 tensor.

The CLI caps BLAS at one thread for its whole process; a library caller does not, so before the
kernels capped BLAS themselves (:mod:`converter.kernels.blas`), the error-report products of
``requantize`` ran on the BLAS library's default thread count (one per core), next to the
kernels' own row threads. This script times, in one run and on the same tensor:

- ``capped``: the kernels as they are (one BLAS thread inside their products);
- ``unlimited``: the same code with the cap removed (the BLAS default thread count: the old
  library-call behaviour).

Each case: ``requantize`` of a 4-bit group-128 tensor to 8-bit per channel (the lossy route,
figures summed in its row blocks) and ``tensor_report`` (the error report row), median of
``--repeat`` runs. Usage: ``python benchmarks/bench_requant_library.py [--size 4096] [--repeat 5]``.

``--checkpoint SRC`` (e.g. a synthetic GPTQ checkpoint, ``tests/synthetic.py``) also times the whole
command both ways, each in a fresh process, paired runs (median): ``converter.convert(SRC, DST,
to="compressed-tensors", target={"bits": 8, "granularity": "channel"})`` from a Python script (the
library caller: no CLI set-up, BLAS left at its default) against ``qckpt convert SRC DST --to
compressed-tensors --per-channel --bits 8``, wall and CPU seconds; the two outputs must be
byte-identical. Measured 2026-12-06, one Llama-7B-shaped GPTQ layer (with its 32000-row embedding and
head), load 8.5: library 8.72 s wall / 2.72 s CPU, CLI 12.31 s / 3.67 s (x0.79), byte-identical.

Measured (2 cores shared with other jobs, load ~5, OpenBLAS default 2 threads): unlimited
108-368 ns/weight, capped 10-17 ns/weight; the code before the cap (c9c210c, same call through
its API) 166 ns/weight in the same conditions. The figures are identical either way.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from threadpoolctl import threadpool_info  # noqa: E402

from timing import median_time  # noqa: E402
from converter.groups import GroupMap  # noqa: E402
from converter.kernels import error_sums, metrics, rtn  # noqa: E402
from converter.quant import format_quant  # noqa: E402
from converter.quant.error_report import tensor_report  # noqa: E402
from converter.quant.quantize import quantize  # noqa: E402
from converter.quant.requant import Target, classify, requantize  # noqa: E402
from converter.scheme import QuantScheme  # noqa: E402

_CAPPED = (rtn, error_sums, metrics, format_quant)


@contextlib.contextmanager
def _uncapped():
    """The kernels without their BLAS cap (what a library call ran on before it)."""
    saved = [m.blas_threads for m in _CAPPED]
    for m in _CAPPED:
        m.blas_threads = lambda n=1: contextlib.nullcontext()
    try:
        yield
    finally:
        for m, f in zip(_CAPPED, saved):
            m.blas_threads = f


_LIBRARY = ("import sys, converter; converter.convert(sys.argv[1], sys.argv[2], to='compressed-tensors', "
            "target={'bits': 8, 'granularity': 'channel'})")


def _timed(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system, the process and its children) seconds of ``cmd``."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    c0, t0 = os.times(), time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    wall, c1 = time.perf_counter() - t0, os.times()
    return wall, (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(path.rglob("*.safetensors")):
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


def command_pairs(src: Path, repeat: int) -> None:
    """The whole requantize command as a library call and through the CLI (fresh processes, paired)."""
    work = Path(tempfile.mkdtemp(prefix="qckpt-lib-"))
    lib_out, cli_out = work / "lib", work / "cli"
    runs: dict[str, list[tuple[float, float]]] = {"library": [], "cli": []}
    try:
        for _ in range(repeat):
            for p in (lib_out, cli_out):
                shutil.rmtree(p, ignore_errors=True)
            runs["library"].append(_timed([sys.executable, "-c", _LIBRARY, str(src), str(lib_out)]))
            runs["cli"].append(_timed([sys.executable, "-m", "converter", "convert", str(src), str(cli_out), "--to",
                                       "compressed-tensors", "--per-channel", "--bits", "8", "--quiet"]))
        same = _digest(lib_out) == _digest(cli_out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"whole command on {src} (8-bit per channel, compressed-tensors), {repeat} paired runs, "
          f"load {os.getloadavg()[0]:.1f}:")
    for label, rs in runs.items():
        print(f"  {label:>8}: wall {statistics.median(r[0] for r in rs):6.2f} s  "
              f"CPU {statistics.median(r[1] for r in rs):6.2f} s   (runs: {', '.join(f'{r[0]:.2f}' for r in rs)})")
    ratio = statistics.median(a[0] / b[0] for a, b in zip(runs["library"], runs["cli"]))
    print(f"  library / CLI wall: x{ratio:.2f} (median of pairs); outputs byte-identical: {same}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--checkpoint", type=Path, help="also time the whole command, library call vs CLI")
    args = ap.parse_args()
    n = args.size
    w = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32) * 0.02
    src = quantize(w, QuantScheme(4, True, scale_dtype="F16"), GroupMap.per_group(128), name="w")
    target = Target(bits=8, granularity="channel")
    plan = classify(src, target)

    def run():
        res = requantize(src, target)
        return tensor_report(src, res, plan)

    blas = [(i["internal_api"], i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"]
    print(f"requantize + tensor_report, {n} x {n} (4-bit group 128 -> 8-bit per channel), library call")
    print(f"BLAS libraries and their default threads: {blas}")
    figures = {}
    for label, ctx in (("unlimited", _uncapped), ("capped", contextlib.nullcontext)):
        with ctx():
            run()  # warm-up (thread pools, caches)
            t = median_time(run, args.repeat)
            figures[label] = run()["vs_source"]
        print(f"  {label:>9}: {t * 1e9 / (n * n):7.2f} ns/weight ({t * 1e3:.0f} ms)")
    same = figures["unlimited"].to_json() == figures["capped"].to_json()
    print(f"  figures identical with and without the cap: {same}")
    if args.checkpoint is not None:
        command_pairs(args.checkpoint, args.repeat)


if __name__ == "__main__":
    main()
