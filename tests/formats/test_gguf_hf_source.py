"""GGUF written from a Hugging Face-style source (no GGUF key/values): the hyperparameters llama.cpp's
``convert_hf_to_gguf.py`` writes, F32 1-D tensors, the no-tokenizer warning, and the read-back proof.

The real sample is ``sample_checkpoints/deepseek_fp8_block_smollm2tiny`` (a 1-layer LLaMA, vocab 256,
config.json from transformers 5.17 with only ``rope_parameters: {rope_theta: 100000}``, no tokenizer).
Expected values come from that config.json and from the source's own bf16 bytes read by hand.
"""

from __future__ import annotations

import json
import struct

import ml_dtypes
import numpy as np
import gguf
from click.testing import CliRunner

from converter.cli import main
from converter.formats.gguf.format import write_gguf
from converter.formats.gguf.hf_source import NO_TOKENIZER, NO_VOCAB_WARNING, config_kv
from converter.formats.registry import load
from converter.ops.compare import compare_tensors
from converter.ops.convert import convert_exact
from converter.tensor import Checkpoint, DenseTensor
from tests.conftest import SAMPLES

SRC = SAMPLES / "deepseek_fp8_block_smollm2tiny"
NORMS = {"model.layers.0.input_layernorm.weight": "blk.0.attn_norm.weight",
         "model.layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
         "model.norm.weight": "output_norm.weight"}


