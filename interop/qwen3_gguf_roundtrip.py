"""A Qwen3 model -> GGUF -> Hugging Face, both steps by qckpt, loaded by transformers (and llama.cpp if present).

Run in the interop venv (torch 2.13.0 CPU, transformers 5.24; not qckpt's test suite):

    python interop/qwen3_gguf_roundtrip.py --qckpt-python /work/venv/bin/python [--write]

transformers builds a tiny random ``Qwen3ForCausalLM`` (seed 0: 2 layers, 4 query / 2 key-value heads of 32,
per-head q/k RMS norms, untied head) and saves it; ``qckpt convert DIR T.gguf --to gguf`` writes llama.cpp's
``qwen3`` layout (no q/k row permutation, ``attn_q_norm`` / ``attn_k_norm``), ``qckpt dequantize T.gguf BACK``
writes float32 safetensors and a config.json rebuilt from the GGUF keys. ``AutoModelForCausalLM.from_pretrained``
of BACK must give the original logits exactly (float32 all the way). With llama-cpp-python installed, llama.cpp
also loads T.gguf and its logits are compared (llama.cpp's own F32 kernels: close, not bit-exact). ``--write``
stores the figures in ``interop/results/qwen3_gguf_roundtrip.json``.
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
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

REPO = Path(__file__).resolve().parent.parent
TOKENS = [[1, 5, 9, 77, 200, 3, 42, 8]]


def qckpt(python: str, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([python, "-m", "converter", *args], check=True, env=env, capture_output=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qckpt-python", required=True)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, max_position_embeddings=128, tie_word_embeddings=False)
    model = Qwen3ForCausalLM(cfg).eval()
    ids = torch.tensor(TOKENS)
    with torch.no_grad():
        ref = model(ids).logits
    result: dict = {"transformers": transformers.__version__, "tokens": TOKENS}
    with tempfile.TemporaryDirectory() as tmp:
        src, g, back = Path(tmp) / "hf", Path(tmp) / "t.gguf", Path(tmp) / "back"
        model.save_pretrained(str(src))
        qckpt(args.qckpt_python, "convert", str(src), str(g), "--to", "gguf")
        qckpt(args.qckpt_python, "dequantize", str(g), str(back))
        rt = AutoModelForCausalLM.from_pretrained(str(back), dtype=torch.float32).eval()
        with torch.no_grad():
            out = rt(ids).logits
        result["hf_round_trip"] = {"class": type(rt).__name__, "max_abs_dlogit": float((out - ref).abs().max()),
                                   "argmax_equal": bool((out.argmax(-1) == ref.argmax(-1)).all())}
        try:
            import llama_cpp
        except ImportError:
            result["llama_cpp"] = "not installed"
        else:
            llm = llama_cpp.Llama(str(g), logits_all=True, verbose=False, n_ctx=64)
            llm.eval(TOKENS[0])
            lc = torch.tensor(llm.scores[: len(TOKENS[0])])
            result["llama_cpp"] = {"version": llama_cpp.__version__, "max_abs_dlogit": float((lc - ref[0]).abs().max()),
                                   "argmax_equal": bool((lc.argmax(-1) == ref[0].argmax(-1)).all())}
    print(json.dumps(result, indent=2))
    if args.write:
        (REPO / "interop" / "results" / "qwen3_gguf_roundtrip.json").write_text(json.dumps(result, indent=2) + "\n")
    ok = result["hf_round_trip"]["max_abs_dlogit"] == 0.0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
