"""gpt-oss MXFP4 -> MLX written by qckpt, loaded by mlx-lm: the experts' decode and the logits against transformers.

Run in a venv with mlx[cpu] 0.32.4 + mlx-lm 0.32.2 (not qckpt's test suite), with a second interpreter that has
torch 2.13.0 (CPU) + transformers 5.24 for the reference logits:

    /work/venvs/mlx/bin/python interop/gpt_oss_mlx.py --qckpt-python /work/venvs/dev/bin/python \
        --torch-python /work/venvs/gptoss/bin/python [--write]

1. ``qckpt convert tests/data/gpt_oss/tiny_mxfp4 OUT --to mlx`` (experts split into SwitchGLU ``gate_proj`` /
   ``up_proj`` / ``down_proj``, mxfp4 ``[E, out, in/8]`` U32 + ``[E, out, in/32]`` U8).
2. ``mlx_lm.utils.load_model(OUT)``: the expert modules must load as ``QuantizedSwitchLinear`` in mode ``mxfp4``;
   ``mx.dequantize`` of their weights (mlx's own decode) is compared with transformers' ``convert_moe_packed_tensors``
   decode (``tests/data/gpt_oss/reference_transformers.safetensors``, ``[E, in, out]``, rows ``0::2`` gate,
   ``1::2`` up).
3. Logits of the same tokens: mlx-lm on the MLX model vs transformers ``GptOssForCausalLM`` on the fixture (its
   dequantize path on CPU), once in BF16 (each framework's BF16 kernels: they agree to BF16 rounding, not bit for
   bit) and once with the float parameters in float32 (the experts stay mxfp4 in mlx; transformers dequantizes
   them), where they must agree to ~1e-3. The figures are printed and, with ``--write``, stored under
   ``"mlx_lm"`` in ``tests/data/gpt_oss/interop.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from gpt_oss_common import FIXTURE, ROOT, TOKENS, logit_stats, qckpt_convert, store_section
from mlx_lm.utils import load_model

REFERENCE = FIXTURE.parent / "reference_transformers.safetensors"

TORCH_LOGITS = """
import sys, numpy as np, torch, transformers
from transformers import GptOssForCausalLM
for name, dt in (("bf16", torch.bfloat16), ("f32", torch.float32)):
    m = GptOssForCausalLM.from_pretrained(sys.argv[1], dtype=dt).eval()
    with torch.no_grad():
        np.save(sys.argv[2] + name + ".npy", m(torch.tensor(%r)).logits.float().numpy())
print(transformers.__version__, torch.__version__)
""" % (TOKENS,)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qckpt-python", required=True)
    ap.add_argument("--torch-python", required=True)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "mlx"
        qckpt_convert(args.qckpt_python, FIXTURE, dst, "mlx")
        model, _ = load_model(dst)
        ref = mx.load(str(REFERENCE))
        classes, decode_diff = set(), 0.0
        for L, layer in enumerate(model.model.layers):
            ex = layer.mlp.experts
            fused = np.array(ref[f"model.layers.{L}.mlp.experts.gate_up_proj"].astype(mx.float32))  # [E, in, 2I]
            down = np.array(ref[f"model.layers.{L}.mlp.experts.down_proj"].astype(mx.float32))      # [E, I, H]
            want = {"gate_proj": fused[..., 0::2], "up_proj": fused[..., 1::2], "down_proj": down}
            for proj, w in want.items():
                lin = getattr(ex, proj)
                classes.add(f"{type(lin).__name__}:{lin.mode}")
                got = mx.dequantize(lin.weight, lin.scales, group_size=lin.group_size, bits=lin.bits, mode=lin.mode)
                got = np.array(got.astype(mx.float32)).transpose(0, 2, 1)
                decode_diff = max(decode_diff, float(np.abs(got - w).max()))
        lm = np.array(model(mx.array(TOKENS)).astype(mx.float32))
        model.set_dtype(mx.float32)  # the float parameters (BF16 values) in float32; experts stay mxfp4
        lm32 = np.array(model(mx.array(TOKENS)).astype(mx.float32))
        res = subprocess.run([args.torch_python, "-c", TORCH_LOGITS, str(FIXTURE), str(Path(tmp) / "t")],
                             check=True, capture_output=True, text=True, cwd=ROOT)
        lt, lt32 = np.load(Path(tmp) / "tbf16.npy"), np.load(Path(tmp) / "tf32.npy")
    out = {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "reference": "transformers " + res.stdout.strip(),
           "tokens": TOKENS, "expert_modules": sorted(classes),
           "max_abs_mx_dequantize_minus_convert_moe_packed_tensors": decode_diff,
           **{dt: dict(zip(("max_abs_logit_diff_mlx_lm_vs_transformers", "mean_abs_logit_transformers",
                            "argmax_agreement"), logit_stats(got, want)))
              for dt, got, want in (("bf16", lm, lt), ("f32", lm32, lt32))}}
    print(json.dumps(out, indent=1))
    if args.write:
        store_section("mlx_lm", out)
    # BF16 logits differ by the frameworks' own BF16 kernels; in float32 they must agree closely
    ok = decode_diff == 0 and classes == {"QuantizedSwitchLinear:mxfp4"} and out["f32"]["argmax_agreement"] == 1.0 \
        and out["f32"]["max_abs_logit_diff_mlx_lm_vs_transformers"] < 1e-2
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
