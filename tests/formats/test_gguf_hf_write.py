"""A GGUF source's config.json and tokenizer files reach the Hugging Face style directories it is written to.

Inputs: tests/data/gguf/smollm2_vocab_tiny.gguf (real SmolLM2 key/values, three tiny synthetic tensors; see
tests/data/gguf/README.md) and the shipped MiniLM samples (BERT, no tokenizer keys). Expected config values
are transformers 5.24.0's (see test_gguf_hf_config.py); file sets and dtypes are by hand from what was asked.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from tokenizers import Tokenizer

from converter.cli import main
from converter.formats.gguf import hf_tokenizer as ght
from converter.formats.registry import load

from converter.formats.plain import write_plain

from ._gguf_hf_data import fixture_checkpoint, write_tiny_llama
from .test_gguf_hf_config import TF_SMOLLM2, _assert_matches
from .test_gguf_hf_tokenizer import TF_IDS

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_checkpoints"
HF_FILES = {"config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
            "generation_config.json"}


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def _run(*args):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


# tiny llama (tests/formats/_gguf_hf_data.write_tiny_llama), by hand from its key/values
TINY_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "vocab_size": 261,
               "hidden_act": "silu", "tie_word_embeddings": True,
               "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}, "rope_theta": 50000.0,
               "attention_bias": False, "mlp_bias": False, "bos_token_id": 259, "eos_token_id": 260}


@pytest.fixture
def tiny(tmp_path):
    return write_tiny_llama(tmp_path / "tiny.gguf")


@pytest.mark.parametrize("dtype, torch_name, st_dtype", [("f32", "float32", "F32"), ("f16", "float16", "F16")])
def test_dequantize_writes_a_complete_model_folder(tmp_path, tiny, dtype, torch_name, st_dtype):
    out = tmp_path / "deq"
    doc = json.loads(_run("dequantize", tiny, out, "--dtype", dtype, "--json"))
    assert set(doc["files"]) == {"model.safetensors"} | HF_FILES and "side_files_skipped" not in doc
    cfg = json.loads((out / "config.json").read_text())
    # the narrowest dtype holding every written tensor exactly: f16 weights beside the F32 norms -> float32
    assert cfg == {**TINY_CONFIG, "dtype": "float32"}
    header = _header(out / "model.safetensors")
    assert header["model.layers.0.self_attn.q_proj.weight"]["dtype"] == st_dtype
    assert header["model.norm.weight"]["dtype"] == "F32" and header["model.embed_tokens.weight"]["dtype"] == "F16"
    # shapes agree with the config: k rows = num_key_value_heads * head_dim, q rows = heads * head_dim
    assert header["model.layers.0.self_attn.k_proj.weight"]["shape"] == [2 * 16, 64]
    assert header["model.layers.0.self_attn.q_proj.weight"]["shape"] == [4 * 16, 64]
    assert header["model.embed_tokens.weight"]["shape"] == [261, 64] and "lm_head.weight" not in header
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    # by hand: <s> (add_bos_token true), then merges 'h e' -> he, 't he' -> the; ' the': 'Ġ t' -> Ġt, he
    # (transformers 5.24 AutoTokenizer.from_pretrained(dir, gguf_file="tiny.gguf") gives the same ids)
    assert tok.encode("the the").ids == [259, 258, 256, 257]
    tcfg = json.loads((out / "tokenizer_config.json").read_text())
    assert (tcfg["bos_token"], tcfg["eos_token"], tcfg["add_bos_token"]) == ("<s>", "</s>", True)
    assert json.loads((out / "generation_config.json").read_text()) == {"bos_token_id": 259, "eos_token_id": 260}


def test_smollm2_fixture_dequantized_in_process(tmp_path):
    out = tmp_path / "deq"
    res = write_plain(fixture_checkpoint(), out)
    assert set(res["files"]) == {"model.safetensors"} | HF_FILES
    cfg = json.loads((out / "config.json").read_text())
    _assert_matches(cfg, TF_SMOLLM2)
    assert cfg["dtype"] == "float32" and cfg["rope_theta"] == 100000.0
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    assert tok.encode("The capital of France is").ids == TF_IDS["The capital of France is"]
    assert json.loads((out / "tokenizer_config.json").read_text())["eos_token"] == "<|im_end|>"


def test_mlx_writer_carries_config_and_tokenizer(tmp_path, tiny):
    out = tmp_path / "mlx"
    _run("convert", tiny, out, "--to", "mlx")
    assert HF_FILES <= {p.name for p in out.iterdir()}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["rope_theta"] == 50000.0 and "quantization" in cfg
    assert (out / "tokenizer.json").read_bytes() == load(tiny).side_files["tokenizer.json"]()


def test_gguf_to_gguf_still_byte_identical(tmp_path, tiny):
    """The derived config must not leak into GGUF output: the source's own key/values win."""
    out = tmp_path / "rt.gguf"
    _run("convert", tiny, out)
    assert out.read_bytes() == tiny.read_bytes()


def test_inspect_and_validate_do_not_build_the_tokenizer(monkeypatch, tiny):
    calls = []
    monkeypatch.setattr(ght, "tokenizer_json", lambda kv: calls.append(1) or "{}")
    _run("inspect", tiny)
    _run("validate", tiny)
    ck = load(tiny)
    assert ck.config["model_type"] == "llama" and "tokenizer.json" in ck.side_files
    assert calls == []
    ck.side_files["tokenizer.json"]()
    assert calls == [1]


def test_unmapped_gguf_says_what_was_not_written(tmp_path):
    out = tmp_path / "mini"
    doc = json.loads(_run("dequantize", SAMPLES / "gguf" / "minilm_gguf_Q4_0.gguf", out, "--json"))
    assert doc["files"] == ["model.safetensors"]
    skipped = doc["side_files_skipped"]
    assert set(skipped) == HF_FILES
    assert "bert" in skipped["config.json"] and "tokenizer.ggml.model" in skipped["tokenizer.json"]
    text = _run("dequantize", SAMPLES / "gguf" / "minilm_gguf_Q4_0.gguf", tmp_path / "mini2")
    assert "not written: config.json" in text


def test_a_tokenizer_that_cannot_be_built_is_skipped_with_its_reason_not_fatal(tmp_path):
    # review of issue 12: a merge that is not two vocabulary tokens ("x yz": "yz" is no token) made
    # the whole write fail; the tensors and the other side files are still written, the report says why
    src = write_tiny_llama(tmp_path / "bad.gguf", merges=("Ġ t", "h e", "x yz"))
    res = CliRunner().invoke(main, ["dequantize", str(src), str(tmp_path / "out"), "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    files = {p.name for p in (tmp_path / "out").iterdir()}
    assert "tokenizer.json" not in files and {"config.json", "model.safetensors", "generation_config.json"} <= files
    assert "tokenizer.ggml.merges" in doc["side_files_skipped"]["tokenizer.json"]
