"""Which modules a target quantizes is the target's decision (issue 12): embeddings, heads and
routers that GPTQ / AWQ / compressed-tensors loaders keep dense are written dense, dequantized
exactly, and the config and report say so. Values are computed by hand below."""

from __future__ import annotations

import json

import numpy as np
import pytest

from converter.errors import NotRepresentableError
from converter.formats import registry
from converter.formats.modules import EMBEDDING, HEAD, LINEAR, OTHER, ROUTER, module_role
from converter.formats.native import write_native
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.ops.convert import convert_exact
from converter.ops.requantize_model import requantize_model
from converter.quant.requant import Target
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor

LLAMA_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "tie_word_embeddings": True,
                "hidden_size": 64, "vocab_size": 6}


@pytest.mark.parametrize("name,ndim,role", [
    ("model.embed_tokens.weight", 2, EMBEDDING), ("transformer.wte.weight", 2, EMBEDDING),
    ("embeddings.word_embeddings.weight", 2, EMBEDDING), ("lm_head.weight", 2, HEAD),
    ("gpt_neox.embed_out.weight", 2, HEAD), ("model.layers.3.mlp.gate.weight", 2, ROUTER),
    ("model.layers.3.block_sparse_moe.gate.weight", 2, ROUTER),
    ("model.layers.3.mlp.gate_proj.weight", 2, LINEAR), ("encoder.layer.0.output.dense.weight", 2, LINEAR),
    ("model.layers.0.input_layernorm.weight", 1, OTHER), ("model.layers.0.self_attn.q_proj.bias", 1, OTHER),
    # review of issue 12: names from Qwen2-MoE, DBRX / GraniteMoE, T5, Gemma 3n, Mamba, BERT heads
    ("model.layers.0.mlp.shared_expert_gate.weight", 2, ROUTER),
    ("transformer.blocks.0.ffn.router.layer.weight", 2, ROUTER),
    ("model.layers.0.block_sparse_moe.router.layer.weight", 2, ROUTER),
    ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", 2, EMBEDDING),
    ("shared.weight", 2, EMBEDDING), ("model.layers.0.mlp.shared.weight", 2, LINEAR),
    ("model.language_model.embed_tokens_per_layer.weight", 2, EMBEDDING), ("backbone.embeddings.weight", 2, EMBEDDING),
    ("cls.predictions.decoder.weight", 2, HEAD), ("model.layers.0.mlp.experts.0.gate_proj.weight", 2, LINEAR),
])
def test_module_roles(name, ndim, role):
    assert module_role(name, ndim) == role


def _embedding() -> QuantizedTensor:
    # 6 tokens x 64, int8 symmetric groups of 32 (GGUF Q8_0-like): value = q * s
    q = (np.arange(6 * 64, dtype=np.int64).reshape(6, 64) % 11 - 5).astype(np.int8)
    s = np.array([[0.5, 0.25]] * 6, np.float16)
    return QuantizedTensor("model.embed_tokens.weight", (OUT, IN), q, s, QuantScheme(8, True, ZeroPoint.NONE, "F16"),
                           GroupMap.per_group(32))


def _linear(name="model.layers.0.self_attn.q_proj.weight") -> QuantizedTensor:
    # 64 x 64, uint4 symmetric (centre 8) groups of 32
    q = (np.arange(64 * 64, dtype=np.int64).reshape(64, 64) % 16).astype(np.uint8)
    s = np.full((64, 2), 0.125, np.float16)
    return QuantizedTensor(name, (OUT, IN), q, s, QuantScheme(4, False, ZeroPoint.NONE, "F16"), GroupMap.per_group(32))


def _llama_src(tmp_path):
    norm = DenseTensor("model.norm.weight", np.ones(64, np.float32))
    p = tmp_path / "src.safetensors"
    write_native(Checkpoint.from_tensors([_embedding(), _linear(), norm], config=LLAMA_CONFIG), p)
    return p


def _expected_embedding() -> np.ndarray:
    q = (np.arange(6 * 64).reshape(6, 64) % 11 - 5).astype(np.float32)
    s = np.repeat(np.array([0.5, 0.25], np.float32), 32)
    return q * s  # exact in float32: small integers times powers of two


@pytest.mark.parametrize("target", ["gptq", "awq", "compressed-tensors"])
def test_hf_linear_targets_write_the_embedding_dense_and_exact(tmp_path, target):
    rep = convert_exact(_llama_src(tmp_path), tmp_path / "out", target)
    out = registry.load(tmp_path / "out")
    emb = out["model.embed_tokens.weight"]
    assert isinstance(emb, DenseTensor) and emb.data.dtype == np.float32
    assert np.array_equal(emb.data, _expected_embedding())
    assert isinstance(out["model.layers.0.self_attn.q_proj.weight"], QuantizedTensor)
    row = next(r for r in rep["tensors"] if r["name"] == "model.embed_tokens.weight")
    assert row["mode"] == "dequantized" and row["bit_exact"] and "input embedding" in row["reason"]
    decisions = {d["tensor"]: d["decision"] for d in rep["modules"]}
    assert decisions == {"model.embed_tokens.weight": "dequantized",
                         "model.layers.0.self_attn.q_proj.weight": "quantized"}
    assert rep["module_summary"] == {"quantized": 1, "dequantized": 1, "kept dense": 0}
    assert rep["summary"]["all_exact"]


