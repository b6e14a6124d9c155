"""Gemma 2 and Gemma 3 (text) -> GGUF -> Hugging Face, both steps by qckpt, loaded by transformers and llama.cpp.

Run in the interop venv (torch 2.13.0 CPU, transformers 5.24, llama-cpp-python 0.3.36; not qckpt's test suite):

    python interop/gemma_gguf_roundtrip.py --qckpt-python /work/venv/bin/python [--write]

transformers builds tiny random ``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM`` models (seed 0: 2 layers, hidden 64,
4 query / 2 key-value heads of 16, ``query_pre_attn_scalar`` = head_dim as in the released 2B / 9B / 4B / 12B
models, sliding window 4 so the 8-token batch crosses it; 1-D weights drawn N(0, 0.3) so the norm offset matters).
``qckpt convert DIR T.gguf --to gguf`` stores the norm weights as ``1 + w`` (llama.cpp's convention),
``qckpt dequantize T.gguf BACK`` reads them back as ``w`` and writes a config.json rebuilt from the GGUF keys.
transformers on BACK must give the original logits up to the rounding of ``(w + 1) - 1`` in float32 (figures
printed; a max |dlogit| under 1e-4 and equal argmax pass); llama.cpp's logits on T.gguf are compared too (its own F32
kernels). ``--write`` stores ``interop/results/gemma_gguf_roundtrip.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parent.parent
TOKENS = [[1, 5, 9, 77, 200, 3, 42, 8]]


def qckpt(python: str, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([python, "-m", "converter", *args], check=True, env=env, capture_output=True)


def _model(kind: str):
    torch.manual_seed(0)
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, max_position_embeddings=128,
                  sliding_window=4)
    if kind == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**common))
    else:
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**common))
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.normal_(0, 0.3)
    return model.eval()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qckpt-python", required=True)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    ids = torch.tensor(TOKENS)
    result: dict = {"transformers": transformers.__version__, "tokens": TOKENS, "rows": {}}
    import llama_cpp
    result["llama_cpp"] = llama_cpp.__version__
    for kind in ("gemma2", "gemma3_text"):
        model = _model(kind)
        with torch.no_grad():
            ref = model(ids).logits
        with tempfile.TemporaryDirectory() as tmp:
            src, g, back = Path(tmp) / "hf", Path(tmp) / "t.gguf", Path(tmp) / "back"
            model.save_pretrained(str(src))
            qckpt(args.qckpt_python, "convert", str(src), str(g), "--to", "gguf")
            qckpt(args.qckpt_python, "dequantize", str(g), str(back))
            rt = AutoModelForCausalLM.from_pretrained(str(back), dtype=torch.float32).eval()
            with torch.no_grad():
                out = rt(ids).logits
            llm = llama_cpp.Llama(str(g), logits_all=True, verbose=False, n_ctx=64)
            llm.eval(TOKENS[0])
            lc = torch.tensor(llm.scores[: len(TOKENS[0])])
            result["rows"][kind] = {
                "hf_round_trip": {"class": type(rt).__name__, "max_abs_dlogit": float((out - ref).abs().max()),
                                  "argmax_equal": bool((out.argmax(-1) == ref.argmax(-1)).all())},
                "llama_cpp": {"max_abs_dlogit": float((lc - ref[0]).abs().max()),
                              "argmax_equal": bool((lc.argmax(-1) == ref[0].argmax(-1)).all())}}
    ok = all(r["hf_round_trip"]["max_abs_dlogit"] < 1e-4 and r["hf_round_trip"]["argmax_equal"]
             and r["llama_cpp"]["argmax_equal"] for r in result["rows"].values())
    result["verdict"] = "PASS" if ok else "FAIL"
    print(json.dumps(result, indent=2))
    if args.write:
        (REPO / "interop" / "results" / "gemma_gguf_roundtrip.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
