"""Shared inputs of the GGUF -> Hugging Face tests: the SmolLM2 vocabulary fixture, read once.

``tests/data/gguf/smollm2_vocab_tiny.gguf`` (see tests/data/gguf/README.md) holds the real
SmolLM2-135M-Instruct key/values; gguf-py's GGUFReader needs seconds to parse its 49152 tokens and
48900 merges, so every test module shares one read.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "gguf"
FIXTURE = DATA / "smollm2_vocab_tiny.gguf"
REAL = Path("/work/shared/real/smollm2_135m_instruct_Q4_1.gguf")
"""The real 98 MB file (only in the project's shared folder; tests using it skip without it)."""


@lru_cache(maxsize=None)
def fixture_checkpoint():
    from converter.formats.registry import load
    return load(FIXTURE)


@lru_cache(maxsize=None)
def real_checkpoint():
    from converter.formats.registry import load
    return load(REAL)


def write_tiny_llama(path: Path, *, add_bos: bool = True, merges: tuple[str, ...] = ("Ġ t", "h e", "t he")) -> Path:
    """A complete one-block LLaMA GGUF small enough to read in milliseconds (gguf-py ``GGUFWriter``).

    Hyperparameters (by hand): hidden 64, 4 heads / 2 kv heads of 16, feed-forward 128, context 256,
    rope freq_base 50000, rms eps 1e-5, tied head (no output.weight). Vocabulary: GPT-2 byte-level, the
    256 byte symbols (ids 0..255 in ``bytes_to_unicode`` order), then ``Ġt`` (256), ``he`` (257),
    ``the`` (258) from merges ``Ġ t``, ``h e``, ``t he``; control tokens ``<s>`` (259), ``</s>`` (260);
    bos 259, eos 260, ``add_bos_token`` as given, pre ``gpt-2``. Weights: seeded normal values.
    """
    import gguf
    import numpy as np

    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    byte_syms, n = [], 0
    for b in range(256):
        byte_syms.append(chr(b) if b in keep else chr(256 + n))
        n += b not in keep
    tokens = byte_syms + ["Ġt", "he", "the", "<s>", "</s>"]
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny llama")
    for key, value in (("block_count", 1), ("context_length", 256), ("embedding_length", 64),
                       ("feed_forward_length", 128), ("attention.head_count", 4), ("attention.head_count_kv", 2),
                       ("vocab_size", len(tokens)), ("rope.dimension_count", 16)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.rope.freq_base", 50000.0)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 259 + [3, 3])
    w.add_token_merges(list(merges))
    w.add_bos_token_id(259)
    w.add_eos_token_id(260)
    w.add_add_bos_token(add_bos)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)  # as llama.cpp writes them (and qckpt's GGUF writer keeps)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    rng = np.random.default_rng(7)
    q8, q4 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0
    w.add_tensor("token_embd.weight", (0.1 * rng.standard_normal((len(tokens), 64))).astype(np.float16))
    for name, shape, qt in (("attn_q", (64, 64), q8), ("attn_k", (32, 64), q8), ("attn_v", (32, 64), q4),
                            ("attn_output", (64, 64), q4), ("ffn_gate", (128, 64), q4), ("ffn_up", (128, 64), q4),
                            ("ffn_down", (64, 128), q8)):
        values = (0.1 * rng.standard_normal(shape)).astype(np.float32)
        w.add_tensor(f"blk.0.{name}.weight", gguf.quants.quantize(values, qt), raw_dtype=qt)
    for name in ("blk.0.attn_norm", "blk.0.ffn_norm", "output_norm"):
        w.add_tensor(f"{name}.weight", (1 + 0.1 * rng.standard_normal(64)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