def test_compressed_tensors_ignores_the_tied_head(tmp_path):
    # targets ["Linear"] match lm_head: a tied (not stored) head must be listed in ignore, else the
    # loader expects a compressed lm_head that was never written
    convert_exact(_llama_src(tmp_path), tmp_path / "ct", "compressed-tensors")
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert "lm_head" in qc["ignore"]
    assert [g["targets"] for g in qc["config_groups"].values()] == [["Linear"]]


def test_mlx_keeps_the_embedding_quantized(tmp_path):
    # mlx-lm quantizes nn.Embedding (to_quantized) when its width divides the group size
    rep = convert_exact(_llama_src(tmp_path), tmp_path / "mlx", "mlx")
    out = registry.load(tmp_path / "mlx")
    emb = out["model.embed_tokens.weight"]
    assert isinstance(emb, QuantizedTensor) and emb.scheme.bits == 8
    assert np.array_equal(emb.dequantize(), _expected_embedding())
    assert {d["decision"] for d in rep["modules"]} == {"quantized"}
    cfg = json.loads((tmp_path / "mlx" / "config.json").read_text())
    q = cfg["quantization"]

    def of(module):  # a per-module entry, else the defaults (mlx-lm's class predicate)
        entry = q.get(module, q)
        return entry["group_size"], entry["bits"]
    assert of("model.embed_tokens") == (32, 8) and of("model.layers.0.self_attn.q_proj") == (32, 4)


def test_requantize_dequantizes_the_embedding_instead_of_requantizing_it(tmp_path):
    doc = requantize_model(_llama_src(tmp_path), tmp_path / "g", Target(bits=4, granularity="group", group_size=32,
                                                                        symmetric=False), to="gptq")
    out = registry.load(tmp_path / "g")
    assert np.array_equal(out["model.embed_tokens.weight"].data, _expected_embedding())
    assert [r["name"] for r in doc["tensors"]] == ["model.layers.0.self_attn.q_proj.weight"]
    emb = next(d for d in doc["modules"] if d["tensor"] == "model.embed_tokens.weight")
    assert emb["decision"] == "dequantized" and emb["readback_bit_exact"] is True
    assert "model.embed_tokens.weight" in doc["passthrough"]


@pytest.mark.parametrize("to", ["gptq", "compressed-tensors"])
def test_float_bias_source_requantized_without_sym_or_asym_gets_the_targets_kind(tmp_path, to):
    # GGUF Q4_1 / MLX keep a float bias; GPTQ / AWQ / compressed-tensors store integer zero points
    # only (before: a per-value "float bias is not an integer zero point" refusal at write time).
    # GPTQ: asymmetric with integer zero points; compressed-tensors: symmetric, since transformers
    # 5.24 cannot load its asymmetric pack-quantized layout (interop: ct-w8-channel, ct-w4g64)
    codes = np.tile(np.arange(16, dtype=np.uint8), (4, 4))  # 4 x 64
    scales = np.array([[0.5, 0.25]] * 4, np.float16)
    bias = np.array([[-3.3, 1.7]] * 4, np.float16)  # -bias/scale = 6.6, -6.8: not integers
    t = QuantizedTensor("model.layers.0.mlp.up_proj.weight", (OUT, IN), codes, scales,
                        QuantScheme(4, False, ZeroPoint.FLOAT, "F16"), GroupMap.per_group(32), zero_points=bias)
    src = tmp_path / "src.safetensors"
    write_native(Checkpoint.from_tensors([t]), src)
    doc = requantize_model(src, tmp_path / "out", Target(bits=8, granularity="channel"), to=to)
    back = registry.load(tmp_path / "out")["model.layers.0.mlp.up_proj.weight"]
    err = np.abs(back.dequantize() - t.dequantize())
    # each row holds c * 0.5 - 3.3 (group 0, c = 0..15: [-3.3, 4.2]) and c * 0.25 + 1.7 (group 1:
    # [1.7, 5.45]), f16 rounding aside
    lo, hi = float(np.float16(-3.3)), float(np.float16(1.7)) + 15 * 0.25
    if to == "gptq":  # one min/max 8-bit grid per row: step (5.45 + 3.3) / 255
        assert back.scheme.zero_point is ZeroPoint.INTEGER and back.scheme.bits == 8
        step = (hi - lo) / 255
    else:  # symmetric absmax grid per row: step 5.45 / 127
        assert back.scheme.zero_point is ZeroPoint.NONE and back.scheme.bits == 8
        step = max(abs(lo), abs(hi)) / 127
    assert err.max() <= step / 2 * 1.01 and doc["tensors"][0]["readback_bit_exact"] is True


