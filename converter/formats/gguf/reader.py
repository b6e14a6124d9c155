"""GGUF reader: the bounded header walk, gguf-py's ``GGUFReader`` cross-checked against it, and the
lazy :class:`~converter.tensor.Checkpoint` (HF names, un-permuted LLaMA q/k rows, config and tokenizer
side files). See :mod:`converter.formats.gguf.format` for the orientation and type facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from converter.errors import ConverterError, CorruptFileError, FormatError, UnsupportedError
from converter.groups import GroupMap
from converter.runtime import drop_pages
from converter.layout import IN, OUT
from converter.tensor import Checkpoint, DenseTensor, DoubleQuant, StoredArray, TensorSpec
from converter.formats.gguf.blocks import FP4Codec, LegacyCodec, codec_for, CODECS
from converter.formats.gguf.fp4 import fp4_note, fp4_scheme, scale_tensor_name
from converter.formats.gguf.names import gguf_to_hf, norm_offset
from converter.formats.gguf.heads import qk_permutation
from converter.formats.gguf.split import SPLIT_KEYS, check_part, check_total, part_paths, split_count
from converter.formats.gguf.fallback import DECODED_BY, fallback_types, decode as fallback_decode
from converter.formats.gguf.fallback import stored_arrays as fallback_stored
from converter.formats.registry import Detection
from converter.formats.source import Source

from converter.formats.gguf.schemes import (DENSE_TYPES, MAX_DIMS, axes_for, gguf_module, group_size_of, scheme_for,
                                            scale_coding_of, tensor_from_fields)
from converter.formats.gguf.bounds import check_gguf_bounds
from converter.formats.gguf.read_rows import row_blocks_of
from converter.formats.gguf.hf_config import hf_config_from_gguf
from converter.formats.gguf.hf_tokenizer import TOKENIZER_FILES, hf_tokenizer_files_from_gguf

@dataclass(frozen=True)
class _Entry:
    """One GGUF tensor as found in the file (validated)."""

    index: int
    gguf_name: str
    name: str  # logical
    type_name: str
    ne: tuple[int, ...]
    data_offset: int
    nbytes: int
    part: int = 0  # which file of a split set (0: the first, or the only one)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.ne))


def _corrupt(path: Path, exc: BaseException) -> CorruptFileError:
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > 300:
        text = text[:300] + "..."
    return CorruptFileError(f"not a readable GGUF file ({text})", file=path)


def _open_reader(path: Path):
    """``(GGUFReader(path), bounds)``; any failure on the untrusted bytes is a CorruptFileError.

    The bounded header parse :func:`~converter.formats.gguf.bounds.check_gguf_bounds` runs first
    (every structural check: counts, alignment, dims, block multiples, offsets, overlap, padding),
    so GGUFReader never sees huge counts or lengths (it memory-maps and trusts them).
    """
    bounds = check_gguf_bounds(path)
    gguf = gguf_module()
    try:
        return gguf.GGUFReader(path, "r"), bounds
    except ConverterError:
        raise
    except Exception as exc:  # noqa: BLE001 - third-party parser on untrusted bytes: all of its failures mean "corrupt"
        raise _corrupt(path, exc) from None


def _field_value(field) -> tuple[Any, Any]:
    """JSON-able value and GGUF type (``"UINT32"`` or ``["ARRAY", "STRING"]``) of a reader field."""
    types = [t.name for t in field.types]
    value = field.contents()
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, list):
        value = [v.item() if isinstance(v, np.generic) else v for v in value]
    return value, (types[0] if len(types) == 1 else types)


def _kv(reader, path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    values, types = {}, {}
    try:
        for key, field in reader.fields.items():
            if key.startswith("GGUF."):
                continue
            values[key], types[key] = _field_value(field)
    except ConverterError:
        raise
    except Exception as exc:  # noqa: BLE001 - malformed key/value bytes
        raise _corrupt(path, exc) from None
    return values, types


def _disagree(path: Path, what: str, tensor: str | None, expected: Any, found: Any) -> CorruptFileError:
    return CorruptFileError("GGUFReader disagrees with the bounded header parse", file=path, tensor=tensor,
                            field=what, expected=expected, found=found)


def _validate(reader, bounds, path: Path) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """Cross-check GGUFReader against ``bounds``; return ``(name, type, ne, data_offset, nbytes)``.

    ``bounds`` (:func:`~converter.formats.gguf.bounds.check_gguf_bounds`) holds every structural
    check; here only the reader's own policy (little-endian, at least one dimension, a data section
    inside the file even without tensors) and whether GGUFReader read the same alignment, data
    start and tensor table (name, type, ne, offset, data size).

    Raises
    ------
    CorruptFileError
        A tensor without dimensions, a data section past the end of the file, or GGUFReader
        disagreeing with the bounded parse.
    UnsupportedError
        Big-endian files.
    """
    if bounds.byteorder == "big":
        raise UnsupportedError("big-endian GGUF files are not supported", file=path, field="byte_order",
                               expected="little-endian", found="big-endian")
    start = bounds.data_start
    if start > bounds.file_size:  # bounds allows it only without tensors
        raise CorruptFileError("tensor data section starts outside the file", file=path, field="data_offset",
                               expected=f"..{bounds.file_size}", found=start)
    if int(reader.alignment) != bounds.alignment:
        raise _disagree(path, "general.alignment", None, bounds.alignment, int(reader.alignment))
    if int(reader.data_offset) != start:
        raise _disagree(path, "data_offset", None, start, int(reader.data_offset))
    if len(reader.tensors) != len(bounds.tensors):
        raise _disagree(path, "tensor_count", None, len(bounds.tensors), len(reader.tensors))
    out = []
    for t, b in zip(reader.tensors, bounds.tensors):
        name, ne = b.name, b.ne
        if not ne:
            raise CorruptFileError("tensor has too many dimensions", file=path, tensor=name, field="n_dims",
                                   expected=f"1..{MAX_DIMS}", found=0)
        found = (t.name, t.tensor_type.name, tuple(int(x) for x in t.shape), int(t.data_offset))
        if found != (name, b.type_name, ne, start + b.offset):
            raise _disagree(path, "tensor_info", name, f"{name} {b.type_name}{list(ne)} at {start + b.offset}",
                            f"{found[0]} {found[1]}{list(found[2])} at {found[3]}")
        if int(t.data.nbytes) != b.nbytes:
            raise CorruptFileError("tensor data size disagrees with its dims and type", file=path, tensor=name,
                                   field="ne", expected=b.nbytes, found=int(t.data.nbytes))
        out.append((name, b.type_name, ne, start + b.offset, b.nbytes))
    return out


def _stored_arrays(e: _Entry, file: str) -> tuple[StoredArray, ...]:
    """Bytes by role: code bits vs block scales/mins (audits)."""
    if e.type_name in DENSE_TYPES:
        return (StoredArray(e.gguf_name, "dense", e.type_name, e.shape, e.nbytes, file),)
    if e.type_name not in CODECS:
        return (StoredArray(e.gguf_name, "other", e.type_name, e.shape, e.nbytes, file),)
    codec = codec_for(e.type_name)
    n = int(np.prod(e.shape, dtype=np.int64))
    code_bytes = n * codec.bits // 8
    rest = e.nbytes - code_bytes
    # block fields interleave with the codes on disk; shapes here are per block (legacy) or per
    # super-block (K-quants: d, dmin and the packed sub-block scales/mins), in logical orientation
    per_block = tuple(e.shape[:-1]) + (e.shape[-1] // codec.block_size,)
    if isinstance(codec, FP4Codec):  # one scale byte per group
        per_group = tuple(e.shape[:-1]) + (e.shape[-1] // codec.group_size,)
        return (StoredArray(e.gguf_name, "codes", e.type_name, e.shape, code_bytes, file),
                StoredArray(e.gguf_name + ":scales", "scales", "U8", per_group, rest, file))
    if isinstance(codec, LegacyCodec) and codec.affine:
        return (StoredArray(e.gguf_name, "codes", e.type_name, e.shape, code_bytes, file),
                StoredArray(e.gguf_name + ":d", "scales", "F16", per_block, rest // 2, file),
                StoredArray(e.gguf_name + ":m", "zero_points", "F16", per_block, rest - rest // 2, file))
    return (StoredArray(e.gguf_name, "codes", e.type_name, e.shape, code_bytes, file),
            StoredArray(e.gguf_name + (":d" if isinstance(codec, LegacyCodec) else ":scales"), "scales",
                        "F16" if isinstance(codec, LegacyCodec) else "U8", per_block, rest, file))


def _spec(e: _Entry, file: str, scale: _Entry | None = None, *, split: bool = False) -> TensorSpec:
    stored = _stored_arrays(e, file)
    notes = (f"ggml_type={e.type_name}", f"gguf_name={e.gguf_name}") + ((f"gguf_file={file}",) if split else ())
    if isinstance(CODECS.get(e.type_name), FP4Codec):
        notes += (fp4_note(e.type_name),)
        if scale is not None and (int(np.prod(scale.ne)) != 1 or scale.type_name != "F32"):
            return TensorSpec(e.name, "opaque", e.shape, stored, dtype=e.type_name, notes=notes + (
                f"NVFP4 scale {scale.gguf_name} {scale.type_name} {list(scale.shape)} is not one F32 (per-expert "
                "scales of stacked experts?): not decoded by qckpt",))
        if scale is not None:
            stored += (StoredArray(scale.gguf_name, "global_scale", "F32", (), scale.nbytes, file),)
            notes += (f"{scale.gguf_name} (F32) multiplies: effective scale = e4m3(d) * scale (llama.cpp ggml_mul)",)
        return TensorSpec(e.name, "quantized", e.shape, stored, axes=axes_for(len(e.shape)),
                          scheme=fp4_scheme(e.type_name, scale is not None),
                          group_map=GroupMap.per_group(group_size_of(e.type_name), IN), notes=notes)
    if e.type_name in DENSE_TYPES:
        return TensorSpec(e.name, "dense", e.shape, stored, dtype=e.type_name, notes=notes)
    if e.type_name in fallback_types():  # IQ*, TQ*: values decoded by gguf-py, never written exactly
        return TensorSpec(e.name, "opaque", e.shape, fallback_stored(e.gguf_name, e.type_name, e.shape, e.nbytes,
                                                                     file),
                          dtype=e.type_name, decoded_by=DECODED_BY,
                          notes=notes + (f"ggml type {e.type_name}: values decoded by gguf-py (no qckpt codec)",))
    if e.type_name not in CODECS:  # a type gguf-py does not decode either: listed (inspect, audit) only
        return TensorSpec(e.name, "opaque", e.shape, stored, dtype=e.type_name,
                          notes=notes + (f"ggml type {e.type_name} has no decoder in qckpt",))
    return TensorSpec(e.name, "quantized", e.shape, stored, axes=axes_for(len(e.shape)),
                      scheme=scheme_for(e.type_name), group_map=GroupMap.per_group(group_size_of(e.type_name), IN),
                      double_quant=None if isinstance(codec_for(e.type_name), LegacyCodec) else e.type_name,
                      scale_coding=scale_coding_of(e.type_name), notes=notes)


def permute_rows(t, perm: np.ndarray):
    """Reorder the ``out`` rows of a tensor (and of every per-row parameter array)."""
    if isinstance(t, DenseTensor):
        return DenseTensor(t.name, np.ascontiguousarray(np.take(t.data, perm, axis=0)))
    ax = t.axes.index(OUT)

    def p(a):
        return None if a is None else np.ascontiguousarray(np.take(a, perm, axis=ax))
    dq = t.double_quant
    if dq is not None:
        dq = DoubleQuant(dq.kind, dq.super_block, p(dq.super_scales), p(dq.sub_scales), p(dq.super_mins),
                         p(dq.sub_mins))
    return t.replace(codes=p(t.codes), scales=p(t.scales), zero_points=p(t.zero_points), double_quant=dq)


def _nvfp4_scales(entries: Mapping[str, _Entry]) -> dict[str, _Entry]:
    """Logical weight name -> its NVFP4 second-level scale tensor ``<name>.scale`` (F32; llama.cpp's
    converter, :mod:`converter.formats.gguf.fp4`), for each NVFP4 weight that has one."""
    by_gguf = {e.gguf_name: e for e in entries.values()}
    out = {}
    for e in entries.values():
        sname = scale_tensor_name(e.gguf_name) if e.type_name == "NVFP4" else None
        s = by_gguf.get(sname) if sname else None
        if s is not None:  # any type: one that is not a single F32 makes the weight opaque (_spec)
            out[e.name] = s
    return out


def read_gguf(src: Source) -> Checkpoint:
    """Read a ``.gguf`` file into a lazily loaded :class:`Checkpoint` (HF names where known).

    Raises
    ------
    CorruptFileError
        The file does not parse or its tensor table contradicts the file.
    UnsupportedError
        Big-endian files. ggml types without a codec (IQ*, TQ*, ...) are listed as ``opaque``
        specs (inspect, audit); loading one raises UnsupportedError (from :class:`Checkpoint`).
        An NVFP4 weight's F32 ``<name>.scale`` tensor is its global scale (a multiplier), not a tensor of its own.
    FormatError
        Two GGUF names mapping to one logical name; a split set whose parts do not belong together
        (:mod:`.split`; a missing part is an InputNotFoundError naming it).

    A split GGUF (``split.count`` >= 2, as ``gguf-split`` writes it) is read as one checkpoint from all of its
    parts, whichever part ``src`` names; ``files`` lists them and ``metadata["gguf_split"]`` has the split keys.
    """
    path = Path(src.path)
    reader, bounds = _open_reader(path)
    rows = _validate(reader, bounds, path)
    kv, kv_types = _kv(reader, path)
    paths, readers, part_rows, split = _split_parts(path, reader, rows, kv)
    if paths[0] != path:  # a later part was given: the set is read from its first part
        path, reader = paths[0], readers[0]
        kv, kv_types = _kv(reader, path)
    if split:
        for key in SPLIT_KEYS:
            kv.pop(key, None)
            kv_types.pop(key, None)
    arch = kv.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    entries: dict[str, _Entry] = {}
    seen: dict[str, str] = {}
    for part, rows in enumerate(part_rows):
        for i, (gname, tname, ne, off, nbytes) in enumerate(rows):
            name = gguf_to_hf(gname, arch)
            if gname in seen or name in entries:
                other = entries[name].gguf_name if name in entries else gname
                raise FormatError("two GGUF tensors map to one name", file=paths[part], tensor=gname, field="name",
                                  expected="unique names", found=f"{other} and {gname} -> {name}"
                                  + (f" (also in {seen[gname]})" if gname in seen else ""))
            seen[gname] = paths[part].name
            entries[name] = _Entry(i, gname, name, tname, ne, off, nbytes, part)
    scales = _nvfp4_scales(entries)
    for s in scales.values():
        del entries[s.name]
    specs = {name: _spec(e, paths[e.part].name, scales.get(name), split=bool(split)) for name, e in entries.items()}

    def load(name: str):
        e = entries[name]
        reader = readers[e.part]
        t = reader.tensors[e.index]
        try:
            if e.type_name in DENSE_TYPES:
                dt = DENSE_TYPES[e.type_name]
                data = np.ascontiguousarray(t.data).view(dt).reshape(e.shape).copy()
                offset = norm_offset(name, arch)
                if offset is not None:  # Gemma: llama.cpp stores 1 + w (names.NORM_OFFSET_ARCHS); w, rounded once
                    data = data - data.dtype.type(offset)
                out = DenseTensor(name, data)
            elif e.type_name in CODECS:
                if len(e.shape) not in (2, 3):
                    raise UnsupportedError("quantized GGUF tensors must be 2-D or 3-D", field="ne",
                                           expected="2 or 3 dims", found=list(e.ne))
                codec = codec_for(e.type_name)
                if 0 in e.shape:  # fuzz finding: the row reshape below needs at least one block
                    raise CorruptFileError("quantized tensor has no elements", field="ne",
                                           expected="every dimension >= 1", found=list(e.ne))
                raw = np.asarray(t.data, dtype=np.uint8).reshape(-1, e.nbytes // max(1, int(np.prod(e.shape[:-1]))))
                g = None
                if name in scales:
                    sc = scales[name]
                    g = np.asarray(readers[sc.part].tensors[sc.index].data).view(np.float32).reshape(())
                out = tensor_from_fields(name, codec.decode(raw), e.shape, global_scale=g)
            elif e.type_name in fallback_types():
                if 0 in e.shape:
                    raise CorruptFileError("quantized tensor has no elements", field="ne",
                                           expected="every dimension >= 1", found=list(e.ne))
                out = DenseTensor(name, fallback_decode(np.asarray(t.data), e.type_name, e.shape))
            else:
                raise UnsupportedError(f"ggml type {e.type_name} is not supported", field="ggml_type",
                                       expected=f"one of {', '.join((*DENSE_TYPES, *CODECS))}", found=e.type_name)
            perm = None
            if len(e.shape) <= 2:
                perm = qk_permutation(e.gguf_name, e.shape[0], arch, kv, {}, file=paths[e.part], tensor=name)
            if perm is not None:
                out = permute_rows(out, np.argsort(perm))
            # the reader maps the whole file once: release the pages this tensor touched (its arrays
            # are copies), so resident memory does not grow with every tensor read
            drop_pages(reader.data)
            return out
        except ConverterError as exc:
            exc.with_context(file=paths[e.part], tensor=f"{name} ({e.gguf_name})" if name != e.gguf_name else name)
            raise

    metadata = {
        "gguf_kv": kv, "gguf_kv_types": kv_types, "architecture": arch,
        "gguf_version": int(reader.fields["GGUF.version"].contents()),
        "alignment": int(reader.alignment),
        "gguf_names": {n: e.gguf_name for n, e in entries.items()},
        "ggml_types": {n: e.type_name for n, e in entries.items()},
    }
    if split:
        metadata["gguf_split"] = {**split, "files": [p.name for p in paths]}
    config, side_files, skipped = _hf_side_files(kv, kv_types, [e.gguf_name for e in entries.values()])
    if skipped:
        metadata["side_files_skipped"] = skipped
    # llama.cpp's names (blk.0.attn_q.weight) look up the same tensors as the Hugging Face names they map to
    aliases = {e.gguf_name: n for n, e in entries.items() if e.gguf_name != n}
    return Checkpoint(specs, load, format="gguf", path=str(path), config=config, metadata=metadata,
                      files=[str(p) for p in paths], side_files=side_files, aliases=aliases,
                      row_blocks=row_blocks_of(entries, readers, arch, kv, paths))


def _split_parts(path: Path, reader, rows, kv: Mapping[str, Any]):
    """``(paths, readers, rows per part, split keys)`` of the file ``path`` (already opened as ``reader`` with
    tensor ``rows`` and key/values ``kv``) or of its split set (:mod:`.split`: every part opened, bounded and
    checked; ``split keys`` is ``{}`` for a file that is not split)."""
    if not split_count(kv):
        return [path], [reader], [rows], {}
    paths = part_paths(path, kv)
    opened = {path: (reader, rows, kv)}
    first_kv = None
    readers, part_rows = [], []
    for i, p in enumerate(paths):
        if p not in opened:
            r, b = _open_reader(p)
            opened[p] = (r, _validate(r, b, p), _kv(r, p)[0])
        r, rw, pkv = opened[p]
        first_kv = pkv if i == 0 else first_kv
        check_part(p, pkv, i, first_kv)
        readers.append(r)
        part_rows.append(rw)
    check_total(paths[0], first_kv, sum(len(rw) for rw in part_rows))
    return paths, readers, part_rows, {k: first_kv[k] for k in SPLIT_KEYS if k in first_kv}


def _hf_side_files(kv: Mapping[str, Any], kv_types: Mapping[str, Any], gguf_names: Sequence[str]):
    """``(config, side_files, skipped)``: the Hugging Face ``config.json`` dict (:mod:`.gguf_hf_config`;
    ``{}`` when the architecture is not mapped), the tokenizer files made on demand
    (:mod:`.gguf_hf_tokenizer`) and, per file not made, the reason."""
    skipped: dict[str, str] = {}
    try:
        config = hf_config_from_gguf(kv, gguf_names, kv_types=kv_types)
    except ConverterError as exc:
        config, skipped["config.json"] = {}, exc.render()
    try:
        side = hf_tokenizer_files_from_gguf(kv)
    except ConverterError as exc:
        side = {}
        skipped.update({name: exc.render() for name in TOKENIZER_FILES})
    return config, side, skipped


def detect_gguf(src: Source) -> Detection | None:
    """Claim ``.gguf`` files / files starting with the ``GGUF`` magic (Source decides the kind)."""
    if src.kind == "gguf":
        return Detection("gguf", 100, "GGUF file (magic or .gguf suffix)")
    return None
