"""gpt-oss MXFP4 in transformers: the reference decode of the fixture and the logits of a qckpt-written model.

Run in a venv with torch 2.13.0 (CPU) + transformers 5.24 + accelerate + safetensors (not qckpt's test suite):

    python interop/gpt_oss_tiny.py --qckpt-python /work/venvs/dev/bin/python [--write-reference]

1. transformers' own dequantize (``integrations/mxfp4.py`` ``convert_moe_packed_tensors``, BF16, ``[E, in, out]``)
   of every ``*_proj_blocks`` / ``_scales`` pair of ``tests/data/gpt_oss/tiny_mxfp4``; with ``--write-reference``
   saved as ``tests/data/gpt_oss/reference_transformers.safetensors`` (what ``tests/formats/test_gpt_oss.py``
   compares qckpt's decode with).
2. qckpt converts the fixture to gpt-oss (``qckpt convert ... --to gpt-oss``) and dumps its own decode of every
   expert tensor (float32, ``[E, out, in]``); transformers loads the written directory with
   ``GptOssForCausalLM.from_pretrained`` (on CPU without Triton the Mxfp4 quantizer dequantizes to BF16:
   ``quantizer_mxfp4.py`` ``validate_environment``), and the same architecture is built in BF16 with the experts
   set to qckpt's decode transposed to ``[E, in, out]`` (the BF16 parameter orientation). Both run the same tokens;
   the figures (max |logit difference|, argmax agreement, loaded expert parameters vs qckpt's decode) are printed
   as JSON and, with ``--write-reference``, saved to ``tests/data/gpt_oss/interop.json``. qckpt's own float export
   (``--to plain``, the experts written ``[E, in, out]`` as the source's ``dense_axes`` declare) runs too.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from gpt_oss_common import FIXTURE, QCKPT_ENV, ROOT, TOKENS, qckpt_convert
from safetensors.torch import load_file, save_file
from transformers import GptOssForCausalLM
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

DUMP = """
import sys, numpy as np
from converter.formats import registry
ck = registry.load(sys.argv[1])
np.savez(sys.argv[2], **{n: ck[n].dequantize() for n in ck.quantized_names()})
"""


def reference(src: Path) -> dict[str, torch.Tensor]:
    sd = load_file(str(src / "model.safetensors"))
    bases = [k[:-len("_blocks")] for k in sd if k.endswith("_blocks")]
    return {b: convert_moe_packed_tensors(sd[b + "_blocks"], sd[b + "_scales"], dtype=torch.bfloat16) for b in bases}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qckpt-python", default=sys.executable)
    ap.add_argument("--write-reference", action="store_true")
    args = ap.parse_args()
    ref = reference(FIXTURE)
    with tempfile.TemporaryDirectory() as tmp:
        dst = Path(tmp) / "written"
        qckpt_convert(args.qckpt_python, FIXTURE, dst, "gpt-oss")
        subprocess.run([args.qckpt_python, "-c", DUMP, str(dst), str(Path(tmp) / "decode.npz")], check=True,
                       env=QCKPT_ENV, cwd=ROOT)
        import numpy as np
        ours = {k: torch.from_numpy(v) for k, v in np.load(Path(tmp) / "decode.npz").items()}
        ids = torch.tensor(TOKENS)
        mx = GptOssForCausalLM.from_pretrained(str(dst), dtype=torch.bfloat16).eval()
        cfg = json.loads((dst / "config.json").read_text())
        cfg.pop("quantization_config")
        sd = {k: v for k, v in load_file(str(dst / "model.safetensors")).items()
              if not k.endswith(("_blocks", "_scales"))}
        sd.update({k: v.transpose(1, 2).contiguous().to(torch.bfloat16) for k, v in ours.items()})
        bdir = Path(tmp) / "bf16"  # the same model as a BF16 export (experts [E, in, out]), loaded the same way
        bdir.mkdir()
        (bdir / "config.json").write_text(json.dumps(cfg))
        save_file(sd, str(bdir / "model.safetensors"), {"format": "pt"})
        bf = GptOssForCausalLM.from_pretrained(str(bdir), dtype=torch.bfloat16).eval()
        loaded = {k for k, _ in bf.named_parameters()}
        missing, unexpected = sorted(loaded - set(sd)), sorted(set(sd) - loaded)
        plain = Path(tmp) / "plain"  # qckpt's own float export (experts written [E, in, out]: metadata dense_axes)
        qckpt_convert(args.qckpt_python, FIXTURE, plain, "plain")
        pl = GptOssForCausalLM.from_pretrained(str(plain), dtype=torch.bfloat16).eval()
        with torch.no_grad():
            lm, lb, lp = mx(ids).logits.float(), bf(ids).logits.float(), pl(ids).logits.float()
        params = {k: v.detach() for k, v in mx.named_parameters()}
        loaded_vs_ours = max(float((params[k].float() - v.transpose(1, 2)).abs().max()) for k, v in ours.items())
        ref_vs_ours = max(float((ref[k].float() - v.transpose(1, 2)).abs().max()) for k, v in ours.items())
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "tokens": TOKENS,
           "loaded_experts_class": type(mx.model.layers[0].mlp.experts).__name__,
           "bf16_missing_keys": list(missing), "bf16_unexpected_keys": list(unexpected),
           "max_abs_loaded_expert_minus_qckpt_decode": loaded_vs_ours,
           "max_abs_convert_moe_packed_tensors_minus_qckpt_decode": ref_vs_ours,
           "max_abs_logit_diff_mxfp4_vs_bf16": float((lm - lb).abs().max()),
           "max_abs_logit_diff_mxfp4_vs_qckpt_plain_export": float((lm - lp).abs().max()),
           "mean_abs_logit_bf16": float(lb.abs().mean()),
           "argmax_agreement": float((lm.argmax(-1) == lb.argmax(-1)).float().mean())}
    print(json.dumps(out, indent=1))
    if args.write_reference:
        save_file(ref, str(FIXTURE.parent / "reference_transformers.safetensors"), {"format": "pt"})
        path = FIXTURE.parent / "interop.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        keep = {k: v for k, v in old.items() if k in ("mlx_lm", "gguf_round_trip")}  # the other scripts' sections
        path.write_text(json.dumps({**out, **keep}, indent=1) + "\n")
    ok = loaded_vs_ours == 0 and ref_vs_ours == 0 and out["max_abs_logit_diff_mxfp4_vs_bf16"] == 0 \
        and out["max_abs_logit_diff_mxfp4_vs_qckpt_plain_export"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
