"""Prints the expected values used by tests/formats/test_gguf_hf_*.py, computed by transformers' own
GGUF integration (not by qckpt). Run in an environment with transformers 5.24.0, tokenizers 0.23.3,
gguf 0.19.0, torch 2.13 (CPU):

    python record_expected.py smollm2_vocab_tiny.gguf [qwen2_kv.gguf]

- AutoTokenizer.from_pretrained(dir, gguf_file=name): ids of STRINGS, the chat template applied to
  MESSAGES (text and ids), decode of DECODE_IDS, special tokens;
- AutoConfig.from_pretrained(dir, gguf_file=name): the config fields qckpt writes;
- when llama-cpp-python is installed (0.3.36 was used), llama.cpp's own ids for STRINGS + LLAMA_CPP_ONLY.
"""

import json
import sys
from pathlib import Path

import transformers
from transformers import AutoConfig, AutoTokenizer

STRINGS = ["The capital of France is", "Hello, we can use", "2018-01-22 12345", "  hello   world\n\n x",
           "héllo wörld 日本語 🤗", "<|im_start|>user\nhi<|im_end|>", "I'm sure they'll've",
           "\t\ttabs\r\nCRLF  ", "", "<|endoftext|><jupyter_code>print(1)"]
MESSAGES = [{"role": "user", "content": "What is 2+2?"}]
DECODE_IDS = [504, 3575, 282, 4649, 314, 7042, 30, 198, 198]
LLAMA_CPP_ONLY = ["x  1", "a  12"]  # runs of spaces before a digit: transformers has no 'smollm' digit split
FIELDS = ["model_type", "architectures", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
          "vocab_size", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "rope_parameters",
          "attention_bias", "mlp_bias", "hidden_act"]

print("transformers", transformers.__version__)
for arg in sys.argv[1:]:
    path = Path(arg).resolve()
    cfg = AutoConfig.from_pretrained(path.parent, gguf_file=path.name).to_dict()
    print(path.name, "config", json.dumps({k: cfg.get(k) for k in FIELDS}))
    try:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    except Exception as exc:  # noqa: BLE001 - a kv-only file has no tokenizer
        print(path.name, "tokenizer", repr(exc)[:200])
        continue
    print(path.name, "ids", json.dumps({s: tok(s)["input_ids"] for s in STRINGS}, ensure_ascii=False))
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tok.apply_chat_template(MESSAGES, tokenize=True, add_generation_prompt=True)["input_ids"]
    print(path.name, "chat", json.dumps(text), json.dumps(ids))
    print(path.name, "decode", json.dumps(tok.decode(DECODE_IDS)))
    print(path.name, "special", json.dumps({k: getattr(tok, k) for k in ("bos_token", "eos_token", "pad_token",
                                                                         "unk_token")}))
    try:
        import llama_cpp
    except ImportError:
        continue
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    print(path.name, "llama.cpp", json.dumps({s: llm.tokenize(s.encode("utf-8"), add_bos=True, special=True)
                                             for s in STRINGS + LLAMA_CPP_ONLY}, ensure_ascii=False))
