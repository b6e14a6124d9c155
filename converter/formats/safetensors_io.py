"""A bounded, strict safetensors reader: the header validated, tensors memory-mapped on demand.

File layout (safetensors README "Format"): 8 bytes ``N`` (little-endian u64), ``N`` bytes of UTF-8
JSON, then the byte buffer. Tensor ``data_offsets`` are relative to the buffer start (``8 + N``).

The reader applies every check of safetensors 0.8.0 ``src/tensor.rs`` (``SafeTensors::read_metadata``,
``Metadata::validate``) and adds the ones it skips (duplicate keys, unknown entry fields), always naming
the file, tensor and field. It reads only the 8-byte prefix and the header; tensor data is memory-mapped
on demand. The writer is :mod:`converter.write.safetensors` (it shares the limits defined there).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from converter.dtypes import DTYPES, storage_nbytes
from converter.errors import CorruptFileError, ErrorKind, InputNotFoundError, MissingTensorError
from converter.write.safetensors import MAX_HEADER_SIZE, METADATA_KEY as _METADATA_KEY, U64_MAX as _U64_MAX
from converter.write.safetensors import bounded_count as _bounded_count, is_uint as _is_uint

__all__ = [
    "DTYPES", "MAX_HEADER_SIZE", "TensorInfo", "SafetensorsHeader", "SafetensorsFile",
    "read_header", "read_tensor", "open_safetensors",
]

_LFS_MAGIC = b"version https://git-lfs"
_ENTRY_FIELDS = frozenset({"dtype", "shape", "data_offsets"})


@dataclass(frozen=True)
class TensorInfo:
    """One header entry, validated.

    Attributes
    ----------
    name : str
    dtype : str
        safetensors dtype string (a key of :data:`DTYPES`).
    shape : tuple of int
        Logical shape; ``()`` for a scalar.
    begin, end : int
        Byte offsets relative to the data buffer start; ``end`` exclusive.
    nbytes : int
        ``end - begin``.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    nbytes: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated safetensors header.

    Attributes
    ----------
    path : Path
    header_len : int
        ``N``, the JSON length in bytes (padding included).
    data_start : int
        ``8 + N``; absolute file offset of the data buffer.
    tensors : dict of str to TensorInfo
        In the order of their offsets in the file.
    metadata : dict of str to str
        ``__metadata__``, or empty.
    file_size : int
        Size of the file when the header was read, in bytes.
    """

    path: Path
    header_len: int
    data_start: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    file_size: int


# --------------------------------------------------------------------------------------------- reader

class DuplicateKey(Exception):
    """Raised from the JSON object hook :func:`no_duplicate_keys`; carries the repeated key."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``json.loads`` ``object_pairs_hook`` refusing repeated keys (the safetensors README disallows them; 0.8.0 does
    not check; Python's json, and transformers after it, keep the last one silently)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def _reject_constant(token: str) -> object:
    """``parse_constant`` hook: ``NaN``/``Infinity`` are not JSON."""
    raise ValueError(f"non-JSON constant {token}")


def _read_prefix(path: Path, fh, file_size: int) -> int:
    """Read and bound ``N``. Errors: file < 8 bytes, ``N`` over the cap (git-LFS stub named), ``8+N`` past EOF."""
    head = fh.read(8)
    if len(head) < 8:
        raise CorruptFileError("file too short to hold the 8-byte header length", file=path,
                               field="header_length", expected=">= 8 bytes", found=f"{len(head)} bytes")
    (n,) = struct.unpack("<Q", head)
    if n > MAX_HEADER_SIZE:
        if head + fh.read(len(_LFS_MAGIC) - 8) == _LFS_MAGIC:
            raise CorruptFileError("file is a git-LFS pointer stub, not safetensors data", file=path,
                                   field="header_length", expected=f"<= {MAX_HEADER_SIZE}", found=n,
                                   hint="run `git lfs pull` to fetch the real file")
        hint = None
        if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
            hint = f"the file starts with text ({head.decode('ascii')!r}): it is not a safetensors or GGUF checkpoint"
        raise CorruptFileError("header length exceeds the cap", file=path, field="header_length",
                               expected=f"<= {MAX_HEADER_SIZE}", found=n, hint=hint)
    if 8 + n > file_size:
        raise CorruptFileError("header length runs past the end of the file (truncated?)", file=path,
                               field="header_length", expected=f"8 + N <= {file_size}", found=f"8 + {n}")
    return n


