"""Throughput of converter.formats.gguf.blocks vs gguf-py's numpy quants (not a test).

Run: ``python benchmarks/bench_gguf_blocks.py [--size 4096] [--repeat 3]``.

For Q4_0 and Q8_0 on a ``size x size`` float32 matrix it times
- encode:  ours ``codec.encode(x)``            vs ``gguf.quants.quantize(x, type)``
- decode:  ours, the product's read path ``tensor_from_fields(name, codec.decode(raw), shape).dequantize()``,
  vs ``gguf.quants.dequantize(raw, type)``
- fields:  ours ``codec.decode(raw)`` alone (codes + scales, no floats; gguf-py has no equivalent)
and prints the best-of-N time, GB/s of float32 data (``size*size*4`` bytes) and ours/gguf speed ratios.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gguf  # noqa: E402
from gguf import GGMLQuantizationType  # noqa: E402

from converter.formats.gguf.blocks import codec_for  # noqa: E402
from converter.formats.gguf.schemes import tensor_from_fields  # noqa: E402
from timing import best_time  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    x = np.random.default_rng(0).standard_normal((args.size, args.size)).astype(np.float32)
    gb = x.nbytes / 1e9
    print(f"matrix {args.size}x{args.size} float32 ({gb:.3f} GB), best of {args.repeat}")
    print(f"{'type':5} {'op':7} {'ours s':>8} {'GB/s':>7} {'gguf s':>8} {'GB/s':>7} {'speedup':>8}")
    for name in ("Q4_0", "Q8_0"):
        codec, qtype = codec_for(name), GGMLQuantizationType[name]
        raw = gguf.quants.quantize(x, qtype)
        assert np.array_equal(codec.encode(x), raw)
        # the lambdas run within this iteration; the defaults bind its codec / raw / qtype all the same
        rows = [
            ("encode", lambda codec=codec: codec.encode(x), lambda qtype=qtype: gguf.quants.quantize(x, qtype)),
            ("decode", lambda codec=codec, raw=raw: tensor_from_fields("t", codec.decode(raw), x.shape).dequantize(),
             lambda raw=raw, qtype=qtype: gguf.quants.dequantize(raw, qtype)),
            ("fields", lambda codec=codec, raw=raw: codec.decode(raw), None),
        ]
        for op, ours_fn, ref_fn in rows:
            ours = best_time(ours_fn, args.repeat)
            line = f"{name:5} {op:7} {ours:8.3f} {gb / ours:7.2f}"
            if ref_fn is not None:
                ref = best_time(ref_fn, args.repeat)
                line += f" {ref:8.3f} {gb / ref:7.2f} {ref / ours:7.2f}x"
            print(line)


if __name__ == "__main__":
    main()
