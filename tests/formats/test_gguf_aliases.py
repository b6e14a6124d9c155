"""GGUF tensors by their llama.cpp names (issue 18 item 17b): ``ckpt["blk.0.attn_q.weight"]`` is the tensor qckpt
names ``encoder.layer.0.attention.self.query.weight``, through the generic ``Checkpoint.aliases``.

The name pairs are llama.cpp's (gguf-py ``tensor_mapping.py``: BERT ``encoder.layer.{bid}.attention.self.query``
-> ``blk.{bid}.attn_q``, ``encoder.layer.{bid}.output.dense`` -> ``blk.{bid}.ffn_down``); the values are
gguf-py's own decode of the file (``gguf.quants.dequantize``, read by llama.cpp name) and the sample's
``reference_dequant.safetensors``.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from safetensors.numpy import load_file

import converter
from converter.errors import MissingTensorError
from tests.conftest import SAMPLES

PATH = SAMPLES / "gguf" / "minilm_llamacpp_Q4_K_M.gguf"
PAIRS = {"blk.0.attn_q.weight": "encoder.layer.0.attention.self.query.weight",
         "blk.0.attn_q.bias": "encoder.layer.0.attention.self.query.bias",
         "blk.0.ffn_down.weight": "encoder.layer.0.output.dense.weight"}


@pytest.mark.parametrize("llama_name", list(PAIRS))
def test_the_llama_cpp_name_looks_up_the_same_tensor(llama_name):
    ckpt = converter.load(PATH)
    hf = PAIRS[llama_name]
    assert llama_name in ckpt and llama_name not in ckpt.names()
    assert ckpt.resolve(llama_name) == hf and ckpt.spec(llama_name) is ckpt.spec(hf)
    t = ckpt[llama_name]
    assert t.name == hf
    ours = t.dequantize()
    rt = next(r for r in gguf.GGUFReader(PATH).tensors if r.name == llama_name)  # gguf-py, by llama.cpp name
    theirs = gguf.quants.dequantize(rt.data, rt.tensor_type).astype(np.float32)
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
    ref = load_file(str(PATH) + ".reference_dequant.safetensors")[hf]
    assert np.array_equal(ours.astype(np.float16), ref.astype(np.float16))


def test_every_gguf_tensor_has_its_llama_cpp_name_and_unknown_names_still_fail():
    ckpt = converter.load(PATH)
    file_names = {r.name for r in gguf.GGUFReader(PATH).tensors}
    assert {ckpt.resolve(n) for n in file_names} == set(ckpt.names())
    with pytest.raises(MissingTensorError) as err:
        ckpt["blk.99.attn_q.weight"]
    assert err.value.tensor == "blk.99.attn_q.weight"
