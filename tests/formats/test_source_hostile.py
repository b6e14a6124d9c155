"""Hostile inputs at the Source boundary: shard indexes (B34), pickle refusal, special files, B36."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from converter.errors import (
    CorruptFileError, FormatError, InputNotFoundError, MissingTensorError, UnsafeFormatError,
)
from converter.formats.registry import load
from converter.write.safetensors import write_safetensors
from converter.formats.source import Source

A = np.arange(6, dtype=np.float32).reshape(2, 3)


def sharded(tmp_path, weight_map=None, shards=None):
    """A two-shard float directory; ``weight_map`` / ``shards`` override the index / files."""
    d = tmp_path / "model"
    d.mkdir()
    shards = shards if shards is not None else {"s1.safetensors": ["a.weight", "a.bias"],
                                                "s2.safetensors": ["b.weight", "b.bias"]}
    for fname, names in shards.items():
        write_safetensors(d / fname, {n: A for n in names})
    wm = weight_map if weight_map is not None else {n: f for f, ns in shards.items() for n in ns}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    return d


def test_valid_sharded_reads(tmp_path):
    ckpt = load(sharded(tmp_path))
    assert ckpt.format == "plain" and sorted(ckpt.names()) == ["a.bias", "a.weight", "b.bias", "b.weight"]
    assert np.array_equal(ckpt["b.weight"].data, A)


def test_b34_missing_shard_named_with_count(tmp_path):
    # CASES.md B34: weight_map {a.qweight: s1, a.scales: s1, b.qweight: s2, b.scales: s2}; only s1 on disk.
    d = tmp_path / "m"
    d.mkdir()
    write_safetensors(d / "s1", {"a.qweight": A.astype(np.int32), "a.scales": A.astype(np.float16)})
    wm = {"a.qweight": "s1", "a.scales": "s1", "b.qweight": "s2", "b.scales": "s2"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    (d / "x.safetensors").write_bytes(b"")  # so the directory is recognised (index alone suffices too)
    with pytest.raises(InputNotFoundError) as ei:
        load(d)
    e = ei.value
    assert "missing shard s2 (2 tensors)" in e.message and e.field == "weight_map"
    assert e.file.endswith("model.safetensors.index.json") and e.found == "s2 absent"


@pytest.mark.parametrize("bad", ["../outside.safetensors", "/etc/passwd", "sub/s1.safetensors", "..", ".", "",
                                 "sub\\s1.safetensors", 3, None])
def test_shard_name_must_be_plain(tmp_path, bad):
    d = sharded(tmp_path)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"]["b.weight"] = bad
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    with pytest.raises(CorruptFileError) as ei:
        load(d)
    e = ei.value
    assert "plain file name" in e.message and e.tensor == "b.weight" and e.field == "weight_map"
    assert e.found == bad


def test_symlink_shard_leading_outside(tmp_path):
    outside = tmp_path / "secret.safetensors"
    write_safetensors(outside, {"b.weight": A})
    d = sharded(tmp_path, shards={"s1.safetensors": ["a.weight"]},
                weight_map={"a.weight": "s1.safetensors", "b.weight": "evil.safetensors"})
    (d / "evil.safetensors").symlink_to(outside)
    with pytest.raises(CorruptFileError) as ei:
        load(d)
    assert "outside the checkpoint directory" in ei.value.message and ei.value.tensor == "b.weight"
    assert ei.value.found == str(outside.resolve())


def test_symlink_shard_inside_is_fine(tmp_path):
    d = sharded(tmp_path, shards={"s1.safetensors": ["a.weight"], "real2.safetensors": ["b.weight"]},
                weight_map={"a.weight": "s1.safetensors", "b.weight": "s2.safetensors"})
    (d / "s2.safetensors").symlink_to(d / "real2.safetensors")
    os.replace(d / "real2.safetensors", d / "real2.bytes")
    (d / "s2.safetensors").unlink()
    (d / "s2.safetensors").symlink_to("real2.bytes")
    assert np.array_equal(load(d)["b.weight"].data, A)


def test_shard_is_a_directory(tmp_path):
    d = sharded(tmp_path, shards={"s1.safetensors": ["a.weight"]},
                weight_map={"a.weight": "s1.safetensors", "b.weight": "dir.safetensors"})
    (d / "dir.safetensors").mkdir()
    with pytest.raises(CorruptFileError) as ei:
        load(d)
    assert "not a regular file" in ei.value.message and ei.value.tensor == "b.weight"


def test_tensor_named_by_index_absent(tmp_path):
    d = sharded(tmp_path, weight_map={"a.weight": "s1.safetensors", "a.bias": "s1.safetensors",
                                      "b.weight": "s2.safetensors", "b.bias": "s2.safetensors",
                                      "c.weight": "s2.safetensors"})
    with pytest.raises(MissingTensorError) as ei:
        load(d)
    e = ei.value
    assert e.tensor == "c.weight" and e.file.endswith("s2.safetensors") and e.found == "absent"


def test_index_names_wrong_shard(tmp_path):
    d = sharded(tmp_path, weight_map={"a.weight": "s2.safetensors", "a.bias": "s1.safetensors",
                                      "b.weight": "s2.safetensors", "b.bias": "s2.safetensors"})
    with pytest.raises(FormatError) as ei:
        load(d)
    assert "wrong shard" in ei.value.message and ei.value.tensor == "a.weight"
    assert ei.value.expected == "s1.safetensors" and ei.value.found == "s2.safetensors"


def test_stale_index_unlisted_tensor(tmp_path):
    d = sharded(tmp_path, weight_map={"a.weight": "s1.safetensors", "a.bias": "s1.safetensors",
                                      "b.weight": "s2.safetensors"})
    with pytest.raises(FormatError) as ei:
        load(d)
    assert "stale index" in ei.value.message and ei.value.found == ["b.bias"]


def test_tensor_in_two_shards(tmp_path):
    d = sharded(tmp_path,
                shards={"s1.safetensors": ["a.weight", "b.weight"], "s2.safetensors": ["a.weight", "c.weight"]},
                weight_map={"a.weight": "s1.safetensors", "b.weight": "s1.safetensors", "c.weight": "s2.safetensors"})
    with pytest.raises(FormatError) as ei:
        load(d)
    assert "two shards" in ei.value.message and ei.value.tensor == "a.weight"


@pytest.mark.parametrize("wm", [None, [], "s1.safetensors", 1])
def test_weight_map_not_object(tmp_path, wm):
    d = sharded(tmp_path)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    with pytest.raises(CorruptFileError) as ei:
        load(d)
    assert ei.value.field == "weight_map"


@pytest.mark.parametrize("text", ["", "{", "[" * 100000, "1" * 5000, "\xff"])
def test_index_not_json(tmp_path, text):
    d = sharded(tmp_path)
    (d / "model.safetensors.index.json").write_text(text, encoding="latin-1")
    with pytest.raises(CorruptFileError) as ei:
        load(d)
    assert ei.value.file.endswith("model.safetensors.index.json")


def test_several_files_without_index(tmp_path):
    d = sharded(tmp_path)
    (d / "model.safetensors.index.json").unlink()
    with pytest.raises(FormatError) as ei:
        load(d)
    assert "no model.safetensors.index.json" in ei.value.message


@pytest.mark.parametrize("text", ["[1, 2]", "{", "[" * 100000])
def test_config_json_bad(tmp_path, text):
    d = tmp_path / "m"
    d.mkdir()
    write_safetensors(d / "model.safetensors", {"a.weight": A})
    (d / "config.json").write_text(text)
    with pytest.raises(CorruptFileError) as ei:
        load(d)
    assert ei.value.file.endswith("config.json")


# -- no pickle, ever ------------------------------------------------------------------------------

class _Boom:
    """Unpickling this would create a marker file: proves nothing was unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "model.pth", "model.ckpt"])
