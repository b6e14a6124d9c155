"""GGUF (llama.cpp / ggml) reader and writer, format ``"gguf"``.

The header is first walked with bounds by :func:`~converter.formats.gguf.bounds.check_gguf_bounds`
(``n_dims <= 4``, element count without overflow, ``ne[0]`` a whole number of blocks, each
tensor's data aligned, inside the file and not overlapping another, zero padding between the
tensor infos and the data); container parsing is then gguf-py's ``GGUFReader``, every exception it
raises on a malformed file becomes a :class:`CorruptFileError` naming the file, and what it reports
is cross-checked against the bounded parse. Block bytes are decoded by
:mod:`converter.formats.gguf.blocks`.

Orientation (FORMATS.md section 5.2, pitfall 5): gguf-py's ``ReaderTensor.shape`` is the raw
``ne`` list (``ne[0]`` innermost = ``in``) while ``.data`` is numpy-ordered; the logical shape is
``reversed(ne)``: ``(out, in)``, or ``(expert, out, in)`` for stacked experts. Rows of ``ne[0]``
elements hold whole blocks, so the stored bytes are already in logical row order and no
transpose happens.

Types -> logical schemes (group of 32 (legacy) or the K-quant sub-block along ``in``):

=========  ==============================================================================
Q4_0/Q5_0  ``bits`` 4/5, unsigned, symmetric (implicit centre 8/16), F16 scales
Q8_0       8-bit signed symmetric, F16 scales
Q4_1/Q5_1  unsigned, float bias ``m`` (``x = d*q + m``), F16 scales and biases
Q2_K/Q4_K  unsigned, float bias; effective F32 scales ``d*sc`` and biases ``-(dmin*m)``
/Q5_K      computed in float32 as ``dequantize_row_q*_K`` does, plus a :class:`DoubleQuant`
           record of ``d``, ``dmin`` (F16) and the integer ``sc``, ``m``
Q3_K/Q6_K  3/6-bit unsigned symmetric (centre 4/32 = 2^(b-1)), effective F32 scales ``d*sc``
F32/F16/   :class:`DenseTensor` (also F64, I8..I64); any other ggml type (IQ*, TQ*, MXFP4 ...)
BF16       is listed but raises UnsupportedError when loaded
=========  ==============================================================================

Names: llama.cpp names map to Hugging Face names per ``general.architecture``
(:mod:`converter.formats.gguf.names`); LLaMA q/k rows are un-permuted on read and permuted on
write (``LlamaModel.permute``). All key/values are kept in ``ckpt.metadata["gguf_kv"]`` (plain
JSON values) with their GGUF types in ``ckpt.metadata["gguf_kv_types"]``. ``ckpt.config`` is the
Hugging Face ``config.json`` the key/values describe (:mod:`converter.formats.gguf.hf_config`) and
``ckpt.side_files`` the tokenizer files (:mod:`converter.formats.gguf.hf_tokenizer`, built when a
directory writer asks for them); what could not be made is in ``metadata["side_files_skipped"]``
(file name -> reason). Writing GGUF from a GGUF source takes every key/value from the source,
never from that derived config.

Writing (``gguf.GGUFWriter``, streamed one tensor at a time into an atomic temporary file) packs
quantized tensors whose scheme *is* a legacy type (codes and scales reused, no requantization);
K-quants cannot be written (no K-quant encoder in gguf-py; ``d*sc`` is generally not one fp16
scale). :func:`quantize_to_gguf` is the explicit requantize path (llama.cpp reference rounding).

Requantizing to GGUF (``qckpt convert --to gguf`` with requantize options) goes through
:data:`converter.formats.gguf.requant.GGUF_QUANTIZER` (:mod:`converter.quant.format_quant`): every target is put in GGUF's form
(:func:`requant_adapt`: fp16 block scales, asymmetric = float minimum as in Q4_1/Q5_1, a legacy
type's exact scheme at groups of 32 along ``in``), and a tensor that is not carried exactly is
quantized to its legacy type by :func:`quantize_to_gguf`, i.e. byte for byte what
``gguf.quants.quantize`` makes of the source's float32 dequantized values. The writer's LLaMA q/k
row permutation moves whole rows and blocks never cross rows, so quantizing the logical rows
and then permuting them equals quantizing the permuted rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from converter.quant.recode import as_groups, exact_cast
from converter.dtypes import DTYPES
from converter.errors import ConverterError, CorruptFileError, FormatError, NotRepresentableError, UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.write.atomic import atomic_output
from converter.runtime import drop_pages
from converter.write.files import write_at_offsets
from converter.layout import EXPERT, IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, DoubleQuant, QuantizedTensor, StoredArray, TensorSpec, opaque_reason
from converter.formats.gguf.blocks import QK_K, SUPPORTED_WRITE, BlockFields, KQuantCodec, LegacyCodec, codec_for, CODECS
from converter.formats.gguf.names import HF_MODEL_TYPE_TO_ARCH, gguf_to_hf, hf_to_gguf, llama_row_permutation, permute_heads_key
from converter.formats.registry import Detection, FormatHandler, register
from converter.formats.source import Source

__all__ = ["read_gguf", "write_gguf", "detect_gguf", "check_target", "quantize_to_gguf",
           "scheme_for", "tensor_from_fields", "legacy_type_for", "requant_adapt", "GGUF_QUANTIZER",
           "LEGACY_TYPES", "DENSE_TYPES"]

LEGACY_TYPES: tuple[str, ...] = SUPPORTED_WRITE
"""Quantized ggml types this module writes (bit-exact repack or reference quantization): the
legacy block codecs of :mod:`gguf_blocks` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)."""

DENSE_TYPES: dict[str, np.dtype] = {n: DTYPES[n].numpy for n in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")}
"""ggml types read as plain arrays (:class:`DenseTensor`), with their numpy dtypes."""

MAX_DIMS = 4
"""``GGML_MAX_DIMS``."""
MAX_NAME_BYTES = 63
"""``GGML_MAX_NAME`` (64) minus the terminating NUL."""
QUANTIZATION_VERSION = 2
"""``GGML_QNT_VERSION`` (gguf-py ``GGML_QUANT_VERSION``)."""
_MANAGED_KEYS = ("general.architecture", "general.quantization_version", "general.file_type",
                 "general.alignment")
_FILE_TYPE = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q4_0": "MOSTLY_Q4_0",
              "Q4_1": "MOSTLY_Q4_1", "Q5_0": "MOSTLY_Q5_0", "Q5_1": "MOSTLY_Q5_1", "Q8_0": "MOSTLY_Q8_0"}


def _gguf():
    import gguf  # imported lazily: only GGUF paths need it
    return gguf


# ---------------------------------------------------------------------------------------------
# Types -> schemes
# ---------------------------------------------------------------------------------------------

def scheme_for(type_name: str) -> QuantScheme:
    """The logical scheme of a ggml block type (see the module table).

    Raises
    ------
    UnsupportedError
        For types without a codec (IQ*, TQ*, ...).
    """
    codec = codec_for(type_name)
    if isinstance(codec, LegacyCodec):
        if codec.bits == 8:
            return QuantScheme(8, True, ZeroPoint.NONE, "F16", "half_away")
        zp = ZeroPoint.FLOAT if codec.affine else ZeroPoint.NONE
        return QuantScheme(codec.bits, False, zp, "F16", "half_away")
    zp = ZeroPoint.FLOAT if codec.has_mins else ZeroPoint.NONE
    scheme = QuantScheme(codec.bits, False, zp, "F32", "half_away")
    assert codec.code_offset == (scheme.center if zp is ZeroPoint.NONE else 0)
    return scheme


def _group_size(type_name: str) -> int:
    codec = codec_for(type_name)
    return codec.block_size if isinstance(codec, LegacyCodec) else codec.sub_block_size


def _axes_for(ndim: int) -> tuple[str, ...] | None:
    return {2: (OUT, IN), 3: (EXPERT, OUT, IN)}.get(ndim)


def tensor_from_fields(name: str, fields: BlockFields, shape: Sequence[int]) -> QuantizedTensor:
    """Build the logical tensor from decoded block fields.

    Parameters
    ----------
    name : str
        Logical name.
    fields : BlockFields
        From ``codec.decode(raw)`` with ``raw`` of shape ``(rows, row_bytes)``, ``rows = prod(shape[:-1])``.
    shape : sequence of int
        Logical shape ``(out, in)`` or ``(expert, out, in)`` (``reversed(ne)``).

    Returns
    -------
    QuantizedTensor
        Codes ``shape``; scales ``(..., out, in/group)``. K-quant effective scales/biases are float32
        products computed exactly as ``KQuantCodec.dequantize`` does, so ``dequantize()`` is bit-exact.
    """
    shape = tuple(int(s) for s in shape)
    axes = _axes_for(len(shape))
    if axes is None:
        raise UnsupportedError("quantized GGUF tensors must be 2-D or 3-D", tensor=name, field="ne",
                               expected="2 or 3 dims", found=len(shape))
    lead = shape[:-1]
    t = fields.type_name
    codec = codec_for(t)
    scheme = scheme_for(t)
    codes = fields.codes.reshape(shape)
    if isinstance(codec, LegacyCodec):
        scales = fields.scales.reshape(*lead, -1)
        zp = fields.mins.reshape(*lead, -1) if codec.affine else None
        dq = None
    else:
        rows = fields.rows
        per = QK_K // codec.sub_block_size
        d = fields.super_scales.astype(np.float32)[..., None]
        scales = (d * fields.sub_scales.reshape(rows, -1, per).astype(np.float32)).reshape(*lead, -1)
        zp = None
        if codec.has_mins:
            dmin = fields.super_mins.astype(np.float32)[..., None]
            zp = -(dmin * fields.sub_mins.reshape(rows, -1, per).astype(np.float32)).reshape(*lead, -1)
        dq = DoubleQuant(
            kind=t, super_block=QK_K, super_scales=fields.super_scales.reshape(*lead, -1),
            sub_scales=fields.sub_scales.reshape(*lead, -1),
            super_mins=None if fields.super_mins is None else fields.super_mins.reshape(*lead, -1),
            sub_mins=None if fields.sub_mins is None else fields.sub_mins.reshape(*lead, -1))
    return QuantizedTensor(name=name, axes=axes, codes=codes, scales=scales, scheme=scheme,
                           group_map=GroupMap.per_group(_group_size(t), IN), zero_points=zp, double_quant=dq)


def quantize_to_gguf(values: np.ndarray, type_name: str, *, name: str = "tensor") -> QuantizedTensor:
    """Requantize float values to a legacy ggml type with llama.cpp's reference quantizer.

    Bytes are identical with ``gguf.quants.quantize`` (``quantize_row_q*_ref``, round half away
    from zero); the result is the decode of those bytes, so writing it packs them back unchanged.

    Parameters
    ----------
    values : ndarray of float, shape (out, in) or (expert, out, in)
        ``in`` a multiple of 32.
    type_name : str
        One of :data:`LEGACY_TYPES`.

    Returns
    -------
    QuantizedTensor

    Raises
    ------
    UnsupportedError
        K-quants and other types (no encoder).
    QuantizationError
        Bad row length, non-finite input, fp16 overflow of a block scale.
    """
    values = np.asarray(values, dtype=np.float32)
    if values.ndim not in (2, 3):
        raise UnsupportedError("only 2-D or 3-D tensors can be quantized to GGUF", tensor=name, field="shape",
                               expected="2 or 3 dims", found=list(values.shape))
    codec = codec_for(type_name)
    try:
        raw = codec.encode(values.reshape(-1, values.shape[-1]))
        return tensor_from_fields(name, codec.decode(raw), values.shape)
    except ConverterError as exc:
        raise exc.with_context(tensor=name)


#: The requantize options that give each legacy type (named in refusals).
REQUANT_OPTIONS = ("--group-size 32 and --bits 4/5/8 --sym (Q4_0/Q5_0/Q8_0) or --bits 4/5 --asym (Q4_1/Q5_1)")




# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

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
    from converter.formats.gguf.bounds import check_gguf_bounds
    bounds = check_gguf_bounds(path)
    gguf = _gguf()
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
    if isinstance(codec, LegacyCodec) and codec.affine:
        return (StoredArray(e.gguf_name, "codes", e.type_name, e.shape, code_bytes, file),
                StoredArray(e.gguf_name + ":d", "scales", "F16", per_block, rest // 2, file),
                StoredArray(e.gguf_name + ":m", "zero_points", "F16", per_block, rest - rest // 2, file))
    return (StoredArray(e.gguf_name, "codes", e.type_name, e.shape, code_bytes, file),
            StoredArray(e.gguf_name + (":d" if isinstance(codec, LegacyCodec) else ":scales"), "scales",
                        "F16" if isinstance(codec, LegacyCodec) else "U8", per_block, rest, file))


def _spec(e: _Entry, file: str) -> TensorSpec:
    stored = _stored_arrays(e, file)
    notes = (f"ggml_type={e.type_name}", f"gguf_name={e.gguf_name}")
    if e.type_name in DENSE_TYPES:
        return TensorSpec(e.name, "dense", e.shape, stored, dtype=e.type_name, notes=notes)
    if e.type_name not in CODECS:  # IQ*, TQ* ...: listed (inspect, audit), never decoded or written
        return TensorSpec(e.name, "opaque", e.shape, stored, dtype=e.type_name,
                          notes=notes + (f"ggml type {e.type_name} has no decoder in qckpt",))
    return TensorSpec(e.name, "quantized", e.shape, stored, axes=_axes_for(len(e.shape)),
                      scheme=scheme_for(e.type_name), group_map=GroupMap.per_group(_group_size(e.type_name), IN),
                      double_quant=None if isinstance(codec_for(e.type_name), LegacyCodec) else e.type_name,
                      notes=notes)


def _permute_rows(t, perm: np.ndarray):
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


def _head_count(kv: Mapping[str, Any], config: Mapping[str, Any], arch: str, which: str) -> int | None:
    """``head_count`` (q) or ``head_count_kv`` (k, defaulting to head_count) from GGUF kv or config.json."""
    n = kv.get(f"{arch}.attention.head_count", config.get("num_attention_heads"))
    if which == "k":
        n = kv.get(f"{arch}.attention.head_count_kv", config.get("num_key_value_heads", n))
    if isinstance(n, list):  # per-layer head counts: not handled
        return None
    return None if n is None else int(n)


def _qk_permutation(gguf_name: str, rows: int, arch: str, kv: Mapping[str, Any], config: Mapping[str, Any],
                    *, file: Any, tensor: str) -> np.ndarray | None:
    which = permute_heads_key(gguf_name, arch)
    if which is None:
        return None
    heads = _head_count(kv, config, arch, which)
    if heads is None:
        raise FormatError("LLaMA q/k rows are permuted in GGUF but the head count is unknown", file=file,
                          tensor=tensor, field=f"{arch}.attention.head_count" + ("_kv" if which == "k" else ""),
                          expected="an integer head count", found=None)
    return llama_row_permutation(rows, heads, tensor=tensor)


def read_gguf(src: Source) -> Checkpoint:
    """Read a ``.gguf`` file into a lazily loaded :class:`Checkpoint` (HF names where known).

    Raises
    ------
    CorruptFileError
        The file does not parse or its tensor table contradicts the file.
    UnsupportedError
        Big-endian files. ggml types without a codec (IQ*, TQ*, ...) are listed as ``opaque``
        specs (inspect, audit); loading one raises UnsupportedError (from :class:`Checkpoint`).
    FormatError
        Two GGUF names mapping to one logical name.
    """
    path = Path(src.path)
    reader, bounds = _open_reader(path)
    rows = _validate(reader, bounds, path)
    kv, kv_types = _kv(reader, path)
    arch = kv.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    entries: dict[str, _Entry] = {}
    for i, (gname, tname, ne, off, nbytes) in enumerate(rows):
        name = gguf_to_hf(gname, arch)
        if name in entries:
            raise FormatError("two GGUF tensors map to one name", file=path, tensor=gname, field="name",
                              expected="unique names", found=f"{entries[name].gguf_name} and {gname} -> {name}")
        entries[name] = _Entry(i, gname, name, tname, ne, off, nbytes)
    file = path.name
    specs = {name: _spec(e, file) for name, e in entries.items()}

    def load(name: str):
        e = entries[name]
        t = reader.tensors[e.index]
        try:
            if e.type_name in DENSE_TYPES:
                dt = DENSE_TYPES[e.type_name]
                data = np.ascontiguousarray(t.data).view(dt).reshape(e.shape).copy()
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
                out = tensor_from_fields(name, codec.decode(raw), e.shape)
            else:
                raise UnsupportedError(f"ggml type {e.type_name} is not supported", field="ggml_type",
                                       expected=f"one of {', '.join((*DENSE_TYPES, *CODECS))}", found=e.type_name)
            perm = None
            if len(e.shape) <= 2:
                perm = _qk_permutation(e.gguf_name, e.shape[0], arch, kv, {}, file=path, tensor=name)
            if perm is not None:
                out = _permute_rows(out, np.argsort(perm))
            # the reader maps the whole file once: release the pages this tensor touched (its arrays
            # are copies), so resident memory does not grow with every tensor read
            drop_pages(reader.data)
            return out
        except ConverterError as exc:
            raise exc.with_context(file=path, tensor=f"{name} ({e.gguf_name})" if name != e.gguf_name else name)

    metadata = {
        "gguf_kv": kv, "gguf_kv_types": kv_types, "architecture": arch,
        "gguf_version": int(reader.fields["GGUF.version"].contents()),
        "alignment": int(reader.alignment),
        "gguf_names": {n: e.gguf_name for n, e in entries.items()},
        "ggml_types": {n: e.type_name for n, e in entries.items()},
    }
    config, side_files, skipped = _hf_side_files(kv, kv_types, [e.gguf_name for e in entries.values()])
    if skipped:
        metadata["side_files_skipped"] = skipped
    return Checkpoint(specs, load, format="gguf", path=str(path), config=config, metadata=metadata,
                      files=[str(path)], side_files=side_files)


def _hf_side_files(kv: Mapping[str, Any], kv_types: Mapping[str, Any], gguf_names: Sequence[str]):
    """``(config, side_files, skipped)``: the Hugging Face ``config.json`` dict (:mod:`.gguf_hf_config`;
    ``{}`` when the architecture is not mapped), the tokenizer files made on demand
    (:mod:`.gguf_hf_tokenizer`) and, per file not made, the reason."""
    from converter.formats.gguf.hf_config import hf_config_from_gguf
    from converter.formats.gguf.hf_tokenizer import TOKENIZER_FILES, hf_tokenizer_files_from_gguf
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


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------

def _k_quant_note(spec: TensorSpec) -> str | None:
    for n in spec.notes:
        if n.startswith("ggml_type="):
            t = n.split("=", 1)[1]
            if isinstance(CODECS.get(t), KQuantCodec):
                return t
    return None


def _legacy_match(spec: TensorSpec) -> tuple[str | None, str | None]:
    """``(type_name, None)`` when the spec is a legacy ggml type exactly, else ``(None, reason)``."""
    s, gm = spec.scheme, spec.group_map
    if s is None or gm is None or spec.axes is None:
        return None, "tensor has no supported quantization scheme (" + "; ".join(spec.notes) + ")"
    kq = _k_quant_note(spec)
    if kq:
        return None, (f"{kq} K-quant (two-level scales): writing K-quants is not supported (gguf-py has no K-quant "
                      "encoder) and d*sc is generally not one fp16 block scale; requantize to a legacy type")
    if s.codebook is not None:
        return None, "codebook schemes (NF4/FP4/E2M1) have no GGUF legacy block type"
    # per-tensor, per-output-channel or groups of 32k along in: each 32-block repeats its scale
    # (converter.quant.recode.as_groups), an exact re-expression
    regroupable = (gm.granularity is Granularity.TENSOR or (gm.granularity is Granularity.CHANNEL and gm.axis == OUT)
                   or (gm.granularity is Granularity.GROUP and gm.axis == IN and gm.group_size % 32 == 0))
    if not regroupable or spec.act_order:
        return None, (f"GGUF legacy blocks are 32 consecutive elements along 'in' (or a parameter shared by "
                      f"whole 32-blocks); the tensor has {gm.describe()}"
                      f"{' with act-order g_idx' if spec.act_order else ''}")
    axes = tuple(spec.axes)
    if axes not in ((OUT, IN), (EXPERT, OUT, IN)):
        return None, f"GGUF quantized tensors are (out, in) or (expert, out, in); found axes {list(axes)}"
    if spec.shape[-1] % 32:
        return None, f"'in' = {spec.shape[-1]} is not a multiple of the 32-element block"
    if s.scale_dtype not in ("F16", "BF16", "F32"):
        return None, f"{s.scale_dtype} scales cannot be stored as fp16 block scales exactly"
    if s.zero_point is ZeroPoint.NONE:
        t = {4: "Q4_0", 5: "Q5_0", 8: "Q8_0"}.get(s.bits)
        if t is None:
            return None, f"no symmetric GGUF legacy type has {s.bits}-bit codes (Q4_0, Q5_0, Q8_0)"
        return t, None
    if s.zero_point is ZeroPoint.FLOAT:
        if s.signed:
            return None, "signed codes with float biases: Q4_1/Q5_1 store unsigned codes (x = d*q + m)"
        t = {4: "Q4_1", 5: "Q5_1"}.get(s.bits)
        if t is None:
            return None, f"no affine GGUF legacy type has {s.bits}-bit codes (Q4_1, Q5_1)"
        return t, None
    return None, ("integer zero points: Q4_1/Q5_1 compute d*q + m, which rounds differently from s*(q - z) "
                  f"in float32; not bit-exact. Requantize instead ({REQUANT_OPTIONS})")


def check_target(spec: TensorSpec) -> str | None:
    """None if ``spec`` can be written to GGUF without requantizing, else the reason.

    Dense tensors: F32/F16/BF16/F64/I8..I64 pass through. Quantized: exactly a legacy type (group
    32 along ``in``). F16 scales are exact; F32/BF16 scales are cast to fp16 and every value is
    checked at write time (NotRepresentableError when a cast would round).
    """
    if spec.kind == "opaque":
        return opaque_reason(spec)
    if spec.kind == "dense":
        return None if spec.dtype in DENSE_TYPES else f"dtype {spec.dtype} has no GGUF tensor type"
    return _legacy_match(spec)[1]


def _exact_f16(a: np.ndarray, *, tensor: str, field: str) -> np.ndarray:
    """``a`` as float16 if every value survives the cast exactly (GGUF block scales are ``ggml_half``)."""
    return exact_cast(a, np.float16, tensor=tensor, field=field,
                      message=f"{field} are not exactly representable in fp16 (GGUF block {field} are ggml_half)",
                      hint="requantize with --scale-dtype f16 (and --group-size 32) to write GGUF")


def _legacy_fields(t: QuantizedTensor, type_name: str) -> BlockFields:
    """Codes and fp16 scales of ``t`` as ``type_name`` block fields (no requantization)."""
    s = t.scheme
    rows = int(np.prod(t.shape[:-1], dtype=np.int64))
    codec = codec_for(type_name)
    if type_name == "Q8_0":
        codes = t.codes if s.signed else (t.codes.astype(np.int16) - np.int16(128)).astype(np.int8)
    elif not codec.affine:
        codes = t.codes if not s.signed else (t.codes.astype(np.int16) + np.int16(s.center or (1 << (s.bits - 1)))).astype(np.uint8)
    else:
        codes = t.codes
    scales = _exact_f16(t.scales, tensor=t.name, field="scales").reshape(rows, -1)
    mins = _exact_f16(t.zero_points, tensor=t.name, field="zero_points").reshape(rows, -1) if codec.affine else None
    return BlockFields(type_name, np.ascontiguousarray(codes).reshape(rows, t.shape[-1]), scales=scales, mins=mins)


@dataclass
class _Plan:
    name: str
    gguf_name: str
    type_name: str
    shape: tuple[int, ...]  # numpy (logical) order
    nbytes: int
    perm: np.ndarray | None


def _infer_type(v: Any) -> Any:
    if isinstance(v, bool):
        return "BOOL"
    if isinstance(v, int):
        return "UINT32" if 0 <= v < 2 ** 32 else ("INT64" if -2 ** 63 <= v < 2 ** 63 else "UINT64")
    if isinstance(v, float):
        return "FLOAT32"
    if isinstance(v, str):
        return "STRING"
    if isinstance(v, (list, tuple)) and v:
        sub = _infer_type(v[0])
        return ["ARRAY", "ARRAY" if isinstance(sub, list) else sub]
    return None


def _config_kv(config: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """Minimal hyperparameter key/values from config.json (best effort, no tokenizer)."""
    pairs = {"block_count": "num_hidden_layers", "context_length": "max_position_embeddings",
             "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
             "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
             "attention.layer_norm_rms_epsilon": "rms_norm_eps", "attention.layer_norm_epsilon": "layer_norm_eps",
             "rope.freq_base": "rope_theta"}
    out = {}
    for k, ck in pairs.items():
        v = config.get(ck)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{arch}.{k}"] = float(v) if ("epsilon" in k or "freq" in k) else int(v)
    return out


def _plan(ckpt: Checkpoint, spec: TensorSpec, arch: str, gguf_type: str | None, names: Mapping[str, str],
          kv: Mapping[str, Any]) -> _Plan:
    gname = names.get(spec.name) or hf_to_gguf(spec.name, arch)
    if len(gname.encode("utf-8")) > MAX_NAME_BYTES:
        raise FormatError("tensor name too long for GGUF", tensor=spec.name, field="name",
                          expected=f"<= {MAX_NAME_BYTES} bytes (GGML_MAX_NAME)", found=gname)
    shape = tuple(int(s) for s in spec.shape)
    if not 1 <= len(shape) <= MAX_DIMS:
        raise NotRepresentableError("GGUF tensors have 1 to 4 dims", tensor=spec.name, field="shape",
                                    expected=f"1..{MAX_DIMS} dims", found=list(shape))
    reason = check_target(spec)
    if reason:
        raise NotRepresentableError(f"cannot write to GGUF exactly: {reason}", tensor=spec.name, field="scheme",
                                    hint="requantize with quantize_to_gguf (e.g. Q8_0, Q4_0) to write GGUF")
    if spec.kind == "dense":
        type_name = spec.dtype
    else:
        type_name = _legacy_match(spec)[0]
        if gguf_type is not None and type_name != gguf_type:
            raise NotRepresentableError(f"tensor's scheme is {type_name}, not the requested {gguf_type}",
                                        tensor=spec.name, field="gguf_type", expected=gguf_type, found=type_name,
                                        hint="requantize with quantize_to_gguf to change the block type")
    gguf = _gguf()
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    perm = None
    if len(shape) <= 2 and permute_heads_key(gname, arch):
        perm = _qk_permutation(gname, shape[0], arch, kv, ckpt.config, file=None, tensor=spec.name)
    return _Plan(spec.name, gname, type_name, shape, n // block * size, perm)


def _encode(t, p: _Plan) -> np.ndarray:
    """The bytes (numpy array) GGUFWriter writes for tensor ``t`` under plan ``p``."""
    if p.perm is not None:
        t = _permute_rows(t, p.perm)
    if isinstance(t, DenseTensor):
        data = np.ascontiguousarray(t.data)
        if tuple(data.shape) != p.shape or data.dtype != DENSE_TYPES[p.type_name]:
            raise FormatError("tensor differs from its spec", tensor=p.name, field="data",
                              expected=f"{p.type_name} {list(p.shape)}", found=f"{data.dtype} {list(data.shape)}")
        return data.view(np.uint8) if p.type_name == "BF16" else data
    if isinstance(t, QuantizedTensor):
        codec = codec_for(p.type_name)
        raw = codec.pack(_legacy_fields(as_groups(t, 32), p.type_name))
        return raw.reshape(*p.shape[:-1], -1)
    raise FormatError("unknown tensor kind", tensor=p.name, found=type(t).__name__)


def write_gguf(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, gguf_type: str | None = None,
               arch: str | None = None, **_: Any) -> dict:
    """Write ``ckpt`` as one ``.gguf`` file (atomically; tensors streamed one at a time).

    Parameters
    ----------
    ckpt : Checkpoint
    dst : Path
        Output file.
    overwrite : bool
    gguf_type : str, optional
        Require every quantized tensor to be exactly this legacy type (``"Q4_0"`` ...).
    arch : str, optional
        ``general.architecture``; default: the source's GGUF value, else config.json ``model_type``.

    Returns
    -------
    dict
        ``files``, ``tensors``, ``types`` (logical name -> ggml type), ``architecture``.

    Raises
    ------
    NotRepresentableError
        A tensor is not exactly a legacy type / GGUF dtype (nothing is written).
    FormatError
        No architecture, over-long names, missing head counts for LLaMA q/k.
    """
    ckpt.refuse_opaque("gguf")
    gguf = _gguf()
    if gguf_type is not None and gguf_type not in LEGACY_TYPES:
        raise UnsupportedError("unsupported GGUF output type", field="gguf_type", expected=list(LEGACY_TYPES),
                               found=gguf_type)
    src_kv = dict(ckpt.metadata.get("gguf_kv") or {})
    src_types = dict(ckpt.metadata.get("gguf_kv_types") or {})
    arch = arch or src_kv.get("general.architecture") or HF_MODEL_TYPE_TO_ARCH.get(ckpt.config.get("model_type")) \
        or ckpt.config.get("model_type")
    if not isinstance(arch, str) or not arch:
        raise FormatError("no GGUF architecture: source has no general.architecture and config.json no model_type",
                          file=dst, field="general.architecture", hint="pass arch=...")
    if not src_kv and ckpt.config:
        src_kv = _config_kv(ckpt.config, arch)
    names = dict(ckpt.metadata.get("gguf_names") or {}) if ckpt.format == "gguf" else {}
    # tied embeddings (CASES.md B32/B33): an lm_head identical to the embedding is left out (llama.cpp
    # then uses token_embd); a different one is kept (GGUF has no tie flag: output.weight wins)
    from converter.formats.ties import resolve_tied_head
    drop, _, tie = resolve_tied_head(ckpt, ckpt.config or None, ckpt.names())
    plans = [_plan(ckpt, spec, arch, gguf_type, names, src_kv) for spec in ckpt.specs() if spec.name not in drop]
    seen: dict[str, str] = {}
    for p in plans:
        if p.gguf_name in seen:
            raise FormatError("two tensors map to one GGUF name", tensor=p.name, field="name",
                              found=f"{seen[p.gguf_name]} and {p.name} -> {p.gguf_name}")
        seen[p.gguf_name] = p.name
    types = {p.name: p.type_name for p in plans}
    src_ggml = ckpt.metadata.get("ggml_types") or {}
    if ckpt.format == "gguf" and src_ggml == types and isinstance(src_kv.get("general.file_type"), int):
        file_type = int(src_kv["general.file_type"])
    else:
        weight = Counter()
        for p in plans:
            weight[p.type_name] += int(np.prod(p.shape, dtype=np.int64)) if len(p.shape) >= 2 else 0
        quant = [t for t in weight if t in LEGACY_TYPES]
        dom = max(quant, key=lambda t: weight[t]) if quant else (max(weight, key=lambda t: weight[t]) if weight else "F32")
        file_type = int(gguf.LlamaFileType[_FILE_TYPE.get(dom, "ALL_F32")])
    alignment = int(ckpt.metadata.get("alignment") or src_kv.get("general.alignment") or 32) \
        if ckpt.format == "gguf" else 32
    notes = []
    with atomic_output(dst, overwrite=overwrite) as tmp:
        writer = gguf.GGUFWriter(None, arch)
        try:
            managed = {"general.quantization_version": lambda: writer.add_quantization_version(QUANTIZATION_VERSION),
                       "general.file_type": lambda: writer.add_file_type(file_type),
                       "general.alignment": lambda: writer.add_custom_alignment(alignment)}
            for key, value in src_kv.items():  # source order kept, managed keys recomputed in place
                if key in managed:
                    managed.pop(key)()
                    continue
                if key in _MANAGED_KEYS or key.startswith("GGUF."):
                    continue
                vt = src_types.get(key) or _infer_type(value)
                if vt is None or (isinstance(value, list) and not value):
                    notes.append(f"key {key} not written (empty or untyped value)")
                    continue
                if isinstance(vt, list):
                    sub = gguf.GGUFValueType[vt[1]] if len(vt) == 2 else None
                    writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=sub)
                else:
                    writer.add_key_value(key, value, gguf.GGUFValueType[vt])
            if alignment == 32:
                managed.pop("general.alignment", None)
            for add in managed.values():
                add()
            for p in plans:
                qt = gguf.GGMLQuantizationType[p.type_name]
                if p.type_name in ("F32", "F16", "F64", "I8", "I16", "I32", "I64"):
                    writer.add_tensor_info(p.gguf_name, p.shape, DENSE_TYPES[p.type_name], p.nbytes)
                else:
                    byte_shape = gguf.quant_shape_to_byte_shape(p.shape, qt)
                    writer.add_tensor_info(p.gguf_name, byte_shape, np.dtype(np.uint8), p.nbytes, raw_dtype=qt)
            writer.write_header_to_file(path=Path(tmp))
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            fout = writer.fout[0]
            fout.flush()
            # GGUFWriter.write_tensor_data pads to the alignment, writes the tensor, pads its size:
            # every offset is known now, so tensors are encoded and pwritten in any order / process
            align = int(writer.data_alignment)
            start = writer.ggml_pad(fout.tell(), align)
        finally:
            writer.close()
        offsets, pos = [], start
        for p in plans:
            offsets.append(pos)
            pos += writer.ggml_pad(p.nbytes, align)

        def produce(i: int):
            p = plans[i]
            try:
                data = _encode(ckpt[p.name], p)
            except ConverterError as exc:
                raise exc.with_context(tensor=p.name)
            if data.nbytes != p.nbytes:
                raise FormatError("encoded size differs from the plan", tensor=p.name, field="nbytes",
                                  expected=p.nbytes, found=data.nbytes)
            return offsets[i], data
        write_at_offsets(tmp, pos, len(plans), produce, total_bytes=pos - start)
    result = {"files": [Path(dst).name], "tensors": len(plans), "types": types, "architecture": arch,
              "file_type": file_type, "notes": notes}
    if tie is not None:
        result["tied_head"] = tie
    return result


from converter.formats.gguf.requant import GGUF_QUANTIZER, legacy_type_for, requant_adapt, requant_targets  # noqa: E402,F401

HANDLER = register(FormatHandler("gguf", "GGUF (llama.cpp): legacy Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 read+write, "
                                 "K-quants Q2_K..Q6_K read, F32/F16/BF16 dense", detect_gguf, read_gguf, write_gguf,
                                 check_target=check_target, quantizer=GGUF_QUANTIZER,
                                 requant_targets=requant_targets))


from converter.validate.hooks import register_hooks  # noqa: E402

#: ggml block scales are signed: Q4_0/Q5_0 use ``d = max / -8`` with ``max`` the signed value of largest
#: magnitude (``ggml-quants.c`` ``quantize_row_q4_0_ref``), so about half the scales are negative.
register_hooks("gguf", negative_scales=True)
