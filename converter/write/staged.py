"""Shards of a staged model directory: pre-created whole, filled in place by another process, read back.

A distributed write (:mod:`converter.distributed`) lays every output shard out before any task runs:
:func:`precreate_shard` writes the shard's planned safetensors header (:func:`converter.write.safetensors.plan_header`,
deterministic) and extends the file to its final size. A task on any node then opens the existing file
without ``O_CREAT`` (:class:`StagedShardWriter`), checks that its header and size are the planned ones,
and ``pwrite``\\ s each tensor at its planned offset, then ``fsync``\\ s; a retried task rewrites the same
bytes at the same offsets. :func:`shard_digests` reads a shard back: its header, and the SHA-256 of each
tensor's bytes (the proof that every node sees the bytes the writer wrote).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

from converter.errors import ProofFailedError
from converter.write.background import pwrite_all
from converter.write.safetensors import SafetensorsWriter, plan_header

__all__ = ["precreate_shard", "StagedShardWriter", "shard_digests"]

#: Bytes read at a time by :func:`shard_digests`.
_CHUNK = 8 * 2**20


def precreate_shard(path: str | os.PathLike, entries: Sequence[tuple[str, str, Sequence[int]]],
                    metadata: Mapping[str, str] | None = None) -> int:
    """Create ``path`` (it must not exist) holding the planned header of ``entries``, at its final size
    (the data region zero until a task fills it), fsynced. Returns the file's size in bytes.

    Raises
    ------
    FormatError
        From :func:`~converter.write.safetensors.plan_header` (duplicate names, bad shapes ...).
    FileExistsError
        ``path`` exists.
    """
    prefix, plan = plan_header(entries, metadata)
    size = len(prefix) + sum(slot.nbytes for slot in plan.values())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        pwrite_all(fd, memoryview(prefix), 0)
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


class StagedShardWriter(SafetensorsWriter):
    """A :class:`~converter.write.safetensors.SafetensorsWriter` over a shard :func:`precreate_shard` made.

    Opens the file ``O_WRONLY`` without ``O_CREAT`` or ``O_TRUNC``; its header and size must be the
    planned ones (else :class:`~converter.errors.ProofFailedError`: another plan made the staging
    directory). Writes, row blocks, the check that every planned tensor was written and the final
    ``fsync`` are the parent's.
    """

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY)  # no O_CREAT: the coordinator made it

    def _prepare(self, prefix: bytes) -> None:
        """Check, instead of writing, that the file holds the planned header and size."""
        size = os.fstat(self._fd).st_size
        with open(self.path, "rb") as fh:
            head = fh.read(len(prefix))
        if size != self._size or head != prefix:
            raise ProofFailedError("the staged shard is not the planned one", file=self.path, field="header",
                                   expected=f"{self._size} bytes, the planned header",
                                   found=f"{size} bytes" + ("" if head == prefix else ", another header"))


def shard_digests(path: str | os.PathLike) -> dict[str, object]:
    """Read a staged shard back: its size, the SHA-256 of its header and of each tensor's bytes.

    Returns
    -------
    dict
        ``{"size": int, "header": hex, "tensors": {name: hex}}``.

    Raises
    ------
    ProofFailedError
        The header cannot be parsed, or a tensor's bytes lie beyond the end of the file.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        raw = fh.read(8)
        n = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        text = fh.read(n) if 0 <= n <= size - 8 else b""
        try:
            header = json.loads(text)
        except ValueError:
            header = None
        if not isinstance(header, dict):
            raise ProofFailedError("the staged shard's header does not parse", file=path, field="header")
        start = 8 + n
        tensors: dict[str, str] = {}
        for name, entry in sorted(header.items()):
            if name == "__metadata__":
                continue
            begin, end = (int(v) for v in entry["data_offsets"])
            if start + end > size:
                raise ProofFailedError("a tensor lies beyond the end of the staged shard", file=path, tensor=name,
                                       field="data_offsets", expected=f"<= {size - start}", found=end)
            digest = hashlib.sha256()
            fh.seek(start + begin)
            left = end - begin
            while left:
                chunk = fh.read(min(left, _CHUNK))
                if not chunk:
                    break
                digest.update(chunk)
                left -= len(chunk)
            tensors[name] = digest.hexdigest()
    return {"size": size, "header": hashlib.sha256(raw + text).hexdigest(), "tensors": tensors}
