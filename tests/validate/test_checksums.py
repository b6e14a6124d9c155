"""``validate --checksums`` (issue 17): each data file's hash against its Hugging Face cache blob name, a
``SHA256SUMS`` entry or a committed git-LFS pointer. The expected hashes are made by the real tools where
they exist here (``git hash-object`` for the cache's small-file blob names, ``sha256sum`` for the sums).
"""

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.validate import validate
from tests.conftest import SAMPLES
from tests.formats.test_hf_cache import make_cache
from tests.validate.helpers import assert_finding

GPTQ = SAMPLES / "gptq_w4_g128_sym"
FILES = ("config.json", "quantize_config.json", "model.safetensors")


def _files():
    return {f: (GPTQ / f).read_bytes() for f in FILES}


def test_hf_cache_snapshot_verifies_every_file_against_its_blob_name(tmp_path):
    snap = make_cache(tmp_path / "hub", _files())
    # the small files' blob names are git's own blob hashes
    git = subprocess.run(["git", "hash-object", str(GPTQ / "config.json")], capture_output=True, text=True, check=True)
    assert (snap / "config.json").resolve().name == git.stdout.strip()
    rep = validate(snap, checksums=True)
    assert rep.findings == [] and "checksums" in rep.checks
    by = {c["file"].rsplit("/", 1)[-1]: c for c in rep.checksums}
    assert sorted(by) == sorted(FILES) and all(c["match"] for c in by.values())
    assert by["model.safetensors"]["algorithm"] == "sha256" and by["config.json"]["algorithm"] == "git-sha1"
    assert by["model.safetensors"]["source"] == "hf-cache blob name"


def test_corrupt_and_truncated_blobs_are_errors_naming_the_file(tmp_path):
    snap = make_cache(tmp_path / "hub", _files())
    blob = (snap / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0x01  # one bit in the last tensor's data: the header still parses
    blob.write_bytes(bytes(data))
    rep = validate(snap, checksums=True)
    f = assert_finding(rep, "checksum-mismatch", "model.safetensors")
    assert f.severity == "error" and f.evidence["expected"] == blob.name and f.evidence["found"] != blob.name
    assert rep.exit_code == 1
    r = CliRunner().invoke(main, ["validate", str(snap), "--checksums"])
    assert r.exit_code == 1 and "checksum-mismatch" in r.output and "1 mismatched" in r.output
    (snap / "config.json").resolve().write_bytes((GPTQ / "config.json").read_bytes()[:-10])
    rep = validate(snap, checksums=True)
    assert_finding(rep, "checksum-mismatch", "config.json")


def test_sha256sums_beside_the_data_and_in_the_parent_folder(tmp_path):
    d = tmp_path / "release" / "model"
    d.mkdir(parents=True)
    for f in FILES:
        shutil.copy(GPTQ / f, d / f)
    sums = subprocess.run(["sha256sum", "model/model.safetensors"], cwd=d.parent, capture_output=True, text=True,
                          check=True).stdout
    (d.parent / "SHA256SUMS").write_text(sums)
    rep = validate(d, checksums=True)
    assert rep.findings == [] and [c["source"] for c in rep.checksums] == ["SHA256SUMS"]
    (d / "model.safetensors").write_bytes((GPTQ / "model.safetensors").read_bytes() + b"\0")
    assert_finding(validate(d, checksums=True), "checksum-mismatch", "model.safetensors")


def test_the_shipped_samples_verify_against_their_sha256sums():
    rep = validate(GPTQ, checksums=True)
    assert rep.findings == [] and {c["source"] for c in rep.checksums} == {"SHA256SUMS"}
    assert len(rep.checksums) == len([p for p in GPTQ.iterdir() if p.is_file()])


def test_git_lfs_pointer_committed_for_the_file(tmp_path):
    if shutil.which("git") is None:
        pytest.fail("git is needed for this test (the product itself runs without it)")
    repo = tmp_path / "clone"
    repo.mkdir()
    data = (GPTQ / "model.safetensors").read_bytes()
    oid = subprocess.run(["sha256sum"], input=data, capture_output=True, check=True).stdout.split()[0].decode()
    (repo / "model.safetensors").write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\n"
                                            f"size {len(data)}\n")
    shutil.copy(GPTQ / "config.json", repo / "config.json")
    shutil.copy(GPTQ / "quantize_config.json", repo / "quantize_config.json")
    env = ["-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", *env, "add", "."], cwd=repo, check=True)
    subprocess.run(["git", *env, "commit", "-qm", "pointer"], cwd=repo, check=True)
    (repo / "model.safetensors").write_bytes(data)  # the LFS object, pulled by hand
    rep = validate(repo, checksums=True)
    by = {c["file"].rsplit("/", 1)[-1]: c for c in rep.checksums}
    assert by["model.safetensors"]["source"] == "git-lfs pointer" and by["model.safetensors"]["match"] is True
    (repo / "model.safetensors").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    assert_finding(validate(repo, checksums=True), "checksum-mismatch", "model.safetensors")


def test_nothing_vouches_is_info_and_json_conforms(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    for f in FILES:
        shutil.copy(GPTQ / f, d / f)
    r = CliRunner().invoke(main, ["validate", str(d), "--checksums", "--json"])
    doc = json.loads(r.output)
    assert r.exit_code == 0 and [(f["code"], f["severity"]) for f in doc["findings"]] == \
        [("checksum-unverified", "warning")]
    # asked to verify and nothing could be: --strict fails (it said "clean" before, a new user's finding)
    assert CliRunner().invoke(main, ["validate", str(d), "--checksums", "--strict"]).exit_code == 1
    assert doc["checksums"][0]["expected"] is None and doc["checksums"][0]["match"] is None
    assert len(doc["checksums"][0]["found"]) == 64


def test_a_mismatch_does_not_stop_the_other_checks(tmp_path):
    """A new user's finding: a checksum mismatch made validate stop ('format: not detected, tensors checked: 0')
    though the files read fine; the finding is reported and every tensor is still checked."""
    snap = make_cache(tmp_path / "hub", _files())
    blob = (snap / "model.safetensors").resolve()
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0x01
    blob.write_bytes(bytes(data))
    rep = validate(snap, checksums=True)
    assert_finding(rep, "checksum-mismatch", "model.safetensors")
    assert rep.format == "gptq" and len(rep.tensors) == 7 and rep.unchecked == []
