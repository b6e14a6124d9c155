"""Structural findings (validate/structural.py) for CASES.md faults: g_idx and actorder (B11, B12),
partial and skipped groups (B13-B15), relabelled bits and packing (B27, B29), tied embeddings
(B32/B33), missing shards (B34), LFS stubs (B36) and block size 512 (B38)."""

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import converter
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor
from converter.validate import validate
from converter.validate.interpretations import alternatives
from tests.validate.helpers import assert_finding, copy_sample, edit_config, write_gptq

U4 = QuantScheme(4, False, ZeroPoint.NONE, "F16")
U4Z = QuantScheme(4, False, ZeroPoint.INTEGER, "F16")




def test_b11_g_idx_with_act_order_not_declared(tmp_path):
    t = QuantizedTensor("m.fc.weight", (OUT, IN), np.array([[10, 11, 12, 13]], np.uint8),
                        np.array([[0.1, 1.0]], np.float16), U4,
                        GroupMap.per_group(2, IN, np.array([1, 0, 1, 0], np.int32)))
    d = write_gptq(tmp_path, t, checkpoint_format="gptq_v2")
    back = converter.load(d)["m.fc.weight"]
    assert np.allclose(back.dequantize(), [[2.0, 0.3, 4.0, 0.5]], rtol=1e-3)
    assert np.allclose(alternatives(back)["sequential groups (g_idx ignored)"], [[0.2, 0.3, 4.0, 5.0]], rtol=1e-3)
    assert not [f for f in validate(d).findings if f.code == "g-idx"]  # desc_act true: declared
    edit_config(d, lambda qc: qc.update(desc_act=False))
    f = assert_finding(validate(d), "g-idx", "m.fc.weight")
    assert "act-order" in f.message and f.evidence["first_difference"] == 0


def test_b12_actorder_on_a_channel_scheme(tmp_path):
    d = copy_sample("ct_pack_w8a16_channel_sym", tmp_path)
    edit_config(d, lambda qc: qc["config_groups"]["group_0"]["weights"].update(actorder="static"))
    rep = validate(d)
    f = assert_finding(rep, "config-mismatch")
    assert "actorder requires strategy=group and a g_idx of length I" in f.message and rep.exit_code == 1


@pytest.mark.parametrize("width, group, padded, legal", [(6, 4, 8, []), (192, 128, 256, [16, 32, 64])])
def test_b13_b14_partial_group_reports_padding_and_legal_sizes(tmp_path, width, group, padded, legal):
    rel = np.resize(np.array([2, -1, 3, 1, 4, -2]), width)
    ng = -(-width // group)
    scales = np.resize(np.array([0.125, 0.5], np.float16), ng).reshape(1, ng)
    t = QuantizedTensor("m.fc.weight", (OUT, IN), (rel + 8).astype(np.uint8).reshape(1, width), scales, U4,
                        GroupMap.per_group(group, IN))
    d = write_gptq(tmp_path, t)
    back = converter.load(d)["m.fc.weight"].dequantize()
    if width == 6:
        assert back.tolist() == [[0.25, -0.125, 0.375, 0.125, 2.0, -1.0]]  # the tail keeps its own scale
    rep = validate(d)
    f = assert_finding(rep, "group-tail", "m.fc.weight")
    assert f.severity == "info" and rep.exit_code == 0
    assert (f.evidence["logical_width"], f.evidence["padded_width"], f.evidence["n_groups"]) == (width, padded, ng)
    assert f.evidence["legal_group_sizes"] == legal


def test_b15_layer_left_dense_reports_legal_group_sizes(tmp_path):
    from converter.validate.probes import probe_tensor
    q = probe_tensor(16, 128, 64, 4, False, ZeroPoint.NONE, name="m.a.weight")
    dense = DenseTensor("m.b.weight", np.zeros((4, 4304), np.float16))
    d = tmp_path / "mlx"
    converter.save(Checkpoint.from_tensors([q, dense]), d, format="mlx")
    rep = validate(d)
    f = assert_finding(rep, "group-skip", "m.b.weight")
    assert f.evidence["legal_group_sizes"] == [16] and f.evidence["group_size"] == 64 and rep.exit_code == 0


def test_b27_bits_and_group_relabeled(tmp_path):
    d = copy_sample("mlx_affine_g64_b4", tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization"] = cfg["quantization_config"] = {"group_size": 128, "bits": 2, "mode": "affine"}
    (d / "config.json").write_text(json.dumps(cfg))
    f = assert_finding(validate(d), "config-mismatch")
    assert "bits=4, group_size=64" in f.evidence["expected"]


def test_b29_padded_vs_dense_3bit_packing(tmp_path):
    from converter.validate.probes import probe_tensor
    t = probe_tensor(8, 512, 128, 3, False, ZeroPoint.NONE, name="m.fc.weight")
    d = tmp_path / "ct3"
    converter.save(Checkpoint.from_tensors([t]), d, format="compressed-tensors")
    assert validate(d).findings == []
    edit_config(d, lambda qc: qc.update(version="0.17.0"))
    f = assert_finding(validate(d), "config-mismatch", "m.fc.weight_packed")
    assert f.evidence["found"] == 48 and "52" in f.evidence["expected"]  # dense words vs padded words for I=512


def _tied_dir(tmp_path, head, tie):
    d = tmp_path / f"tied-{len(list(tmp_path.iterdir()))}"
    d.mkdir()
    e = np.array([[1, 0], [0, 1], [1, 1]], np.float32)
    tensors = {"model.embed_tokens.weight": e}
    if head is not None:
        tensors["lm_head.weight"] = np.asarray(head, np.float32)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"tie_word_embeddings": tie, "hidden_size": 2, "vocab_size": 3}))
    return d


