"""sample_checkpoints/ stays indexed: every file's sha256 is in SHA256SUMS and every sample folder with
a PROVENANCE.json has a MANIFEST.json entry (scripts/index_samples.py writes both)."""

from __future__ import annotations

import hashlib
import json

from tests.conftest import SAMPLES


def test_sha256sums_cover_every_file_and_match():
    listed = {}
    for line in (SAMPLES / "SHA256SUMS").read_text().splitlines():
        digest, path = line.split("  ", 1)
        listed[path.removeprefix("./")] = digest
    on_disk = {p.relative_to(SAMPLES).as_posix() for p in SAMPLES.rglob("*") if p.is_file()}
    on_disk -= {"SHA256SUMS", "README.md"}
    assert set(listed) == on_disk
    for rel, digest in listed.items():
        assert hashlib.sha256((SAMPLES / rel).read_bytes()).hexdigest() == digest, rel


def test_every_provenanced_sample_is_in_the_manifest_and_readme():
    manifest = json.loads((SAMPLES / "MANIFEST.json").read_text())
    indexed = {e["path"].split("/")[0] for e in manifest["files"]}
    readme = (SAMPLES / "README.md").read_text()
    for d in sorted(SAMPLES.iterdir()):
        if (d / "PROVENANCE.json").exists():
            assert d.name in indexed, d.name
            assert f"{d.name}/" in readme or d.name in readme, d.name
