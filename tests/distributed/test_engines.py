"""``--engine ray|dask`` on local clusters (127.0.0.1, two worker slots): the output and report of the local
pool, byte for byte; a worker killed mid-task is retried; a qckpt error in one task and a failed read-back
proof leave neither a destination nor a staging directory.

The clusters are the engines' own (``ray.init`` / ``distributed.LocalCluster``), started once per module
and shut down after it. Skipped when the extra is not installed (``pip install 'qckpt[ray]' 'qckpt[dask]'``;
CI installs both).
"""

from __future__ import annotations

import pytest

from converter.schemas import validate_document
from tests.distributed.common import CONVERT, files_of, qckpt, siblings, without_engine

ENGINES = ["dask", "ray"]


@pytest.fixture(scope="module", params=ENGINES)
def cluster(request):
    """(engine, address) of a two-slot local cluster, shut down after the module's tests."""
    if request.param == "ray":
        ray = pytest.importorskip("ray")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20,
                 configure_logging=False)
        yield "ray", None  # a Ray already initialised in this process is the one the executor uses
        ray.shutdown()
    else:
        pytest.importorskip("distributed")
        import dask
        from distributed import LocalCluster
        with dask.config.set({"distributed.worker.daemon": False, "distributed.scheduler.allowed-failures": 2}):
            lc = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                              dashboard_address=None, silence_logs=50)
        yield "dask", lc.scheduler_address
        lc.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The local pool's output and report (``--workers 2``)."""
    dst = tmp_path_factory.mktemp("local") / "out"
    code, doc, out = qckpt(CONVERT, dst)
    assert code == 0, out
    return dst, doc


def _engine_args(cluster) -> list[str]:
    engine, address = cluster
    return ["--engine", engine] + (["--address", address] if address else [])


def test_output_and_report_identical_to_local_pool(cluster, reference, tmp_path):
    ref_dst, ref_doc = reference
    dst = tmp_path / "out"
    code, doc, out = qckpt(CONVERT + _engine_args(cluster), dst)
    assert code == 0, out
    assert files_of(dst) == files_of(ref_dst)
    assert len([n for n in files_of(dst) if n.startswith("model-")]) == 6
    assert without_engine(doc, dst, ref_dst) == ref_doc  # rows merged exactly as the local run's
    validate_document(doc, "convert-report")
    eng = doc["engine"]
    counts = (eng["tasks"], eng["proof_tasks"], eng["rows_tasks"], eng["retries"])
    assert eng["name"] == cluster[0] and counts == (6, 6, 6, 0)
    assert sum(n["write_tasks"] for n in eng["per_node"]) == 6
    assert siblings(dst) == []


def test_worker_killed_mid_task_is_retried(cluster, reference, tmp_path, monkeypatch):
    ref_dst, _ = reference
    dst = tmp_path / "out"
    monkeypatch.setenv("QCKPT_TEST_ENGINE_KILL", "2")  # shard 3's first attempt scribbles, then SIGKILLs itself
    code, doc, out = qckpt(CONVERT + _engine_args(cluster), dst)
    assert code == 0, out
    assert files_of(dst) == files_of(ref_dst)
    assert doc["engine"]["retries"] >= 1
    assert siblings(dst) == []


def test_qckpt_error_in_one_task(cluster, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    monkeypatch.setenv("QCKPT_TEST_ENGINE_FAIL", "4")
    code, doc, out = qckpt(CONVERT + _engine_args(cluster), dst)
    assert code == 3, out
    assert doc["error"] == "FormatError" and doc["field"] == "test" and doc["found"] == "shard 4", doc
    assert not dst.exists() and siblings(dst) == []


def test_failed_proof_commits_nothing(cluster, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    monkeypatch.setenv("QCKPT_TEST_ENGINE_CORRUPT", "0")
    code, doc, out = qckpt(CONVERT + _engine_args(cluster), dst)
    assert code == 3, out
    assert doc["error"] == "ProofFailedError" and doc["file"].endswith("model-00001-of-00006.safetensors"), doc
    assert not dst.exists() and siblings(dst) == []


def test_an_oserror_is_retried(cluster, reference, tmp_path, monkeypatch):
    ref_dst, _ = reference
    dst = tmp_path / "out"
    monkeypatch.setenv("QCKPT_TEST_ENGINE_OSERROR", "1")
    code, doc, out = qckpt(CONVERT + _engine_args(cluster), dst)
    assert code == 0, out
    assert files_of(dst) == files_of(ref_dst) and doc["engine"]["retries"] >= 1
    assert siblings(dst) == []


def test_retries_are_bounded(cluster, tmp_path, monkeypatch):
    dst = tmp_path / "out"
    monkeypatch.setenv("QCKPT_TEST_ENGINE_KILL_ALWAYS", "0")  # every attempt of shard 1 dies
    code, doc, out = qckpt(CONVERT + _engine_args(cluster), dst)
    assert code == 3 and doc["error"] == "EngineError", out
    assert not dst.exists() and siblings(dst) == []
