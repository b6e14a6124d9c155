"""quantize, dequantize and convert with a requantize target on a local Dask cluster (two slots, 127.0.0.1):
output files and report identical to the local pool's (the encoders' rows come back from the tasks)."""

from __future__ import annotations

import pytest

from tests.distributed.common import SOURCE, files_of, qckpt, siblings, without_engine

pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def address():
    import dask
    from distributed import LocalCluster
    with dask.config.set({"distributed.worker.daemon": False}):
        lc = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None, silence_logs=50)
    yield lc.scheduler_address
    lc.close()


@pytest.fixture(scope="module")
def float_source(tmp_path_factory):
    """The GPTQ sample dequantized to float16 (a float source for quantize)."""
    dst = tmp_path_factory.mktemp("float") / "f16"
    code, _, out = qckpt(["dequantize", str(SOURCE), "{dst}", "--dtype", "f16", "--quiet"], dst)
    assert code == 0, out
    return dst


def _same(args: list[str], tmp_path, address: str) -> dict:
    ref, dst = tmp_path / "local", tmp_path / "dask"
    code, ref_doc, out = qckpt(args + ["--workers", "2", "--quiet", "--json"], ref)
    assert code == 0, out
    code, doc, out = qckpt(args + ["--workers", "2", "--quiet", "--json", "--engine", "dask", "--address", address],
                           dst)
    assert code == 0, out
    assert files_of(dst) == files_of(ref)
    assert sum(n.startswith("model-") for n in files_of(dst)) >= 3
    assert without_engine(doc, dst, ref) == ref_doc
    assert siblings(dst) == [] and doc["engine"]["name"] == "dask"
    return doc


def test_dequantize(tmp_path, address):
    _same(["dequantize", str(SOURCE), "{dst}", "--max-shard-size", "1MB"], tmp_path, address)


def test_quantize(tmp_path, address, float_source):
    doc = _same(["quantize", str(float_source), "{dst}", "--bits", "4", "--group-size", "64",
                 "--to", "compressed-tensors", "--max-shard-size", "300KB"], tmp_path, address)
    assert doc["tensors"] and all(r["sqnr_db"] is not None for r in doc["tensors"])  # rows from the tasks


def test_convert_requantize(tmp_path, address):
    doc = _same(["convert", str(SOURCE), "{dst}", "--to", "compressed-tensors", "--per-channel", "--bits", "8",
                 "--max-shard-size", "300KB"], tmp_path, address)
    assert doc["tensors"] and all(r["readback_bit_exact"] for r in doc["tensors"])  # read back on the nodes
    assert doc["engine"]["rows_tasks"] == doc["engine"]["tasks"]


@pytest.mark.parametrize("command", ["convert", "dequantize", "requantize"])
def test_coordinator_reads_no_tensor(tmp_path, address, monkeypatch, command):
    """Planning on the coordinator is header-only: no tensor of the source (or of the output, whose proof
    runs on the nodes) is loaded in this process; the Dask workers are other processes."""
    from converter.tensor import Checkpoint
    loaded: list[str] = []
    real = Checkpoint.__getitem__

    def spy(self, name):
        loaded.append(name)
        return real(self, name)
    monkeypatch.setattr(Checkpoint, "__getitem__", spy)
    args = {"convert": ["convert", str(SOURCE), "{dst}", "--to", "compressed-tensors"],
            "dequantize": ["dequantize", str(SOURCE), "{dst}"],
            "requantize": ["convert", str(SOURCE), "{dst}", "--to", "compressed-tensors", "--per-channel",
                           "--bits", "8"]}[command]
    code, doc, out = qckpt(args + ["--max-shard-size", "300KB", "--quiet", "--json", "--engine", "dask",
                                   "--address", address], tmp_path / "out")
    assert code == 0, out
    assert doc["engine"]["tasks"] >= 3
    assert loaded == []


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_refusal_under_the_engine_suggests_the_users_command(tmp_path, address, overwrite):
    """A refusal found inside the command (Q4_1's float minimum is no integer zero point: requantize instead) names
    the user's command line: --engine and --address kept, --overwrite only when the user gave it (the engine's
    own call writes its staging directory with overwrite: the hint used to add it, and drop the engine)."""
    import shlex

    from tests.conftest import SAMPLES
    src = SAMPLES / "gguf" / "minilm_gguf_Q4_1.gguf"
    dst = tmp_path / "out"
    code, doc, out = qckpt(["convert", str(src), "{dst}", "--to", "compressed-tensors", "--json", "--quiet",
                            "--engine", "dask", "--address", address, *(["--overwrite"] if overwrite else [])], dst)
    assert code == 3 and doc["error"] == "NotRepresentableError", out
    words = shlex.split(doc["hint"][doc["hint"].index("qckpt convert"):])
    assert words == ["qckpt", "convert", str(src), str(dst), "--to", "compressed-tensors", "--sym",
                     "--engine", "dask", "--address", address, *(["--overwrite"] if overwrite else [])]
    assert not dst.exists() and siblings(dst) == []