def test_b32_b33_tied_embeddings(tmp_path):
    e = [[1, 0], [0, 1], [1, 1]]
    h = np.array([2, 1], np.float32)
    assert (h @ np.array(e, np.float32).T).tolist() == [2, 1, 3]
    dup = validate(_tied_dir(tmp_path, e, True))
    f = assert_finding(dup, "tied-embeddings", "lm_head.weight")
    assert f.severity == "warning" and f.evidence["duplicate_bytes"] == 24
    real_head = [[1, 0], [0, 1], [1.5, 1]]
    assert (h @ np.array(real_head, np.float32).T).tolist() == [2, 1, 4]
    f = assert_finding(validate(_tied_dir(tmp_path, real_head, True)), "tied-embeddings", "lm_head.weight")
    assert f.severity == "error" and f.evidence["max_abs_diff"] == 0.5
    f = assert_finding(validate(_tied_dir(tmp_path, None, False)), "tied-embeddings", "model.embed_tokens.weight")
    assert f.severity == "error"
    assert validate(_tied_dir(tmp_path, real_head, False)).findings == []


def test_b34_missing_shard_counts_its_tensors(tmp_path):
    d = tmp_path / "b34"
    d.mkdir()
    save_file({"a.qweight": np.zeros((1, 8), np.int32), "a.scales": np.ones((1, 8), np.float16)},
              str(d / "s1.safetensors"))
    wm = {"a.qweight": "s1.safetensors", "a.scales": "s1.safetensors", "b.qweight": "s2.safetensors",
          "b.scales": "s2.safetensors"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    rep = validate(d)
    f = assert_finding(rep, "missing-shard", "s2.safetensors")
    assert f.message == "missing shard s2.safetensors (2 tensors)" and rep.exit_code == 1


def test_b36_lfs_stub(tmp_path):
    stub = "version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 9876543210\n"
    d = copy_sample("gptq_w4_g128_sym", tmp_path)
    (d / "model.safetensors").write_text(stub)
    f = assert_finding(validate(d), "lfs-pointer", "model.safetensors")
    assert f.evidence["bytes"] == len(stub)
    # a lone stub file is unreadable (exit 3), and the error says why
    from converter.errors import CorruptFileError
    lone = tmp_path / "lone.safetensors"
    lone.write_text(stub)
    with pytest.raises(CorruptFileError, match="git-LFS"):
        validate(lone)


def test_b38_block_size_512_is_reported_with_the_exact_reblocking(tmp_path):
    K, N, G = 2048, 4, 512
    t = QuantizedTensor("m.fc.weight", (OUT, IN), np.full((N, K), 2, np.uint8), np.full((N, K // G), 0.5, np.float16),
                        U4Z, GroupMap.per_group(G, IN), zero_points=np.full((N, K // G), 3, np.int16))
    d = write_gptq(tmp_path, t, checkpoint_format="gptq_v2")
    w = converter.load(d)["m.fc.weight"].dequantize()
    assert (w @ np.ones(K, np.float32)).tolist() == [-1024.0] * N
    f = assert_finding(validate(d), "group-size", "m.fc.weight")
    assert f.evidence["group_size"] == 512 and f.evidence["exact_reblock_to"] == 256


def test_check_padding_reads_the_words_only_when_the_stored_shape_has_room(tmp_path):
    """The padding check maps a packed array only when its stored width leaves fields past the logical length
    (a GPTQ ``qweight`` of I = 252 four-bit codes: 32 words hold 256); a second map of an unpadded tensor's words
    (every other tensor) doubled their resident pages (8-bit codes: 2.1 bytes per weight under validate's budget of
    2) and its populate time. The padded tensor's nonzero padding fields are still found."""
    from converter.formats.source import Source
    from converter.validate import structural
    from tests.synthetic import lsb_words

    rng = np.random.default_rng(0)
    for width, padded in ((256, False), (252, True)):
        codes = rng.integers(0, 16, (64, width)).astype(np.uint8)
        t = QuantizedTensor("l.weight", (OUT, IN), codes, np.full((64, 2), 0.01, np.float16),
                            QuantScheme(4, False, ZeroPoint.NONE, "F16"), GroupMap.per_group(128, IN))
        d = tmp_path / f"w{width}"
        converter.formats.registry.get("gptq").write(Checkpoint.from_tensors([t]), d)
        if padded:  # set the four padding fields of the last word row's first column: 0xF << 16 ... 0xF << 28
            arrays = load_file(str(d / "model.safetensors"))
            q = arrays["l.qweight"].view(np.uint32).copy()
            q[-1, 0] |= np.uint32(lsb_words([0, 0, 0, 0, 15, 15, 15, 15], 4)[0])
            arrays["l.qweight"] = q.view(np.int32)
            save_file(arrays, str(d / "model.safetensors"), {"format": "pt"})
        ckpt = converter.load(d)
        source = Source(d)
        reads: list[str] = []
        source.read = lambda name, reads=reads, real=source.read: reads.append(name) or real(name)
        found = structural.check_padding(source, ckpt.spec("l.weight"), ckpt["l.weight"])
        assert reads == (["l.qweight"] if padded else [])
        assert [(f.code, f.evidence.get("nonzero")) for f in found] == ([("padding", 4)] if padded else [])
