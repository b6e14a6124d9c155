"""Sharded sources (formats/source.py) from copies of the real samples (CASES.md B34)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from converter.errors import FormatError, InputNotFoundError, MissingTensorError
from converter.formats import registry
from converter.ops.convert import convert_exact
from tests.conftest import SAMPLES


# -- B34: sharded copies of real samples ---------------------------------------------------------
def _shard(tmp_path, sample, fmt):
    dst = tmp_path / f"{sample}-sharded"
    rep = registry.get(fmt).write(registry.load(SAMPLES / sample), dst, max_shard_bytes=400_000)
    assert len([f for f in rep["files"] if f.startswith("model-")]) > 1
    return dst


@pytest.mark.parametrize("sample,fmt", [("gptq_w4_g128_sym", "gptq"), ("minilm_fp16.safetensors", "plain")])
def test_b34_sharded_real_sample_reads_equal(tmp_path, sample, fmt):
    d = _shard(tmp_path, sample, fmt)
    a, b = registry.load(SAMPLES / sample), registry.load(d)
    assert b.format == fmt and sorted(a.names()) == sorted(b.names()) and len(b.files) > 1
    for n in a.names():
        x, y = a[n], b[n]
        if hasattr(x, "codes"):
            assert np.array_equal(x.codes, y.codes) and np.array_equal(x.scales, y.scales)
        else:
            assert x.data.tobytes() == y.data.tobytes()


@pytest.mark.parametrize("sample,fmt", [("gptq_w4_g128_sym", "gptq"), ("minilm_fp16.safetensors", "plain")])
def test_b34_missing_shard_is_an_error(tmp_path, sample, fmt):
    d = _shard(tmp_path, sample, fmt)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    victim = sorted(set(index["weight_map"].values()))[-1]
    lost = sorted(k for k, v in index["weight_map"].items() if v == victim)
    (d / victim).unlink()
    with pytest.raises(InputNotFoundError) as info:
        registry.load(d)
    msg = str(info.value)
    assert victim in msg and str(len(lost)) in msg  # "missing shard s2 (2 tensors)"


def test_b34_index_and_shards_disagree(tmp_path):
    d = _shard(tmp_path, "gptq_w4_g128_sym", "gptq")
    ipath = d / "model.safetensors.index.json"
    index = json.loads(ipath.read_text())
    # an index entry naming a tensor that its shard does not hold
    name, shard = next(iter(index["weight_map"].items()))
    index["weight_map"]["ghost.qweight"] = shard
    ipath.write_text(json.dumps(index))
    with pytest.raises((MissingTensorError, FormatError)) as info:
        registry.load(d)
    assert "ghost.qweight" in str(info.value)
    # a shard holding a tensor the index does not list
    index["weight_map"].pop("ghost.qweight")
    index["weight_map"].pop(name)
    ipath.write_text(json.dumps(index))
    with pytest.raises(FormatError) as info:
        registry.load(d)
    assert name in str(info.value)


def test_b34_convert_from_sharded_source(tmp_path):
    d = _shard(tmp_path, "gptq_w4_g128_sym", "gptq")
    rep = convert_exact(d, tmp_path / "awq", "awq")
    assert rep["summary"]["all_exact"]
    shutil.rmtree(d)
