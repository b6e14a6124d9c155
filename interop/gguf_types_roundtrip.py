"""A real Q4_1 GGUF -> Hugging Face folder -> GGUF with the source's own per-tensor types: llama.cpp generates the
source's greedy tokens from it.

Run outside CI, with a python that has llama-cpp-python (0.3.36, built from source) and gguf-py (e.g.
/work/interop-venv):

    /work/interop-venv/bin/python interop/gguf_types_roundtrip.py --qckpt-python /work/venv/bin/python [--write]

Chain (SmolLM2-135M-Instruct, a real third-party llama.cpp Q4_1 file: ``token_embd`` Q8_0, 210 Linear weights
Q4_1, 61 F32 norms; ``--source`` / ``$QCKPT_SMOLLM2``):

1. ``qckpt dequantize SRC HF`` -> a Hugging Face folder (F32 weights, config.json, tokenizer files);
2. ``qckpt convert HF OUT.gguf --to gguf --gguf-types-from SRC`` ("types": key/values made from the folder as
   ``convert_hf_to_gguf.py`` makes them) and the same with ``--gguf-metadata SRC`` ("types+metadata": the source's
   key/values);
3. each output against the source, tensor by tensor (gguf-py's reader): same names, same ggml types, and the number
   of blocks whose bytes differ, per type;
4. llama.cpp (``llama_cpp.Llama``, 2 threads) loads the source and each output: the logits of every position of
   each prompt (``logits_all``; max |difference| against the source's) and greedy ``N_TOKENS`` tokens after each of
   ``PROMPTS`` (``Llama.generate``, ``top_k=1``, ``temp=0``, no repeat penalty; no BOS, as the file's
   ``add_bos_token = false`` says);
5. the pure ``--quant-type Q4_1`` path against llama-quantize: qckpt's F32 GGUF of the folder (``convert --to gguf``)
   is quantized by llama.cpp itself (``llama_model_quantize``, ftype MOSTLY_Q4_1, once ``pure`` = llama-quantize
   ``--pure``, once without: llama.cpp's own Q4_1 mix, which keeps the tied head Q8_0 because its 576-wide rows are
   not a multiple of 256) and compared tensor by tensor with ``qckpt convert HF --to gguf --quant-type Q4_1``
   (pure) and with the "types" output (the mix).

Verdict PASS when both outputs have the source's tensor names and types, every block's bytes, every greedy token
and the same logits (max |difference| 0), and qckpt's pure Q4_1 equals llama-quantize ``--pure``'s bytes.
``--write`` stores ``interop/results/gguf_types_roundtrip.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gguf_compare import compare_gguf

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(os.environ.get("QCKPT_SMOLLM2", "/work/shared/real/smollm2_135m_instruct_Q4_1.gguf"))
PROMPTS = ["The capital of France is",
           "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
           "def fibonacci(n):\n"]
N_TOKENS = 32


def _qckpt(python: str, *args: str) -> float:
    t0 = time.monotonic()
    subprocess.run([python, "-m", "converter", *args, "--quiet"], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    return round(time.monotonic() - t0, 1)


def _blocks(ours: Path, theirs: Path) -> dict:
    """Per ggml type of ``theirs``: tensors, blocks, and blocks whose bytes differ in ``ours`` (same name)."""
    import gguf
    a = {t.name: t for t in gguf.GGUFReader(ours).tensors}
    out: dict[str, dict] = {}
    for t in gguf.GGUFReader(theirs).tensors:
        row = out.setdefault(t.tensor_type.name, {"tensors": 0, "blocks": 0, "blocks_differing": 0,
                                                  "tensors_differing": []})
        _, size = gguf.GGML_QUANT_SIZES[t.tensor_type]
        tb = np.asarray(t.data).view(np.uint8).reshape(-1, size)
        mine = a.get(t.name)
        row["tensors"] += 1
        row["blocks"] += tb.shape[0]
        if mine is None or mine.tensor_type != t.tensor_type:
            row["blocks_differing"] += tb.shape[0]
            row["tensors_differing"].append(t.name)
            continue
        n = int((np.asarray(mine.data).view(np.uint8).reshape(-1, size) != tb).any(axis=1).sum())
        if n:
            row["blocks_differing"] += n
            row["tensors_differing"].append(t.name)
    return out


def _probe(path: Path) -> dict:
    """Greedy tokens and per-position logits of every prompt, by llama.cpp."""
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=512, n_threads=2, seed=0, verbose=False, logits_all=True)
    out = {}
    for p in PROMPTS:
        ids = llm.tokenize(p.encode("utf-8"), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
        llm.reset()
        gen: list[int] = []
        for tok in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            gen.append(int(tok))
            if len(gen) == N_TOKENS:
                break
        out[p] = {"prompt_ids": ids, "logits": logits, "greedy_ids": gen,
                  "greedy_text": llm.detokenize(gen).decode("utf-8", "replace")}
    del llm
    return out


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def _llama_quantize(src: Path, dst: Path, *, pure: bool) -> float:
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1)
    params.pure = pure
    params.nthread = 2
    t0 = time.monotonic()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc}")
    return round(time.monotonic() - t0, 1)


def _tensor_compare(ours: Path, theirs: Path) -> dict:
    d = compare_gguf(ours, theirs)
    return {"tensors": d["tensors"], "tensor_names_differing": d["tensor_names_differing"],
            "tensors_differing": d["tensors_differing"], "blocks": _blocks(ours, theirs)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qckpt-python", default=sys.executable)
    ap.add_argument("--source", type=Path, default=SOURCE)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    import llama_cpp
    src = args.source
    secs: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        hf = t / "hf"
        secs["dequantize"] = _qckpt(args.qckpt_python, "dequantize", str(src), str(hf))
        outputs = {"types": (t / "types.gguf", ("--gguf-types-from", str(src))),
                   "types+metadata": (t / "types_meta.gguf", ("--gguf-types-from", str(src), "--gguf-metadata",
                                                              str(src)))}
        for name, (path, extra) in outputs.items():
            secs[f"convert {name}"] = _qckpt(args.qckpt_python, "convert", str(hf), str(path), "--to", "gguf", *extra)
        ref = _probe(src)
        rows = []
        ok = True
        for name, (path, extra) in outputs.items():
            cmp = compare_gguf(path, src)
            blocks = _blocks(path, src)
            got = _probe(path)
            per_prompt = []
            for p in PROMPTS:
                r, g = ref[p], got[p]
                same_ids = r["prompt_ids"] == g["prompt_ids"]
                dl = float(np.max(np.abs(r["logits"] - g["logits"]))) if same_ids else None
                per_prompt.append({"prompt": p, "same_prompt_ids": same_ids, "max_abs_logit_diff": dl,
                                   "greedy_ids": g["greedy_ids"], "greedy_text": g["greedy_text"],
                                   "same_greedy": g["greedy_ids"] == r["greedy_ids"],
                                   "first_greedy_difference": _first_difference(g["greedy_ids"], r["greedy_ids"])})
            row_ok = (not cmp["tensor_names_differing"] and not cmp["tensors_differing"]
                      and all(x["same_greedy"] and x["max_abs_logit_diff"] == 0.0 for x in per_prompt))
            ok = ok and row_ok
            rows.append({"output": name, "qckpt": ["convert", "HF", "OUT.gguf", "--to", "gguf", *[
                "SRC" if e == str(src) else e for e in extra]], "keys_differing_from_source": cmp["keys_differing"],
                "tensors": cmp["tensors"], "tensor_names_differing": cmp["tensor_names_differing"],
                "tensors_differing": cmp["tensors_differing"], "blocks": blocks, "prompts": per_prompt,
                "verdict": "PASS" if row_ok else "FAIL"})
        # the pure --quant-type Q4_1 path and llama.cpp's own Q4_1 mix, against llama-quantize of the same F32 file
        f32 = t / "f32.gguf"
        secs["convert F32"] = _qckpt(args.qckpt_python, "convert", str(hf), str(f32), "--to", "gguf")
        pure = t / "pure_q4_1.gguf"
        secs["convert --quant-type Q4_1"] = _qckpt(args.qckpt_python, "convert", str(hf), str(pure), "--to", "gguf",
                                                   "--quant-type", "Q4_1")
        lq_pure, lq_mix = t / "lq_pure.gguf", t / "lq_mix.gguf"
        secs["llama-quantize Q4_1 --pure"] = _llama_quantize(f32, lq_pure, pure=True)
        secs["llama-quantize Q4_1"] = _llama_quantize(f32, lq_mix, pure=False)
        llama_quantize = {
            "qckpt --quant-type Q4_1 vs llama-quantize --pure Q4_1 (same F32 file)": _tensor_compare(pure, lq_pure),
            "qckpt --gguf-types-from SRC vs llama-quantize Q4_1 (same F32 file)": _tensor_compare(
                outputs["types"][0], lq_mix),
            "llama-quantize Q4_1 of the F32 file vs the source": _tensor_compare(lq_mix, src),
        }
        pure_cmp = next(iter(llama_quantize.values()))
        ok = ok and not pure_cmp["tensor_names_differing"] and not pure_cmp["tensors_differing"]
    source_probe = {p: {"prompt_ids": ref[p]["prompt_ids"], "greedy_ids": ref[p]["greedy_ids"],
                        "greedy_text": ref[p]["greedy_text"]} for p in PROMPTS}
    doc = {"llama_cpp_python": llama_cpp.__version__, "source": str(src), "n_tokens": N_TOKENS,
           "source_greedy": source_probe, "rows": rows, "llama_quantize": llama_quantize, "seconds": secs,
           "verdict": "PASS" if ok else "FAIL"}
    print(json.dumps(doc, indent=1, ensure_ascii=False))
    if args.write:
        _write(doc, src)
    return 0 if ok else 1


def _write(doc: dict, src: Path) -> None:
    res = ROOT / "interop" / "results"
    (res / "gguf_types_roundtrip.json").write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    lines = [f"# A real Q4_1 GGUF through a Hugging Face folder and back with its own types ({doc['verdict']})", "",
             f"llama-cpp-python {doc['llama_cpp_python']}; source `{src.name}`; `interop/gguf_types_roundtrip.py` "
             "(chain and verdict rule in its docstring).", "",
             f"Source greedy {doc['n_tokens']} tokens (llama.cpp):", ""]
    for p, r in doc["source_greedy"].items():
        lines.append(f"- {p!r} -> {r['greedy_text']!r}")
    lines += ["", "| qckpt output | keys differing from the source's | tensors (types or bytes) differing | "
              "blocks differing per type | greedy tokens vs source (3 prompts) | max abs logit diff | verdict |",
              "|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        blocks = "; ".join(f"{k}: {v['blocks_differing']}/{v['blocks']}" for k, v in r["blocks"].items())
        greedy = ", ".join("same" if x["same_greedy"] else f"differs at {x['first_greedy_difference']}"
                           for x in r["prompts"])
        dl = max((x["max_abs_logit_diff"] for x in r["prompts"] if x["max_abs_logit_diff"] is not None), default=None)
        lines.append(f"| `{' '.join(r['qckpt'])}` | {', '.join(r['keys_differing_from_source']) or 'none'} | "
                     f"{len(r['tensors_differing'])} of {r['tensors']} | {blocks} | {greedy} | {dl} | "
                     f"{r['verdict']} |")
    lines += ["", "llama-quantize (`llama_cpp.llama_model_quantize`, ftype MOSTLY_Q4_1) of qckpt's F32 GGUF of the "
              "same folder:", "", "| comparison | tensors | names differing | tensors differing | "
              "blocks differing per type |", "|---|---|---|---|---|"]
    for k, c in doc["llama_quantize"].items():
        blocks = "; ".join(f"{t}: {v['blocks_differing']}/{v['blocks']}" for t, v in c["blocks"].items())
        lines.append(f"| {k} | {c['tensors']} | {len(c['tensor_names_differing'])} | {len(c['tensors_differing'])} "
                     f"| {blocks} |")
    lines += ["", f"Seconds: {doc['seconds']}", ""]
    (res / "gguf_types_roundtrip.md").write_text("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