def _moe_src(tmp_path, *, router_quantized_everywhere=True):
    # two blocks, each with a quantized q_proj and an MoE router (quantized in the source, as an MLX
    # model stores it): transformers' AWQ / GPTQ loaders replace every Linear of a block unless the
    # config names it, and would leave a router that holds no qweight randomly initialised
    tensors = []
    for b in (0, 1):
        tensors.append(_linear(f"model.layers.{b}.self_attn.q_proj.weight"))
        tensors.append(_linear(f"model.layers.{b}.mlp.gate.weight"))
    p = tmp_path / "moe.safetensors"
    write_native(Checkpoint.from_tensors(tensors, config=LLAMA_CONFIG), p)
    return p


def test_awq_config_names_the_dense_router(tmp_path):
    rep = convert_exact(_moe_src(tmp_path), tmp_path / "awq", "awq")
    qc = json.loads((tmp_path / "awq" / "config.json").read_text())["quantization_config"]
    assert qc["modules_to_not_convert"] == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    assert {d["tensor"]: d["decision"] for d in rep["modules"]}["model.layers.1.mlp.gate.weight"] == "dequantized"
    assert all(d["readback_bit_exact"] for d in rep["modules"] if d["decision"] == "dequantized")


def test_gptq_config_names_the_dense_router_for_gptqmodel_and_for_transformers(tmp_path):
    convert_exact(_moe_src(tmp_path), tmp_path / "gptq", "gptq")
    qc = json.loads((tmp_path / "gptq" / "config.json").read_text())["quantization_config"]
    # GPTQModel: negative dynamic rules; transformers (optimum convert_model): the modules to convert
    assert qc["dynamic"] == {r"-:^model\.layers\.0\.mlp\.gate$": {}, r"-:^model\.layers\.1\.mlp\.gate$": {}}
    assert qc["modules_in_block_to_quantize"] == [["self_attn.q_proj"]]
    back = registry.load(tmp_path / "gptq")
    assert isinstance(back["model.layers.0.mlp.gate.weight"], DenseTensor)
    assert isinstance(back["model.layers.0.self_attn.q_proj.weight"], QuantizedTensor)


def test_gptq_refuses_a_module_dense_in_one_block_and_quantized_in_another(tmp_path):
    # layer 1's up_proj is dense in the source, layer 0's quantized: optimum's per-block list cannot say so
    tensors = [_linear("model.layers.0.mlp.up_proj.weight"),
               DenseTensor("model.layers.1.mlp.up_proj.weight", np.zeros((64, 64), np.float16))]
    p = tmp_path / "mixed.safetensors"
    write_native(Checkpoint.from_tensors(tensors), p)
    with pytest.raises(NotRepresentableError, match="dense in one decoder block and quantized in another"):
        convert_exact(p, tmp_path / "gptq", "gptq")
    assert not (tmp_path / "gptq").exists()


def test_compressed_tensors_keeps_a_quantized_head_quantized(tmp_path):
    # compressed-tensors' targets ["Linear"] cover lm_head: its loaders read a quantized head
    head = _linear("lm_head.weight")
    p = tmp_path / "head.safetensors"
    write_native(Checkpoint.from_tensors([_linear(), head], config={"architectures": ["LlamaForCausalLM"]}), p)
    rep = convert_exact(p, tmp_path / "ct", "compressed-tensors")
    assert isinstance(registry.load(tmp_path / "ct")["lm_head.weight"], QuantizedTensor)
    qc = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]
    assert "lm_head" not in qc["ignore"] and rep["module_summary"]["dequantized"] == 0
    rep = convert_exact(p, tmp_path / "gptq", "gptq")  # optimum converts block Linears only: dense
    assert {d["tensor"]: d["decision"] for d in rep["modules"]}["lm_head.weight"] == "dequantized"


@pytest.mark.parametrize("to", ["gptq", "awq"])
def test_requantize_into_an_fp16_scale_format_uses_fp16_scales(tmp_path, to):
    # a llama.cpp Q4_K_M sample keeps F32 (super-block x sub-block) scales; GPTQ and AWQ store fp16
    # scales only: a requantization that leaves --scale-dtype out writes fp16 (before: refused,
    # "F32 scales round ... requantize with --scale-dtype f16", to a user already requantizing)
    from tests.conftest import SAMPLES
    src = SAMPLES / "gguf" / "minilm_llamacpp_Q4_K_M.gguf"
    doc = requantize_model(src, tmp_path / to, Target(bits=4, granularity="group", group_size=32, symmetric=False),
                           to=to)
    back = registry.load(tmp_path / to)
    assert {back.spec(n).scheme.scale_dtype for n in back.quantized_names()} == {"F16"}
    assert doc["target"]["scale_dtype"] == "F16" and all(r["readback_bit_exact"] for r in doc["tensors"])
