"""Hugging Face cache snapshots and repo ids (issue 17).

The cache layout is built here the way ``huggingface_hub`` writes it (``models--org--name/blobs/<sha256>``,
``refs/main`` holding the commit, ``snapshots/<commit>/<file>`` a relative link to ``../../blobs/<sha256>``)
from the real GPTQModel sample, sharded. Before: a sharded snapshot was refused ("shard path leads outside
the checkpoint directory"), a single-file snapshot lost tokenizer.json silently, and a repo id was "no such
file or directory".
"""

import hashlib
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

import converter
from converter.cli import main
from converter.errors import CorruptFileError, InputNotFoundError, UnsafeFormatError
from converter.formats import hub
from converter.formats.gptq import format as gptq
from converter.formats.source import Source
from tests.conftest import SAMPLES

GPTQ = "gptq_w4_g128_sym"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKENIZER = '{"version": "1.0", "note": "side file"}'


def make_cache(root, files: dict, repo="acme/tiny-gptq", commit=COMMIT):
    """A hub cache under ``root`` holding ``files`` (name -> bytes) as one snapshot; returns the snapshot dir."""
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    (repo_dir / "blobs").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, data in files.items():
        # huggingface_hub names an LFS file's blob by its SHA-256, a small (git) file's by its git blob SHA-1
        sha = (hashlib.sha256(data).hexdigest() if name.endswith((".safetensors", ".gguf"))
               else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        (repo_dir / "blobs" / sha).write_bytes(data)
        (snap / name).symlink_to(os.path.join("..", "..", "blobs", sha))
    return snap


@pytest.fixture(scope="module")
def sharded_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("src") / "gptq"
    gptq.write_gptq(converter.load(SAMPLES / GPTQ), d, checkpoint_format="gptq", max_shard_bytes=300_000)
    files = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    files["tokenizer.json"] = TOKENIZER.encode()
    assert sum(n.endswith(".safetensors") for n in files) >= 3
    return files


def test_sharded_snapshot_reads_like_the_directory_and_carries_side_files(tmp_path, sharded_files):
    snap = make_cache(tmp_path / "hub", sharded_files)
    ck, ref = converter.load(snap), converter.load(SAMPLES / GPTQ)
    assert sorted(ck.names()) == sorted(ref.names())
    name = next(n for n in ref.names() if n.endswith("query.weight"))
    assert np.array_equal(ck[name].dequantize(), ref[name].dequantize())
    dst = tmp_path / "out"
    r = CliRunner().invoke(main, ["dequantize", str(snap), str(dst)])
    assert r.exit_code == 0, r.output
    assert (dst / "tokenizer.json").read_text() == TOKENIZER and not (dst / "tokenizer.json").is_symlink()


def test_single_file_snapshot_carries_the_tokenizer(tmp_path):
    files = {f: (SAMPLES / GPTQ / f).read_bytes() for f in ("config.json", "quantize_config.json",
                                                             "model.safetensors")}
    snap = make_cache(tmp_path / "hub", {**files, "tokenizer.json": TOKENIZER.encode()})
    dst = tmp_path / "out"
    r = CliRunner().invoke(main, ["convert", str(snap), str(dst), "--to", "compressed-tensors"])
    assert r.exit_code == 0, r.output
    assert (dst / "tokenizer.json").read_text() == TOKENIZER


def test_repo_id_resolves_in_the_local_cache_offline(tmp_path, sharded_files, monkeypatch):
    cache = tmp_path / "hub"
    snap = make_cache(cache, sharded_files)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.resolve_repo_id("acme/tiny-gptq") == snap
    assert hub.resolve_repo_id(f"acme/tiny-gptq@{COMMIT}") == snap
    assert hub.resolve_repo_id("not a repo id") is None and hub.resolve_repo_id("/abs/path") is None
    assert sorted(converter.load("acme/tiny-gptq").names()) == sorted(converter.load(snap).names())
    r = CliRunner().invoke(main, ["validate", "acme/tiny-gptq", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["format"] == "gptq"


def test_repo_id_not_in_the_cache_is_one_line_with_the_download_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    with pytest.raises(InputNotFoundError) as e:
        converter.load("acme/absent")
    assert "hf download acme/absent" in e.value.hint and str(tmp_path / "empty") in e.value.message
    r = CliRunner().invoke(main, ["inspect", "acme/absent@v2"])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 3 and len(lines) == 1 and "at revision v2" in lines[0] and "Traceback" not in r.output
    assert "hf download acme/absent --revision v2" in lines[0] and "LocalEntryNotFoundError" not in lines[0]


def test_snapshot_link_leading_outside_the_repository_is_refused_by_name(tmp_path, sharded_files):
    snap = make_cache(tmp_path / "hub", sharded_files)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy")
    (snap / "tokenizer.json").unlink()
    (snap / "tokenizer.json").symlink_to(secret)
    dst = tmp_path / "out"
    r = CliRunner().invoke(main, ["dequantize", str(snap), str(dst)])
    assert r.exit_code == 3 and "side file leads outside the checkpoint directory" in r.output
    assert "tokenizer.json" in r.output and not dst.exists()
    with pytest.raises(UnsafeFormatError) as e:
        Source(snap).extra_files()
    assert e.value.found == str(secret.resolve())
    # a shard linked outside the repository (another repo's blob) is refused as before
    shard = sorted(snap.glob("model-*.safetensors"))[0]
    other = make_cache(tmp_path / "hub2", {"x.safetensors": shard.read_bytes()})
    shard.unlink()
    shard.symlink_to(other / "x.safetensors")
    with pytest.raises(CorruptFileError, match="outside the checkpoint directory"):
        converter.load(snap).names()
