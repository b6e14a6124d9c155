"""A GGUF file's block-type tensors read as row blocks (:meth:`converter.tensor.Checkpoint.row_blocks` of the
GGUF reader's checkpoint), never decoded whole.

A legacy or K-quant tensor's stored rows are whole blocks / super-blocks of one row each (``ne[0]`` is a
multiple of the block size), so rows ``r0:r1`` are the bytes ``r0 * row_bytes : r1 * row_bytes`` of the
tensor's data, decoded alone by the same codec and :func:`~converter.formats.gguf.schemes.tensor_from_fields`
as the whole tensor (every field and effective scale is per row: the same values as the whole's rows). Used
by the read-back proof of a requantized GGUF (:func:`converter.ops.readback.verify_readback`): a 32000 x
4096 Q6_K head decoded whole is 131 MB of codes and 65 MB of effective scales and biases.

Not offered (None: load the tensor whole): dense and fallback types, FP4 types, tensors not 2-D, and q/k
tensors whose stored rows llama.cpp permuted (their logical rows are not the stored rows in order).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from converter.errors import ConverterError
from converter.runtime import drop_pages
from converter.formats.gguf.blocks import CODECS, codec_for
from converter.formats.gguf.fp4 import FP4_TYPES
from converter.formats.gguf.heads import qk_permutation
from converter.formats.gguf.schemes import tensor_from_fields

__all__ = ["row_blocks_of", "ROW_BLOCK_ELEMENTS"]

#: Elements per row block read (about; whole rows).
ROW_BLOCK_ELEMENTS = 1 << 20


def row_blocks_of(entries: Mapping[str, Any], readers: Sequence[Any], arch: str | None, kv: Mapping[str, Any],
                  paths: Sequence[Any]) -> Callable[[str], "Iterator | None"]:
    """The ``row_blocks`` function of a GGUF reader's checkpoint (``entries``: the reader's tensor entries by
    logical name; ``readers`` / ``paths``: the opened part files)."""

    def row_blocks(name: str, values_only: bool = False) -> "Iterator | None":
        e = entries.get(name)
        if (e is None or e.type_name not in CODECS or e.type_name in FP4_TYPES or len(e.shape) != 2
                or 0 in e.shape):
            return None
        try:
            if qk_permutation(e.gguf_name, e.shape[0], arch, kv, {}, file=paths[e.part], tensor=name) is not None:
                return None
        except ConverterError:  # (loading it whole raises it, naming the file)
            return None
        return _blocks(e)

    def _blocks(e) -> Iterator:
        reader = readers[e.part]
        rows, n = e.shape
        codec = codec_for(e.type_name)
        try:
            raw = np.asarray(reader.tensors[e.index].data, dtype=np.uint8).reshape(rows, e.nbytes // rows)
            step = max(1, ROW_BLOCK_ELEMENTS // n)
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                block = tensor_from_fields(e.name, codec.decode(np.ascontiguousarray(raw[r0:r1])), (r1 - r0, n))
                drop_pages(reader.data)  # (the whole file is mapped once: the rows read are not kept resident)
                yield r0, block
        except ConverterError as exc:
            exc.with_context(file=paths[e.part], tensor=f"{e.name} ({e.gguf_name})" if e.name != e.gguf_name
                             else e.name)
            raise

    return row_blocks
