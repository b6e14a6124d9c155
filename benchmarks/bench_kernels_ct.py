"""Kernel rows of qckpt issue 19 against compressed-tensors, numpy and compiled kernels in one run: unpack,
dequantize and quantize of one 11008 x 4096 matrix (a Llama-7B ``mlp.up_proj``), symmetric int4, groups of 128
(random weights put on their own int4 grid, as ``bench_streaming.py``'s dequantized GPTQ matrix).

Run from a checkout (compressed-tensors and torch live in another environment: ``--ct-python``)::

    python benchmarks/bench_kernels_ct.py --ct-python /work/interop-venv/bin/python
    python benchmarks/bench_kernels_ct.py --rows 1024 --repeat 3          # smaller, qckpt only if no --ct-python

Ours, in this process, each with ``QCKPT_KERNELS=numpy`` and, when numba is installed, ``numba`` (the fast
extra), on the same inputs:

- unpack: the compressed-tensors ``weight_packed`` words (qckpt's own writer, format 0.20.1) to int8 codes,
  as qckpt's reader holds them (:class:`converter.layout.PackedCodes`);
- dequantize: those int8 codes and float16 scales to float32 (``QuantizedTensor.dequantize``);
- quantize: the float32 matrix to int4 codes and scales (``converter.quant.quantize.quantize``, absmax per group:
  it also chooses the scales, compressed-tensors is handed them).

Theirs: ``bench_streaming._ct_rates`` in a subprocess of ``--ct-python`` (torch, its default threads and one
thread) on the same arrays; its equality checks (codes, bit-identical float32) are printed. Rates are GB/s of
the float32 matrix (4 bytes per weight), medians. Issue 19's targets: ours / theirs >= 2x (default install),
>= 3x (fast extra), at torch's default threads. Never a timed assert in the tests.

Measured 2026-12-06 04:45 UTC, 11008 x 4096, load average 4.9 (GB/s; ours / compressed-tensors at its 2 default
threads)::

    kernel     ours numpy  ours numba  ct default ct 1 thread   numpy/ct   numba/ct
    unpack           9.01        7.38        1.29        1.60      6.98x      5.72x
    dequant          2.81        3.34        0.53        0.51      5.33x      6.33x
    quant            1.74        1.81        0.28        0.26      6.21x      6.49x

(no compiled kernel ran on these three paths at that commit: the compressed-tensors words are packed along the
last axis, where numpy's byte views are as fast, and the integer dequantize / quantize kernels are numpy; the
numba column differs from the numpy one by the load's noise only.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing import median_time  # noqa: E402

from converter.formats.compressed_tensors.int_layout import AXES, codes_map  # noqa: E402
from converter.formats.compressed_tensors.writer import encode  # noqa: E402
from converter.groups import GroupMap  # noqa: E402
from converter.kernels.compiled import available, compile_seconds  # noqa: E402
from converter.layout import PackedCodes  # noqa: E402
from converter.quant.quantize import quantize  # noqa: E402
from converter.runtime import run_options  # noqa: E402
from converter.scheme import QuantScheme  # noqa: E402
from converter.tensor import QuantizedTensor  # noqa: E402

NAME = "model.layers.0.mlp.up_proj.weight"
WHAT = ("unpack", "dequant", "quant")


def ours(x: np.ndarray, repeat: int, kernels: str) -> tuple[dict, dict]:
    """(rates GB/s, arrays) of our three kernels on ``x`` with ``kernels``."""
    scheme, gm = QuantScheme(4, signed=True), GroupMap.per_group(128)
    with run_options(kernels=kernels):
        qt = quantize(x, scheme, gm, name=NAME)
        ct = encode(qt, "m", fmt="pack-quantized", version=(0, 20, 1), keep_g_idx=False)
        words, scales = ct["m.weight_packed"], ct["m.weight_scale"]
        sizes = dict(zip(AXES, x.shape))

        def packed():
            return PackedCodes(words, codes_map(4, "stream"), AXES, sizes, signed=True, flip=True)
        codes8 = packed().unpack()
        t = QuantizedTensor(NAME, AXES, codes8, scales, scheme, gm)
        t.dequantize()  # (compiles / loads the compiled kernels before timing)
        n = x.nbytes
        rates = {"unpack": n / median_time(lambda: packed().unpack(), repeat) / 1e9,
                 "dequant": n / median_time(t.dequantize, repeat) / 1e9,
                 "quant": n / median_time(lambda: quantize(x, scheme, gm, name=NAME), repeat) / 1e9}
        arrays = {"words": words, "scales": scales, "codes8": codes8, "q_scales": qt.scales, "q_codes": qt.codes,
                  "dequant": t.dequantize()}
    return rates, arrays


def theirs(ct_python: str, x: np.ndarray, arrays: dict, repeat: int) -> dict:
    """``bench_streaming._ct_rates`` run by ``ct_python`` (compressed-tensors + torch) on the same arrays."""
    with tempfile.TemporaryDirectory() as tmp:
        npz = Path(tmp) / "inputs.npz"
        np.savez(npz, x=x, **{k: v for k, v in arrays.items() if k != "dequant"})
        code = ("import json, sys, numpy as np; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/benchmarks']; "
                "from bench_streaming import _ct_rates; d = np.load(sys.argv[2]); "
                "print(json.dumps(_ct_rates(d['x'], d['words'], d['scales'], d['codes8'], d['q_scales'], "
                "d['q_codes'], int(sys.argv[3]))))")
        out = subprocess.run([ct_python, "-c", code, str(ROOT), str(npz), str(repeat)], check=True,
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=11008)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--ct-python", default=None, help="a Python with compressed-tensors and torch")
    args = ap.parse_args()
    raw = (np.random.default_rng(0).standard_normal((args.rows, args.cols)) * 0.02).astype(np.float32)
    # the matrix on its own int4 grid (as a dequantized checkpoint's weights): every kernel then reproduces it
    x = quantize(raw, QuantScheme(4, signed=True), GroupMap.per_group(128), name=NAME).dequantize()
    paths = ["numpy", "numba"] if available() else ["numpy"]
    results, arrays = {}, {}
    for k in paths:
        results[k], arrays[k] = ours(x, args.repeat, k)
    same = all(np.array_equal(arrays[paths[0]][a], arrays[k][a]) for k in paths for a in arrays[k])
    print(f"{args.rows} x {args.cols} int4 sym g128, GB/s of the float32 matrix (load average "
          f"{os.getloadavg()[0]:.1f}); numpy and compiled outputs identical: {same}")
    if "numba" in results:
        print("  first-call compile / cache-load seconds: "
              + ", ".join(f"{k.rsplit('.', 1)[-1]} {v:.2f}" for k, v in compile_seconds().items()))
    c = theirs(args.ct_python, x, arrays["numpy"], args.repeat) if args.ct_python else None
    if c:
        print(f"  compressed-tensors {c['version']} (torch {c['torch']}, default threads {c['default_threads']}): "
              f"codes equal {c['unpack_codes_equal']}, float32 bit-identical {c['dequant_f32_bit_identical']}, "
              f"quantized codes equal {c['quant_codes_equal']}")
    head = "  kernel   " + "".join(f"{'ours ' + k:>12s}" for k in paths)
    if c:
        head += f"{'ct default':>12s}{'ct 1 thread':>12s}" + "".join(f"{k + '/ct':>11s}" for k in paths)
    print(head + ("   (target >= 2x numpy, >= 3x fast)" if c else ""))
    for what in WHAT:
        line = f"  {what:<8s} " + "".join(f"{results[k][what]:12.2f}" for k in paths)
        if c:
            d, one = c[f"threads_{c['default_threads']}"][f"{what}_gbs"], c["threads_1"][f"{what}_gbs"]
            line += f"{d:12.2f}{one:12.2f}" + "".join(f"{results[k][what] / d:10.2f}x" for k in paths)
        print(line)
    if "numba" in results:
        print("  compiled / numpy: " + ", ".join(f"{w} {results['numba'][w] / results['numpy'][w]:.2f}x"
                                                   for w in WHAT))
    if not same:
        raise SystemExit("numpy and compiled kernels disagree")


if __name__ == "__main__":
    main()
