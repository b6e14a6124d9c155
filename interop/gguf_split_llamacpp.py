"""llama.cpp loads a split GGUF written by qckpt (``--max-shard-size`` with a GGUF target) from its first part and
generates the same greedy tokens as the unsplit file.

Run outside CI, with a python that has llama-cpp-python (e.g. /work/interop-venv):

    /work/interop-venv/bin/python interop/gguf_split_llamacpp.py --qckpt-python /work/venv/bin/python \\
        [--source ../shared/real/smollm2_135m_instruct_Q4_1.gguf] [--write]

Rows:
- the real third-party SmolLM2-135M-Instruct Q4_1 GGUF (llama.cpp's converter + llama-quantize), repacked by
  ``qckpt convert SRC OUT.gguf --to gguf --max-shard-size 30MB`` (exact: the source's blocks carried) and with
  ``--max-shard-tensors 100``;
- ``tests/formats/_gguf_arch_data.py``'s tiny llama folder with the SmolLM2 byte-level BPE tokenizer (as
  ``interop/gguf_from_hf_archs.py`` builds it), written unsplit and with ``--max-shard-size 100KB``.

For each: the parts' names and ``split.*`` keys, the unsplit file's and the first part's greedy 16 tokens after
"The capital of France is" (llama.cpp, temperature 0), and the token ids of the prompt. ``--write`` stores
``interop/results/gguf_split_llamacpp.json`` / ``.md``. Exit 0 when every row's tokens are equal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PROMPT = b"The capital of France is"


def _greedy(path: Path) -> dict:
    from llama_cpp import Llama
    llm = Llama(model_path=str(path), n_ctx=128, n_threads=2, seed=0, verbose=False)
    prompt = llm.tokenize(PROMPT, add_bos=True, special=False)
    out: list[int] = []
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        out.append(int(tok))
        if len(out) == 16 or tok == llm.token_eos():
            break
    return {"prompt_ids": list(prompt), "greedy": out, "text": llm.detokenize(out).decode("utf-8", "replace")}


def _split_keys(path: Path) -> dict:
    import gguf
    r = gguf.GGUFReader(path)
    return {"keys": len([k for k in r.fields if not k.startswith("GGUF.")]), "tensors": len(r.tensors),
            **{k: r.fields[k].contents() for k in ("split.no", "split.count", "split.tensors.count") if k in r.fields}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qckpt-python", default=sys.executable)
    ap.add_argument("--source", type=Path, default=ROOT.parent / "shared" / "real" / "smollm2_135m_instruct_Q4_1.gguf")
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def qckpt(*a):
        subprocess.run([args.qckpt_python, "-m", "converter", *map(str, a), "--quiet"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        from gguf_from_hf_archs import _folder
        bpe = base / "bpe"
        qckpt("dequantize", ROOT / "tests" / "data" / "gguf" / "smollm2_vocab_tiny.gguf", bpe)
        tiny = _folder(base, "llama", bpe)
        whole_tiny = base / "tiny.gguf"
        qckpt("convert", tiny, whole_tiny, "--to", "gguf")
        cases = [("smollm2-135m Q4_1 (real), --max-shard-size 30MB", args.source, ("--max-shard-size", "30MB")),
                 ("smollm2-135m Q4_1 (real), --max-shard-tensors 100", args.source, ("--max-shard-tensors", "100")),
                 ("tiny llama from a Hugging Face folder, --max-shard-size 100KB", whole_tiny,
                  ("--max-shard-size", "100KB"))]
        for i, (label, whole, opts) in enumerate(cases):
            src = tiny if whole == whole_tiny else whole
            out = base / f"split{i}" / "model.gguf"
            qckpt("convert", src, out, "--to", "gguf", *opts)
            parts = sorted(out.parent.glob("model-*.gguf"))
            a, b = _greedy(whole), _greedy(parts[0])
            rows.append({"case": label, "parts": [p.name for p in parts],
                         "part_keys": [_split_keys(p) for p in parts], "unsplit": a, "first_part": b,
                         "identical": len(parts) >= 2 and a == b})
    import llama_cpp
    doc = {"llama_cpp_python": llama_cpp.__version__, "prompt": PROMPT.decode(), "rows": rows,
           "verdict": "PASS" if all(r["identical"] for r in rows) else "FAIL"}
    print(json.dumps(doc, indent=1))
    if args.write:
        res = ROOT / "interop" / "results"
        (res / "gguf_split_llamacpp.json").write_text(json.dumps(doc, indent=1) + "\n")
        lines = [f"# llama.cpp loads qckpt's split GGUFs from the first part ({doc['verdict']})", "",
                 f"llama-cpp-python {doc['llama_cpp_python']}; `interop/gguf_split_llamacpp.py` (inputs in its "
                 f"docstring); prompt {doc['prompt']!r}, greedy 16 tokens.", "",
                 "| case | parts | tensors per part | greedy tokens, unsplit vs first part |", "|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['case']} | {len(r['parts'])} | {[k['tensors'] for k in r['part_keys']]} | "
                         f"{'same' if r['unsplit'] == r['first_part'] else 'DIFFERENT'} `{r['first_part']['greedy']}`"
                         f" {r['first_part']['text']!r} |")
        (res / "gguf_split_llamacpp.md").write_text("\n".join(lines) + "\n")
    return 0 if doc["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
