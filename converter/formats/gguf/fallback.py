"""ggml types qckpt has no codec of its own for (IQ*, TQ1_0 / TQ2_0): decoded by ``gguf.quants.dequantize``.

gguf-py's numpy decoders are bit-exact with llama.cpp's C ``dequantize_row_*`` (its own tests compare
them); qckpt uses them as they are, on rows of whole blocks (:data:`ROW_BLOCK_VALUES` values at a time,
so a large tensor is never expanded through full-size temporaries). Such a tensor loads as its float32
values only: it has no codes or scales qckpt can repack, so exact conversions refuse it and a lossy one
(requantize, dequantize) reads its values.

Block layouts (``ggml/src/ggml-common.h``, bytes per block): where the fp16 super-block scale ``d`` sits
(validated finite; IQ1_M's is rebuilt from its scale words) and, where the block separates them, how many
bytes are codes and how many scales. ``IQ2_XXS`` / ``IQ3_XXS`` / ``IQ1_S`` pack their sub-block scales into
the code words, ``IQ1_M`` packs ``d`` itself into its scale bits: their bytes are role ``codes+scales``.

=========  =====  =========  =====================================================================
type       block  d offset   layout
=========  =====  =========  =====================================================================
IQ4_NL     32     0          ``d``, ``qs[16]`` (4-bit indices into ``kvalues_iq4nl``)
IQ4_XS     256    0          ``d``, ``scales_h`` u16, ``scales_l[4]`` (6-bit sub-scales), ``qs[128]``
IQ2_XS     256    0          ``d``, ``qs[32]`` u16, ``scales[8]``
IQ2_S      256    0          ``d``, ``qs[64]``, ``qh[8]``, ``scales[8]``
IQ3_S      256    0          ``d``, ``qs[64]``, ``qh[8]``, ``signs[32]``, ``scales[4]``
IQ2_XXS    256    0          ``d``, ``qs[32]`` u16 (grid, signs and scales packed)
IQ3_XXS    256    0          ``d``, ``qs[96]`` (grid, then signs and scales packed)
IQ1_S      256    0          ``d``, ``qs[32]``, ``qh[8]`` u16 (sub-scales and delta packed)
IQ1_M      256    none       ``qs[32]``, ``qh[16]``, ``scales[8]`` (``d`` packed in the scales' top bits)
TQ1_0      256    52         ``qs[48]`` (base-3), ``qh[4]``, ``d``
TQ2_0      256    64         ``qs[64]`` (2-bit), ``d``
=========  =====  =========  =====================================================================
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from converter.formats.gguf.schemes import gguf_module
from converter.formats.source import Source
from converter.spec import StoredArray, TensorSpec

__all__ = ["FALLBACK", "FallbackLayout", "DECODED_BY", "fallback_types", "decode", "stored_arrays",
           "scale_bytes_d", "block_scales", "ROW_BLOCK_VALUES"]

DECODED_BY = "gguf.quants.dequantize (gguf-py, bit-exact with llama.cpp's dequantize_row_*)"

#: float32 values decoded per gguf-py call (whole rows, at least one). A tensor of at most this many values is
#: decoded in one call and gguf-py's array returned as it is (no copy: gguf-py's own speed); a larger one in row
#: blocks of this size copied into the result (4 MiB of output per call: gguf-py's temporaries stay small, and
#: ``benchmarks/bench_gguf_fallback.py`` measured this at par or faster than one whole-tensor call)
ROW_BLOCK_VALUES = 1 << 20


@dataclass(frozen=True)
class FallbackLayout:
    """Where a block's fp16 ``d`` is (None: not stored as such) and its scale bytes (None: not separable)."""

    d_offset: int | None
    scale_bytes: int | None


FALLBACK: dict[str, FallbackLayout] = {
    "IQ4_NL": FallbackLayout(0, 2), "IQ4_XS": FallbackLayout(0, 8), "IQ2_XS": FallbackLayout(0, 10),
    "IQ2_S": FallbackLayout(0, 10), "IQ3_S": FallbackLayout(0, 6), "IQ2_XXS": FallbackLayout(0, None),
    "IQ3_XXS": FallbackLayout(0, None), "IQ1_S": FallbackLayout(0, None), "IQ1_M": FallbackLayout(None, None),
    "TQ1_0": FallbackLayout(52, 2), "TQ2_0": FallbackLayout(64, 2),
}
"""The ggml types decoded through gguf-py (those of gguf 0.19 without a qckpt codec)."""