def _parse_json(path: Path, raw: bytes) -> dict[str, object]:
    """Decode UTF-8 and JSON; the top level must be an object without duplicate keys."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptFileError("header is not valid UTF-8", file=path, field="header",
                               expected="UTF-8", found=f"invalid byte at offset {8 + exc.start}") from None
    try:
        obj = json.loads(text, object_pairs_hook=no_duplicate_keys, parse_constant=_reject_constant)
    except DuplicateKey as dup:
        raise CorruptFileError("duplicate key in header JSON", file=path, field="header",
                               tensor=dup.key, expected="unique keys", found=f"{dup.key!r} twice") from None
    except (ValueError, RecursionError) as exc:
        raise CorruptFileError("header is not valid JSON", file=path, field="header",
                               expected="a JSON object", found=str(exc)[:200]) from None
    if not isinstance(obj, dict):
        raise CorruptFileError("header JSON is not an object", file=path, field="header",
                               expected="object", found=type(obj).__name__)
    return obj


def _parse_metadata(path: Path, value: object) -> dict[str, str]:
    """``__metadata__`` must be a str -> str map (0.8.0 rejects non-string values)."""
    if not isinstance(value, dict):
        raise CorruptFileError("__metadata__ is not an object", file=path, field=_METADATA_KEY,
                               expected="object of str -> str", found=type(value).__name__)
    for key, item in value.items():
        if not isinstance(item, str):
            raise CorruptFileError(f"__metadata__ value for {key!r} is not a string", file=path,
                                   field=_METADATA_KEY, expected="str", found=type(item).__name__)
    return dict(value)


def _parse_entry(path: Path, name: str, entry: object) -> tuple[str, tuple[int, ...], int, int]:
    """Check one tensor entry's schema; returns ``(dtype, shape, begin, end)``."""
    def bad(msg: str, field: str | None, expected: object, found: object) -> CorruptFileError:
        return CorruptFileError(msg, file=path, tensor=name, field=field, expected=expected, found=found)

    if not isinstance(entry, dict):
        raise bad("header entry is not an object", None, "object", type(entry).__name__)
    if set(entry) != _ENTRY_FIELDS:
        raise bad("header entry has wrong fields", None, sorted(_ENTRY_FIELDS), sorted(entry))
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise bad("unknown dtype", "dtype", f"one of {sorted(DTYPES)}", repr(dtype)[:80])
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise bad("shape is not a list of non-negative integers", "shape", "list of int >= 0",
                  repr(shape)[:80])
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)):
        raise bad("data_offsets is not two non-negative integers", "data_offsets", "[begin, end]",
                  repr(offsets)[:80])
    begin, end = offsets
    if end < begin:
        raise bad("data_offsets end before begin", "data_offsets", "begin <= end", f"[{begin}, {end}]")
    return dtype, tuple(shape), begin, end


def _check_size(path: Path, info: TensorInfo) -> None:
    """Element count x bitsize must be whole bytes and equal ``end - begin``.

    Source: ``Metadata::validate`` (``MisalignedSlice``, ``TensorInvalidInfo``, ``ValidationOverflow``).
    The product stops once it passes ``2**64`` (Rust ``usize``), so a hostile shape cannot blow up.
    """
    bits = DTYPES[info.dtype].bits
    where = f"{info.dtype}{list(info.shape)}"
    count = _bounded_count(info.shape, _U64_MAX)
    if count is None:
        raise CorruptFileError("element count overflows u64", file=path, tensor=info.name, field="shape",
                               expected=f"<= {_U64_MAX} elements", found=f"{where} (more)")
    nbytes = storage_nbytes(bits, count)
    if nbytes is None:
        raise CorruptFileError("element count x bitsize is not a whole number of bytes", file=path,
                               tensor=info.name, field="shape", expected="multiple of 8 bits",
                               found=f"{count} x {bits} bits")
    if nbytes != info.nbytes:
        raise CorruptFileError("shape and dtype do not match the data_offsets byte size", file=path,
                               tensor=info.name, field="data_offsets",
                               expected=f"{nbytes} bytes for {where}", found=f"{info.nbytes} bytes",
                               kind=ErrorKind.SHAPE)


