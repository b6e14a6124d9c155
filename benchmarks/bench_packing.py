"""Throughput of converter.kernels.packing on a 4096 x 11008 code matrix (one Llama-7B MLP weight).

Run: ``python benchmarks/bench_packing.py [--repeat N]``. Prints G codes/s for pack and unpack,
4-bit and 3-bit, packing along the last axis (compressed-tensors / MLX orientation) and axis 0
(GPTQ ``qweight`` orientation), plus AWQ-ordered 4-bit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from converter.formats.awq import ORDER as AWQ_ORDER
from converter.kernels.compiled import available
from converter.kernels.packing import pack_codes, unpack_codes
from converter.runtime import run_options
from timing import best_time  # noqa: E402

SHAPE = (4096, 11008)


def bench(bits: int, axis: int, repeat: int, order=None, label: str = "") -> None:
    """Print pack / unpack throughput for one configuration, numpy and compiled kernels (the fast extra, when
    numba is installed), and check the round trip and that both paths give the same bytes."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 1 << bits, size=SHAPE, dtype=np.uint8)
    n = codes.size
    outputs = []
    for kernels in ("numpy", "numba") if available() else ("numpy",):
        with run_options(kernels=kernels):
            words = pack_codes(codes, bits, axis=axis, order=order)
            back = unpack_codes(words, bits, axis=axis, length=SHAPE[axis], order=order)
            assert np.array_equal(back, codes)
            outputs.append((words.tobytes(), back.tobytes()))
            t_pack = best_time(lambda: pack_codes(codes, bits, axis=axis, order=order), repeat)
            t_unpack = best_time(lambda w=words: unpack_codes(w, bits, axis=axis, length=SHAPE[axis], order=order),
                                 repeat)
        print(f"{bits}-bit axis={axis:<2d}{label:<10s}{kernels:<6s} pack {n / t_pack / 1e9:6.2f} G codes/s "
              f"({t_pack * 1e3:7.1f} ms)   unpack {n / t_unpack / 1e9:6.2f} G codes/s ({t_unpack * 1e3:7.1f} ms)")
    assert all(o == outputs[0] for o in outputs), "numpy and compiled kernels disagree"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"matrix {SHAPE[0]}x{SHAPE[1]} = {SHAPE[0] * SHAPE[1] / 1e6:.1f} M codes (uint8 in), uint32 words")
    for bits in (4, 8, 2, 3):
        for axis in (-1, 0):
            bench(bits, axis, args.repeat)
    bench(4, -1, args.repeat, order=AWQ_ORDER, label=" AWQ")


if __name__ == "__main__":
    main()
