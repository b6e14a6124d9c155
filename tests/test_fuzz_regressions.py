"""Regression tests for crashes the fuzzer found (each was an untyped exception before the fix)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from converter.errors import ConverterError, CorruptFileError, FormatError, LayoutError, MalformedInputError
from converter.formats.registry import load
from converter.groups import MAX_GROUP_SIZE, GroupMap
from tests.conftest import SAMPLES


def sample(tmp_path, name):
    d = tmp_path / name
    shutil.copytree(SAMPLES / name, d)
    return d


def edit_config(d, fn, fname="config.json"):
    cfg = json.loads((d / fname).read_text())
    fn(cfg)
    (d / fname).write_text(json.dumps(cfg))


def read_all(path, fmt=None):
    ckpt = load(path, format=fmt)
    for _, t in ckpt.items():
        if hasattr(t, "dequantize"):
            t.dequantize()
    return ckpt


@pytest.mark.parametrize("key,value,field", [
    ("ignore", 3, "quantization_config.ignore"),                   # was TypeError: 'int' object is not iterable
    ("ignore", [["lm_head"]], "quantization_config.ignore"),       # was AttributeError: no attribute 'startswith'
    ("sparsity_config", "dense", "quantization_config.sparsity_config"),  # was AttributeError: no attribute 'get'
])
def test_ct_config_types(tmp_path, key, value, field):
    d = sample(tmp_path, "ct_pack_w4a16_group128_sym")
    edit_config(d, lambda c: c["quantization_config"].__setitem__(key, value))
    with pytest.raises(FormatError) as ei:
        read_all(d)
    assert not isinstance(ei.value, MalformedInputError)
    assert ei.value.field == field and ei.value.file.endswith("config.json") or ei.value.field == field


def test_ct_targets_not_strings(tmp_path):
    d = sample(tmp_path, "ct_pack_w4a16_group128_sym")
    edit_config(d, lambda c: c["quantization_config"]["config_groups"]["group_0"].__setitem__("targets", 7))
    with pytest.raises(FormatError) as ei:
        read_all(d)
    assert ei.value.field == "quantization_config.config_groups.group_0.targets" and ei.value.found == "7"


@pytest.mark.parametrize("gs", ["gptq", 1.5, True, [128]])
def test_gptq_group_size_not_int(tmp_path, gs):
    d = sample(tmp_path, "gptq_w4_g128_sym")
    edit_config(d, lambda c: c["quantization_config"].__setitem__("group_size", gs))
    with pytest.raises(FormatError) as ei:
        read_all(d)
    assert ei.value.field == "quantization_config.group_size" and not isinstance(ei.value, MalformedInputError)


@pytest.mark.parametrize("gs", [2**63 - 1, 2**64, 10**30])
def test_gptq_huge_group_size_typed_not_overflow(tmp_path, gs):
    # was OverflowError in GroupMap.is_trivial_g_idx (int32 arange // huge), and a huge np.repeat
    d = sample(tmp_path, "gptq_w4_gchan_sym")
    edit_config(d, lambda c: c["quantization_config"].__setitem__("group_size", gs))
    with pytest.raises(ConverterError) as ei:
        read_all(d)
    assert not isinstance(ei.value, MalformedInputError)


def test_gptq_meta_not_object(tmp_path):
    d = sample(tmp_path, "gptq_w4_g128_sym")
    edit_config(d, lambda c: c["quantization_config"].__setitem__("meta", 3))
    read_all(d)  # was AttributeError: 'int' object has no attribute 'get'; meta is optional


def test_mlx_mode_unhashable(tmp_path):
    d = sample(tmp_path, "mlx_affine_g64_b4")
    cfg = json.loads((d / "config.json").read_text())
    key = "quantization" if "quantization" in cfg else "quantization_config"
    edit_config(d, lambda c: c[key].__setitem__("mode", ["affine"]))
    with pytest.raises(FormatError) as ei:  # was TypeError: unhashable type: 'list'
        read_all(d, "mlx")
    assert ei.value.field == "quantization.mode"


@pytest.mark.parametrize("qc", ["x", 3, [1]])
def test_quantization_config_not_object_in_detection_message(tmp_path, qc):
    d = sample(tmp_path, "awq_gemm_w4_g128_zp")
    edit_config(d, lambda c: c.__setitem__("quantization_config", qc))
    from converter.formats.source import Source
    assert "quant_method=None" in Source(d).describe()  # was AttributeError in Source.describe
    try:
        read_all(d)
    except ConverterError as exc:
        assert not isinstance(exc, MalformedInputError)


def test_group_map_bounds_and_no_huge_repeat():
    with pytest.raises(LayoutError) as ei:
        GroupMap.per_group(MAX_GROUP_SIZE + 1)
    assert ei.value.field == "group_map.group_size"
    gm = GroupMap.per_group(MAX_GROUP_SIZE)
    out = gm.expand(np.ones((3, 1), np.float32), (3, 5), ("out", "in"))  # must not repeat 2**31 times
    assert out.shape == (3, 5)
    assert gm.is_trivial_g_idx(5)


def test_shard_directory_in_index(tmp_path):
    # was IsADirectoryError from read_header
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").mkdir()
    with pytest.raises(CorruptFileError) as ei:
        load(d)
    assert "not a regular file" in ei.value.message


@pytest.mark.malformed_ok
def test_safety_net_wraps_foreign_errors(tmp_path, monkeypatch):
    """A reader bug on foreign data still gives a typed one-line error naming the file and tensor."""
    from converter.formats.source import Source
    ckpt_ok = load(SAMPLES / "minilm_fp16.safetensors")
    name = ckpt_ok.names()[0]
    def broken(self, n):
        return [][1]  # any foreign error: IndexError
    monkeypatch.setattr(Source, "dense", broken)  # the plain reader's dense loader
    ckpt = load(SAMPLES / "minilm_fp16.safetensors", format="plain")
    with pytest.raises(MalformedInputError) as ei:
        ckpt[name]
    e = ei.value
    assert e.tensor == name and e.file.endswith("minilm_fp16.safetensors") and "IndexError" in e.message
    assert isinstance(e.__cause__, IndexError) and e.exit_code == 3


def test_gguf_quantized_tensor_with_zero_elements(tmp_path):
    # was ValueError (reshape of an empty block array) in the GGUF reader's tensor load
    from tests.formats.test_gguf_bounds import STR, build, kv, s, tinfo
    raw = build([kv("general.architecture", STR, s("bert"))],
                [tinfo("blk.0.attn_q.weight", (32, 0), 2, 0), tinfo("blk.0.attn_q.bias", (8,), 0, 0)], b"\0" * 32)
    p = tmp_path / "z.gguf"
    p.write_bytes(raw)
    ckpt = load(p)
    names = [n for n in ckpt.names() if ckpt.spec(n).kind == "quantized"]
    with pytest.raises(CorruptFileError) as ei:
        for n in names:
            ckpt[n]
    assert ei.value.field == "ne" and "no elements" in ei.value.message and ei.value.file.endswith("z.gguf")
    assert not isinstance(ei.value, MalformedInputError)


def test_gguf_reader_runs_the_bounds_check(tmp_path):
    from tests.formats.test_gguf_bounds import build
    p = tmp_path / "huge.gguf"
    p.write_bytes(build(n_tensors=2**63))
    with pytest.raises(CorruptFileError) as ei:
        load(p, format="gguf")
    assert ei.value.field == "tensor_count"
