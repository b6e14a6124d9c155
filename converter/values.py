"""Float32 values of a quantized tensor: the model's side of the one dequantize kernel.

:func:`dequantize` hands :func:`converter.kernels.dequant.dequantize_rows` plain arrays: for a
row-local tensor (:meth:`converter.groups.GroupMap.row_local`) the parameters as stored, one set
per row block, and the codes straight from their packed words when those decode bytewise; a stack
``(expert, out, in)`` grouped along ``in`` as its ``expert x out`` rows the same way; for any other
grouping (``g_idx``, flat blocks ...) :func:`dequantize_parts`: blocks of the leading axis when the
groups run along another axis, else the whole tensor as one block
(:func:`~converter.kernels.dequant.dequantize_block`), its parameters expanded to every element. Either way the
arithmetic is the formula of :func:`dequantize_parts`, operand for operand.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from converter.groups import Granularity, GroupMap
from converter.row_groups import as_row_groups
from converter.kernels.compiled import use_compiled
from converter.kernels.compiled.fp_decode import decode_block_tables, decode_codebook
from converter.kernels.dequant import byte_table, dequantize_block, dequantize_block_tables, dequantize_rows
from converter.layout import EXPERT, PackedCodes
from converter.scheme import AMAX_DENOMINATOR, QuantScheme, ZeroPoint

#: Elements per block of :func:`dequantize_parts` (a float32 output, its scales and an int64 codebook index:
#: about 16 MB of temporaries per block).
PARTS_ELEMENTS = 1 << 20

if TYPE_CHECKING:  # (annotations only: converter.tensor imports this module)
    from converter.tensor import QuantizedTensor


def dequantize(t: "QuantizedTensor", dtype=None) -> np.ndarray:
    """Reconstruct a :class:`~converter.tensor.QuantizedTensor` in float32 (or rounded to ``dtype``).

    ``x = s * (q - c)`` (symmetric), ``s * (q - z)`` (integer zero point), ``s * q + b`` (float
    bias) or ``s * codebook[q]``; every operand widened to float32 first (fp16/bf16 scales are
    exact in float32). ``dtype`` (a numpy float dtype): the float32 values rounded once to it, as
    ``dequantize(t).astype(dtype)``; a block-tiled 8-bit codebook tensor (FP8) rounded to a 2-byte
    float is decoded through per-block tables instead (:func:`~converter.kernels.dequant.dequantize_block_tables`:
    the same values, bit for bit, without a float32 matrix).

    Returns
    -------
    ndarray of float32 (or ``dtype``), shape ``t.shape`` (named by ``t.axes``).
    """
    if t.global_scale is not None:
        t = with_effective_scales(t)
    if dtype is not None and np.dtype(dtype) != np.float32:
        if _table_decodable(t, np.dtype(dtype)):
            return _dequantize_tables(t, np.dtype(dtype))
        return dequantize(t).astype(dtype)
    s, gm = t.scheme, t.group_map
    if gm.granularity is Granularity.BLOCK:
        return _dequantize_blocks(t)
    if len(t.shape) > 2 and _stacked_rows(t):  # (expert, out, in) ...: rows of every leading index, in blocks
        n = t.shape[-1]
        flat = t.replace(axes=("out", "in"), codes=np.asarray(t.codes).reshape(-1, n),
                         scales=t.scales.reshape(-1, t.scales.shape[-1]),
                         zero_points=None if t.zero_points is None else t.zero_points.reshape(-1, t.scales.shape[-1]),
                         double_quant=None)
        return dequantize(flat).reshape(t.shape)
    if len(t.shape) != 2 or not gm.row_local(t.axes):
        return dequantize_parts(t.codes, t.scales, t.zero_points, s, gm, t.axes)
    rows, n = t.shape
    if rows * n == 0:
        return np.empty((rows, n), dtype=np.float32)
    if s.codebook is not None and use_compiled(rows * n):  # the fast extra: FP8 / FP4 codes times scales, one pass
        codebook = np.asarray(s.codebook, dtype=np.float32)
        raw = _raw_bytes(t)
        plain = raw is not None and not raw[2] and not raw[3]  # stored fields are the codes (no flip, no sign)
        nibbles = plain and raw[1] == 4
        codes = raw[0] if nibbles or (plain and raw[1] == 8) else np.ascontiguousarray(t.codes)
        out = decode_codebook(codes.view(np.uint8), codebook, t.scales.astype(np.float32), n_in=n, nibbles=nibbles,
                              group_size=gm.group_size if gm.granularity is Granularity.GROUP else None)
        if out is not None:
            return out
    return row_plan(t).dequantize()


@dataclass(frozen=True, eq=False)
class RowPlan:
    """What :func:`dequantize` hands :func:`~converter.kernels.dequant.dequantize_rows` for a row-local
    ``(out, in)`` tensor (the arguments of that call, as plain arrays): a compiled kernel decoding the
    same rows (:mod:`converter.kernels.compiled.requant`) reads the very arrays and formula.

    Attributes
    ----------
    codes : ndarray ``(out, in)`` integer codes, or with ``table`` ``(out, in * bits / 8)`` uint8 bytes.
    scales : ndarray of float32, ``(out, groups)``, ``(out, 1)`` or ``(1, 1)``.
    zero_points : ndarray of float32 like ``scales``, or None.
    n_in, zero_kind, group_size, center, table, codebook : as :func:`dequantize_rows` takes them.
    """

    codes: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    n_in: int
    zero_kind: str
    group_size: int | None
    center: float
    table: np.ndarray | None
    codebook: np.ndarray | None

    def dequantize(self, out: np.ndarray | None = None) -> np.ndarray:
        """Float32 ``(out, in)`` values (:func:`~converter.kernels.dequant.dequantize_rows`), into ``out`` if given."""
        return dequantize_rows(self.codes, self.scales, self.zero_points, n_in=self.n_in, zero_kind=self.zero_kind,
                               group_size=self.group_size, center=self.center, table=self.table,
                               codebook=self.codebook, out=out)


def row_plan(t: "QuantizedTensor") -> RowPlan | None:
    """The :class:`RowPlan` :func:`dequantize` decodes a 2-D row-local tensor by; None for any other
    (block-tiled, ``g_idx``, N-D ...: those take other routes)."""
    if t.global_scale is not None:
        t = with_effective_scales(t)
    s, gm = t.scheme, t.group_map
    if gm.granularity is Granularity.BLOCK or len(t.shape) != 2 or not gm.row_local(t.axes):
        return None
    n = t.shape[1]
    codebook = np.asarray(s.codebook, dtype=np.float32) if s.codebook is not None else None
    kind = ZeroPoint.NONE.value if codebook is not None else s.zero_point.value
    center = float(s.center) if kind == ZeroPoint.NONE.value and codebook is None else 0.0
    got = _raw_bytes(t) if codebook is None else None
    table = None
    if got is not None:  # packed codes decoded bytewise, the centre already in the table
        codes, bits, signed, flip = got
        table, center = byte_table(bits, signed=signed, flip=flip, center=center), 0.0
    else:
        codes = np.ascontiguousarray(t.codes)
    zp = t.zero_points.astype(np.float32) if t.zero_points is not None and codebook is None else None
    return RowPlan(codes, t.scales.astype(np.float32), zp, n, kind,
                   gm.group_size if gm.granularity is Granularity.GROUP else None, center, table, codebook)


def _leading_step(shape: Sequence[int], scales, zero_points, group_map: GroupMap, axes: Sequence[str]) -> int | None:
    """Leading-axis indices per block of :func:`dequantize_parts` when its groups run along another axis (so a
    block of the leading axis carries its own parameters) and the tensor is larger than one block; else None."""
    if (group_map.granularity is not Granularity.GROUP or group_map.axis == axes[0] or len(shape) < 2
            or np.shape(scales)[:1] != tuple(shape[:1])
            or (zero_points is not None and np.shape(zero_points)[:1] != tuple(shape[:1]))):
        return None
    per = int(np.prod(shape[1:], dtype=np.int64))
    step = max(1, PARTS_ELEMENTS // max(1, per))
    return step if step < shape[0] else None


def _stacked_rows(t: "QuantizedTensor") -> bool:
    """An N-D tensor (``expert, out, in`` ...) grouped along its last axis ``in`` only (no ``g_idx``), its
    parameters ``(..., groups)``: every leading index is a row of its own, so the stack decodes as
    ``(prod(leading), in)`` rows in blocks (:func:`~converter.kernels.dequant.dequantize_rows`), never with
    its parameters expanded to every element (issue 15: a GGUF MXFP4 ``[8, 2048, 4096]`` stack)."""
    gm = t.group_map
    if gm.granularity is not Granularity.GROUP or gm.axis != t.axes[-1] or gm.g_idx is not None:
        return False
    groups = -(-t.shape[-1] // gm.group_size)
    return tuple(t.scales.shape) == (*t.shape[:-1], groups) and (
        t.zero_points is None or tuple(t.zero_points.shape) == tuple(t.scales.shape))


def effective_scales(scales: np.ndarray, global_scale: np.ndarray | None, direction: str | None) -> np.ndarray:
    """Group scales with the per-tensor global scale applied, in float32: ``s * g`` (``multiplier``,
    ModelOpt ``weight_scale_2``), ``s / g`` (``divisor``, compressed-tensors ``weight_global_scale``,
    ``compressors/nvfp4``: ``scale / global_scale``) or ``s * (g / 2688)`` (``amax``, MLX nvfp4
    ``global_scale``; the quotient rounded to float32 first, as ``mx.dequantize`` computes it,
    checked bit for bit on mlx 0.32.4); ``s`` as float32 when there is none.

    Parameters
    ----------
    scales : ndarray, any shape (the group map's ``param_shape``), any float dtype (E4M3 for NVFP4)
    global_scale : ndarray of float32, shape ``()``, or None
    direction : ``"multiplier"``, ``"divisor"``, ``"amax"`` or None (:attr:`QuantScheme.global_scale`)

    Returns
    -------
    ndarray of float32, shape ``scales.shape``: one rounding (the product or quotient in float32).
    """
    s = np.asarray(scales).astype(np.float32)
    if global_scale is None:
        return s
    g = np.float32(global_scale)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if direction == "amax":
            return s * (g / np.float32(AMAX_DENOMINATOR))
        return s * g if direction == "multiplier" else s / g


def with_effective_scales(t: "QuantizedTensor") -> "QuantizedTensor":
    """``t`` with its global scale folded into float32 group scales (:func:`effective_scales`): the
    tensor every one-level consumer (dequantize, requantize, error sums) sees. Codes stay packed."""
    if t.global_scale is None:
        return t
    eff = effective_scales(t.scales, t.global_scale, t.scheme.global_scale)
    return t.replace(scales=eff, scheme=t.scheme.replace(scale_dtype="F32", global_scale=None), global_scale=None)


def _table_decodable(t: "QuantizedTensor", dtype: np.dtype) -> bool:
    """An 8-bit codebook tensor tiled in 2-D blocks, to a 2-byte float: the per-block table decode applies."""
    gm, s = t.group_map, t.scheme
    return dtype.itemsize == 2 and (dtype.kind == "f" or dtype.name == "bfloat16") and s.codebook is not None \
        and len(s.codebook) == 256 and gm.granularity is Granularity.BLOCK and gm.extent("out") is not None \
        and gm.extent("in") is not None and t.axes in (("out", "in"), (EXPERT, "out", "in"))


def _dequantize_tables(t: "QuantizedTensor", dtype: np.dtype) -> np.ndarray:
    codebook = np.asarray(t.scheme.codebook, dtype=np.float32)
    block = (t.group_map.extent("out"), t.group_map.extent("in"))
    codes, scales = t.codes, t.scales.astype(np.float32)
    if use_compiled(int(np.prod(t.shape))):  # the fast extra: the same tables, one compiled look-up pass
        out = np.empty(t.shape, dtype=np.uint16)
        stack = t.axes != ("out", "in")
        for e in range(t.shape[0] if stack else 1):
            c, s = (codes[e], scales[e]) if stack else (codes, scales)
            tables = (codebook[None, None, :] * s[:, :, None]).astype(dtype).view(np.uint16)  # as dequant.py's
            decode_block_tables(np.ascontiguousarray(c).view(np.uint8), tables, block, out[e] if stack else out)
        return out.view(dtype)
    if t.axes == ("out", "in"):
        return dequantize_block_tables(np.ascontiguousarray(codes), scales, codebook, block, dtype)
    out = np.empty(t.shape, dtype=dtype)
    for e in range(t.shape[0]):
        out[e] = dequantize_block_tables(np.ascontiguousarray(codes[e]), scales[e], codebook, block, dtype)
    return out


def _dequantize_blocks(t: "QuantizedTensor") -> np.ndarray:
    """:func:`dequantize` of a ``block``-tiled tensor, one ``(out, in)`` matrix (per expert) at a
    time, its block parameters repeated per row only (:func:`converter.groups.as_row_groups`): the
    same ``codebook[q] * s`` (or integer) formula, never a full-size scale matrix."""
    gm = t.group_map
    if t.axes == ("out", "in"):
        rg, scales = as_row_groups(gm, t.scales, t.shape, t.axes)
        zp = None if t.zero_points is None else as_row_groups(gm, t.zero_points, t.shape, t.axes)[1]
        return dequantize(t.replace(group_map=rg, scales=scales, zero_points=zp))
    if t.axes == (EXPERT, "out", "in"):
        out = np.empty(t.shape, dtype=np.float32)
        codes = t.codes
        for e in range(t.shape[0]):
            out[e] = _dequantize_blocks(t.replace(axes=("out", "in"), codes=codes[e], scales=t.scales[e],
                                                  zero_points=None if t.zero_points is None else t.zero_points[e]))
        return out
    return dequantize_parts(t.codes, t.scales, t.zero_points, t.scheme, gm, t.axes)


def dequantize_parts(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, scheme: QuantScheme,
                     group_map: GroupMap, axes: Sequence[str], zero_shift: float = 0.0) -> np.ndarray:
    """The dequantize formula on loose parts, parameters expanded to every element.

    ``x = s * (q - c)`` (symmetric, implicit centre ``c``), ``s * (q - z)`` (integer zero point),
    ``s * q + b`` (float bias) or ``s * codebook[q]``; every operand widened to float32 first.
    ``zero_shift`` moves the zero point by that many code steps (centre or integer zero + shift,
    float bias - shift * s); 0 leaves the formula untouched (used by the validator's interpretations).

    Parameters
    ----------
    codes : ndarray of integers, logical shape (named by ``axes``)
    scales, zero_points : ndarray, ``group_map.param_shape(codes.shape, axes)``
    scheme, group_map, axes : the tensor's quantization description

    Returns
    -------
    ndarray of float32, shape ``codes.shape``.
    """
    shape = codes.shape
    out = np.empty(shape, dtype=np.float32)
    if out.size == 0:
        return out
    step = _leading_step(shape, scales, zero_points, group_map, axes)
    if step is not None:  # blocks of the leading axis, each with its own parameters expanded: no full-size
        for r0 in range(0, shape[0], step):  # scale array (nor int64 codebook index); same float32 operations
            r1 = min(shape[0], r0 + step)
            out[r0:r1] = dequantize_parts(codes[r0:r1], scales[r0:r1],
                                          None if zero_points is None else zero_points[r0:r1], scheme,
                                          group_map, axes, zero_shift)
        return out
    # one block: the whole tensor, parameters expanded (broadcast views) to every element
    scale = group_map.expand(np.asarray(scales).astype(np.float32), shape, axes)
    if scheme.codebook is not None:
        dequantize_block(out, codes, scale, None, zero_kind="none",
                         codebook=np.asarray(scheme.codebook, dtype=np.float32))
        return out
    if scheme.zero_point is ZeroPoint.NONE:
        dequantize_block(out, codes, scale, None, zero_kind="none", center=scheme.center + zero_shift)
        return out
    z = group_map.expand(np.asarray(zero_points).astype(np.float32), shape, axes)
    if scheme.zero_point is ZeroPoint.INTEGER:
        if zero_shift:
            z = z + np.float32(zero_shift)
        dequantize_block(out, codes, scale, z, zero_kind="integer")
        return out
    dequantize_block(out, codes, scale, z, zero_kind="float")
    if zero_shift:
        out -= np.float32(zero_shift) * scale
    return out


def _raw_bytes(t: "QuantizedTensor") -> tuple[np.ndarray, int, bool, bool] | None:
    """``(bytes, bits, signed, flip)`` when ``t``'s codes are packed so that each byte of the words
    (in logical row order, ``(out, in * bits / 8)`` uint8) holds ``8 / bits`` whole fields
    LSB-first; else None. ``signed`` / ``flip`` say how a field maps to its code
    (:class:`converter.layout.PackedCodes`)."""
    pc = t.packed
    if pc is None or sys.byteorder != "little" or pc.bits not in (1, 2, 4, 8):
        return None
    # raw stored fields in logical order (no copy when already so); the caller applies the flip
    words = PackedCodes(pc.words, pc.amap, pc.axes, pc.sizes, signed=pc.signed).logical_words()
    if words is None:
        return None
    rows, n = t.shape
    if (n * pc.bits) % 8:
        return None
    return words.view(np.uint8).reshape(rows, -1)[:, : n * pc.bits // 8], pc.bits, pc.signed, pc.flip
