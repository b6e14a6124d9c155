"""GGUF fallback decode (types without a qckpt codec, through gguf-py) vs gguf-py directly (not a test).

Run: ``python benchmarks/bench_gguf_fallback.py [--rows 2048] [--cols 4096] [--repeat 3]``.

On the same ``rows x cols`` matrices it times, best of N:
- fallback types (IQ4_NL, IQ4_XS, TQ2_0, IQ2_XXS, IQ3_S ...): qckpt's read path
  (:func:`converter.formats.gguf.fallback.decode`, row blocks) vs ``gguf.quants.dequantize`` on the whole
  tensor (target: qckpt no slower, ratio >= 1.0 up to noise);
- beside them, qckpt's own legacy / K-quant codecs (Q4_0, Q8_0, Q4_K: the reader's
  ``tensor_from_fields(codec.decode(raw)).dequantize()``) vs ``gguf.quants.dequantize`` of the same bytes.

``--whole`` raises the row block (``fallback.ROW_BLOCK_VALUES``, 1M values) above the matrix: one
gguf-py call, its array returned as is (the path of tensors of at most 1M values).

Prints seconds, GB/s of float32 output and gguf/qckpt time ratios. Bytes of the IQ types are random blocks
with a finite fp16 ``d`` (gguf-py quantizes only TQ1_0 / TQ2_0 of them, and no K-quant); the decoders' cost
does not depend on the values.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gguf  # noqa: E402

from converter.formats.gguf.blocks import codec_for  # noqa: E402
from converter.formats.gguf import fallback  # noqa: E402
from converter.formats.gguf.fallback import FALLBACK, decode  # noqa: E402
from converter.formats.gguf.schemes import tensor_from_fields  # noqa: E402
from timing import best_time  # noqa: E402

FALLBACK_TYPES = ("IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_S", "IQ3_S", "IQ1_M")
OWN_TYPES = ("Q4_0", "Q8_0", "Q4_K")


def _raw(type_name: str, rows: int, cols: int, x: np.ndarray) -> np.ndarray:
    qt = gguf.GGMLQuantizationType[type_name]
    if type_name in ("TQ1_0", "TQ2_0", "Q4_0", "Q8_0"):
        return gguf.quants.quantize(x, qt)
    block, size = gguf.GGML_QUANT_SIZES[qt]
    raw = np.random.default_rng(1).integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    offsets = (0, 2) if type_name == "Q4_K" else (FALLBACK[type_name].d_offset,)  # Q4_K: d, dmin
    for off in offsets:
        if off is not None:
            raw[:, :, off:off + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--whole", action="store_true")
    args = parser.parse_args()
    if args.whole:
        fallback.ROW_BLOCK_VALUES = args.rows * args.cols
    shape = (args.rows, args.cols)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    gb = x.nbytes / 1e9
    print(f"matrix {args.rows}x{args.cols} -> float32 ({gb:.3f} GB), best of {args.repeat}, "
          f"fallback row block {fallback.ROW_BLOCK_VALUES} values")
    print(f"{'type':8} {'path':9} {'qckpt s':>8} {'GB/s':>6} {'gguf s':>8} {'GB/s':>6} {'gguf/qckpt':>10}")
    for name in FALLBACK_TYPES + OWN_TYPES:
        qt = gguf.GGMLQuantizationType[name]
        raw = _raw(name, *shape, x)
        if name in FALLBACK_TYPES:
            path = "fallback"
            ours_fn = lambda raw=raw, name=name: decode(raw, name, shape)  # noqa: E731
        else:
            path = "own codec"
            codec = codec_for(name)
            ours_fn = lambda raw=raw, codec=codec: tensor_from_fields("t", codec.decode(raw), shape).dequantize()  # noqa: E731
        ref_fn = lambda raw=raw, qt=qt: gguf.quants.dequantize(raw, qt)  # noqa: E731
        assert np.array_equal(ours_fn(), ref_fn(), equal_nan=True), name
        ours, ref = best_time(ours_fn, args.repeat), best_time(ref_fn, args.repeat)
        print(f"{name:8} {path:9} {ours:8.3f} {gb / ours:6.2f} {ref:8.3f} {gb / ref:6.2f} {ref / ours:9.2f}x")


if __name__ == "__main__":
    main()