def _check_layout(path: Path, infos: list[TensorInfo], data_len: int) -> None:
    """Sorted by offsets: start at 0, contiguous, and end exactly at EOF.

    Source: ``Metadata::validate`` (``InvalidOffset``) and ``read_metadata``
    (``MetadataIncompleteBuffer``).
    """
    cursor = 0
    for info in infos:
        if info.begin != cursor:
            what = "gap before tensor" if info.begin > cursor else "tensor overlaps the previous one"
            raise CorruptFileError(what, file=path, tensor=info.name, field="data_offsets",
                                   expected=f"begin == {cursor}", found=f"begin == {info.begin}")
        cursor = info.end
    if cursor != data_len:
        what = "trailing bytes after the last tensor" if data_len > cursor else "data buffer is truncated"
        raise CorruptFileError(what, file=path, field="data_offsets", expected=f"{cursor} data bytes",
                               found=f"{data_len} data bytes", hint="the file may be truncated or corrupt")


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Read and validate a safetensors header without reading tensor data.

    Parameters
    ----------
    path : str or PathLike

    Returns
    -------
    SafetensorsHeader

    Raises
    ------
    InputNotFoundError
        ``path`` does not exist.
    CorruptFileError
        For every check of safetensors ``read_metadata`` / ``Metadata::validate``, plus duplicate keys
        and unknown entry fields; names the file, tensor and field.
    """
    path = Path(path)
    if path.exists() and not path.is_file():  # a directory, FIFO or device: refuse before open() can block
        raise CorruptFileError("not a regular file", file=path, field="header", expected="a safetensors file",
                               found="directory or special file")
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise InputNotFoundError("no such file", file=path) from None
    except OSError as exc:
        raise CorruptFileError(f"cannot open: {exc.strerror}", file=path) from None
    with fh:
        file_size = os.fstat(fh.fileno()).st_size
        n = _read_prefix(path, fh, file_size)
        raw = fh.read(n)
    if len(raw) != n:  # file shrank while reading
        raise CorruptFileError("header is truncated", file=path, field="header", expected=n, found=len(raw))
    obj = _parse_json(path, raw)
    metadata: dict[str, str] = {}
    infos = []
    for name, entry in obj.items():
        if name == _METADATA_KEY:
            metadata = _parse_metadata(path, entry)
            continue
        dtype, shape, begin, end = _parse_entry(path, name, entry)
        infos.append(TensorInfo(name, dtype, shape, begin, end, end - begin))
    infos.sort(key=lambda t: (t.begin, t.end))
    _check_layout(path, infos, file_size - 8 - n)
    for info in infos:
        _check_size(path, info)
    return SafetensorsHeader(path, n, 8 + n, {t.name: t for t in infos}, metadata, file_size)


#: Tensors up to this size are mapped with ``MAP_POPULATE``: one system call maps every page
#: instead of one page fault per 4 KiB (about 2x less system time reading a checkpoint). Larger
#: ones stay lazily mapped, so a row-block reader holds only the rows it touches.
POPULATE_MAX = 64 * 2**20


def _map_populated(path: Path, offset: int, nbytes: int) -> np.ndarray:
    """Read-only ``uint8[nbytes]`` view of ``path[offset:offset+nbytes]``, prefaulted (the map lives
    as long as the array, like ``numpy.memmap``)."""
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), offset - start + nbytes, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                       prot=mmap.PROT_READ, offset=start)
    return np.frombuffer(mm, dtype=np.uint8, count=nbytes, offset=offset - start)


def read_tensor(header: SafetensorsHeader, name: str) -> np.ndarray:
    """A read-only view of one tensor, memory-mapped.

    Parameters
    ----------
    header : SafetensorsHeader
    name : str

    Returns
    -------
    numpy.ndarray
        Shape ``info.shape`` and the table's numpy dtype, read-only. For F4 / F6_* (no numpy dtype):
        raw ``uint8`` of shape ``(nbytes,)``, packed as stored.

    Raises
    ------
    MissingTensorError
        ``name`` is not in the header (the message lists a few known names).
    CorruptFileError
        The file changed size since the header was read.
    """
    info = header.tensors.get(name)
    if info is None:
        known = list(header.tensors)
        raise MissingTensorError("no such tensor", file=header.path, tensor=name,
                                 expected=f"one of {known[:10]}{' ...' if len(known) > 10 else ''}",
                                 found="absent")
    if os.stat(header.path).st_size != header.file_size:
        raise CorruptFileError("file changed size since its header was read", file=header.path,
                               tensor=name, expected=header.file_size, found=os.stat(header.path).st_size)
    np_dtype = DTYPES[info.dtype].numpy
    if info.nbytes == 0:
        raw = np.empty(0, dtype=np.uint8)
    elif info.nbytes <= POPULATE_MAX and hasattr(mmap, "MAP_POPULATE"):
        raw = _map_populated(header.path, header.data_start + info.begin, info.nbytes)
    else:
        raw = np.memmap(header.path, dtype=np.uint8, mode="r", offset=header.data_start + info.begin,
                        shape=(info.nbytes,))
    arr = raw if np_dtype is None else raw.view(np_dtype).reshape(info.shape)
    arr.flags.writeable = False
    return arr


class SafetensorsFile:
    """A validated safetensors file: ``.header``, ``.metadata``, ``.keys()``, ``.get(name)``."""

    def __init__(self, header: SafetensorsHeader) -> None:
        self.header = header

    @property
    def metadata(self) -> dict[str, str]:
        """``__metadata__`` (a copy)."""
        return dict(self.header.metadata)

    def keys(self) -> list[str]:
        """Tensor names in file (offset) order."""
        return list(self.header.tensors)

    def get(self, name: str) -> np.ndarray:
        """See :func:`read_tensor`."""
        return read_tensor(self.header, name)

    def __contains__(self, name: object) -> bool:
        return name in self.header.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.header.tensors)

    def __len__(self) -> int:
        return len(self.header.tensors)

    def __enter__(self) -> "SafetensorsFile":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def open_safetensors(path: str | os.PathLike) -> SafetensorsFile:
    """Validate the header of ``path`` (:func:`read_header`) and return a :class:`SafetensorsFile`."""
    return SafetensorsFile(read_header(path))
