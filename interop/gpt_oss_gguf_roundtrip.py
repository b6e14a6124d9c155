"""gpt-oss MXFP4 -> GGUF (llama.cpp's gpt-oss layout) -> gpt-oss, all by qckpt, loaded by transformers.

Run in a venv with torch 2.13.0 (CPU) + transformers 5.24 + accelerate (not qckpt's test suite):

    python interop/gpt_oss_gguf_roundtrip.py --qckpt-python /work/venvs/dev/bin/python [--write]

``qckpt convert tests/data/gpt_oss/tiny_mxfp4 T.gguf --to gguf`` (ffn_gate_exps / ffn_up_exps split from the
interleaved rows, ffn_down_exps, MXFP4 blocks relaid), then ``qckpt convert T.gguf BACK --to gpt-oss`` (gate and
up interleaved again; config.json rebuilt from the GGUF keys). ``GptOssForCausalLM.from_pretrained`` loads the
fixture and BACK; the logits of the same tokens must be identical (the 1-D tensors come back F32, as
``convert_hf_to_gguf.py`` writes them; their values are the BF16 ones). With ``--write`` the figures are stored
under ``"gguf_round_trip"`` in ``tests/data/gpt_oss/interop.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import transformers
from gpt_oss_common import FIXTURE, TOKENS, logit_stats, qckpt_convert, store_section
from transformers import GptOssForCausalLM


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qckpt-python", required=True)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        g, back = Path(tmp) / "t.gguf", Path(tmp) / "back"
        for a, b, to in ((FIXTURE, g, "gguf"), (g, back, "gpt-oss")):
            qckpt_convert(args.qckpt_python, a, b, to)
        ids = torch.tensor(TOKENS)
        src = GptOssForCausalLM.from_pretrained(str(FIXTURE), dtype=torch.bfloat16).eval()
        rt = GptOssForCausalLM.from_pretrained(str(back), dtype=torch.bfloat16).eval()
        with torch.no_grad():
            ls, lr = src(ids).logits.float(), rt(ids).logits.float()
        ps, pr = dict(src.named_parameters()), dict(rt.named_parameters())
        param_diff = max(float((ps[k].float() - pr[k].float()).abs().max()) for k in ps)
    out = {"transformers": transformers.__version__, "torch": torch.__version__, "tokens": TOKENS,
           "same_parameter_names": sorted(ps) == sorted(pr), "max_abs_parameter_diff": param_diff,
           "max_abs_logit_diff_round_trip_vs_source": logit_stats(lr.numpy(), ls.numpy())[0]}
    print(json.dumps(out, indent=1))
    if args.write:
        store_section("gguf_round_trip", out)
    ok = out["same_parameter_names"] and param_diff == 0 and out["max_abs_logit_diff_round_trip_vs_source"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
