"""The commit protocol of a distributed write without a cluster (default suite, fast): an in-process executor
stands in for Ray / Dask, so the staging, pre-created shards, tasks, proof and commit run as on a cluster.
Also the staging directory's lease, the staged shard writer, and the CLI's refusals."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import numpy as np
import pytest

from converter.distributed import job as job_module
from converter.distributed.staging import Staging, clean_stale_staging
from converter.distributed.task import qckpt_version
from converter.errors import EngineError, ProofFailedError
from converter.ops.convert import convert_exact
from converter.runtime import run_options
from converter.write.safetensors import SafetensorsWriter
from converter.write.staged import StagedShardWriter, precreate_shard, shard_digests
from tests.distributed.common import CONVERT, SOURCE, files_of, qckpt, siblings, without_engine


class InlineExecutor:
    """Runs every task in this process, in order (the executor interface, no engine)."""

    name, address = "ray", "local"

    def __init__(self, versions=None):
        self.versions = versions

    def on_every_node(self, fn):
        return self.versions or {"node-a": fn()}

    def map(self, fn, specs, *, retries):
        for i, spec in enumerate(specs):
            yield i, fn(spec)

    def close(self):
        pass


@pytest.fixture
def inline(monkeypatch):
    monkeypatch.setattr(job_module, "open_executor", lambda name, address, workers: InlineExecutor())


def _convert(dst, **kw):
    with run_options(max_shard_size="300KB", workers=1):
        return job_module.run_command(convert_exact, SOURCE, dst, engine="ray", to="compressed-tensors", **kw)


def test_inline_engine_matches_local_pool(inline, tmp_path):
    ref = tmp_path / "local"
    code, ref_doc, out = qckpt(CONVERT, ref)
    assert code == 0, out
    dst = tmp_path / "out"
    doc = _convert(dst)
    assert files_of(dst) == files_of(ref)
    assert without_engine(json.loads(json.dumps(doc)), dst, ref) == ref_doc
    assert doc["engine"]["tasks"] == doc["engine"]["rows_tasks"] == 6 and doc["engine"]["retries"] == 0
    assert siblings(dst) == []


def test_failure_in_a_task_leaves_nothing(inline, tmp_path, monkeypatch):
    monkeypatch.setenv("QCKPT_TEST_ENGINE_CORRUPT", "5")
    dst = tmp_path / "out"
    with pytest.raises(ProofFailedError) as err:
        _convert(dst)
    assert err.value.file == str(dst / "model-00006-of-00006.safetensors")  # named at DST, not the staging path
    assert not dst.exists() and siblings(dst) == []


def test_overwrite_replaces_only_at_the_commit(inline, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "old").write_text("x")
    monkeypatch.setenv("QCKPT_TEST_ENGINE_FAIL", "0")
    with pytest.raises(Exception, match="injected failure"):
        _convert(dst, overwrite=True)
    assert sorted(os.listdir(dst)) == ["old"] and siblings(dst) == []  # a failed run keeps the old output
    monkeypatch.delenv("QCKPT_TEST_ENGINE_FAIL")
    _convert(dst, overwrite=True)
    assert "old" not in os.listdir(dst) and siblings(dst) == []


def test_another_qckpt_on_a_node_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr(job_module, "open_executor",
                        lambda name, address, workers: InlineExecutor({"node-a": qckpt_version(), "node-b": "0.0+x"}))
    dst = tmp_path / "out"
    with pytest.raises(EngineError, match="another qckpt") as err:
        _convert(dst)
    assert err.value.found == "0.0+x on node-b"
    assert not dst.exists() and siblings(dst) == []


def test_missing_extra_is_a_typed_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    monkeypatch.delitem(sys.modules, "converter.distributed.ray_engine", raising=False)
    code, doc, out = qckpt(CONVERT + ["--engine", "ray"], tmp_path / "out")
    assert code == 2 and doc["error"] == "MissingExtraError" and "qckpt[ray]" in doc["hint"], out
    assert siblings(tmp_path / "out") == []


@pytest.mark.parametrize("args, word", [
    (["--address", "auto"], "--address names a Ray or Dask cluster"),
    (["--engine", "dask", "--to", "gguf"], "writes a model directory"),
])
def test_usage_errors(tmp_path, args, word):
    base = ["convert", str(SOURCE), "{dst}", "--json"] + ([] if "--to" in args else ["--to", "compressed-tensors"])
    code, doc, out = qckpt(base + args, tmp_path / "out")
    assert code == 2 and word in doc["message"], out


def test_dequantize_to_one_file_is_refused(tmp_path):
    code, doc, out = qckpt(["dequantize", str(SOURCE), str(tmp_path / "x.safetensors"), "--engine", "dask", "--json"],
                           tmp_path / "unused")
    assert code == 2 and "one file" in doc["message"], out


# ------------------------------------------------------------------------------------------- the pieces

ENTRIES = [("b", "F16", (3, 5)), ("a", "I32", (4,)), ("c", "U8", (7,))]
ARRAYS = {"a": np.arange(4, dtype=np.int32), "b": np.linspace(-1, 1, 15, dtype=np.float16).reshape(3, 5),
          "c": np.arange(7, dtype=np.uint8)}


def test_staged_shard_equals_a_written_file(tmp_path):
    ref = tmp_path / "ref.safetensors"
    with SafetensorsWriter(ref, ENTRIES, {"format": "pt"}) as w:
        for name, arr in ARRAYS.items():
            w.write(name, arr)
    staged = tmp_path / "staged.safetensors"
    size = precreate_shard(staged, ENTRIES, {"format": "pt"})
    assert size == ref.stat().st_size
    with StagedShardWriter(staged, ENTRIES, {"format": "pt"}) as w:
        for name, arr in reversed(list(ARRAYS.items())):
            w.write(name, arr)
    assert staged.read_bytes() == ref.read_bytes()
    digests = shard_digests(staged)
    assert digests["size"] == size
    assert digests["tensors"] == {n: hashlib.sha256(a.tobytes()).hexdigest() for n, a in sorted(ARRAYS.items())}


def test_staged_writer_never_creates_and_checks_the_plan(tmp_path):
    with pytest.raises(FileNotFoundError):
        StagedShardWriter(tmp_path / "absent.safetensors", ENTRIES)
    assert not (tmp_path / "absent.safetensors").exists()
    other = tmp_path / "other.safetensors"
    precreate_shard(other, ENTRIES[:2])
    with pytest.raises(ProofFailedError, match="not the planned one"):
        StagedShardWriter(other, ENTRIES)
    with pytest.raises(FileExistsError):
        precreate_shard(other, ENTRIES)


def test_staging_lease_and_stale_cleanup(tmp_path):
    dst = tmp_path / "out"
    live = Staging(dst)
    assert live.path.parent == tmp_path and live.path.name.startswith(".out.qckpt-stage-")
    assert str(os.getpid()) in live.path.name
    lease = json.loads((live.ctl / "lease.json").read_text())
    assert lease["pid"] == os.getpid() and lease["expires"] > time.time()
    # another host's staging: kept while its lease runs, removed once it expired
    other = tmp_path / ".out.qckpt-stage-elsewhere-12-abcd"
    (other.with_name(other.name + ".ctl")).mkdir(parents=True)
    other.mkdir()
    (other.with_name(other.name + ".ctl") / "lease.json").write_text(
        json.dumps({"host": "elsewhere", "pid": 12, "expires": time.time() + 60}))
    assert clean_stale_staging(dst) == [] and other.exists()
    (other.with_name(other.name + ".ctl") / "lease.json").write_text(
        json.dumps({"host": "elsewhere", "pid": 12, "expires": time.time() - 1}))
    assert clean_stale_staging(dst) == [other] and not other.exists()
    assert live.path.exists()  # this process's own, alive
    live.remove()
    assert siblings(dst) == []


def test_text_report_names_the_engine(inline, tmp_path):
    args = [a for a in CONVERT if a != "--json"] + ["--engine", "ray"]
    code, _, out = qckpt(args, tmp_path / "out")
    assert code == 0, out
    assert "engine: ray (local), 1 node(s): 6 shard tasks, 6 read-back, 6 proof-row tasks, 0 retried" in out
    assert "node-a" not in out and out.count("peak RSS") == 1  # one node ran every task


def test_stale_staging_of_a_dead_coordinator_on_this_host(tmp_path):
    import subprocess
    from converter.distributed.staging import _host
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # its pid is now free (no process)
    dead = tmp_path / f".out.qckpt-stage-{_host()}-{proc.pid}-abcd"
    dead.mkdir()
    assert clean_stale_staging(tmp_path / "out") == [dead] and not dead.exists()


def test_python_api_takes_the_engine(inline, tmp_path):
    import converter
    with run_options(max_shard_size="300KB", workers=1):
        ref = converter.convert(SOURCE, tmp_path / "local", to="compressed-tensors")
        doc = converter.convert(SOURCE, tmp_path / "out", to="compressed-tensors", engine="ray")
    assert files_of(tmp_path / "out") == files_of(tmp_path / "local")
    assert without_engine(doc, tmp_path / "out", tmp_path / "local") == ref and doc["engine"]["tasks"] == 6
    with pytest.raises(EngineError, match="one file"):
        converter.dequantize(SOURCE, tmp_path / "x.safetensors", engine="ray")
    assert not (tmp_path / "x.safetensors").exists() and siblings(tmp_path / "x.safetensors") == []
