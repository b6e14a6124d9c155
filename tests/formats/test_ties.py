"""Tied heads (formats/ties.py) through every writer, CASES.md B32 / B33: an lm_head identical to the
embedding under tie_word_embeddings is stored once; a different one is kept and the config untied.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import converter
from converter.formats import registry
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.ops.convert import convert_exact
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor
from converter.validate import validate


# -- B32 / B33: tied embeddings -----------------------------------------------------------------
E = np.array([[1, 0], [0, 1], [1, 1]], np.float16)
H = np.array([2, 1], np.float32)


def _tied_source(tmp_path, head, tie=True):
    q = QuantizedTensor("model.layers.0.mlp.down_proj.weight", (OUT, IN), np.full((8, 32), 9, np.uint8),
                        np.full((8, 1), 0.5, np.float16), QuantScheme(4, False, ZeroPoint.NONE, "F16"),
                        GroupMap.per_group(32))
    cfg = {"model_type": "llama", "tie_word_embeddings": tie}
    from tests.conftest import write_native_as_is  # a source carrying the head as it is (tie rule not applied)
    tensors = [q, DenseTensor("model.embed_tokens.weight", E), DenseTensor("lm_head.weight", head)]
    return write_native_as_is(tmp_path / "src.safetensors", tensors, cfg)


@pytest.mark.parametrize("target", ["gptq", "awq", "compressed-tensors", "mlx", "plain"])
def test_b33_identical_head_stored_once(tmp_path, target):
    src = _tied_source(tmp_path, E.copy())
    rep = convert_exact(src, tmp_path / "out", target)
    assert rep["summary"]["all_exact"] and rep["summary"]["changed"] == 0
    row = next(r for r in rep["tensors"] if r["name"] == "lm_head.weight")
    assert row["mode"] == "tied" and row["tied_to"] == "model.embed_tokens.weight"
    assert "B33" in rep["written"]["tied_head"]["note"]
    out = registry.load(tmp_path / "out")
    assert "lm_head.weight" not in out and json.loads((tmp_path / "out" / "config.json").read_text())[
        "tie_word_embeddings"] is True
    logits = H @ out["model.embed_tokens.weight"].data.astype(np.float32).T
    assert logits.tolist() == [2, 1, 3]


@pytest.mark.parametrize("target", ["gptq", "mlx", "plain"])
def test_b32_different_head_kept_and_untied(tmp_path, target):
    L = E.copy()
    L[2] = [1.5, 1]
    src = _tied_source(tmp_path, L)
    rep = convert_exact(src, tmp_path / "out", target)
    assert rep["summary"]["all_exact"]
    tie = rep["written"]["tied_head"]
    assert not tie["identical"] and tie["max_abs_diff"] == 0.5 and "B32" in tie["note"]
    out = registry.load(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    logits = H @ out["lm_head.weight"].data.astype(np.float32).T
    assert logits.tolist() == [2, 1, 4]  # not the tied [2, 1, 3]


def test_untied_config_keeps_head_without_note(tmp_path):
    src = _tied_source(tmp_path, E.copy(), tie=False)
    rep = convert_exact(src, tmp_path / "out", "gptq")
    assert "tied_head" not in rep["written"] and "lm_head.weight" in registry.load(tmp_path / "out")


# -- B32 / B33: tied heads ----------------------------------------------------------------------------
def _tied_native_source(tmp_path, head) -> Path:
    q = QuantizedTensor("model.layers.0.mlp.down_proj.weight", (OUT, IN), np.full((8, 32), 9, np.uint8),
                        np.full((8, 1), 0.5, np.float16), QuantScheme(4, False, ZeroPoint.NONE, "F16"),
                        GroupMap.per_group(32))
    p = tmp_path / "src.safetensors"
    from tests.conftest import write_native_as_is
    cfg = {"model_type": "llama", "tie_word_embeddings": True, "hidden_size": 2, "vocab_size": 3}
    write_native_as_is(p, [q, DenseTensor("model.embed_tokens.weight", E), DenseTensor("lm_head.weight", head)], cfg)
    assert "lm_head.weight" in converter.load(p).names()
    return p


def test_b32_gguf_keeps_a_different_head(tmp_path):
    L = E.copy()
    L[2] = [1.5, 1]
    convert_exact(_tied_native_source(tmp_path, L), tmp_path / "out.gguf", "gguf")
    out = converter.load(tmp_path / "out.gguf")
    assert (H @ out["lm_head.weight"].dequantize().T).tolist() == [2, 1, 4]  # not the tied [2, 1, 3]


@pytest.mark.parametrize("target", ["gguf", "native"])
def test_b33_identical_head_stored_once_in_every_target(tmp_path, target):
    """README: with tie_word_embeddings true, an lm_head identical to the embedding is stored once.

    llama.cpp falls back to token_embd when output.weight is absent; the native file keeps the config.
    """
    dst = tmp_path / ("out.gguf" if target == "gguf" else "out.safetensors")
    rep = convert_exact(_tied_native_source(tmp_path, E.copy()), dst, target)
    out = converter.load(dst)
    assert (H @ out["model.embed_tokens.weight"].dequantize().T).tolist() == [2, 1, 3]
    assert "lm_head.weight" not in out.names(), f"{target}: the identical head is stored twice"
    assert next(r for r in rep["tensors"] if r["name"] == "lm_head.weight")["mode"] == "tied"


def test_b32_native_target_unties_a_different_head(tmp_path):
    """A kept, different head under tie_word_embeddings: true is dropped by tie-honouring loaders."""
    L = E.copy()
    L[2] = [1.5, 1]
    dst = tmp_path / "out.safetensors"
    convert_exact(_tied_native_source(tmp_path, L), dst, "native")
    out = converter.load(dst)
    assert (H @ out["lm_head.weight"].dequantize().T).tolist() == [2, 1, 4]
    assert out.config.get("tie_word_embeddings") is False, "config still ties a head that differs (B32)"
    assert not [f for f in validate(dst).findings if f.code == "tied-embeddings"]


def test_b33_quantized_duplicate_head_cost(tmp_path):
    # Qwen1.5-0.5B: vocab 151936 x hidden 1024, 4-bit / g64, fp16 scales + biases. Here vocab 64 = 151936 / 2374.
    V, Hd = 64, 1024
    rng = np.random.default_rng(33)
    scheme = QuantScheme(4, False, ZeroPoint.FLOAT, "F16")
    e = converter.quantize(rng.normal(size=(V, Hd)).astype(np.float32), scheme, GroupMap.per_group(64),
                           name="model.embed_tokens.weight")
    other = QuantizedTensor("model.layers.0.mlp.x.weight", (OUT, IN), e.codes, e.scales, scheme, e.group_map,
                            zero_points=e.zero_points)
    d = tmp_path / "m"
    converter.save(Checkpoint.from_tensors([e, other], config={"model_type": "qwen2", "tie_word_embeddings": True,
                                                                "hidden_size": Hd, "vocab_size": V}), d, format="mlx")
    raw = load_file(str(d / "model.safetensors"))
    for k in [k for k in raw if k.startswith("model.layers.0.mlp.x.")]:
        raw["lm_head." + k.rsplit(".", 1)[1]] = raw.pop(k)  # an untied copy of the embedding as the head
    save_file(raw, str(d / "model.safetensors"))
    f = next(f for f in validate(d).findings if f.code == "tied-embeddings")
    assert f.severity == "warning" and f.tensor == "lm_head.weight"
    assert f.evidence["duplicate_bytes"] == V * Hd // 2 + 2 * 2 * V * Hd // 64 == 36864
    assert f.evidence["duplicate_bytes"] * (151936 // V) == 77_791_232 + 9_723_904  # ~87.5 MB
    rep = convert_exact(d, tmp_path / "once", "mlx")
    assert rep["written"]["tied_head"]["identical"]
    assert not any(k.startswith("lm_head") for k in load_file(str(tmp_path / "once" / "model.safetensors")))
