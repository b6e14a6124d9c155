"""The safetensors file writer: the whole header planned before any data, tensors in any order.

File layout (safetensors README "Format"): 8 bytes ``N`` (little-endian u64), ``N`` bytes of UTF-8
JSON, then the byte buffer; tensor ``data_offsets`` are relative to the buffer start (``8 + N``).
:func:`plan_header` lays a file out deterministically (safetensors ``prepare`` order), so the
bytes depend only on the entries, the metadata and the values, and :class:`SafetensorsWriter`
streams tensors (or row blocks of them) at their planned offsets in any order, from any process,
through the background writer (:mod:`converter.write.background`). The reader and its checks are
:mod:`converter.formats.safetensors_io`, which shares the limits below.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from converter.dtypes import DTYPES, lookup, name_for_numpy, storage_nbytes
from converter.errors import ConverterError, FormatError
from converter.runtime import drop_pages, is_mapped
from converter.write.background import BackgroundWriter, pwrite_all

__all__ = ["MAX_HEADER_SIZE", "METADATA_KEY", "U64_MAX", "SafetensorsWriter", "plan_header", "write_safetensors",
           "bounded_count", "is_uint"]

#: Header size cap (safetensors ``MAX_HEADER_SIZE``).
MAX_HEADER_SIZE = 100_000_000
#: Largest offset / dimension a u64 (Rust ``usize``) can hold.
U64_MAX = 2**64 - 1
#: The header key of the str -> str metadata map.
METADATA_KEY = "__metadata__"


def is_uint(x: object) -> bool:
    """A JSON integer in ``[0, 2**64)`` (bools excluded)."""
    return type(x) is int and 0 <= x <= U64_MAX


def bounded_count(shape: tuple[int, ...], bound: int) -> int | None:
    """Element count, or ``None`` as soon as the product exceeds ``bound`` (never a huge product)."""
    if 0 in shape:
        return 0
    count = 1
    for dim in shape:
        count *= dim
        if count > bound:
            return None
    return count


@dataclass(frozen=True)
class _Planned:
    """A tensor's slot in the output: dtype string, shape, absolute byte offset and size."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _as_dims(shape: object) -> tuple[int, ...] | None:
    """A shape as a tuple of Python ints in ``[0, 2**64)``, or ``None`` if it is not one."""
    if not isinstance(shape, (tuple, list)):
        return None
    dims = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not is_uint(int(d)):
            return None
        dims.append(int(d))
    return tuple(dims)


def _plan_entry(name: object, dtype: object, shape: object) -> tuple[str, str, tuple[int, ...], int]:
    """Validate one ``(name, dtype, shape)`` and return it with its byte size."""
    if not isinstance(name, str) or name == METADATA_KEY:
        raise FormatError("invalid tensor name", tensor=str(name), field="name",
                          expected=f"str other than {METADATA_KEY!r}", found=repr(name))
    try:
        bits = lookup(dtype).bits  # type: ignore[arg-type]
    except ConverterError as exc:
        raise exc.with_context(tensor=name) from None
    dims = _as_dims(shape)
    if dims is None:
        raise FormatError("shape must be a sequence of non-negative integers", tensor=name,
                          field="shape", expected="tuple of int >= 0", found=repr(shape))
    count = bounded_count(dims, U64_MAX)
    if count is None:
        raise FormatError("element count overflows u64", tensor=name, field="shape",
                          expected=f"<= {U64_MAX} elements", found=repr(dims))
    nbytes = storage_nbytes(bits, count)
    if nbytes is None:
        raise FormatError("element count x bitsize is not a whole number of bytes", tensor=name,
                          field="shape", expected="multiple of 8 bits", found=f"{count} x {bits} bits")
    return name, dtype, dims, nbytes  # type: ignore[return-value]


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str]:
    """``__metadata__`` must be str -> str."""
    metadata = dict(metadata or {})
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise FormatError("metadata must map str to str", field=METADATA_KEY, expected="str -> str",
                              found=f"{type(key).__name__} -> {type(value).__name__}")
    return metadata