def fallback_types() -> tuple[str, ...]:
    """The types of :data:`FALLBACK` the installed gguf-py decodes."""
    gguf = gguf_module()
    known = {t.name for t in getattr(gguf.quants, "_type_traits", {})}
    return tuple(t for t in FALLBACK if t in known)


def _block(type_name: str) -> tuple[int, int]:
    gguf = gguf_module()
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]


def decode(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values, ``shape`` (logical, ``in`` last), of the stored bytes ``raw`` (uint8, any shape holding
    ``prod(shape[:-1])`` rows of whole blocks), decoded by ``gguf.quants.dequantize`` (a row block of
    :data:`ROW_BLOCK_VALUES` values at a time for a larger tensor)."""
    gguf = gguf_module()
    qt = gguf.GGMLQuantizationType[type_name]
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    flat = np.asarray(raw, dtype=np.uint8).reshape(rows, -1)
    if rows * shape[-1] <= ROW_BLOCK_VALUES:
        return gguf.quants.dequantize(flat, qt).reshape(shape)
    out = np.empty((rows, shape[-1]), dtype=np.float32)
    step = max(1, ROW_BLOCK_VALUES // max(1, shape[-1]))
    for r in range(0, rows, step):
        out[r:r + step] = gguf.quants.dequantize(flat[r:r + step], qt)
    return out.reshape(shape)


def scale_bytes_d(raw: np.ndarray, type_name: str) -> np.ndarray | None:
    """The fp16 ``d`` of every block (float32, ``(blocks,)``), None when the type stores none (IQ1_M)."""
    lay = FALLBACK[type_name]
    _, size = _block(type_name)
    blocks = np.asarray(raw, dtype=np.uint8).reshape(-1, size)
    if lay.d_offset is None:  # IQ1_M: d's 16 bits are the top nibbles of the four u16 scales (dequantize_row_iq1_m)
        sc = np.ascontiguousarray(blocks[:, 48:56]).view("<u2").astype(np.uint16)
        bits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
        return bits.astype(np.uint16).view(np.float16).astype(np.float32)
    return np.ascontiguousarray(blocks[:, lay.d_offset:lay.d_offset + 2]).view(np.float16).reshape(-1) \
        .astype(np.float32)


@functools.lru_cache(maxsize=2)
def _reader(path: str, mtime_ns: int, size: int):
    return gguf_module().GGUFReader(path, "r")


def block_scales(src: Source, spec: TensorSpec) -> np.ndarray | None:
    """Validation hook: the fp16 ``d`` of every block of fallback tensor ``spec`` (float32, block order),
    None for a tensor of another type. The file is parsed once per validation (cached reader)."""
    if spec.dtype not in FALLBACK:
        return None
    gname = next((n.split("=", 1)[1] for n in spec.notes if n.startswith("gguf_name=")), spec.name)
    part = next((n.split("=", 1)[1] for n in spec.notes if n.startswith("gguf_file=")), None)  # a split set's part
    path = Path(src.path) if part is None else Path(src.path).with_name(part)
    st = path.stat()
    reader = _reader(str(path), st.st_mtime_ns, st.st_size)
    t = next((t for t in reader.tensors if t.name == gname), None)
    return None if t is None else scale_bytes_d(np.asarray(t.data), spec.dtype)


def stored_arrays(gguf_name: str, type_name: str, shape: tuple[int, ...], nbytes: int, file: str) \
        -> tuple[StoredArray, ...]:
    """Bytes by role: ``codes`` and ``scales`` where the block layout separates them, else one array of
    role ``codes+scales`` (the bits are packed together: not split, rather than split by a guess)."""
    lay = FALLBACK[type_name]
    block, size = _block(type_name)
    n_blocks = nbytes // size
    per_block = tuple(shape[:-1]) + (shape[-1] // block,)
    if lay.scale_bytes is None:
        return (StoredArray(gguf_name, "codes+scales", type_name, shape, nbytes, file),)
    scale = n_blocks * lay.scale_bytes
    return (StoredArray(gguf_name, "codes", type_name, shape, nbytes - scale, file),
            StoredArray(gguf_name + ":scales", "scales", "U8", per_block, scale, file))
