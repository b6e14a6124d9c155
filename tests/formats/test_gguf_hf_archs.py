"""GGUF written from tiny synthetic Hugging Face decoders per architecture (names, shapes, q/k rows, keys).

Expected names: gguf-py 0.19's own tables (``gguf.get_tensor_name_map(arch, n_blocks).get_name(hf_name)`` and
``MODEL_TENSORS[arch]``), i.e. what ``convert_hf_to_gguf.py`` names them. Expected keys: by hand from the config
and ``convert_hf_to_gguf.py`` (``TextModel`` / ``LlamaModel`` / ``Qwen2Model`` / ``Phi3MiniModel``
``set_gguf_parameters``; llama.cpp as vendored by llama-cpp-python 0.3.36). Shapes: GGUF ``ne`` is the reversed
numpy shape.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from converter.cli import main
from converter.formats.gguf.names import ARCH_TABLES, HF_MODEL_TYPE_TO_ARCH

from ._gguf_arch_data import HEAD_DIM, HEADS, HIDDEN, KV_HEADS, LAYERS, _config, _tensors

def _write(tmp_path: Path, model_type: str) -> Path:
    folder = tmp_path / model_type
    folder.mkdir()
    save_file(_tensors(model_type), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(_config(model_type)))
    return folder


def _convert(folder: Path, out: Path) -> gguf.GGUFReader:
    res = CliRunner().invoke(main, ["convert", str(folder), str(out), "--to", "gguf"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return gguf.GGUFReader(out)


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "phi3"])
def test_names_and_shapes_are_gguf_pys(model_type, tmp_path):
    arch = HF_MODEL_TYPE_TO_ARCH[model_type]
    src = _tensors(model_type)
    reader = _convert(_write(tmp_path, model_type), tmp_path / "out.gguf")
    assert reader.fields["general.architecture"].contents() == arch
    arch_enum = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
    name_map = gguf.get_tensor_name_map(arch_enum, LAYERS)
    allowed = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[arch_enum] for i in range(LAYERS)}
    got = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    expected = {}
    for hf, a in src.items():
        stem, suffix = hf.rsplit(".", 1)
        g = name_map.get_name(stem)
        assert g in allowed, (hf, g)
        expected[f"{g}.{suffix}"] = list(reversed(a.shape))
    assert got == expected


@pytest.mark.parametrize("model_type, permuted", [("llama", True), ("qwen2", False), ("qwen3", False)])
def test_q_k_rows(model_type, permuted, tmp_path):
    """llama: LlamaModel.permute (rows as (heads, 2, head_dim/2), inner axes swapped; k with the kv heads);
    Qwen2Model / Qwen3Model leave q and k as they are."""
    src = _tensors(model_type)
    reader = _convert(_write(tmp_path, model_type), tmp_path / "out.gguf")
    data = {t.name: np.asarray(t.data) for t in reader.tensors}
    for x, n in (("q", HEADS), ("k", KV_HEADS)):
        w = src[f"model.layers.1.self_attn.{x}_proj.weight"]
        want = w.reshape(n, 2, HEAD_DIM // 2, HIDDEN).swapaxes(1, 2).reshape(w.shape) if permuted else w
        np.testing.assert_array_equal(data[f"blk.1.attn_{x}.weight"], want)


def _kv(reader: gguf.GGUFReader, arch: str) -> dict:
    return {k[len(arch) + 1:]: f.contents() for k, f in reader.fields.items() if k.startswith(arch + ".")}


def test_qwen3_keys(tmp_path):
    kv = _kv(_convert(_write(tmp_path, "qwen3"), tmp_path / "out.gguf"), "qwen3")
    assert kv == {"block_count": 2, "context_length": 512, "embedding_length": 64, "feed_forward_length": 96,
                  "attention.head_count": 4, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon":
                  pytest.approx(1e-6, rel=1e-7), "vocab_size": 40, "attention.key_length": 16,
                  "attention.value_length": 16, "rope.freq_base": 1000000.0}  # no sliding window (TextModel)


def test_llama_keys(tmp_path):
    kv = _kv(_convert(_write(tmp_path, "mistral"), tmp_path / "out.gguf"), "llama")
    assert kv["rope.dimension_count"] == 16 and "attention.sliding_window" not in kv
    # no head_dim in config.json: transformers' LlamaConfig fills hidden / heads = 16, which convert_hf_to_gguf.py
    # writes (llama.cpp's converter on this folder: key_length 16, value_length 16)
    assert kv["attention.key_length"] == kv["attention.value_length"] == 16 and kv["vocab_size"] == 40


def test_phi3_keys(tmp_path):
    kv = _kv(_convert(_write(tmp_path, "phi3"), tmp_path / "out.gguf"), "phi3")
    assert kv == {"block_count": 2, "context_length": 512, "embedding_length": 64, "feed_forward_length": 96,
                  "attention.head_count": 4, "attention.head_count_kv": 2, "attention.layer_norm_rms_epsilon":
                  pytest.approx(1e-6, rel=1e-7), "rope.freq_base": 1000000.0, "attention.sliding_window": 0,
                  "rope.dimension_count": 16, "rope.scaling.original_context_length": 256}


def test_tables_agree_with_gguf_py():
    """Every (GGUF, Hugging Face) pair of the decoder tables is one gguf-py's TensorNameMap gives."""
    for arch in ("llama", "qwen2", "qwen3", "phi3"):
        arch_enum = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch)
        name_map = gguf.get_tensor_name_map(arch_enum, 3)
        for g, h in ARCH_TABLES[arch]:
            assert name_map.get_name(h.format(bid=2)) == g.format(bid=2), (arch, h)


def test_general_keys(tmp_path):
    """ModelBase.prepare_metadata: general.type 'model', a name (from the folder here: no model card), and the size
    label of the parameter count: qwen3 tiny = 2 x 64 embed / head rows of 40 (5120) + norm 64 + per layer
    (2 norms 128, o 4096, q 4096, k 2048, v 2048, gate / up / down 3 x 6144, q/k norms 32 = 30880) x 2 = 66944
    -> '67K'."""
    reader = _convert(_write(tmp_path, "qwen3"), tmp_path / "out.gguf")
    kv = {k: f.contents() for k, f in reader.fields.items() if k.startswith("general.")}
    assert kv["general.type"] == "model" and kv["general.size_label"] == "67K"
    assert isinstance(kv["general.name"], str) and kv["general.name"]
    assert kv["general.file_type"] == 0  # ALL_F32
