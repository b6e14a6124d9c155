"""GGUF written from tiny Hugging Face gemma2 / gemma3 / deepseek_v2 folders (issue 16): names, Gemma's norm offset,
DeepSeek-V2's kv_b_proj cut, hyperparameters; and read back (config.json for Gemma; none for deepseek2).

Expected names: gguf-py 0.19's own tables (``get_tensor_name_map(arch, n).get_name``, ``MODEL_TENSORS``). Expected
values and keys: by hand from llama.cpp's ``conversion/gemma.py`` (``data_torch + 1`` for every ``*norm.weight``) and
``conversion/deepseek.py`` (``kv_b.view(heads, nope + v, rank)``, split ``[nope, v]``, the key part transposed;
``set_gguf_parameters``), written here as explicit index loops. ``interop/gguf_from_hf_archs.py`` compares the same
three architectures, made by transformers 5.24, with llama.cpp's own converter key by key and byte by byte.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

from converter.cli import main

H, HEADS, KV, HD, FF, VOCAB = 64, 4, 2, 16, 96, 40
RANK, QRANK, ROPE, NOPE, V, EXPERTS, MOE_FF = 32, 24, 8, 16, 16, 4, 32


def _gemma(model_type: str, dtype=np.float32) -> tuple[dict, dict]:
    rng = np.random.default_rng(7)

    def w(*shape):
        return (0.3 * rng.standard_normal(shape)).astype(dtype)
    t = {"model.embed_tokens.weight": w(VOCAB, H), "model.norm.weight": w(H)}
    for i in range(2):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            t[p + n + ".weight"] = w(H)
        t[p + "self_attn.q_proj.weight"] = w(HEADS * HD, H)
        t[p + "self_attn.k_proj.weight"] = w(KV * HD, H)
        t[p + "self_attn.v_proj.weight"] = w(KV * HD, H)
        t[p + "self_attn.o_proj.weight"] = w(H, HEADS * HD)
        t[p + "mlp.gate_proj.weight"] = w(FF, H)
        t[p + "mlp.up_proj.weight"] = w(FF, H)
        t[p + "mlp.down_proj.weight"] = w(H, FF)
        if model_type == "gemma3_text":
            t[p + "self_attn.q_norm.weight"] = w(HD)
            t[p + "self_attn.k_norm.weight"] = w(HD)
    cfg = {"model_type": model_type, "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": KV,
           "head_dim": HD, "intermediate_size": FF, "num_hidden_layers": 2, "max_position_embeddings": 512,
           "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "sliding_window": 128, "tie_word_embeddings": True}
    if model_type == "gemma2":
        cfg.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                   rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    else:
        cfg.update(final_logit_softcapping=None, rope_parameters={
            "full_attention": {"rope_theta": 1000000.0, "rope_type": "default"},
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}})
    return t, cfg


def _deepseek() -> tuple[dict, dict]:
    rng = np.random.default_rng(8)

    def w(*shape):
        return (0.3 * rng.standard_normal(shape)).astype(np.float32)
    t = {"model.embed_tokens.weight": w(VOCAB, H), "model.norm.weight": w(H), "lm_head.weight": w(VOCAB, H)}
    for i in range(2):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = w(H)
        t[p + "post_attention_layernorm.weight"] = w(H)
        t[p + "self_attn.q_a_proj.weight"] = w(QRANK, H)
        t[p + "self_attn.q_a_layernorm.weight"] = w(QRANK)
        t[p + "self_attn.q_b_proj.weight"] = w(HEADS * (NOPE + ROPE), QRANK)
        t[p + "self_attn.kv_a_proj_with_mqa.weight"] = w(RANK + ROPE, H)
        t[p + "self_attn.kv_a_layernorm.weight"] = w(RANK)
        t[p + "self_attn.kv_b_proj.weight"] = w(HEADS * (NOPE + V), RANK)
        t[p + "self_attn.o_proj.weight"] = w(H, HEADS * V)
        if i == 0:
            for n, shape in (("gate_proj", (FF, H)), ("up_proj", (FF, H)), ("down_proj", (H, FF))):
                t[p + f"mlp.{n}.weight"] = w(*shape)
            continue
        t[p + "mlp.gate.weight"] = w(EXPERTS, H)
        for e in range(EXPERTS):
            for n, shape in (("gate_proj", (MOE_FF, H)), ("up_proj", (MOE_FF, H)), ("down_proj", (H, MOE_FF))):
                t[p + f"mlp.experts.{e}.{n}.weight"] = w(*shape)
        for n, shape in (("gate_proj", (MOE_FF, H)), ("up_proj", (MOE_FF, H)), ("down_proj", (H, MOE_FF))):
            t[p + f"mlp.shared_experts.{n}.weight"] = w(*shape)
    cfg = {"model_type": "deepseek_v2", "hidden_size": H, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
           "intermediate_size": FF, "moe_intermediate_size": MOE_FF, "num_hidden_layers": 2,
           "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "vocab_size": VOCAB, "q_lora_rank": QRANK,
           "kv_lora_rank": RANK, "qk_rope_head_dim": ROPE, "qk_nope_head_dim": NOPE, "v_head_dim": V,
           "head_dim": ROPE, "n_routed_experts": EXPERTS, "num_experts_per_tok": 2, "n_shared_experts": 1,
           "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
           "norm_topk_prob": False, "tie_word_embeddings": False,
           "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
    return t, cfg


def _convert(tmp_path: Path, tensors: dict, cfg: dict) -> tuple[gguf.GGUFReader, dict]:
    d = tmp_path / cfg["model_type"]
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(main, ["convert", str(d), str(tmp_path / "o.gguf"), "--to", "gguf", "--json", "--quiet"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return gguf.GGUFReader(tmp_path / "o.gguf"), json.loads(r.output)


def _kv(reader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith(("GGUF.", "general.", "tokenizer."))}


def _names_from_gguf_py(arch_name: str, hf_names) -> set:
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    name_map = gguf.get_tensor_name_map(arch, 2)
    allowed = {gguf.TENSOR_NAMES[t].format(bid=i) for t in gguf.MODEL_TENSORS[arch] for i in range(2)}
    out = set()
    for hf in hf_names:
        stem, suffix = hf.rsplit(".", 1)
        g = name_map.get_name(stem)
        assert g in allowed, hf
        out.add(f"{g}.{suffix}")
    return out


@pytest.mark.parametrize("model_type,arch", [("gemma2", "gemma2"), ("gemma3_text", "gemma3")])
def test_gemma_names_norm_offset_and_keys(tmp_path, model_type, arch):
    src, cfg = _gemma(model_type)
    reader, doc = _convert(tmp_path, src, cfg)
    assert reader.fields["general.architecture"].contents() == arch
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    assert set(stored) == _names_from_gguf_py(arch, src)  # no output.weight: the head is the embedding
    name_map = gguf.get_tensor_name_map(next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch), 2)
    for hf, a in src.items():
        g = name_map.get_name(hf.rsplit(".", 1)[0]) + ".weight"
        want = a + np.float32(1) if hf.endswith("norm.weight") else a  # Gemma RMSNorm: x * (1 + w), stored 1 + w
        assert np.array_equal(stored[g].reshape(a.shape).view(np.uint32), want.view(np.uint32)), hf
    want_kv = {f"{arch}.context_length": 512, f"{arch}.embedding_length": H, f"{arch}.block_count": 2,
               f"{arch}.feed_forward_length": FF, f"{arch}.attention.head_count": HEADS,
               f"{arch}.attention.head_count_kv": KV, f"{arch}.attention.key_length": HD,
               f"{arch}.attention.value_length": HD, f"{arch}.attention.sliding_window": 128}
    if arch == "gemma2":
        want_kv.update({"gemma2.attn_logit_softcapping": 50.0, "gemma2.final_logit_softcapping": 30.0})
    else:
        want_kv.update({"gemma3.rope.freq_base": 1000000.0, "gemma3.rope.freq_base_swa": 10000.0})
    got = _kv(reader)
    assert {k: got.get(k) for k in want_kv} == want_kv
    assert got[f"{arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6, rel=1e-7)
    assert set(got) == set(want_kv) | {f"{arch}.attention.layer_norm_rms_epsilon", f"{arch}.vocab_size"}
    # the proof: norm weights are w + 1 read back - 1, i.e. w up to that one rounding; everything else exact
    rows = {r["name"]: r for r in doc["tensors"]}
    for name, r in rows.items():
        if name.endswith("norm.weight"):
            assert r["mode"] in ("exact", "exact_up_to_rounding") and r["offset"] == 1.0, r
            assert r["max_abs_diff"] <= 2.0 ** -24 * (1 + float(np.max(np.abs(src[name])))) * 2
        else:
            assert r["mode"] in ("exact", "passthrough"), r
    assert doc["summary"]["changed"] == 0 and doc["summary"]["within_rounding"]


def test_gemma_norm_offset_added_in_the_source_dtype(tmp_path):
    src, cfg = _gemma("gemma2", dtype=ml_dtypes.bfloat16)
    reader, doc = _convert(tmp_path, src, cfg)
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    w = src["model.layers.0.input_layernorm.weight"]
    want = (w.astype(np.float64) + 1.0).astype(ml_dtypes.bfloat16).astype(np.float32)  # bf16 sum rounded once
    got = stored["blk.0.attn_norm.weight"]
    assert got.dtype == np.float32 and np.array_equal(got, want)  # 1-D written F32 (widened), as the converter
    assert not np.array_equal(want, w.astype(np.float32) + 1)  # the bf16 rounding is visible in this sample


def test_deepseek2_mla_moe_tensors_and_keys(tmp_path):
    src, cfg = _deepseek()
    reader, doc = _convert(tmp_path, src, cfg)
    assert reader.fields["general.architecture"].contents() == "deepseek2"
    stored = {t.name: np.asarray(t.data) for t in reader.tensors}
    hf = [n for n in src if "kv_b_proj" not in n and ".experts." not in n]
    hf += [f"model.layers.{i}.self_attn.{x}_b_proj.weight" for i in range(2) for x in "kv"]
    hf += [f"model.layers.1.mlp.experts.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
    assert set(stored) == _names_from_gguf_py("deepseek2", hf)
    for i in range(2):
        kv_b = src[f"model.layers.{i}.self_attn.kv_b_proj.weight"]
        k_b, v_b = stored[f"blk.{i}.attn_k_b.weight"], stored[f"blk.{i}.attn_v_b.weight"]
        assert k_b.shape == (HEADS, RANK, NOPE) and v_b.shape == (HEADS, V, RANK)
        for h in range(HEADS):
            for j in range(NOPE):  # key row j of head h, transposed
                assert np.array_equal(k_b[h, :, j], kv_b[h * (NOPE + V) + j])
            for j in range(V):
                assert np.array_equal(v_b[h, j], kv_b[h * (NOPE + V) + NOPE + j])
    exps = stored["blk.1.ffn_gate_exps.weight"]
    for e in range(EXPERTS):
        assert np.array_equal(exps[e], src[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"])
    assert np.array_equal(stored["blk.1.ffn_up_shexp.weight"], src["model.layers.1.mlp.shared_experts.up_proj.weight"])
    got = _kv(reader)
    want = {"deepseek2.attention.head_count_kv": 1, "deepseek2.attention.kv_lora_rank": RANK,
            "deepseek2.attention.q_lora_rank": QRANK, "deepseek2.attention.key_length": RANK + ROPE,
            "deepseek2.attention.value_length": RANK, "deepseek2.attention.key_length_mla": NOPE + ROPE,
            "deepseek2.attention.value_length_mla": V, "deepseek2.rope.dimension_count": ROPE,
            "deepseek2.leading_dense_block_count": 1, "deepseek2.expert_count": EXPERTS,
            "deepseek2.expert_used_count": 2, "deepseek2.expert_shared_count": 1,
            "deepseek2.expert_feed_forward_length": MOE_FF, "deepseek2.expert_weights_scale": 1.0,
            "deepseek2.expert_group_count": 1, "deepseek2.expert_group_used_count": 1,
            "deepseek2.vocab_size": VOCAB, "deepseek2.feed_forward_length": FF, "deepseek2.rope.freq_base": 10000.0}
    assert {k: got.get(k) for k in want} == want
    assert "deepseek2.expert_weights_norm" not in got  # norm_topk_prob false: not written
    assert doc["summary"]["all_exact"]


def test_read_back_gives_the_hugging_face_values(tmp_path):
    src, cfg = _gemma("gemma3_text")
    _convert(tmp_path, src, cfg)
    r = CliRunner().invoke(main, ["dequantize", str(tmp_path / "o.gguf"), str(tmp_path / "hf"), "--quiet"],
                           catch_exceptions=False)
    assert r.exit_code == 0, r.output
    back = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert set(back) == set(src)
    for name, a in src.items():
        want = (a + np.float32(1)) - np.float32(1) if name.endswith("norm.weight") else a
        assert np.array_equal(back[name], want), name
    cfg_back = json.loads((tmp_path / "hf" / "config.json").read_text())  # rebuilt from the GGUF keys
    assert cfg_back["model_type"] == "gemma3_text" and cfg_back["num_hidden_layers"] == 2


def test_kv_b_proj_rows_not_matching_config_refused(tmp_path):
    from converter.errors import NotRepresentableError
    from converter.formats.gguf.mla import split_kv_b
    from converter.formats.registry import load
    src, cfg = _deepseek()
    d = tmp_path / "d"
    d.mkdir()
    save_file(src, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({**cfg, "qk_nope_head_dim": NOPE + 1}))
    with pytest.raises(NotRepresentableError, match="kv_b_proj rows"):
        split_kv_b(load(d))


def test_gemma_config_from_gguf_keys_by_hand():
    """config.json rebuilt from gemma2 / gemma3 keys as llama.cpp runs them (``llama-model.cpp``): GELU-tanh,
    soft-capping (gemma2 defaults 50 / 30), sliding pattern 2 / 6 starting with a sliding layer,
    ``query_pre_attn_scalar`` = head_dim except at llama.cpp's 27B block counts (46 / 62: hidden / heads), gemma3's
    RoPE per layer type (freq_base_swa default 10000). interop/gemma_gguf_roundtrip.py: transformers on the round
    trip gives the original logits (max |dlogit| 0.0) and llama.cpp agrees (argmax equal)."""
    from converter.formats.gguf.hf_config import hf_config_from_gguf
    names = ["token_embd.weight", "blk.0.attn_q.weight"]
    base = {"context_length": 512, "embedding_length": 64, "block_count": 7, "feed_forward_length": 96,
            "attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 16,
            "attention.value_length": 16, "attention.layer_norm_rms_epsilon": 1e-6, "attention.sliding_window": 128,
            "vocab_size": 300}
    g2 = hf_config_from_gguf({"general.architecture": "gemma2", **{f"gemma2.{k}": v for k, v in base.items()}}, names)
    assert (g2["model_type"], g2["architectures"]) == ("gemma2", ["Gemma2ForCausalLM"])
    assert g2["hidden_activation"] == "gelu_pytorch_tanh" and "hidden_act" not in g2
    assert (g2["attn_logit_softcapping"], g2["final_logit_softcapping"]) == (50.0, 30.0)
    assert g2["layer_types"] == ["sliding_attention", "full_attention"] * 3 + ["sliding_attention"]
    assert g2["query_pre_attn_scalar"] == 16 and g2["tie_word_embeddings"] is True
    assert g2["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    kv3 = {"general.architecture": "gemma3", **{f"gemma3.{k}": v for k, v in base.items()},
           "gemma3.block_count": 62, "gemma3.rope.freq_base": 1e6, "gemma3.rope.scaling.type": "linear",
           "gemma3.rope.scaling.factor": 8.0}
    g3 = hf_config_from_gguf(kv3, names)
    assert (g3["model_type"], g3["architectures"]) == ("gemma3_text", ["Gemma3ForCausalLM"])
    assert g3["query_pre_attn_scalar"] == 64 // 4  # 62 blocks: llama.cpp's 27B, 1 / sqrt(n_embd / n_head)
    assert g3["layer_types"][:7] == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    assert g3["rope_parameters"] == {"full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}
    assert g3["final_logit_softcapping"] is None and g3["attn_logit_softcapping"] is None
    with pytest.raises(Exception, match="output.weight"):
        hf_config_from_gguf({**kv3, "gemma3.block_count": 2}, [*names, "output.weight"])
    with pytest.raises(Exception, match="no Hugging Face config mapping"):
        hf_config_from_gguf({"general.architecture": "deepseek2", **{f"deepseek2.{k}": v for k, v in base.items()}},
                            names)


def test_gemma2_with_an_untied_head_is_refused(tmp_path):
    src, cfg = _gemma("gemma2")
    src["lm_head.weight"] = src["model.embed_tokens.weight"] + np.float32(1)  # differs from the embedding
    d = tmp_path / "g"
    d.mkdir()
    save_file(src, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({**cfg, "tie_word_embeddings": False}))
    r = CliRunner().invoke(main, ["convert", str(d), str(tmp_path / "o.gguf"), "--to", "gguf"])
    assert r.exit_code != 0 and "output tensor" in r.output and "lm_head.weight" in r.output
    assert not (tmp_path / "o.gguf").exists()


def test_deepseek_mtp_layer_dropped_as_llama_cpp_does(tmp_path):
    """DeepSeek-V3 keeps its multi-token-prediction block as layer num_hidden_layers (61 of 61); llama.cpp's
    DeepseekV2Model (which also converts V3) skips it: the file is byte for byte the one made without it, and each
    of its tensors is a ``dropped`` row naming why."""
    src, cfg = _deepseek()
    cfg = {**cfg, "model_type": "deepseek_v3", "num_nextn_predict_layers": 1}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _convert(tmp_path / "a", src, cfg)
    mtp = {k.replace("model.layers.1.", "model.layers.2."): v for k, v in src.items()
           if k.startswith("model.layers.1.")}
    mtp["model.layers.2.eh_proj.weight"] = np.ones((H, 2 * H), np.float32)
    mtp["model.layers.2.enorm.weight"] = np.ones(H, np.float32)
    reader, doc = _convert(tmp_path / "b", {**src, **mtp}, cfg)
    assert (tmp_path / "a" / "o.gguf").read_bytes() == (tmp_path / "b" / "o.gguf").read_bytes()
    rows = {r["name"]: r for r in doc["tensors"]}
    layer2 = [n for n in rows if n.startswith("model.layers.2.")]
    # rows name the arranged tensors: 8 attention / norm tensors with kv_b_proj as k_b + v_b (10), the router,
    # 3 stacked expert tensors, 3 shared experts, eh_proj and enorm: 19
    assert len(layer2) == 19 and all(rows[n]["mode"] == "dropped" and "multi-token-prediction" in rows[n]["reason"]
                                     for n in layer2)
