"""The bytes of a GGUF write: key/values, tensor infos and tensor data of one file or of each part of a split GGUF.

``gguf.GGUFWriter`` writes the header, the key/values and the tensor infos of every file (with ``split_max_size`` /
``split_max_tensors`` it cuts the parts and adds the ``split.*`` keys itself, :mod:`.split_write`); the tensor data
is then encoded (:func:`converter.formats.gguf.tensor_plan.encode`) and pwritten at offsets known from the header
(``GGUFWriter.write_tensor_data``'s layout: each tensor padded to the alignment), by the write engine's workers. A
tensor the checkpoint produces in row blocks (:meth:`converter.tensor.Checkpoint.row_blocks`: a requantization by
the format's quantizer) is encoded and written block by block (:func:`~.tensor_plan.encode_rows`), never whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from converter.errors import ConverterError, FormatError
from converter.tensor import Checkpoint
from converter.write.files import write_at_offsets
from converter.formats.gguf.schemes import DENSE_TYPES, MANAGED_KEYS, QUANTIZATION_VERSION, gguf_module
from converter.formats.gguf.tensor_plan import TensorPlan, encode, encode_rows, rows_encodable

__all__ = ["infer_type", "write_files"]


def infer_type(v: Any) -> Any:
    """The GGUF value type name of a plain JSON value (``["ARRAY", sub]`` for a list), ``None`` when none fits."""
    if isinstance(v, bool):
        return "BOOL"
    if isinstance(v, int):
        return "UINT32" if 0 <= v < 2 ** 32 else ("INT64" if -2 ** 63 <= v < 2 ** 63 else "UINT64")
    if isinstance(v, float):
        return "FLOAT32"
    if isinstance(v, str):
        return "STRING"
    if isinstance(v, (list, tuple)) and v:
        sub = infer_type(v[0])
        return ["ARRAY", "ARRAY" if isinstance(sub, list) else sub]
    return None


def _add_kv(writer, gguf, kv: Mapping[str, Any], types: Mapping[str, Any], file_type: int, alignment: int,
            notes: dict[str, list[str]]) -> None:
    """The model's key/values into ``writer`` (the first file): source order kept, managed keys recomputed."""
    managed = {"general.quantization_version": lambda: writer.add_quantization_version(QUANTIZATION_VERSION),
               "general.file_type": lambda: writer.add_file_type(file_type),
               "general.alignment": lambda: writer.add_custom_alignment(alignment)}
    for key, value in kv.items():
        if key in managed:
            managed.pop(key)()
            continue
        if key in MANAGED_KEYS or key.startswith("GGUF."):
            continue
        vt = types.get(key) or infer_type(value)
        if vt is None or (isinstance(value, list) and not value):
            notes[key] = ["key not written (empty or untyped value)"]
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


def write_files(ckpt: Checkpoint, plans: Sequence[TensorPlan], parts: Sequence[Sequence[int]], paths: Sequence[Path],
                arch: str, kv: Mapping[str, Any], types: Mapping[str, Any], file_type: int, alignment: int,
                notes: dict[str, list[str]], *, split: tuple[int, int] = (0, 0)) -> None:
    """Write the files ``paths`` (one, or the parts of a split GGUF named as ``GGUFWriter`` names them), part ``k``
    holding the tensors ``plans[i] for i in parts[k]``.

    ``split``: ``(split_max_size, split_max_tensors)`` given to ``GGUFWriter``, whose cut must equal ``parts``.

    Raises
    ------
    FormatError
        ``GGUFWriter`` cut or named the parts otherwise, or a tensor's encoded size differs from its plan.
    """
    gguf = gguf_module()
    writer = gguf.GGUFWriter(None, arch, split_max_size=split[0], split_max_tensors=split[1])
    try:
        _add_kv(writer, gguf, kv, types, file_type, alignment, notes)
        for p in plans:
            qt = gguf.GGMLQuantizationType[p.type_name]
            if p.type_name in ("F32", "F16", "F64", "I8", "I16", "I32", "I64"):
                writer.add_tensor_info(p.gguf_name, p.shape, DENSE_TYPES[p.type_name], p.nbytes)
            else:
                byte_shape = gguf.quant_shape_to_byte_shape(p.shape, qt)
                writer.add_tensor_info(p.gguf_name, byte_shape, np.dtype(np.uint8), p.nbytes, raw_dtype=qt)
        cut = [list(t) for t in writer.tensors]
        if cut != [[plans[i].gguf_name for i in part] for part in parts]:
            raise FormatError("GGUFWriter cut the parts otherwise than planned", file=paths[0], field="split.count",
                              expected=len(parts), found=len(cut))
        base = Path(paths[0]) if len(paths) == 1 else Path(paths[0]).with_name(_whole_name(paths))
        if [Path(p) for p in writer.format_shard_names(base)] != [Path(p) for p in paths]:
            raise FormatError("GGUFWriter names the parts otherwise than planned", file=paths[0], field="name",
                              expected=[Path(p).name for p in paths])
        writer.write_header_to_file(path=base)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        # GGUFWriter.write_tensor_data pads to the alignment, writes the tensor, pads its size:
        # every offset is known now, so tensors are encoded and pwritten in any order / process
        align = int(writer.data_alignment)
        starts = []
        for fout in writer.fout:
            fout.flush()
            starts.append(writer.ggml_pad(fout.tell(), align))
    finally:
        writer.close()
    for path, part, start in zip(paths, parts, starts):
        offsets, pos = [], start
        for i in part:
            offsets.append(pos)
            pos += writer.ggml_pad(plans[i].nbytes, align)

        def produce(k: int, part=part, offsets=offsets):
            p = plans[part[k]]
            try:  # (making the row blocks may load the source tensor: its errors name this tensor too)
                blocks = ckpt.row_blocks(p.name) if rows_encodable(p) else None
            except ConverterError as exc:
                exc.with_context(tensor=p.name)
                raise
            if blocks is not None:  # made, encoded and written block by block: never whole
                return offsets[k], _named(encode_rows(blocks, p), p.name)
            try:
                data = encode(ckpt[p.name], p)
            except ConverterError as exc:
                exc.with_context(tensor=p.name)
                raise
            if data.nbytes != p.nbytes:
                raise FormatError("encoded size differs from the plan", tensor=p.name, field="nbytes",
                                  expected=p.nbytes, found=data.nbytes)
            return offsets[k], data
        write_at_offsets(path, pos, len(part), produce, total_bytes=pos - start)


def _named(pieces, name: str):
    """``pieces`` with a :class:`ConverterError` raised while making one naming tensor ``name``."""
    try:
        yield from pieces
    except ConverterError as exc:
        exc.with_context(tensor=name)
        raise


def _whole_name(paths: Sequence[Path]) -> str:
    """``<stem>.gguf`` of parts named ``<stem>-00001-of-0000N.gguf`` (the name GGUFWriter derives them from)."""
    name = Path(paths[0]).name
    return name[: -len("-00001-of-00000.gguf")] + ".gguf"
