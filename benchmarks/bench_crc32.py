"""CRC-32 throughput: the standard library's ``zlib.crc32`` against :func:`converter.kernels.crc32.crc32` (zlib-ng's
with the ``fast`` extra installed), on the same buffer in one run; values checked equal.

Run from a checkout: ``python benchmarks/bench_crc32.py [--mib 256] [--repeat 5]``. The read-back proof of a
requantize digests every output byte (7.0 GB for the 7B-shaped checkpoint of ``bench_streaming.py --size 7b``), so
the GB/s here times the output size is the proof's CRC share of the command's CPU time.

Measured 2026-12-06 on the 2-core dev VM (quiet, 256 MiB, best of 5): zlib 4.1 GB/s, zlib-ng 31.6 GB/s (x7.7).
"""

from __future__ import annotations

import argparse
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from converter.kernels.crc32 import crc32, implementation  # noqa: E402


def rate(fn, buf, repeat: int) -> float:
    """Best GB/s of ``repeat`` calls."""
    fn(buf)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(buf)
        best = min(best, time.perf_counter() - t0)
    return len(buf) / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    buf = np.random.default_rng(0).integers(0, 256, args.mib << 20, dtype=np.uint8).data
    assert crc32(buf) == zlib.crc32(buf)
    base, ours = rate(zlib.crc32, buf, args.repeat), rate(crc32, buf, args.repeat)
    print(f"CRC-32 of {args.mib} MiB (values equal): zlib.crc32 {base:.1f} GB/s; converter.kernels.crc32 "
          f"({implementation()}) {ours:.1f} GB/s: x{ours / base:.1f}")
    print(f"  on a 7.0 GB output: {7.0 / base:.2f} s -> {7.0 / ours:.2f} s of CPU")


if __name__ == "__main__":
    main()
