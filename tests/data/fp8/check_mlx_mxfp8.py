"""Cross-check qckpt's FP8 -> MLX ``mxfp8`` carry with the real MLX (not part of pytest: needs mlx).

    PYTHONPATH=. python tests/data/fp8/check_mlx_mxfp8.py make DIR          # qckpt's venv (pytest, numpy)
    /path/to/venv-with-mlx/bin/python tests/data/fp8/check_mlx_mxfp8.py check DIR

``make`` quantizes the fixture's two SmolLM2 tensors to E4M3 128 x 128 blocks (qckpt), rounds each
block scale to the nearest power of two (E8M0-representable, as DeepSeek V3.1's scales are), writes
that as a native file, converts it with ``qckpt convert --to mlx`` (an exact repack, proven by
read-back) into ``DIR/mlx`` and saves qckpt's float32 decode of the source as ``DIR/qckpt.npz``.
``check`` compares ``mx.dequantize(weight, scales, mode="mxfp8")`` (mlx 0.32) with it bit for bit
and loads each layer into an ``mlx.nn.QuantizedLinear`` with the written config's mode (mxfp8);
one line per tensor, exit status 1 on any mismatch.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np


def make(out: Path) -> None:
    import ml_dtypes
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    from tests.kernels.test_fp_rtn import NAMES, load_fixture
    from tests.quant.test_fp8_source import fp8_block, native_source
    fx = load_fixture()
    out.mkdir(parents=True, exist_ok=True)
    tensors = [fp8_block(n, fx[f"{n}.bf16"].view(ml_dtypes.bfloat16), pow2=True, scale_dtype="F32") for n in NAMES]
    src = native_source(out, tensors)
    subprocess.run([sys.executable, "-m", "converter", "convert", str(src), str(out / "mlx"), "--to", "mlx",
                    "--overwrite"], check=True)
    np.savez(out / "qckpt.npz", **{t.name: t.dequantize() for t in tensors})


def check(out: Path) -> int:
    import mlx.core as mx
    import mlx.nn as nn
    want = np.load(out / "qckpt.npz")
    w = mx.load(str(out / "mlx" / "model.safetensors"))
    q = json.loads((out / "mlx" / "config.json").read_text())["quantization"]
    bad = 0
    for name in want.files:
        p = name[: -len(".weight")]
        got = np.array(mx.dequantize(w[f"{p}.weight"], w[f"{p}.scales"], None, group_size=32, bits=8,
                                     mode="mxfp8").astype(mx.float32))
        same = got.shape == want[name].shape and np.array_equal(got.view(np.uint32), want[name].view(np.uint32))
        o, i = want[name].shape
        lin = nn.QuantizedLinear(i, o, bias=False, group_size=q["group_size"], bits=q["bits"], mode=q["mode"])
        lin.load_weights([("weight", w[f"{p}.weight"]), ("scales", w[f"{p}.scales"])])
        x = mx.random.normal((3, i), key=mx.random.key(0))
        y = np.array(lin(x).astype(mx.float32))
        ref = np.array(x.astype(mx.float32)) @ want[name].T
        rel = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
        ok = same and type(lin).__name__ == "QuantizedLinear" and rel < 1e-5
        bad += not ok
        print(f"{name} {[o, i]}: mx.dequantize(mode='mxfp8') bit-identical to qckpt's decode: {same}; "
              f"QuantizedLinear(mode={lin.mode}) output vs decode @ x: rel {rel:.2e}")
    return 1 if bad else 0


if __name__ == "__main__":
    cmd, where = sys.argv[1], Path(sys.argv[2])
    if cmd == "make":
        make(where)
    else:
        sys.exit(check(where))
