"""Writes tiny_spm/tokenizer.model: a 300-piece SentencePiece BPE model with byte fallback and identity normalization
(Llama-2 style).

Trained with sentencepiece 0.2.3 (``SentencePieceTrainer``) on the fixed text below, so the model is a real
SentencePiece ``ModelProto``: <unk> (0, UNKNOWN), <s> (1, CONTROL), </s> (2, CONTROL), the 256 byte pieces
<0x00>..<0xFF> (BYTE), then BPE pieces with their scores. Run: python make_tiny_spm.py
"""

import io
from pathlib import Path

import sentencepiece as spm

TEXT = ("The capital of France is Paris. The quick brown fox jumps over the lazy dog.\n"
        "Hello world, hello tokenizer; SentencePiece splits words into pieces.\n") * 40
out = Path(__file__).with_name("tiny_spm")
out.mkdir(exist_ok=True)
model = io.BytesIO()
spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT.splitlines()), model_writer=model, vocab_size=300,
                               model_type="bpe", byte_fallback=True, character_coverage=1.0,
                               unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2, num_threads=1,
                               normalization_rule_name="identity")
(out / "tokenizer.model").write_bytes(model.getvalue())
print(out / "tokenizer.model", len(model.getvalue()))
