"""``validate --checksums``: every data file's hash against what its provenance says it must be.

The first thing to rule out before deploying a download is a corrupt or truncated file. Expected
hashes come from, in order:

1. the Hugging Face cache: a snapshot file is a link to ``blobs/<name>``, and ``huggingface_hub``
   names each blob by its content: the SHA-256 (64 hex digits) of an LFS file (the weights), the git
   blob SHA-1 (40 hex digits, ``sha1(b"blob <size>\\0" + content)``) of a small file;
2. a ``SHA256SUMS`` file beside the data (``sha256sum`` format: ``<64 hex>  <name>``, ``*`` for binary
   mode), as release pages and qckpt's own sample folders ship;
3. a git-LFS pointer committed for the file in a git work tree (``git cat-file blob HEAD:<file>`` is
   ``version https://git-lfs.github.com/spec/v1 / oid sha256:<hex> / size <n>``), e.g. a clone whose
   LFS objects were pulled by hand.

Hashing is streamed (1 MiB reads, constant memory) and runs on a thread pool (``hashlib`` releases
the GIL on large updates), with the write progress bar on stderr.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from converter.formats import hub
from converter.validate.findings import Finding, finding
from converter.write.progress import Progress

__all__ = ["FileCheck", "expected_hashes", "check_checksums", "DATA_SUFFIXES"]

#: Files whose bytes are the model (hashed even when no expected hash is known, to say so).
DATA_SUFFIXES = (".safetensors", ".gguf")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_SUMS_LINE = re.compile(r"^([0-9a-fA-F]{64}) [ *](.+)$")
_LFS_OID = re.compile(rb"^oid sha256:([0-9a-f]{64})$", re.M)
_CHUNK = 1 << 20


@dataclass(frozen=True)
class FileCheck:
    """One file's verdict.

    Attributes
    ----------
    file : str
        The path as the checkpoint names it (a snapshot's link, not the blob).
    algorithm : str
        ``"sha256"`` or ``"git-sha1"`` (git's blob hash), or None when nothing is expected.
    expected, found : str or None
        Hex digests.
    source : str or None
        Where ``expected`` came from: ``"hf-cache blob name"``, ``"SHA256SUMS"``, ``"git-lfs pointer"``.
    """

    file: str
    algorithm: str | None
    expected: str | None
    found: str | None
    source: str | None

    @property
    def match(self) -> bool | None:
        return None if self.expected is None else self.expected == self.found

    def to_json(self) -> dict:
        return {"file": self.file, "algorithm": self.algorithm, "expected": self.expected, "found": self.found,
                "source": self.source, "match": self.match}


def _files_of(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))


def _sums_files(directory: Path) -> dict[Path, str]:
    """Entries of ``SHA256SUMS`` in ``directory`` or its parent (paths relative to the sums file's folder),
    keyed by absolute path (a release folder may list every model's files in one sums file)."""
    out: dict[Path, str] = {}
    for folder in (directory.parent, directory):  # the nearer file wins
        sums = folder / "SHA256SUMS"
        if not sums.is_file() or sums.stat().st_size > 16 * 2**20:
            continue
        for line in sums.read_text(encoding="utf-8", errors="replace").splitlines():
            if m := _SUMS_LINE.match(line.strip()):
                out[Path(os.path.abspath(folder / m[2]))] = m[1].lower()
    return out


def _lfs_pointer_oid(path: Path) -> str | None:
    """The oid of the LFS pointer committed at HEAD for ``path``, when ``path`` lies in a git work tree."""
    spec = f"HEAD:./{path.name}"
    try:  # the committed blob's size first: a pointer is ~130 bytes, a weight file committed whole is not read
        size = subprocess.run(["git", "-C", str(path.parent), "cat-file", "-s", spec], capture_output=True,
                              timeout=30, check=False)
        if size.returncode != 0 or not size.stdout.strip().isdigit() or int(size.stdout) > 1024:
            return None
        r = subprocess.run(["git", "-C", str(path.parent), "cat-file", "blob", spec], capture_output=True,
                           timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0 or not r.stdout.startswith(b"version https://git-lfs"):
        return None
    m = _LFS_OID.search(r.stdout)
    return m[1].decode() if m else None


def expected_hashes(path: Path) -> dict[Path, tuple[str, str, str]]:
    """Per file of the checkpoint at ``path``: ``(algorithm, expected hex digest, source)``, where known."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    in_cache = hub.cache_repo_dir(directory) is not None
    sums = _sums_files(directory)
    git = any((d / ".git").exists() for d in (directory, *directory.parents))
    out: dict[Path, tuple[str, str, str]] = {}
    for f in _files_of(path):
        if in_cache and f.is_symlink():
            blob = f.resolve().name
            if _SHA256.match(blob):
                out[f] = ("sha256", blob, "hf-cache blob name")
                continue
            if _SHA1.match(blob):
                out[f] = ("git-sha1", blob, "hf-cache blob name")
                continue
        if (key := Path(os.path.abspath(f))) in sums:
            out[f] = ("sha256", sums[key], "SHA256SUMS")
        elif git and f.suffix in DATA_SUFFIXES and (oid := _lfs_pointer_oid(f)) is not None:
            out[f] = ("sha256", oid, "git-lfs pointer")
    return out


def _digest(path: Path, algorithm: str, progress: Progress) -> str:
    h = hashlib.sha256() if algorithm == "sha256" else hashlib.sha1()
    if algorithm == "git-sha1":
        h.update(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            progress.advance(nbytes=len(chunk))
    progress.advance(items=1)
    return h.hexdigest()


def check_checksums(path: str | Path, *, workers: int = 2) -> tuple[list[Finding], list[FileCheck]]:
    """Hash every file of the checkpoint with a known expected hash, and every data file.

    Returns
    -------
    findings : list of Finding
        ``checksum-mismatch`` (error) per file whose hash differs, naming the file, expected vs found
        and the source; ``checksum-unverified`` (info) listing the data files nothing vouches for.
    checks : list of FileCheck
        One per file hashed.
    """
    path = Path(path)
    expected = expected_hashes(path)
    todo = [f for f in _files_of(path) if f in expected or f.suffix in DATA_SUFFIXES]
    progress = Progress("checksums", len(todo), sum(f.stat().st_size for f in todo))
    algos = {f: expected.get(f, ("sha256", None, None))[0] for f in todo}
    with progress, ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        digests = dict(zip(todo, pool.map(lambda f: _digest(f, algos[f], progress), todo)))
    checks = [FileCheck(str(f), algos[f], expected.get(f, (None, None, None))[1], digests[f],
                        expected.get(f, (None, None, None))[2]) for f in todo]
    findings: list[Finding] = []
    for c in checks:
        if c.match is False:
            findings.append(finding("checksum-mismatch", Path(c.file).name,
                                    f"{Path(c.file).name}: {c.algorithm} differs from the {c.source} (a corrupt, "
                                    f"truncated or replaced file)", file=c.file, algorithm=c.algorithm,
                                    expected=c.expected, found=c.found, source=c.source,
                                    hint="download the file again"))
    unverified = [Path(c.file).name for c in checks if c.expected is None]
    if unverified:
        findings.append(finding("checksum-unverified", unverified[0],
                                f"{len(unverified)} data file(s) have no expected hash (no Hugging Face cache blob, "
                                f"SHA256SUMS entry or LFS pointer): hashed, not verified", files=unverified[:16],
                                count=len(unverified)))
    return findings, checks
