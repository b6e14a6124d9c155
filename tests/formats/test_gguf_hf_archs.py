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

def _stacked(tensors: dict) -> dict:
    """Per-expert weights stacked along a new leading axis, as Qwen2MoeModel.modify_tensors does (by hand)."""
    out, groups = {}, {}
    for name, a in tensors.items():
        parts = name.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            groups.setdefault(".".join(parts[:i + 1] + parts[i + 2:]), {})[int(parts[i + 1])] = a
        else:
            out[name] = a
    for name, members in groups.items():
        out[name] = np.stack([members[e] for e in range(len(members))])
    return out


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


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2", "qwen3", "phi3", "qwen2_moe", "qwen3_moe"])
def test_names_and_shapes_are_gguf_pys(model_type, tmp_path):
    arch = HF_MODEL_TYPE_TO_ARCH[model_type]
    src = _stacked(_tensors(model_type))
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
    for arch in ("llama", "qwen2", "qwen3", "phi3", "qwen2moe", "qwen3moe"):
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


def test_moe_experts_stacked_and_keys(tmp_path):
    """qwen2_moe: blk.N.ffn_gate_exps = experts 0..3 of gate_proj stacked (expert, out, in), values exact; the MoE
    keys of Qwen2MoeModel.set_gguf_parameters by hand from the config."""
    src = _tensors("qwen2_moe")
    reader = _convert(_write(tmp_path, "qwen2_moe"), tmp_path / "out.gguf")
    data = {t.name: np.asarray(t.data) for t in reader.tensors}
    for e in range(4):
        np.testing.assert_array_equal(data["blk.1.ffn_gate_exps.weight"][e],
                                      src[f"model.layers.1.mlp.experts.{e}.gate_proj.weight"])
        np.testing.assert_array_equal(data["blk.0.ffn_down_exps.weight"][e],
                                      src[f"model.layers.0.mlp.experts.{e}.down_proj.weight"])
    kv = _kv(reader, "qwen2moe")
    assert (kv["expert_count"], kv["expert_used_count"], kv["expert_feed_forward_length"],
            kv["expert_shared_feed_forward_length"], kv["feed_forward_length"]) == (4, 2, 32, 48, 96)


def test_moe_fused_experts_split_in_halves(tmp_path):
    """transformers 5's fused layout: experts.gate_up_proj (expert, 2 * ff, hidden) -> gate = first half of the rows,
    up = second half (Qwen2MoeModel.modify_tensors); experts.down_proj -> ffn_down_exps as it is."""
    folder = _write(tmp_path, "qwen3_moe")
    src = _tensors("qwen3_moe")
    fused = {}
    for name, a in src.items():
        if ".experts." not in name:
            fused[name] = a
    for i in range(LAYERS):
        p = f"model.layers.{i}.mlp.experts."
        gate = np.stack([src[f"{p}{e}.gate_proj.weight"] for e in range(4)])
        up = np.stack([src[f"{p}{e}.up_proj.weight"] for e in range(4)])
        fused[p + "gate_up_proj"] = np.concatenate([gate, up], axis=1)
        fused[p + "down_proj"] = np.stack([src[f"{p}{e}.down_proj.weight"] for e in range(4)])
    save_file(fused, str(folder / "model.safetensors"))
    (tmp_path / "b").mkdir()
    per_expert = _convert(_write(tmp_path / "b", "qwen3_moe"), tmp_path / "per_expert.gguf")
    from_fused = _convert(folder, tmp_path / "fused.gguf")
    a = {t.name: np.asarray(t.data) for t in per_expert.tensors}
    b = {t.name: np.asarray(t.data) for t in from_fused.tensors}
    assert sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a)


def test_quantized_per_expert_weights_are_refused():
    from converter.errors import NotRepresentableError
    from converter.formats.gguf.experts import stack_experts
    from converter.groups import GroupMap
    from converter.scheme import QuantScheme, ZeroPoint
    from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor
    q = QuantizedTensor("model.layers.0.mlp.experts.0.gate_proj.weight", ("out", "in"), np.zeros((8, 64), np.int8),
                        np.ones((8, 2), np.float16), QuantScheme(8, True, ZeroPoint.NONE, "F16"),
                        GroupMap.per_group(32))
    d = DenseTensor("model.layers.0.mlp.experts.1.gate_proj.weight", np.zeros((8, 64), np.float32))
    ckpt = Checkpoint.from_tensors([q, d], config={"model_type": "qwen3_moe"})
    with pytest.raises(NotRepresentableError, match="quantized per-expert") as info:
        stack_experts(ckpt)
    assert info.value.tensor == q.name and "dequantize" in info.value.hint
    assert stack_experts(Checkpoint.from_tensors([q, d], config={"model_type": "llama"})).names() == [q.name, d.name]


def test_unmapped_architecture_is_named_in_a_warning(tmp_path):
    """olmo2 has no name table: the file is written with Hugging Face names and the report says llama.cpp
    will not load it (no silent success)."""
    folder = _write(tmp_path, "llama")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "olmo2"}))
    res = CliRunner().invoke(main, ["convert", str(folder), str(tmp_path / "out.gguf"), "--to", "gguf", "--json"])
    assert res.exit_code == 0, res.output
    warning = json.loads(res.output)["side_files_skipped"]["tensor names"]
    assert "'olmo2'" in warning and "will not load" in warning
    names = {t.name for t in gguf.GGUFReader(tmp_path / "out.gguf").tensors}
    assert "model.layers.0.self_attn.q_proj.weight" in names
