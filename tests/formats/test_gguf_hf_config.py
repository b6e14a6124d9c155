"""config.json from GGUF key/values (converter.formats.gguf.hf_config) against transformers' own GGUF loader.

Expected values: transformers 5.24.0, ``AutoConfig.from_pretrained(dir, gguf_file=name).to_dict()``
(tests/data/gguf/record_expected.py for the SmolLM2 fixture; the Qwen2 / Mistral-name files were written
with gguf-py 0.19.0 ``GGUFWriter`` from the key/values in ``QWEN2_KV`` below, one F32 tensor each). Values
transformers does not derive (RoPE scaling, biases, refusals) are by hand from llama.cpp's loader
(``llama_model_loader`` / ``llama-model.cpp``) as cited per test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from converter.errors import ConverterError, FormatError, UnsupportedError
from converter.formats.gguf.hf_config import f32_decimal, hf_config_from_gguf
from converter.formats.registry import load

from ._gguf_hf_data import REAL, fixture_checkpoint, real_checkpoint

# transformers 5.24.0 AutoConfig.from_pretrained(tests/data/gguf, gguf_file="smollm2_vocab_tiny.gguf"); the same
# call on the real 98 MB file gives the same dict
TF_SMOLLM2 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
              "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192,
              "rms_norm_eps": 9.999999747378752e-06, "vocab_size": 49152, "tie_word_embeddings": True,
              "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
              "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
              "attention_bias": False, "mlp_bias": False, "hidden_act": "silu"}

QWEN2_KV = {"general.architecture": "qwen2", "general.name": "Qwen2.5 0.5B Instruct",
            "qwen2.block_count": 24, "qwen2.context_length": 32768, "qwen2.embedding_length": 896,
            "qwen2.feed_forward_length": 4864, "qwen2.attention.head_count": 14, "qwen2.attention.head_count_kv": 2,
            "qwen2.rope.freq_base": 1000000.0, "qwen2.attention.layer_norm_rms_epsilon": float(np.float32(1e-6)),
            "qwen2.vocab_size": 151936, "tokenizer.ggml.bos_token_id": 151643, "tokenizer.ggml.eos_token_id": 151645,
            "tokenizer.ggml.padding_token_id": 151643}
# transformers 5.24.0 on that file (head_dim: Qwen2Config leaves it None = hidden / heads = 64)
TF_QWEN2 = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
            "rms_norm_eps": 9.999999974752427e-07, "vocab_size": 151936, "tie_word_embeddings": True,
            "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643,
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "use_sliding_window": False,
            "hidden_act": "silu"}


def _qwen2_names(layers=24, extra=()):
    return [f"blk.{b}.{s}.{p}" for b in range(layers) for s in ("attn_q", "attn_k", "attn_v")
            for p in ("weight", "bias")] \
        + ["token_embd.weight", *extra]


def _llama_kv():
    """QWEN2_KV as a llama file (the Mistral-name file written for transformers had these key/values)."""
    return {k.replace("qwen2.", "llama."): v for k, v in QWEN2_KV.items()} | {"general.architecture": "llama"}


def _assert_matches(cfg: dict, expected: dict) -> None:
    for key, want in expected.items():
        got = cfg[key]
        if key == "rms_norm_eps":  # we write the shortest float32 decimal: the same float32
            assert np.float32(got) == np.float32(want), (key, got, want)
        else:
            assert got == want, (key, got, want)


def _fixture_kv():
    ck = fixture_checkpoint()
    return ck, ck.metadata["gguf_kv"], ck.metadata["gguf_kv_types"]


def test_smollm2_config_matches_transformers_gguf_loader():
    ck, kv, types = _fixture_kv()
    cfg = hf_config_from_gguf(kv, ck.metadata["gguf_names"].values(), kv_types=types)
    _assert_matches(cfg, TF_SMOLLM2)
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["rms_norm_eps"] == 1e-05  # float32 9.999999747378752e-06 written as its shortest decimal
    # mlx_lm 0.32 reads only the top-level key (mlx_lm/models/llama.py ModelArgs.rope_theta = 10000 default)
    assert cfg["rope_theta"] == 100000.0 and "rope_scaling" not in cfg
    assert "dtype" not in cfg and "torch_dtype" not in cfg  # the writer's
    assert ck.config == cfg  # the reader sets it


@pytest.mark.skipif(not REAL.exists(), reason="the 98 MB SmolLM2 GGUF lives only in /work/shared")
def test_real_smollm2_config_matches_transformers_gguf_loader():
    ck = real_checkpoint()
    _assert_matches(ck.config, TF_SMOLLM2)
    assert ck.config["tie_word_embeddings"] is True and "lm_head.weight" not in ck


def test_tie_word_embeddings_follows_output_weight():
    _, kv, types = _fixture_kv()
    names = ["token_embd.weight", "blk.0.attn_v.weight"]
    assert hf_config_from_gguf(kv, names)["tie_word_embeddings"] is True
    assert hf_config_from_gguf(kv, names + ["output.weight"])["tie_word_embeddings"] is False


def test_qwen2_config_matches_transformers_gguf_loader():
    cfg = hf_config_from_gguf(QWEN2_KV, _qwen2_names())
    _assert_matches(cfg, TF_QWEN2)
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["head_dim"] == 896 // 14
    assert cfg["rope_theta"] == 1000000.0 and cfg["rms_norm_eps"] == 1e-06


def test_qwen2_without_qkv_biases_is_refused():
    names = [n for n in _qwen2_names() if n != "blk.3.attn_k.bias"]
    with pytest.raises(UnsupportedError, match="q/k/v biases"):
        hf_config_from_gguf(QWEN2_KV, names)
    with pytest.raises(UnsupportedError, match="q/k/v biases"):
        hf_config_from_gguf(QWEN2_KV, _qwen2_names(extra=["blk.0.attn_output.bias"]))


def test_mistral_named_llama_file_stays_llama():
    """transformers 5.24 on a llama GGUF named 'Mistral 7B Instruct v0.3' -> LlamaConfig (its switch to
    'mistral' needs general.name == 'mistral' exactly); llama.cpp runs such a file as llama."""
    kv = _llama_kv()
    kv["general.name"] = "Mistral 7B Instruct v0.3"
    cfg = hf_config_from_gguf(kv, ["token_embd.weight", "output.weight"])
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["tie_word_embeddings"] is False and cfg["attention_bias"] is False


def test_llama_biases_all_or_none():
    kv = _llama_kv()
    kv["llama.block_count"] = 2
    attn = [f"blk.{b}.{s}.bias" for b in range(2) for s in ("attn_q", "attn_k", "attn_v", "attn_output")]
    assert hf_config_from_gguf(kv, attn)["attention_bias"] is True
    with pytest.raises(UnsupportedError, match="only some"):
        hf_config_from_gguf(kv, attn[:3])


def test_rope_scaling_linear_and_yarn_by_hand():
    """llama.cpp: freq_scale = 1/factor for linear (positions divided by factor, as transformers' 'linear');
    YaRN keeps factor and original_context_length (transformers 'original_max_position_embeddings')."""
    kv = dict(QWEN2_KV, **{"qwen2.rope.scaling.type": "linear", "qwen2.rope.scaling.factor": 4.0})
    cfg = hf_config_from_gguf(kv, _qwen2_names())
    assert cfg["rope_parameters"] == {"rope_type": "linear", "rope_theta": 1000000.0, "factor": 4.0}
    assert cfg["rope_scaling"] == cfg["rope_parameters"] and cfg["rope_theta"] == 1000000.0
    kv = dict(QWEN2_KV, **{"qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
                           "qwen2.rope.scaling.original_context_length": 32768})
    assert hf_config_from_gguf(kv, _qwen2_names())["rope_parameters"] == {
        "rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768}
    # no type: llama.cpp defaults to linear; factor 1 (or none): no scaling
    kv = dict(QWEN2_KV, **{"qwen2.rope.scaling.factor": 2.0})
    assert hf_config_from_gguf(kv, _qwen2_names())["rope_parameters"]["rope_type"] == "linear"
    kv = dict(QWEN2_KV, **{"qwen2.rope.scaling.type": "linear", "qwen2.rope.scaling.factor": 1.0})
    assert hf_config_from_gguf(kv, _qwen2_names())["rope_parameters"]["rope_type"] == "default"


def test_rope_theta_default_is_llama_cpp_default():
    kv = {k: v for k, v in QWEN2_KV.items() if k != "qwen2.rope.freq_base"}
    cfg = hf_config_from_gguf(kv, _qwen2_names())
    assert cfg["rope_theta"] == 10000.0 == cfg["rope_parameters"]["rope_theta"]


@pytest.mark.parametrize("change, names_extra, error, match", [
    ({"general.architecture": "bert"}, [], UnsupportedError, "no Hugging Face config mapping"),
    ({"qwen2.expert_count": 8}, [], UnsupportedError, "mixture-of-experts"),
    ({"qwen2.rope.dimension_count": 32}, [], UnsupportedError, "partial rotary"),
    ({"qwen2.attention.head_count_kv": [2, 2]}, [], UnsupportedError, "per-layer"),
    ({"qwen2.rope.scaling.type": "longrope"}, [], UnsupportedError, "no mapping"),
    ({}, ["rope_freqs.weight"], UnsupportedError, "rope_freqs"),
    ({"qwen2.block_count": None}, [], FormatError, "missing"),
    ({"qwen2.attention.head_count_kv": 3}, [], FormatError, "do not group"),
    ({"tokenizer.ggml.eos_token_id": 151936}, [], FormatError, "outside the vocabulary"),
])
def test_refusals_name_the_field(change, names_extra, error, match):
    kv = {k: v for k, v in dict(QWEN2_KV, **change).items() if v is not None}
    with pytest.raises(error, match=match) as exc:
        hf_config_from_gguf(kv, _qwen2_names(extra=names_extra))
    assert exc.value.field


def test_unmapped_architecture_leaves_config_empty_with_reason():
    ck = load(Path(__file__).resolve().parents[2] / "sample_checkpoints" / "gguf" / "minilm_gguf_Q4_0.gguf")
    assert ck.config == {}
    assert "general.architecture" in ck.metadata["side_files_skipped"]["config.json"]


def test_f32_decimal():
    assert f32_decimal(float(np.float32(1e-5))) == 1e-05
    assert f32_decimal(float(np.float32(1e-6))) == 1e-06
    assert f32_decimal(100000.0) == 100000.0
    x = float(np.float32(0.1))
    assert np.float32(f32_decimal(x)) == np.float32(x) and f32_decimal(x) == 0.1


def test_errors_are_converter_errors():
    with pytest.raises(ConverterError):
        hf_config_from_gguf({}, [])


# A tiny Qwen3 made by transformers 5.24.0 (Qwen3Config(vocab_size=256, hidden_size=64, intermediate_size=128,
# num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=128,
# tie_word_embeddings=False), save_pretrained): the fields of its config.json a GGUF carries. Its round trip
# HF -> qckpt GGUF -> qckpt dequantize -> transformers gives the original logits exactly (max |dlogit| 0.0,
# interop/qwen3_gguf_roundtrip.py, results/qwen3_gguf_roundtrip.json).
TF_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False, "head_dim": 32,
            "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128, "max_position_embeddings": 128,
            "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "tie_word_embeddings": False,
            "use_sliding_window": False, "vocab_size": 256}


def _qwen3_folder(root: Path) -> Path:
    """The tiny Qwen3's config.json fields and random float32 weights under transformers' names."""
    import json

    from safetensors.numpy import save_file
    rng = np.random.default_rng(0)
    d = root / "qwen3"
    d.mkdir()
    h, inter, heads, kv, hd, vocab = 64, 128, 4, 2, 32, 256
    t = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for b in range(2):
        p = f"model.layers.{b}."
        t |= {p + "self_attn.q_proj.weight": (heads * hd, h), p + "self_attn.k_proj.weight": (kv * hd, h),
              p + "self_attn.v_proj.weight": (kv * hd, h), p + "self_attn.o_proj.weight": (h, heads * hd),
              p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
              p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
              p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
              p + "post_attention_layernorm.weight": (h,)}
    save_file({k: rng.standard_normal(s).astype(np.float32) for k, s in t.items()}, str(d / "model.safetensors"))
    cfg = {k: v for k, v in TF_QWEN3.items() if k != "rope_parameters"} | {
        "rope_parameters": TF_QWEN3["rope_parameters"], "dtype": "float32", "layer_types": ["full_attention"] * 2}
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_qwen3_hf_to_gguf_to_hf_keeps_config_and_weights(tmp_path):
    import json

    from click.testing import CliRunner

    from converter.cli import main
    src = _qwen3_folder(tmp_path)
    gguf_path, back = tmp_path / "q3.gguf", tmp_path / "back"
    assert CliRunner().invoke(main, ["convert", str(src), str(gguf_path), "--to", "gguf"]).exit_code == 0
    r = CliRunner().invoke(main, ["dequantize", str(gguf_path), str(back), "--json"])
    assert r.exit_code == 0 and "config.json" in json.loads(r.output)["files"], r.output
    cfg = json.loads((back / "config.json").read_text())
    _assert_matches(cfg, TF_QWEN3)
    a, b = load(src), load(back)
    assert sorted(a.names()) == sorted(b.names())
    for name in a.names():  # float32 all the way: bit-identical, q/k rows in transformers' order (no permute)
        assert np.array_equal(a[name].dequantize(), b[name].dequantize()), name


def test_qwen3_without_q_k_norms_or_with_mlp_biases_is_refused():
    kv = {k.replace("qwen2.", "qwen3."): v for k, v in QWEN2_KV.items()} | {"general.architecture": "qwen3"}
    names = ["token_embd.weight"] + [f"blk.{b}.{s}.weight" for b in range(24)
                                     for s in ("attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm")]
    assert hf_config_from_gguf(kv, names)["architectures"] == ["Qwen3ForCausalLM"]
    with pytest.raises(UnsupportedError, match="q/k norms") as e:
        hf_config_from_gguf(kv, [n for n in names if n != "blk.7.attn_k_norm.weight"])
    assert e.value.field == "blk.*.attn_k_norm.weight"
    with pytest.raises(UnsupportedError, match="no MLP bias"):
        hf_config_from_gguf(kv, names + ["blk.0.ffn_up.bias"])