def test_pickle_file_refused(tmp_path, name):
    marker = tmp_path / "executed"
    p = tmp_path / name
    p.write_bytes(pickle.dumps(_Boom(marker)))
    with pytest.raises(UnsafeFormatError) as ei:
        load(p)
    e = ei.value
    assert "pickle" in e.message and "safetensors" in e.hint and "weights_only=True" in e.hint
    assert not marker.exists()


def test_directory_with_only_pytorch_model_bin(tmp_path):
    marker = tmp_path / "executed"
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "pytorch_model.bin").write_bytes(pickle.dumps(_Boom(marker)))
    with pytest.raises(UnsafeFormatError) as ei:
        load(d)
    assert ei.value.file.endswith("pytorch_model.bin") and "safetensors" in ei.value.hint
    assert not marker.exists()


def test_pickle_next_to_safetensors_is_ignored_not_copied(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    write_safetensors(d / "model.safetensors", {"a.weight": A})
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04junk")
    src = Source(d)
    assert src.files == [d / "model.safetensors"]
    assert all(p.suffix != ".bin" for p in src.extra_files())


def test_source_provenance_is_not_copied_but_the_tokenizer_is(tmp_path):
    """Regression: `qckpt dequantize sample_checkpoints/ct_nvfp4_smollm2` copied the sample's
    PROVENANCE.json (llm-compressor's record) into an output qckpt wrote."""
    d = tmp_path / "m"
    d.mkdir()
    write_safetensors(d / "model.safetensors", {"a.weight": A})
    (d / "PROVENANCE.json").write_text('{"tool": "llm-compressor"}')
    (d / "tokenizer.json").write_text("{}")
    assert [p.name for p in Source(d).extra_files()] == ["tokenizer.json"]


# -- special files, LFS stubs ---------------------------------------------------------------------

def test_fifo_refused_without_blocking(tmp_path):
    p = tmp_path / "model.safetensors"
    os.mkfifo(p)
    with pytest.raises(CorruptFileError) as ei:
        load(p)
    assert "not a regular file" in ei.value.message


def test_b36_lfs_pointer_stub_in_directory(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes(
        b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"0" * 64 + b"\nsize 9000000000\n")
    with pytest.raises(CorruptFileError) as ei:
        load(d)
    e = ei.value
    assert "git-LFS pointer" in e.message and "git lfs pull" in e.hint and e.found == 2336927755350992246

