"""FP4 dequantize benchmark (qckpt issue 15): MXFP4 and NVFP4 weights decoded to float32 by qckpt's
library, against a plain numpy decode of the same bytes in the same run.

Run from a checkout::

    python benchmarks/bench_fp4_dequant.py                       # 4096 x 4096 (16.8 M weights), 5 repeats
    python benchmarks/bench_fp4_dequant.py --out 8192 --in 14336 --repeat 3

Each tensor is built in memory the way the compressed-tensors reader hands it over
(``converter/formats/compressed_tensors/fp4_layout.py``): E2M1 codes packed two per byte, the even
element in the low nibble, ``[out, in / 2]`` uint8 words; MXFP4 with E8M0 scales per 32 along ``in``
(``[out, in / 32]``), NVFP4 with E4M3 scales per 16 (``[out, in / 16]``) and a float32
``weight_global_scale`` divisor. The codes are random (the decode's cost does not depend on the
values; E4M3 scales avoid the NaN bytes 0x7F / 0xFF, E8M0 the NaN 0xFF).

Timed, median of ``--repeat`` runs each:

- **qckpt**: ``QuantizedTensor.dequantize()`` (float32), the library path every command uses
  (:func:`converter.values.dequantize`: unpack, E2M1 table, effective scales in float32);
- **numpy baseline**: the textbook decode written here with nothing of qckpt: ``words & 0xF`` /
  ``words >> 4`` interleaved, an E2M1 table lookup (float32), the scales widened with ``np.repeat``
  along ``in`` (NVFP4: ``scale / global_scale`` in float32 first) and one multiply.

The two results are checked bit-identical (float32) before any figure is printed. Printed per
format: seconds, input MB/s (packed codes + scales), output MB/s (float32), elements/s, and the
ratio qckpt / baseline (below 1: qckpt faster). Never a timed assert in the tests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import wall_times  # noqa: E402

from converter.codebooks import E2M1  # noqa: E402
from converter.kernels.compiled import available  # noqa: E402
from converter.runtime import run_options  # noqa: E402
from converter.formats.compressed_tensors.fp4_layout import CODES_MAP  # noqa: E402
from converter.groups import GroupMap  # noqa: E402
from converter.layout import IN, OUT, PackedCodes  # noqa: E402
from converter.scheme import QuantScheme  # noqa: E402
from converter.tensor import QuantizedTensor  # noqa: E402

#: E2M1 values by code, from the OCP MX spec v1.0 table (section 5.3.3), written out for the baseline.
E2M1_TABLE = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
FORMATS = {"mxfp4": (32, "F8_E8M0"), "nvfp4": (16, "F8_E4M3")}


def build(fmt: str, n_out: int, n_in: int, seed: int = 0):
    """(QuantizedTensor, words uint8 [out, in/2], scale bytes [out, in/g], global scale or None)."""
    group, sd = FORMATS[fmt]
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 256, size=(n_out, n_in // 2), dtype=np.uint8)
    if fmt == "mxfp4":
        sbytes = rng.integers(110, 130, size=(n_out, n_in // group), dtype=np.uint8)
        scales = sbytes.view(ml_dtypes.float8_e8m0fnu)
        gs = None
    else:
        sbytes = rng.integers(0x08, 0x7F, size=(n_out, n_in // group), dtype=np.uint8)  # positive, no NaN
        scales = sbytes.view(ml_dtypes.float8_e4m3fn)
        gs = np.array(936.0, dtype=np.float32)
    scheme = QuantScheme(4, False, scale_dtype=sd, codebook=E2M1, global_scale="divisor" if gs is not None else None)
    codes = PackedCodes(words, CODES_MAP, (OUT, IN), {OUT: n_out, IN: n_in}, signed=False)
    t = QuantizedTensor("w", (OUT, IN), codes, scales, scheme, GroupMap.per_group(group, IN),
                        stored={"codes": CODES_MAP}, global_scale=gs)
    return t, words, sbytes, gs


def numpy_decode(fmt: str, words: np.ndarray, sbytes: np.ndarray, gs) -> np.ndarray:
    """The plain numpy decode (module docstring), float32 [out, in]."""
    group, _ = FORMATS[fmt]
    codes = np.empty((words.shape[0], words.shape[1] * 2), dtype=np.uint8)
    codes[:, 0::2] = words & 0x0F
    codes[:, 1::2] = words >> 4
    if fmt == "mxfp4":
        s = np.ldexp(np.float32(1), sbytes.astype(np.int32) - 127).astype(np.float32)
    else:
        s = sbytes.view(ml_dtypes.float8_e4m3fn).astype(np.float32) / np.float32(gs)
    return E2M1_TABLE[codes] * np.repeat(s, group, axis=1)


def measure(fmt: str, n_out: int, n_in: int, repeat: int) -> dict:
    t, words, sbytes, gs = build(fmt, n_out, n_in)
    b = numpy_decode(fmt, words, sbytes, gs)
    paths = ["numpy", "numba"] if available() else ["numpy"]
    out = {}
    for kernels in paths:  # qckpt's numpy kernels, then the compiled ones (the fast extra)
        with run_options(kernels=kernels):
            a = np.asarray(t.dequantize(), dtype=np.float32)
            if not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
                raise SystemExit(f"{fmt} ({kernels}): qckpt and the numpy baseline disagree")
            del a
            out[f"qckpt {kernels}"] = statistics.median(wall_times(lambda: t.dequantize(), repeat))
    del b
    base = wall_times(lambda: numpy_decode(fmt, words, sbytes, gs), repeat)
    n = n_out * n_in
    in_bytes = words.nbytes + sbytes.nbytes + (4 if gs is not None else 0)
    return {"elements": n, "in_bytes": in_bytes, "out_bytes": 4 * n, "numpy_s": statistics.median(base), **out}


def report(fmt: str, m: dict) -> None:
    bpw = 8 * m["in_bytes"] / m["elements"]
    print(f"{fmt}: {m['elements'] / 1e6:.1f} M weights, {m['in_bytes'] / 1e6:.1f} MB packed ({bpw:.3g} bits/weight) "
          f"-> {m['out_bytes'] / 1e6:.0f} MB float32; decodes bit-identical (numpy and compiled kernels)")
    rows = [(k, k) for k in m if k.startswith("qckpt ")] + [("numpy baseline", "numpy_s")]
    for label, key in rows:
        s = m[key]
        print(f"  {label:<16s} {s:8.3f} s  {m['in_bytes'] / s / 1e6:8.0f} MB/s in  "
              f"{m['out_bytes'] / s / 1e6:8.0f} MB/s out  {m['elements'] / s / 1e6:8.1f} M elements/s")
    for k in (k for k in m if k.startswith("qckpt ")):
        print(f"  ratio {k} / numpy baseline x{m[k] / m['numpy_s']:.2f} (below 1: qckpt faster)")
    if "qckpt numba" in m:
        print(f"  compiled speed-up over qckpt's numpy kernels x{m['qckpt numpy'] / m['qckpt numba']:.2f} "
              f"(load average {__import__('os').getloadavg()[0]:.1f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=int, default=4096, help="rows (out features)")
    ap.add_argument("--in", dest="n_in", type=int, default=4096, help="columns (in features, a multiple of 32)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--formats", default="mxfp4,nvfp4")
    args = ap.parse_args()
    if args.n_in % 32:
        raise SystemExit("--in must be a multiple of 32")
    for fmt in args.formats.split(","):
        report(fmt, measure(fmt, args.out, args.n_in, args.repeat))


if __name__ == "__main__":
    main()