def plan_header(entries: Sequence[tuple[str, str, Sequence[int]]],
                metadata: Mapping[str, str] | None = None) -> tuple[bytes, dict[str, _Planned]]:
    """Lay out a safetensors file deterministically.

    Order: descending dtype alignment rank, then name (safetensors ``prepare``). Header: JSON with
    sorted keys and compact separators, right-padded with spaces to a multiple of 8 (so the buffer,
    and every tensor in it, is naturally aligned).

    Returns
    -------
    prefix : bytes
        ``N`` (u64 LE) followed by the padded header; the data buffer starts at ``len(prefix)``.
    plan : dict of str to _Planned
        Absolute offsets, in layout order.

    Raises
    ------
    FormatError
        Duplicate names, unknown dtypes, bad shapes, sub-byte sizes, non-string metadata.
    """
    rows = [_plan_entry(*e) for e in entries]
    names = [r[0] for r in rows]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise FormatError("tensor planned twice", tensor=dup, field="name", expected="unique names",
                          found=f"{names.count(dup)} entries")
    rows.sort(key=lambda r: (-DTYPES[r[1]].rank, r[0]))
    header: dict[str, object] = {}
    md = _check_metadata(metadata)
    if md:
        header[METADATA_KEY] = md
    cursor = 0
    relative = {}
    for name, dtype, shape, nbytes in rows:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [cursor, cursor + nbytes]}
        relative[name] = (dtype, shape, cursor, nbytes)
        cursor += nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_SIZE:
        raise FormatError("header would exceed the safetensors cap", field="header",
                          expected=f"<= {MAX_HEADER_SIZE} bytes", found=len(text))
    start = 8 + len(text)
    plan = {n: _Planned(d, s, start + off, nb) for n, (d, s, off, nb) in relative.items()}
    return struct.pack("<Q", len(text)) + text, plan


def _as_bytes(name: str, slot: _Planned, array: np.ndarray) -> memoryview:
    """Check ``array`` against its slot and return its C-contiguous little-endian bytes (a view of
    ``array`` when it already is so, e.g. a memory map of the source)."""
    array = np.asarray(array)
    np_dtype = DTYPES[slot.dtype].numpy
    if np_dtype is None:  # F4 / F6: raw packed bytes
        if array.dtype != np.uint8 or array.size != slot.nbytes:
            raise FormatError("packed sub-byte tensor must be given as raw uint8 bytes", tensor=name,
                              field="dtype", expected=f"uint8[{slot.nbytes}]",
                              found=f"{array.dtype}{list(array.shape)}")
        data = np.ascontiguousarray(array)
    else:
        found = name_for_numpy(array.dtype)
        if found != slot.dtype:
            raise FormatError("dtype does not match the plan", tensor=name, field="dtype",
                              expected=slot.dtype, found=found)
        if tuple(array.shape) != slot.shape:
            raise FormatError("shape does not match the plan", tensor=name, field="shape",
                              expected=list(slot.shape), found=list(array.shape))
        data = np.ascontiguousarray(array, dtype=np_dtype)
    view = memoryview(data.reshape(-1).view(np.uint8))
    if view.nbytes != slot.nbytes:
        raise FormatError("byte size does not match the plan", tensor=name, field="data_offsets",
                          expected=slot.nbytes, found=view.nbytes)
    return view