def _bf16_as_f32_by_hand(path, name):
    """A BF16 tensor of a safetensors file as float32, from its raw bytes (bf16 bits << 16)."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    info = json.loads(raw[8:8 + n])[name]
    assert info["dtype"] == "BF16"
    a, b = info["data_offsets"]
    bits = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32)


def _convert_real(tmp_path):
    out = tmp_path / "out.gguf"
    r = CliRunner().invoke(main, ["convert", str(SRC), str(out), "--to", "gguf", "--bits", "8", "--group-size", "32",
                                  "--sym", "--json", "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return out, json.loads(r.output)


def test_real_fp8_source_to_gguf_keys_types_and_warning(tmp_path):
    cfg = json.loads((SRC / "config.json").read_text())
    assert "rope_theta" not in cfg and cfg["rope_parameters"]["rope_theta"] == 100000.0  # the case at hand
    out, doc = _convert_real(tmp_path)
    r = gguf.GGUFReader(out)
    kv = {k: f.contents() for k, f in r.fields.items()}
    # 1. rope base from rope_parameters (absent: loaders use 10000)
    assert kv["llama.rope.freq_base"] == 100000.0
    # 2. {arch}.vocab_size (gguf-py Keys.LLM.VOCAB_SIZE) from config vocab_size
    assert kv["llama.vocab_size"] == 256
    # no vocabulary: declared as llama.cpp's converter declares one (convert_hf_to_gguf.py _set_vocab_none writes
    # tokenizer.ggml.model "none"; without the key llama.cpp 0.3.36 refuses the file: "key not found in model:
    # tokenizer.ggml.model", interop/results/RESULTS_FP4.md), and nothing else of a vocabulary
    assert {k: v for k, v in kv.items() if k.startswith("tokenizer.ggml.")} == {"tokenizer.ggml.model": "none"}
    assert doc["side_files_skipped"] == {"tokenizer.ggml.*": NO_VOCAB_WARNING}
    assert NO_VOCAB_WARNING.startswith("warning: no tokenizer: written as tokenizer.ggml.model 'none'")
    # 3. 1-D tensors F32, values the source's bf16 values exactly
    tensors = {t.name: t for t in r.tensors}
    for hf, g in NORMS.items():
        assert tensors[g].tensor_type == gguf.GGMLQuantizationType.F32
        assert np.array_equal(np.asarray(tensors[g].data).view(np.uint32),
                              _bf16_as_f32_by_hand(SRC / "model.safetensors", hf).view(np.uint32))
    # a 2-D float tensor keeps its dtype (only 1-D tensors are widened)
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.BF16


def test_real_fp8_source_cli_text_warns_about_the_tokenizer(tmp_path):
    r = CliRunner().invoke(main, ["convert", str(SRC), str(tmp_path / "o.gguf"), "--to", "gguf", "--bits", "8",
                                  "--group-size", "32", "--sym", "--quiet"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "warning: no tokenizer: written as tokenizer.ggml.model 'none'" in " ".join(r.output.split())


def test_config_kv_rope_theta_flat_nested_and_vocab_size():
    assert config_kv({"rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}, "llama") == \
        {"llama.rope.freq_base": 500000.0}
    # a flat rope_theta (transformers 4) wins over a nested one
    assert config_kv({"rope_theta": 10000, "rope_parameters": {"rope_theta": 1.0}}, "llama") == \
        {"llama.rope.freq_base": 10000.0}
    assert config_kv({"vocab_size": 49152, "rope_parameters": None}, "qwen2") == {"qwen2.vocab_size": 49152}
    assert config_kv({"vocab_size": True}, "llama") == {}


def test_tokenizer_warning_only_without_tokenizer_keys(tmp_path):
    t = DenseTensor("model.layers.0.mlp.gate_proj.weight", np.zeros((4, 32), np.float32))
    with_tok = Checkpoint.from_tensors([t], metadata={"gguf_kv": {"general.architecture": "llama",
                                                                  "tokenizer.ggml.model": "llama",
                                                                  "tokenizer.ggml.tokens": ["a", "b"]}})
    assert "side_files_skipped" not in write_gguf(with_tok, tmp_path / "a.gguf")
    # no vocabulary size either: nothing to declare a placeholder vocabulary with, no key written
    res = write_gguf(Checkpoint.from_tensors([t]), tmp_path / "b.gguf", arch="llama")
    assert res["side_files_skipped"] == {"tokenizer.ggml.*": NO_TOKENIZER}
    assert not any(k.startswith("tokenizer.") for k in gguf.GGUFReader(tmp_path / "b.gguf").fields)
    # a vocabulary size without a vocabulary (a GGUF source without tokenizer keys): declared 'none'
    no_vocab = Checkpoint.from_tensors([t], metadata={"gguf_kv": {"general.architecture": "llama",
                                                                  "llama.vocab_size": 4}})
    res = write_gguf(no_vocab, tmp_path / "c.gguf")
    assert res["side_files_skipped"] == {"tokenizer.ggml.*": NO_VOCAB_WARNING}
    assert gguf.GGUFReader(tmp_path / "c.gguf").fields["tokenizer.ggml.model"].contents() == "none"


def test_1d_f16_bf16_widened_2d_kept_and_notes(tmp_path):
    rng = np.random.default_rng(3)
    bf = rng.standard_normal(32).astype(ml_dtypes.bfloat16)
    h = rng.standard_normal(32).astype(np.float16)
    two = rng.standard_normal((2, 32)).astype(np.float16)
    ck = Checkpoint.from_tensors([DenseTensor("model.norm.weight", bf),
                                  DenseTensor("model.layers.0.self_attn.v_proj.bias", h),
                                  DenseTensor("model.layers.0.mlp.gate_proj.weight", two)])
    res = write_gguf(ck, tmp_path / "w.gguf", arch="llama")
    rt = {t.name: t for t in gguf.GGUFReader(tmp_path / "w.gguf").tensors}
    assert rt["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert rt["blk.0.attn_v.bias"].tensor_type == gguf.GGMLQuantizationType.F32
    assert rt["blk.0.ffn_gate.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    # bf16 -> f32 is bits << 16; f16 -> f32 by hand for a few values
    assert np.array_equal(np.asarray(rt["output_norm.weight"].data).view(np.uint32),
                          bf.view(np.uint16).astype(np.uint32) << 16)
    assert np.array_equal(np.asarray(rt["blk.0.attn_v.bias"].data), [float(x) for x in h])
    assert res["types"]["model.norm.weight"] == "F32"
    assert res["notes"]["model.norm.weight"][0].startswith("BF16 widened to F32 (values exact")
    assert res["notes"]["model.layers.0.self_attn.v_proj.bias"][0].startswith("F16 widened to F32")
    assert "model.layers.0.mlp.gate_proj.weight" not in res["notes"]


def test_compare_widened_dense_is_exact_not_passthrough():
    bf = np.array([1.0, -2.5, 3.140625, 0.0], dtype=ml_dtypes.bfloat16)
    a = DenseTensor("n", bf)
    row = compare_tensors(a, DenseTensor("n", np.array([1.0, -2.5, 3.140625, 0.0], np.float32)))
    assert row["mode"] == "exact" and row["bit_exact"] is True
    assert row["widened"] == {"source": "bfloat16", "target": "float32"}
    # one value off by one float32 ulp: changed
    off = np.array([1.0, -2.5, np.nextafter(np.float32(3.140625), np.float32(4)), 0.0], np.float32)
    assert compare_tensors(a, DenseTensor("n", off))["mode"] == "changed"
    # -0.0 widened must stay -0.0 (bits, not values)
    z = compare_tensors(DenseTensor("z", np.array([-0.0], np.float16)), DenseTensor("z", np.array([0.0], np.float32)))
    assert z["mode"] == "changed"
    # same dtype: still a passthrough; narrowing is never accepted
    assert compare_tensors(a, DenseTensor("n", bf.copy()))["mode"] == "passthrough"
    narrow = compare_tensors(DenseTensor("n", bf.astype(np.float32)), a)
    assert narrow["mode"] == "changed" and "widened" not in narrow


def test_gguf_to_gguf_bf16_norm_widened_and_proven(tmp_path):
    rng = np.random.default_rng(5)
    src = tmp_path / "src.gguf"
    w = gguf.GGUFWriter(src, "llama")
    w.add_block_count(1)
    norm = rng.standard_normal(32).astype(ml_dtypes.bfloat16)
    w.add_tensor("output_norm.weight", norm.view(np.uint8), raw_dtype=gguf.GGMLQuantizationType.BF16)
    q = gguf.quants.quantize(rng.standard_normal((4, 32)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.ffn_gate.weight", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    back = load(src)["model.norm.weight"].data
    assert back.dtype == ml_dtypes.bfloat16 and np.array_equal(back.view(np.uint16), norm.view(np.uint16))
    doc = convert_exact(src, tmp_path / "dst.gguf", "gguf")
    rows = {r["name"]: r for r in doc["tensors"]}
    assert rows["model.norm.weight"]["mode"] == "exact"
    assert rows["model.norm.weight"]["widened"] == {"source": "bfloat16", "target": "float32"}
    assert rows["model.layers.0.mlp.gate_proj.weight"]["mode"] == "exact"
    rt = {t.name: t for t in gguf.GGUFReader(tmp_path / "dst.gguf").tensors}
    assert rt["output_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert np.array_equal(np.asarray(rt["output_norm.weight"].data).view(np.uint32),
                          norm.view(np.uint16).astype(np.uint32) << 16)
