"""K-quant tensors decode in row chunks (the unpacking temporaries of a 32000 x 4096 head were ~0.5 GB at once):
the fields and values are the same whatever the chunk, and equal to gguf-py's decode of the shipped
llama-quantize file."""

from __future__ import annotations

import gguf
import numpy as np

from converter.formats.gguf import block_kquants
from converter.formats.registry import load
from tests.conftest import SAMPLES

Q4_K_M = SAMPLES / "gguf" / "minilm_llamacpp_Q4_K_M.gguf"


def test_chunked_decode_equals_whole_and_gguf_py(monkeypatch):
    reader = gguf.GGUFReader(Q4_K_M)
    kq = [t for t in reader.tensors if t.tensor_type.name.endswith("_K")]
    assert kq
    whole = {}
    ckpt = load(Q4_K_M)
    for t in kq:
        name = next(n for n, g in ckpt.metadata["gguf_names"].items() if g == t.name)
        whole[t.name] = ckpt[name].dequantize()
        ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(whole[t.name].shape)
        assert np.array_equal(whole[t.name], ref)
    monkeypatch.setattr(block_kquants, "DECODE_CHUNK_SUPER_BLOCKS", 7)  # one row (6 super-blocks) per chunk
    ckpt = load(Q4_K_M)
    for t in kq:
        name = next(n for n, g in ckpt.metadata["gguf_names"].items() if g == t.name)
        assert np.array_equal(ckpt[name].dequantize(), whole[t.name])
