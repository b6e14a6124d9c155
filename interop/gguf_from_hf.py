"""A GGUF that qckpt writes from a Hugging Face folder loads in llama.cpp and generates what the source GGUF does.

Run outside CI, with a python that has llama-cpp-python (0.3.36, built from source; e.g. /work/interop-venv):

    /work/interop-venv/bin/python interop/gguf_from_hf.py --qckpt-python /work/venv/bin/python [--write]

Chain (SmolLM2-135M-Instruct, a real third-party llama.cpp Q4_1 file, ``--source`` / ``$QCKPT_SMOLLM2``):

1. ``qckpt dequantize SRC HF`` -> a Hugging Face folder (F32 weights, config.json, tokenizer.json,
   tokenizer_config.json ... made from the GGUF's key/values);
2. ``qckpt convert HF OUT.gguf --to gguf`` (F32 weights: the dequantized values, bit-exact) and
   ``qckpt convert HF OUT.gguf --to gguf --quant-type Q4_1`` (requantized by llama.cpp's reference rounding);
3. llama.cpp (``llama_cpp.Llama``) loads the source and each output: every ``tokenizer.*`` key read back by
   llama.cpp (``Llama.metadata``), the token ids of a few texts (``Llama.tokenize``, specials parsed), and the
   greedy 20 tokens after ``"The capital of France is"`` (``Llama.generate`` with ``top_k=1``, ``temp=0``; no BOS,
   as the file's ``add_bos_token = false`` says) are compared with the source's.

With ``--write`` the figures go to ``interop/results/gguf_from_hf.json`` and ``.md``. Exit status 0 when every
output loads, tokenizes like the source and its metadata keys equal the source's; a greedy-token difference is
recorded (the F32 file computes in F32, not with Q4_1 x Q8_1 dot products, so equal tokens are expected but not
guaranteed) and also gives exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(os.environ.get("QCKPT_SMOLLM2", "/work/shared/real/smollm2_135m_instruct_Q4_1.gguf"))
PROMPT = "The capital of France is"
TEXTS = [PROMPT, "<|im_start|>user\nWhat is 2018-01-22 + 12345?<|im_end|>\n", "  héllo   wörld\n\n x 日本語 🤗",
         "I'm sure they'll've <|endoftext|>"]
N_TOKENS = 20


def _qckpt(python: str, *args: str) -> float:
    t0 = time.monotonic()
    subprocess.run([python, "-m", "converter", *args], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    return round(time.monotonic() - t0, 1)


def _probe(path: Path) -> dict:
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=256, n_threads=2, seed=0, verbose=False, logits_all=False)
    meta = {k: v for k, v in llm.metadata.items() if k.startswith("tokenizer.")}
    ids = {t: llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in TEXTS}
    prompt = ids[PROMPT]
    out: list[int] = []
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        out.append(int(tok))
        if len(out) == N_TOKENS:
            break
    text = llm.detokenize(out).decode("utf-8", "replace")
    del llm
    return {"metadata": meta, "token_ids": ids, "greedy_ids": out, "greedy_text": text}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qckpt-python", default=sys.executable)
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    import llama_cpp
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        secs = {"dequantize": _qckpt(args.qckpt_python, "dequantize", str(args.source), str(hf))}
        outputs = {"F32": (Path(tmp) / "f32.gguf", ()), "Q4_1": (Path(tmp) / "q4_1.gguf", ("--quant-type", "Q4_1"))}
        for name, (path, extra) in outputs.items():
            secs[f"convert {name}"] = _qckpt(args.qckpt_python, "convert", str(hf), str(path), "--to", "gguf", *extra)
        ref = _probe(args.source)
        for name, (path, extra) in outputs.items():
            got = _probe(path)
            differing_keys = sorted(k for k in set(ref["metadata"]) | set(got["metadata"])
                                    if ref["metadata"].get(k) != got["metadata"].get(k))
            same_ids = got["token_ids"] == ref["token_ids"]
            same_greedy = got["greedy_ids"] == ref["greedy_ids"]
            ok = ok and not differing_keys and same_ids and same_greedy
            rows.append({"output": name, "qckpt": ["convert", "HF", "OUT.gguf", "--to", "gguf", *extra],
                         "loads": True, "tokenizer_keys_read_by_llama_cpp": len(got["metadata"]),
                         "tokenizer_keys_differing": differing_keys, "same_token_ids": same_ids,
                         "greedy_ids": got["greedy_ids"], "greedy_text": got["greedy_text"],
                         "same_greedy_tokens": same_greedy})
    doc = {"llama_cpp_python": llama_cpp.__version__, "source": str(args.source), "prompt": PROMPT,
           "source_greedy_ids": ref["greedy_ids"], "source_greedy_text": ref["greedy_text"],
           "source_tokenizer_keys": len(ref["metadata"]), "texts": TEXTS, "seconds": secs, "rows": rows,
           "verdict": "PASS" if ok else "FAIL"}
    print(json.dumps(doc, indent=1, ensure_ascii=False))
    if args.write:
        res = ROOT / "interop" / "results"
        (res / "gguf_from_hf.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        lines = [f"# GGUF from a Hugging Face folder, loaded by llama.cpp ({doc['verdict']})", "",
                 f"llama-cpp-python {doc['llama_cpp_python']}; source `{args.source.name}`; "
                 f"`interop/gguf_from_hf.py` (chain in its docstring).", "",
                 f"Source greedy {N_TOKENS} tokens after {PROMPT!r}: `{ref['greedy_ids']}` = "
                 f"{ref['greedy_text']!r}", "",
                 "| output | loads | tokenizer.* keys (llama.cpp) | keys differing | token ids of 4 texts | "
                 "greedy 20 tokens |", "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['output']} | {r['loads']} | {r['tokenizer_keys_read_by_llama_cpp']} | "
                         f"{', '.join(r['tokenizer_keys_differing']) or 'none'} | "
                         f"{'same' if r['same_token_ids'] else 'DIFFERENT'} | "
                         f"{'same' if r['same_greedy_tokens'] else 'DIFFERENT: ' + repr(r['greedy_text'])} |")
        lines += ["", f"qckpt seconds: {secs}", ""]
        (res / "gguf_from_hf.md").write_text("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