class SafetensorsWriter:
    """Write a safetensors file whose header is fixed before any data, tensors in any order.

    Parameters
    ----------
    path : str or PathLike
        Output file (created or truncated). Pair with :func:`converter.write.atomic.atomic_output`.
    entries : list of (name, dtype string, shape)
        Every tensor that will be written.
    metadata : dict of str to str, optional
        ``__metadata__``.

    Raises
    ------
    FormatError
        From :func:`plan_header`; from :meth:`write` on a dtype / shape / size mismatch, an unplanned
        or repeated tensor; from :meth:`close` if a planned tensor was never written.

    Notes
    -----
    Output bytes depend only on ``entries`` (as a set), ``metadata`` and the array values.
    Writes go through a background thread (:mod:`converter.write.background`): an array handed to
    :meth:`write` / :meth:`write_rows` must not be modified afterwards; :meth:`flush` waits for
    them, :meth:`close` flushes, checks every planned tensor was written and fsyncs.
    """

    def __init__(self, path: str | os.PathLike, entries: Sequence[tuple[str, str, Sequence[int]]],
                 metadata: Mapping[str, str] | None = None) -> None:
        self.path = Path(path)
        prefix, self._plan = plan_header(entries, metadata)
        self._written: set[str] = set()
        self._rows: dict[str, int] = {}
        self._size = len(prefix) + sum(s.nbytes for s in self._plan.values())
        self._fd: int | None = self._open()
        self._bg = BackgroundWriter(self._fd, path=self.path)  # its thread starts with the first tensor
        try:
            self._prepare(prefix)
        except BaseException:
            self._abort()
            raise

    def _open(self) -> int:
        """The output file's descriptor: created (or truncated) for writing."""
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def _prepare(self, prefix: bytes) -> None:
        """Write the header ``prefix`` and size the file to the plan."""
        pwrite_all(self._fd, memoryview(prefix), 0)  # synchronously: no thread exists yet when workers fork
        os.ftruncate(self._fd, self._size)

    def limit_in_flight(self, nbytes: int) -> None:
        """Bytes of arrays queued for the background writer before :meth:`write` waits (each worker process of a
        pool has its own queue: :func:`converter.write.files.write_plans` divides the default among them)."""
        self._bg.limit = max(1, int(nbytes))

    def _pwrite(self, view: memoryview, offset: int) -> None:
        """Queue ``view`` for writing at ``offset`` (a background thread writes it, see
        :mod:`converter.write.background`; the array behind ``view`` must not change afterwards).
        Bytes of a memory-mapped file (a dense tensor passed through) are queued without waiting,
        the map's pages dropped after each chunk is written."""
        assert self._fd is not None
        owner = view.obj
        release = (lambda: drop_pages(owner)) if is_mapped(owner) else None
        self._bg.submit(view, offset, release)

    def write(self, name: str, array: np.ndarray) -> None:
        """Write one planned tensor at its precomputed offset.

        Parameters
        ----------
        name : str
        array : numpy.ndarray
            Planned shape and dtype (``uint8[nbytes]`` for F4 / F6_*); any memory order / byte order.
        """
        if self._fd is None:
            raise FormatError("writer is closed", file=self.path, tensor=name)
        slot = self._plan.get(name)
        if slot is None:
            raise FormatError("tensor was not planned", file=self.path, tensor=name,
                              expected=f"one of {list(self._plan)[:10]}", found="unplanned name")
        if name in self._written:
            raise FormatError("tensor written twice", file=self.path, tensor=name)
        try:
            view = _as_bytes(name, slot, array)
        except ConverterError as exc:
            raise exc.with_context(file=self.path) from None
        self._pwrite(view, slot.offset)
        self._written.add(name)

    def slot(self, name: str) -> _Planned:
        """The planned dtype, shape, absolute offset and size of ``name``."""
        slot = self._plan.get(name)
        if slot is None:
            raise FormatError("tensor was not planned", file=self.path, tensor=name,
                              expected=f"one of {list(self._plan)[:10]}", found="unplanned name")
        return slot

    def write_rows(self, name: str, array: np.ndarray, row_start: int) -> int:
        """Write rows ``row_start .. row_start + len(array)`` of a planned tensor (leading axis).

        Blocks may come in any order; the tensor counts as written once every row has been.
        Returns the number of bytes written.

        Raises
        ------
        FormatError
            Unplanned name, a dtype or trailing-shape mismatch, rows out of range, a tensor
            already complete, or a sub-byte dtype (F4 / F6 rows are not byte-addressable).
        """
        if self._fd is None:
            raise FormatError("writer is closed", file=self.path, tensor=name)
        slot = self.slot(name)
        if name in self._written:
            raise FormatError("tensor written twice", file=self.path, tensor=name)
        array = np.asarray(array)
        np_dtype = DTYPES[slot.dtype].numpy
        if np_dtype is None or not slot.shape:
            raise FormatError("row blocks need a byte-addressable tensor with a leading axis", file=self.path,
                              tensor=name, field="dtype", found=slot.dtype)
        found = name_for_numpy(array.dtype)
        if found != slot.dtype:
            raise FormatError("dtype does not match the plan", file=self.path, tensor=name, field="dtype",
                              expected=slot.dtype, found=found)
        n = array.shape[0] if array.ndim else 0
        if tuple(array.shape[1:]) != slot.shape[1:] or row_start < 0 or row_start + n > slot.shape[0]:
            raise FormatError("row block does not fit the plan", file=self.path, tensor=name, field="shape",
                              expected=f"rows within [0, {slot.shape[0]}) x {list(slot.shape[1:])}",
                              found=f"rows [{row_start}, {row_start + n}) x {list(array.shape[1:])}")
        row_bytes = slot.nbytes // slot.shape[0] if slot.shape[0] else 0
        data = np.ascontiguousarray(array, dtype=np_dtype)
        self._pwrite(memoryview(data.reshape(-1).view(np.uint8)), slot.offset + row_start * row_bytes)
        self.mark_rows(name, n)
        return n * row_bytes

    def mark_rows(self, name: str, n: int) -> None:
        """Count ``n`` rows of ``name`` as written (by this or another process)."""
        slot = self.slot(name)
        done = self._rows.get(name, 0) + int(n)
        if done > slot.shape[0]:
            raise FormatError("more rows written than planned", file=self.path, tensor=name,
                              expected=slot.shape[0], found=done)
        self._rows[name] = done
        if done == slot.shape[0]:
            self._written.add(name)

    def complete(self, name: str) -> bool:
        """True once every byte of ``name`` has been written (by this process, or adopted)."""
        return name in self._written

    def adopt(self, names) -> None:
        """Count ``names`` as written (by a worker process at their planned offsets); idempotent."""
        for name in names:
            self.slot(name)
            self._written.add(name)

    def mark_written(self, name: str) -> None:
        """Count ``name`` as written (its bytes were written by a worker process at its offset)."""
        self.slot(name)
        if name in self._written:
            raise FormatError("tensor written twice", file=self.path, tensor=name)
        self._written.add(name)

    def _abort(self) -> None:
        """Close the descriptor without validating (queued writes not yet started are dropped)."""
        if self._fd is not None:
            self._bg.abandon()
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """Flush and close; raises :class:`FormatError` if a planned tensor is missing."""
        if self._fd is None:
            return
        missing = [n for n in self._plan if n not in self._written]
        try:
            if missing:
                raise FormatError("planned tensors were never written", file=self.path,
                                  tensor=missing[0], expected=f"{len(self._plan)} tensors",
                                  found=f"{len(missing)} missing: {missing[:10]}")
            self._bg.close()
            os.fsync(self._fd)
        finally:
            self._abort()

    def __enter__(self) -> "SafetensorsWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._abort()


def write_safetensors(path: str | os.PathLike, tensors: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` to ``path``; dtype strings come from the numpy dtypes (:data:`DTYPES`).

    Raises
    ------
    FormatError
        A numpy dtype with no safetensors equivalent, or any :class:`SafetensorsWriter` error.
    """
    arrays = {name: np.asarray(a) for name, a in tensors.items()}
    entries = []
    for name, arr in arrays.items():
        try:
            entries.append((name, name_for_numpy(arr.dtype), arr.shape))
        except ConverterError as exc:
            raise exc.with_context(file=path, tensor=name) from None
    with SafetensorsWriter(path, entries, metadata) as writer:
        for name, arr in arrays.items():
            writer.write(name, arr)
