"""A GGUF that qckpt writes from a Hugging Face folder loads in llama.cpp and generates what the source GGUF does.

Run outside CI, with a python that has llama-cpp-python (0.3.36, built from source; e.g. /work/interop-venv):

    /work/interop-venv/bin/python interop/gguf_from_hf.py --qckpt-python /work/venv/bin/python \
        [--llama-cpp-dir DIR] [--write]

Chain (SmolLM2-135M-Instruct, a real third-party llama.cpp Q4_1 file, ``--source`` / ``$QCKPT_SMOLLM2``):

1. ``qckpt dequantize SRC HF`` -> a Hugging Face folder (F32 weights, config.json, tokenizer.json,
   tokenizer_config.json ... made from the GGUF's key/values);
2. ``qckpt convert HF OUT.gguf --to gguf`` (F32 weights: the dequantized values, bit-exact) and
   ``qckpt convert HF OUT.gguf --to gguf --quant-type Q4_1`` (requantized by llama.cpp's reference rounding);
3. llama.cpp (``llama_cpp.Llama``) loads the source and each output: every ``tokenizer.*`` key read back by
   llama.cpp (``Llama.metadata``), the token ids of a few texts (``Llama.tokenize``, specials parsed), and the
   greedy 20 tokens after ``"The capital of France is"`` (``Llama.generate`` with ``top_k=1``, ``temp=0``; no BOS,
   as the file's ``add_bos_token = false`` says) are compared with the source's;
4. with ``--llama-cpp-dir`` (a llama.cpp source tree: ``convert_hf_to_gguf.py``, ``conversion/``, ``gguf-py/``; run
   with this python, which needs torch + transformers), llama.cpp's own converter makes
   ``convert_hf_to_gguf.py HF --outtype f32`` from the same folder: every key/value (value and GGUF type) and every
   tensor (name, type, bytes) of qckpt's F32 file is compared with it, and its greedy tokens with qckpt's.

With ``--write`` the figures go to ``interop/results/gguf_from_hf.json`` and ``.md``. Verdict PASS when every
output loads, tokenizes like the source, its ``tokenizer.*`` keys read by llama.cpp equal the source's, and (with
``--llama-cpp-dir``) qckpt's F32 file equals llama.cpp's converter output key for key and tensor for tensor with
the same greedy tokens. The greedy tokens against the *source* are recorded with the first differing position:
the source computes Q4_1 x Q8_1 dot products, the F32 file F32 ones, and a requantized file differs from the source
where its types do (``--quant-type Q4_1`` is llama-quantize ``--pure``: ``token_embd`` Q4_1, the source's is Q8_0).
``interop/gguf_types_roundtrip.py`` writes the source's own types (``--gguf-types-from``) and gets its tokens.
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

from gguf_compare import compare_gguf

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(os.environ.get("QCKPT_SMOLLM2", "/work/shared/real/smollm2_135m_instruct_Q4_1.gguf"))
PROMPT = "The capital of France is"
TEXTS = [PROMPT, "<|im_start|>user\nWhat is 2018-01-22 + 12345?<|im_end|>\n", "  héllo   wörld\n\n x 日本語 🤗",
         "I'm sure they'll've <|endoftext|>"]
N_TOKENS = 20


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def _compare_files(ours: Path, theirs: Path) -> dict:
    """Key/values and tensors of two GGUF files (:func:`gguf_compare.compare_gguf`), with the tensor names as one
    flag (this script's recorded form)."""
    d = compare_gguf(ours, theirs)
    return {"keys": d["keys"], "keys_differing": d["keys_differing"], "tensors": d["tensors"],
            "tensor_names_equal": not d["tensor_names_differing"], "tensors_differing": d["tensors_differing"]}


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
    ap.add_argument("--llama-cpp-dir", type=Path, default=None)
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
        reference = None
        if args.llama_cpp_dir is not None:
            theirs = Path(tmp) / "llama_cpp_f32.gguf"
            t0 = time.monotonic()
            subprocess.run([sys.executable, str(args.llama_cpp_dir / "convert_hf_to_gguf.py"), str(hf), "--outtype",
                            "f32", "--outfile", str(theirs)], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            secs["llama.cpp convert_hf_to_gguf f32"] = round(time.monotonic() - t0, 1)
            reference = {"vs_qckpt_f32": _compare_files(outputs["F32"][0], theirs), **_probe(theirs)}
            del reference["metadata"], reference["token_ids"]
            cmp = reference["vs_qckpt_f32"]
            ok = ok and not cmp["keys_differing"] and cmp["tensor_names_equal"] and not cmp["tensors_differing"]
        for name, (path, extra) in outputs.items():
            got = _probe(path)
            differing_keys = sorted(k for k in set(ref["metadata"]) | set(got["metadata"])
                                    if ref["metadata"].get(k) != got["metadata"].get(k))
            same_ids = got["token_ids"] == ref["token_ids"]
            same_greedy = got["greedy_ids"] == ref["greedy_ids"]
            ok = ok and not differing_keys and same_ids
            if name == "F32" and reference is not None:
                reference["same_greedy_as_qckpt_f32"] = got["greedy_ids"] == reference["greedy_ids"]
                ok = ok and reference["same_greedy_as_qckpt_f32"]
            rows.append({"output": name, "qckpt": ["convert", "HF", "OUT.gguf", "--to", "gguf", *extra],
                         "loads": True, "tokenizer_keys_read_by_llama_cpp": len(got["metadata"]),
                         "tokenizer_keys_differing": differing_keys, "same_token_ids": same_ids,
                         "greedy_ids": got["greedy_ids"], "greedy_text": got["greedy_text"],
                         "same_greedy_tokens_as_source": same_greedy,
                         "first_greedy_difference": _first_difference(got["greedy_ids"], ref["greedy_ids"])})
    doc = {"llama_cpp_python": llama_cpp.__version__, "source": str(args.source), "prompt": PROMPT,
           "source_greedy_ids": ref["greedy_ids"], "source_greedy_text": ref["greedy_text"],
           "source_tokenizer_keys": len(ref["metadata"]), "texts": TEXTS, "seconds": secs, "rows": rows,
           "llama_cpp_converter": reference,
           "verdict": "PASS" if ok else "FAIL"}
    print(json.dumps(doc, indent=1, ensure_ascii=False))
    if args.write:
        res = ROOT / "interop" / "results"
        (res / "gguf_from_hf.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
        lines = [f"# GGUF from a Hugging Face folder, loaded by llama.cpp ({doc['verdict']})", "",
                 "Verdict rule and chain: the docstring of `interop/gguf_from_hf.py`.", "",
                 f"llama-cpp-python {doc['llama_cpp_python']}; source `{args.source.name}`; "
                 f"`interop/gguf_from_hf.py` (chain in its docstring).", "",
                 f"Source greedy {N_TOKENS} tokens after {PROMPT!r}: `{ref['greedy_ids']}` = "
                 f"{ref['greedy_text']!r}", "",
                 "| qckpt output | loads | tokenizer.* keys (llama.cpp) | keys differing from the source's | "
                 "token ids of 4 texts | greedy 20 tokens vs the source's |", "|---|---|---|---|---|---|"]
        for r in rows:
            greedy = ("same" if r["same_greedy_tokens_as_source"] else
                      f"first differs at {r['first_greedy_difference']}: {r['greedy_text']!r}")
            lines.append(f"| {r['output']} | {r['loads']} | {r['tokenizer_keys_read_by_llama_cpp']} | "
                         f"{', '.join(r['tokenizer_keys_differing']) or 'none'} | "
                         f"{'same' if r['same_token_ids'] else 'DIFFERENT'} | {greedy} |")
        if reference is not None:
            c = reference["vs_qckpt_f32"]
            lines += ["", "llama.cpp's own `convert_hf_to_gguf.py --outtype f32` on the same folder vs qckpt's F32 "
                      f"file: {c['keys']} key/values, differing: {', '.join(c['keys_differing']) or 'none'}; "
                      f"{c['tensors']} tensors, same names: {c['tensor_names_equal']}, differing (type or bytes): "
                      f"{len(c['tensors_differing'])}; greedy tokens {reference['greedy_text']!r}, same as qckpt's: "
                      f"{reference['same_greedy_as_qckpt_f32']}."]
        lines += ["", f"qckpt seconds: {secs}", ""]
        (res / "gguf_from_hf.md").write_text("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
