"""qckpt's GGUF of tiny synthetic Hugging Face decoders vs llama.cpp's own converter, and llama.cpp loading it.

Run outside CI, with a python that has torch, transformers and llama-cpp-python (e.g. /work/interop-venv), and a
llama.cpp source tree (``convert_hf_to_gguf.py``, ``conversion/``, ``gguf-py/``; the ``vendor/llama.cpp`` folder of
the llama-cpp-python 0.3.36 sdist):

    /work/interop-venv/bin/python interop/gguf_from_hf_archs.py --qckpt-python /work/venv/bin/python \\
        --llama-cpp-dir DIR [--write]

For each of llama, mistral, qwen2, qwen3, phi3, qwen2_moe, qwen3_moe (4 experts of 32, 2 used; per-expert weights
stacked): a folder with the seeded tensors and config.json of ``tests/formats/_gguf_arch_data.py`` (2 layers,
hidden 64, 4 / 2 heads of 16); gemma2 / gemma3_text / deepseek_v2 are made by transformers
(``TRANSFORMERS_ARCHS``); and a tokenizer: the SmolLM2 byte-level BPE files qckpt makes from
``tests/data/gguf/smollm2_vocab_tiny.gguf`` (49152 tokens) for llama / mistral / qwen3 / the MoE models, the
SentencePiece ``tests/data/spm/tiny_spm/tokenizer.model`` (300 pieces) for qwen2 and phi3
(llama.cpp's Phi3 converter requires a tokenizer.model; for a qwen2 ``model_type`` transformers 5 builds its own
Qwen2 pre-tokenizer, whose hash llama.cpp does not know). Then ``convert_hf_to_gguf.py DIR --outtype f32`` and
``qckpt convert DIR OUT --to gguf``: every key/value (value and GGUF type) and tensor (name, type, bytes) compared;
llama.cpp loads qckpt's file and both files' greedy 8 tokens after the ids of "The capital" are compared.
``--write`` stores ``interop/results/gguf_from_hf_archs.json`` / ``.md``. Exit 0 when every row is identical (a file
llama.cpp refuses counts as identical only when it refuses llama.cpp's converter output with the same message: the
tiny phi3 with its 300-piece SentencePiece vocabulary is refused that way, "error loading model vocabulary:
unordered_map::at").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf_compare import compare_gguf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ARCHS = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
         "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
         "qwen3_moe": "Qwen3MoeForCausalLM"}
SPM = ("qwen2", "phi3")
#: made by transformers (random weights, seed 0, 1-D weights drawn N(0, 0.3) so Gemma's norm offset is visible):
#: 2 layers, hidden 64, intermediate 96, 4 heads; Gemma 2 kv heads of 16, sliding window 128, the SentencePiece
#: test vocabulary (300 pieces); DeepSeek-V2 MLA (q_lora_rank 24, kv_lora_rank 32, rope 8, nope 16, v 16; llama.cpp
#: 0.3.36 requires q_lora_rank unless the model has 26 / 27 layers), 4 routed experts of 32 (2 used), 1 shared,
#: the first layer dense, the SmolLM2 byte-level BPE vocabulary (49152); DeepSeek-V3 the same with 2 expert groups,
#: routed scaling 2.5, top-k normalised and a random router score correction (exp_probs_b)
TRANSFORMERS_ARCHS = {"gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                      "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}


def _folder(base: Path, model_type: str, bpe: Path) -> Path:
    from safetensors.numpy import save_file
    from tests.formats._gguf_arch_data import _config, _tensors
    d = base / model_type
    d.mkdir()
    vocab = 300 if model_type in SPM else 49152
    rng = np.random.default_rng(1)
    t = {k: (0.05 * v if v.ndim == 2 else np.ones_like(v)).astype(np.float32) for k, v in _tensors(model_type).items()}
    t["model.embed_tokens.weight"] = (0.02 * rng.standard_normal((vocab, 64))).astype(np.float32)
    t["lm_head.weight"] = (0.02 * rng.standard_normal((vocab, 64))).astype(np.float32)
    save_file(t, str(d / "model.safetensors"))
    cfg = {**_config(model_type), "vocab_size": vocab, "architectures": [ARCHS[model_type]]}
    if model_type == "phi3":
        cfg["rope_scaling"] = None
    if model_type in SPM:
        cfg.update(bos_token_id=1, eos_token_id=2)
        shutil.copy(ROOT / "tests" / "data" / "spm" / "tiny_spm" / "tokenizer.model", d / "tokenizer.model")
        (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer",
                                                             "add_bos_token": True, "bos_token": "<s>",
                                                             "eos_token": "</s>"}))
    else:
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(bpe / f, d / f)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _transformers_folder(base: Path, model_type: str, bpe: Path) -> Path:
    import torch
    import transformers
    torch.manual_seed(0)
    d = base / model_type
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    if model_type == "gemma2":
        model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**common, sliding_window=128))
    elif model_type == "gemma3_text":
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**common, sliding_window=128))
    else:
        common.pop("head_dim")
        common.update(num_key_value_heads=4, vocab_size=49152, q_lora_rank=24, kv_lora_rank=32, qk_rope_head_dim=8,
                      qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                      moe_intermediate_size=32, first_k_dense_replace=1, topk_group=1)
        if model_type == "deepseek_v2":
            model = transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(
                **common, n_group=1, routed_scaling_factor=1.0, norm_topk_prob=False))
        else:
            model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
                **common, n_group=2, routed_scaling_factor=2.5, norm_topk_prob=True))
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.normal_(0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(0, 0.1)
    model.save_pretrained(d)
    if model_type.startswith("deepseek"):
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(bpe / f, d / f)
    else:
        shutil.copy(ROOT / "tests" / "data" / "spm" / "tiny_spm" / "tokenizer.model", d / "tokenizer.model")
        (d / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer",
                                                             "add_bos_token": True, "bos_token": "<s>",
                                                             "eos_token": "</s>"}))
    return d


def _greedy(path: Path) -> list[int] | str:
    """Greedy 8 token ids, or ``"refused: ..."`` when llama.cpp does not load the file."""
    from llama_cpp import Llama
    try:
        llm = Llama(model_path=str(path), n_ctx=64, n_threads=2, seed=0, verbose=False)
    except ValueError as exc:  # llama-cpp-python's "Failed to load model from file"
        return f"refused: {exc}".replace(str(path), path.name)
    prompt = llm.tokenize(b"The capital", add_bos=False, special=False)
    out: list[int] = []
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
        out.append(int(tok))
        if len(out) == 8:
            break
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qckpt-python", default=sys.executable)
    ap.add_argument("--llama-cpp-dir", type=Path, required=True)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        bpe = base / "bpe"
        subprocess.run([args.qckpt_python, "-m", "converter", "dequantize",
                        str(ROOT / "tests" / "data" / "gguf" / "smollm2_vocab_tiny.gguf"), str(bpe)],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        for model_type in [*ARCHS, *TRANSFORMERS_ARCHS]:
            d = _folder(base, model_type, bpe) if model_type in ARCHS else _transformers_folder(base, model_type, bpe)
            ours, theirs = base / f"{model_type}.gguf", base / "llama_cpp" / f"{model_type}.gguf"
            theirs.parent.mkdir(exist_ok=True)
            subprocess.run([args.qckpt_python, "-m", "converter", "convert", str(d), str(ours), "--to", "gguf"],
                           check=True, env=env, stdout=subprocess.DEVNULL)
            subprocess.run([sys.executable, str(args.llama_cpp_dir / "convert_hf_to_gguf.py"), str(d), "--outtype",
                            "f32", "--outfile", str(theirs)], check=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            row = {"model_type": model_type, **compare_gguf(ours, theirs)}
            row["greedy_qckpt"], row["greedy_llama_cpp_converter"] = _greedy(ours), _greedy(theirs)
            same_greedy = row["greedy_qckpt"] == row["greedy_llama_cpp_converter"]
            row["identical"] = (not row["keys_differing"] and not row["tensor_names_differing"]
                                and not row["tensors_differing"] and same_greedy)
            rows.append(row)
    import llama_cpp
    doc = {"llama_cpp_python": llama_cpp.__version__, "rows": rows,
           "verdict": "PASS" if all(r["identical"] for r in rows) else "FAIL"}
    print(json.dumps(doc, indent=1))
    if args.write:
        res = ROOT / "interop" / "results"
        (res / "gguf_from_hf_archs.json").write_text(json.dumps(doc, indent=1) + "\n")
        lines = [f"# qckpt GGUF vs llama.cpp's convert_hf_to_gguf.py, tiny synthetic decoders ({doc['verdict']})", "",
                 f"llama-cpp-python {doc['llama_cpp_python']}; `interop/gguf_from_hf_archs.py` (inputs in its "
                 "docstring).", "",
                 "| model_type | key/values | differing | tensors | differing (names, type or bytes) | greedy 8 tokens "
                 "(llama.cpp) |", "|---|---|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['model_type']} | {r['keys']} | {', '.join(r['keys_differing']) or 'none'} | "
                         f"{r['tensors']} | {len(r['tensor_names_differing']) + len(r['tensors_differing'])} | "
                         f"{'same' if r['greedy_qckpt'] == r['greedy_llama_cpp_converter'] else 'DIFFERENT'} "
                         f"`{r['greedy_qckpt']}` |")
        (res / "gguf_from_hf_archs.md").write_text("\n".join(lines) + "\n")
    return 0 if doc["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
