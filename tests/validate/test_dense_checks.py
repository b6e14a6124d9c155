"""Dense tensors are checked too (a new user's finding: validate said 'clean' for a GPTQ checkpoint with an infinite
bias, and for a plain fp16 file with a NaN weight, 'tensors checked: 0'): value-nonfinite names the tensor, the count
and the first non-finite value; dense_checked counts them; integer tensors are finite by construction."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import converter
from converter.validate import dense_checks, validate
from tests.conftest import SAMPLES
from tests.validate.helpers import copy_sample, edit_tensors


def test_an_infinite_bias_is_an_error_not_clean(tmp_path):
    d = copy_sample("gptq_w4_g128_sym", tmp_path)
    name = "encoder.layer.0.attention.self.query.bias"

    def inf_bias(tensors):
        b = tensors[name].copy()
        b[5] = np.inf
        tensors[name] = b
    edit_tensors(d, inf_bias)
    doc = validate(d).to_json()
    found = [f for f in doc["findings"] if f["code"] == "value-nonfinite"]
    assert [(f["tensor"], f["severity"]) for f in found] == [(name, "error")]
    assert found[0]["evidence"]["count"] == 1 and found[0]["evidence"]["first_index"] == [5]
    assert found[0]["evidence"]["first_value"] == "inf"  # (the report's JSON form of a non-finite number)
    assert doc["summary"]["verdict"] == "findings" and doc["exit_code"] == 1
    dense = [s.name for s in converter.load(d).specs() if s.kind == "dense"]
    assert doc["summary"]["dense_checked"] == len(dense) == 7


def test_a_plain_float_file_is_checked_value_by_value(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 48)).astype(np.float16)
    w[3, 7] = np.nan
    b16 = rng.standard_normal(100).astype(ml_dtypes.bfloat16)
    b16[[10, 90]] = -np.inf
    p = tmp_path / "plain.safetensors"
    save_file({"w": w, "b": b16}, str(p))
    doc = validate(p).to_json()
    got = {f["tensor"]: f["evidence"] for f in doc["findings"] if f["code"] == "value-nonfinite"}
    assert set(got) == {"w", "b"}
    assert got["w"]["count"] == 1 and got["w"]["first_index"] == [3, 7]
    assert got["b"]["count"] == 2 and got["b"]["first_index"] == [10] and got["b"]["first_value"] == "-inf"
    assert doc["summary"]["dense_checked"] == 2 and doc["summary"]["verdict"] == "findings"


def test_blocks_add_up_and_the_first_is_the_first(monkeypatch):
    monkeypatch.setattr(dense_checks, "BLOCK_VALUES", 7)  # many blocks: counts across them, first in a later one
    x = np.zeros((5, 9), np.float32)
    x[2, 3], x[2, 4], x[4, 8] = np.nan, np.inf, -np.inf
    (f,) = dense_checks.check_dense("x", x)
    assert f.evidence["count"] == 3 and f.evidence["first_index"] == [2, 3]
    assert dense_checks.check_dense("ok", np.ones((5, 9), np.float32)) == []
    assert dense_checks.check_dense("ints", np.arange(45).reshape(5, 9)) == []


@pytest.mark.parametrize("sample", ["gptq_w4_g128_sym", "minilm_fp16.safetensors", "mlx_affine_g64_b4"])
def test_correct_files_stay_clean(sample):
    doc = validate(SAMPLES / sample).to_json()
    assert doc["summary"]["verdict"] == "clean"
    assert not any(f["code"] == "value-nonfinite" for f in doc["findings"])
    assert doc["summary"]["dense_checked"] == sum(s.kind == "dense" for s in converter.load(SAMPLES / sample).specs())



def _resident_kib(path) -> int:
    """Rss (KiB) of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if line[:1] in "0123456789abcdef" and "-" in line.split()[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="Linux /proc/self/smaps")
def test_a_mapped_dense_tensor_is_not_left_resident(tmp_path, monkeypatch):
    """check_dense reads a memory-mapped tensor block by block and releases each block's pages (as the writers do
    between row blocks): after checking a 64 MiB float16 map, at most about one block (here 1 MiB) stays resident,
    not the whole tensor (an embedding of 32000 x 4096 float16 left 256 MiB resident in validate)."""
    path = tmp_path / "emb.bin"
    np.ones((4096, 8192), dtype=np.float16).tofile(path)  # 64 MiB
    monkeypatch.setattr(dense_checks, "BLOCK_VALUES", 1 << 19)  # 1 MiB of float16
    mm = np.memmap(path, dtype=np.float16, mode="r", shape=(4096, 8192))
    assert dense_checks.check_dense("emb", mm) == []
    assert _resident_kib(path) <= 2 * 1024, _resident_kib(path)
