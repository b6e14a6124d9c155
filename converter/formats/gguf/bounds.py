"""A bounded pre-check of a GGUF file's header, run before ``gguf.GGUFReader`` touches it.

``GGUFReader`` memory-maps the file and trusts its counts: a hostile ``tensor_count`` or array
length makes it build huge numpy views or loop for a very long time, and a bad offset makes
``np.memmap`` slices silently short. This module walks the header with explicit bounds and raises
:class:`~converter.errors.CorruptFileError` naming file, field (and tensor) with expected vs found.

Layout (``ggml-org/ggml`` ``docs/gguf.md`` "File Structure"; gguf-py ``gguf_reader.py``
``GGUFReader.__init__``, ``_build_fields``, ``_build_tensor_info``; FORMATS.md section 5.1)::

    u32 magic "GGUF" | u32 version (2 or 3) | u64 tensor_count | u64 kv_count
    kv_count x  (string key, u32 value_type, value)
    tensor_count x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset)
    zero padding to ALIGNMENT, tensor data (offsets relative to its start)

Strings are ``u64 length + bytes``; arrays are ``u32 elem_type + u64 count + elements``. Byte order
is little-endian unless the version reads with zero low 16 bits (gguf-py's big-endian detection).

Every count is bounded by the bytes that remain (each element needs at least its minimum encoded
size), so parsing time and memory are linear in the file size. Nothing is allocated from a count.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from converter.errors import CorruptFileError, InputNotFoundError

__all__ = ["GGUFTensorBounds", "GGUFBounds", "check_gguf_bounds", "MAX_DIMS", "MAX_ARRAY_DEPTH"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
#: ``GGML_MAX_DIMS``.
MAX_DIMS = 4
#: Arrays of arrays deeper than this are refused (gguf-py recurses without a limit).
MAX_ARRAY_DEPTH = 8
DEFAULT_ALIGNMENT = 32
_INT64_MAX = 2**63 - 1
_MAX_DIM = 1 << 62

# value type id -> (name, fixed size in bytes or None for string/array)
_VALUE_TYPES = {0: ("UINT8", 1), 1: ("INT8", 1), 2: ("UINT16", 2), 3: ("INT16", 2), 4: ("UINT32", 4),
                5: ("INT32", 4), 6: ("FLOAT32", 4), 7: ("BOOL", 1), 8: ("STRING", None), 9: ("ARRAY", None),
                10: ("UINT64", 8), 11: ("INT64", 8), 12: ("FLOAT64", 8)}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
# minimal encoded size of one value of each kind (a string: its u64 length; an array: type + count)
_MIN_SIZE = {k: (v[1] if v[1] is not None else (8 if k == _STRING else 12)) for k, v in _VALUE_TYPES.items()}
_MIN_KV = 8 + 4 + 1          # key length, value type, smallest value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8  # name length, n_dims, ggml_type, offset


def _quant_sizes() -> dict[int, tuple[str, int, int]]:
    """ggml type id -> (name, block size, bytes per block), from ``gguf.GGML_QUANT_SIZES``."""
    from gguf import GGML_QUANT_SIZES
    return {int(t): (t.name, int(bs), int(ts)) for t, (bs, ts) in GGML_QUANT_SIZES.items()}


@dataclass(frozen=True)
class GGUFTensorBounds:
    """One tensor info entry, checked.

    Attributes
    ----------
    name : str
    ggml_type : int
    type_name : str
    ne : tuple of int
        Dimensions in ggml order (``ne[0]`` fastest-varying).
    offset : int
        Relative to the data section start.
    nbytes : int
        ``prod(ne) / block_size * type_size``.
    """

    name: str
    ggml_type: int
    type_name: str
    ne: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFBounds:
    """What the pre-check established about a GGUF file."""

    path: Path
    version: int
    byteorder: str
    kv_count: int
    keys: tuple[str, ...]
    alignment: int
    data_start: int
    file_size: int
    tensors: tuple[GGUFTensorBounds, ...]


class _Cursor:
    """Bounded sequential reads over a read-only buffer; every read checks the remaining bytes."""

    def __init__(self, path: Path, buf, size: int, endian: str) -> None:
        self.path, self.buf, self.size, self.pos, self.e = path, buf, size, 0, endian

    def remaining(self) -> int:
        return self.size - self.pos

    def need(self, n: int, field: str, tensor: str | None = None) -> None:
        if n > self.remaining():
            raise CorruptFileError("truncated: field runs past the end of the file", file=self.path, tensor=tensor,
                                   field=field, expected=f"{n} bytes at offset {self.pos}",
                                   found=f"{self.remaining()} bytes left (file size {self.size})")

    def unpack(self, fmt: str, field: str, tensor: str | None = None):
        n = struct.calcsize(self.e + fmt)
        self.need(n, field, tensor)
        val = struct.unpack_from(self.e + fmt, self.buf, self.pos)[0]
        self.pos += n
        return val

    def skip(self, n: int, field: str, tensor: str | None = None) -> None:
        self.need(n, field, tensor)
        self.pos += n

    def string(self, field: str, tensor: str | None = None, *, decode: bool = True) -> str | None:
        """A bounded string; decoded (UTF-8 checked) for keys and tensor names, skipped for values
        (gguf-py decodes values lazily, and vocabularies may hold arbitrary bytes)."""
        start = self.pos
        n = self.unpack("Q", field + ".length", tensor)
        if n > self.remaining():
            raise CorruptFileError("string length runs past the end of the file", file=self.path, tensor=tensor,
                                   field=field, expected=f"<= {self.remaining()} bytes (remaining)",
                                   found=f"{n} at offset {start}")
        if not decode:
            self.pos += n
            return None
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptFileError("string is not valid UTF-8", file=self.path, tensor=tensor, field=field,
                                   expected="UTF-8",
                                   found=f"invalid byte at offset {self.pos - n + exc.start}") from None


def _value(cur: _Cursor, vtype: int, field: str, depth: int = 0) -> object:
    """Skip (or, for scalars used later, return) one value of ``vtype`` with bounds."""
    if vtype not in _VALUE_TYPES:
        raise CorruptFileError("unknown value type", file=cur.path, field=field,
                               expected=f"one of {sorted(_VALUE_TYPES)}", found=vtype)
    if vtype == _STRING:
        return cur.string(field, decode=False)
    if vtype == _ARRAY:
        if depth >= MAX_ARRAY_DEPTH:
            raise CorruptFileError("arrays nested too deeply", file=cur.path, field=field,
                                   expected=f"depth <= {MAX_ARRAY_DEPTH}", found=depth + 1)
        etype = cur.unpack("I", field + ".array_type")
        if etype not in _VALUE_TYPES:
            raise CorruptFileError("unknown array element type", file=cur.path, field=field + ".array_type",
                                   expected=f"one of {sorted(_VALUE_TYPES)}", found=etype)
        count = cur.unpack("Q", field + ".array_length")
        min_size = _MIN_SIZE[etype]
        if count > cur.remaining() // min_size:
            raise CorruptFileError("array length exceeds the bytes left in the file", file=cur.path,
                                   field=field + ".array_length",
                                   expected=f"<= {cur.remaining() // min_size} elements of >= {min_size} bytes",
                                   found=count)
        fixed = _VALUE_TYPES[etype][1]
        if fixed is not None:
            cur.skip(count * fixed, field)
        else:
            for _ in range(count):  # bounded: count <= remaining / min_size
                _value(cur, etype, field, depth + 1)
        return None
    fmt = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}[vtype]
    return cur.unpack(fmt, field)


def check_gguf_bounds(path: str | os.PathLike) -> GGUFBounds:
    """Walk a GGUF header with explicit bounds before any library parses it.

    Parameters
    ----------
    path : str or PathLike
        A ``.gguf`` file. Opened read-only and memory-mapped read-only; never modified.

    Returns
    -------
    GGUFBounds
        Version, byte order, keys, alignment, data start and every tensor's checked extent.

    Raises
    ------
    InputNotFoundError
        ``path`` does not exist.
    CorruptFileError
        Naming the file, the field (and tensor), with expected vs found, when: the magic is not
        ``GGUF``; the version is not 2 or 3; ``tensor_count`` / ``kv_count`` exceed what the rest
        of the file could hold; a string or array length runs past the end; a value type is
        unknown; arrays nest deeper than :data:`MAX_ARRAY_DEPTH`; a key or tensor name repeats or
        is not UTF-8; ``general.alignment`` is not a non-zero power-of-two UINT32; ``n_dims`` is
        over 4; a dimension product overflows int64; the ggml type is unknown; ``ne[0]`` is not a
        multiple of the type's block size; a dimension is 2^62 or more; an offset is not aligned;
        tensor data lies (partly) outside the file or overlaps another tensor; the padding before
        the data section is not zero (a count that does not match the file). A file without tensors
        may end before the aligned data start (the GGUF reader refuses that).
    """
    path = Path(path)
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise InputNotFoundError("no such file", file=path) from None
    except IsADirectoryError:
        raise CorruptFileError("expected a GGUF file, found a directory", file=path) from None
    with fh:
        size = os.fstat(fh.fileno()).st_size
        if size < 24:
            head = fh.read(4)
            if head != GGUF_MAGIC:
                raise CorruptFileError("not a GGUF file (bad magic)", file=path, field="magic",
                                       expected=repr(GGUF_MAGIC), found=repr(head))
            raise CorruptFileError("file too short for a GGUF header", file=path, field="header",
                                   expected=">= 24 bytes", found=f"{size} bytes")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _walk(path, buf, size)


def _walk(path: Path, buf, size: int) -> GGUFBounds:
    magic = bytes(buf[:4])
    if magic != GGUF_MAGIC:
        raise CorruptFileError("not a GGUF file (bad magic)", file=path, field="magic",
                               expected=repr(GGUF_MAGIC), found=repr(magic))
    (version,) = struct.unpack_from("<I", buf, 4)
    endian, order = "<", "little"
    if version & 0xFFFF == 0:  # gguf-py: a byte-swapped version means a big-endian file
        (version,) = struct.unpack_from(">I", buf, 4)
        endian, order = ">", "big"
    if version not in SUPPORTED_VERSIONS:
        raise CorruptFileError("unsupported GGUF version", file=path, field="version",
                               expected=" or ".join(map(str, SUPPORTED_VERSIONS)), found=version)
    cur = _Cursor(path, buf, size, endian)
    cur.pos = 8
    n_tensors = cur.unpack("Q", "tensor_count")
    n_kv = cur.unpack("Q", "metadata_kv_count")
    if n_kv > cur.remaining() // _MIN_KV:
        raise CorruptFileError("metadata_kv_count exceeds what the file could hold", file=path,
                               field="metadata_kv_count",
                               expected=f"<= {cur.remaining() // _MIN_KV} (file size {size})", found=n_kv)
    if n_tensors > cur.remaining() // _MIN_TENSOR_INFO:
        raise CorruptFileError("tensor_count exceeds what the file could hold", file=path, field="tensor_count",
                               expected=f"<= {cur.remaining() // _MIN_TENSOR_INFO} (file size {size})",
                               found=n_tensors)

    keys: list[str] = []
    seen: set[str] = set()
    alignment = DEFAULT_ALIGNMENT
    for i in range(n_kv):
        key = cur.string(f"kv[{i}].key")
        if key in seen:
            raise CorruptFileError("duplicate metadata key", file=path, field=key, expected="unique keys",
                                   found=f"{key!r} twice")
        seen.add(key)
        keys.append(key)
        vtype = cur.unpack("I", f"{key}.value_type")
        value = _value(cur, vtype, key)
        if key == "general.alignment":
            if vtype != _UINT32:
                raise CorruptFileError("general.alignment has the wrong type", file=path, field=key,
                                       expected="UINT32", found=_VALUE_TYPES.get(vtype, (vtype,))[0])
            if value == 0 or value & (value - 1):
                raise CorruptFileError("alignment is not a non-zero power of two", file=path, field=key,
                                       expected="power of two", found=value)
            alignment = value

    sizes = _quant_sizes()
    infos: list[tuple[str, int, tuple[int, ...], int]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"tensor_info[{i}].name")
        if name in names:
            raise CorruptFileError("duplicate tensor name", file=path, tensor=name, field="name",
                                   expected="unique names", found=f"{name!r} twice")
        names.add(name)
        n_dims = cur.unpack("I", "n_dims", name)
        if n_dims > MAX_DIMS:
            raise CorruptFileError("too many dimensions", file=path, tensor=name, field="n_dims",
                                   expected=f"<= {MAX_DIMS}", found=n_dims)
        ne = tuple(cur.unpack("Q", f"ne[{d}]", name) for d in range(n_dims))
        gtype = cur.unpack("I", "ggml_type", name)
        offset = cur.unpack("Q", "offset", name)
        infos.append((name, gtype, ne, offset))

    # data section starts at the next multiple of the alignment (gguf-py: offs += padding)
    data_start = -(-cur.pos // alignment) * alignment
    if infos and data_start > size:
        raise CorruptFileError("data section starts past the end of the file", file=path, field="data_start",
                               expected=f"<= {size}", found=data_start)

    tensors: list[GGUFTensorBounds] = []
    for name, gtype, ne, offset in infos:
        if gtype not in sizes:
            raise CorruptFileError("unknown ggml type", file=path, tensor=name, field="ggml_type",
                                   expected=f"one of {sorted(sizes)}", found=gtype)
        tname, block, type_size = sizes[gtype]
        count = 1
        for d in ne:  # overflow-checked: stop as soon as the product leaves int64
            count *= d
            if count > _INT64_MAX:
                raise CorruptFileError("dimension product overflows int64", file=path, tensor=name, field="ne",
                                       expected=f"prod(ne) <= {_INT64_MAX}", found=list(ne))
        if block > 1 and not ne:  # gguf-py quant_shape_to_byte_shape indexes shape[-1]
            raise CorruptFileError("a block-quantized tensor needs at least one dimension", file=path, tensor=name,
                                   field="n_dims", expected=">= 1 for " + tname, found=0)
        if ne and ne[0] % block:
            raise CorruptFileError("ne[0] is not a multiple of the type's block size", file=path, tensor=name,
                                   field="ne", expected=f"multiple of {block} for {tname}", found=ne[0])
        nbytes = count // block * type_size
        if offset % alignment:
            raise CorruptFileError("tensor offset is not aligned", file=path, tensor=name, field="offset",
                                   expected=f"multiple of {alignment}", found=offset)
        if offset > size - data_start or nbytes > size - data_start - offset:
            raise CorruptFileError("tensor data lies outside the file", file=path, tensor=name, field="offset",
                                   expected=f"data_start {data_start} + offset + {nbytes} bytes ({tname}{list(ne)}) "
                                            f"<= file size {size}",
                                   found=f"offset {offset}, end {data_start + offset + nbytes}")
        if any(d >= _MAX_DIM for d in ne):  # reachable only with prod(ne) == 0 (else the data lies outside)
            raise CorruptFileError("dimension out of range", file=path, tensor=name, field="ne",
                                   expected="0..2^62", found=list(ne))
        tensors.append(GGUFTensorBounds(name, gtype, tname, ne, offset, nbytes))

    prev = None
    for t in sorted(tensors, key=lambda t: (t.offset, t.nbytes)):
        if prev is not None and t.offset < prev.offset + prev.nbytes:
            raise CorruptFileError("tensor data overlaps another tensor", file=path, tensor=t.name, field="offset",
                                   expected=f">= {prev.offset + prev.nbytes} (end of {prev.name!r})", found=t.offset)
        prev = t
    if any(bytes(buf[cur.pos:data_start])):
        raise CorruptFileError("non-zero bytes between the tensor infos and the tensor data "
                               "(tensor_count or kv_count does not match the file)", file=path,
                               field="padding", expected="zero padding", found=f"bytes {cur.pos}..{data_start}")
    return GGUFBounds(path, version, order, n_kv, tuple(keys), alignment, data_start, size, tuple(tensors))
