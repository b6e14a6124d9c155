"""Tensor-by-tensor proof of a written checkpoint: a source tensor against its read-back counterpart.

:func:`compare_tensors` decides a report row's ``mode`` (``exact``, ``exact_up_to_rounding``,
``passthrough``, ``dequantized``, ``changed``): codes in a common unsigned domain, scales, and the
dequantized float32 values; :func:`bytes_equal` compares dense bytes in blocks without a full-size
temporary.

A dense float16 / bfloat16 tensor read back as float32 (a writer's declared exact widening, e.g. GGUF's
1-D tensors, which ``convert_hf_to_gguf.py`` writes F32) is not a passthrough: its row is ``exact`` with
``widened`` (source and target dtype) when every value is the same number, bit for bit after widening,
else ``changed``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import ProofFailedError
from converter.quant.recode import as_unsigned
from converter.runtime import current, drop_pages
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor, source_arrays
from converter.tensor_rows import row_splittable, take_rows


def compare_tensors(a, b, dense_axes: "list[str] | None" = None) -> dict[str, Any]:
    """Compare a source tensor with its written-and-read-back counterpart.

    ``dense_axes``: the axis order in which a float target stores quantized ``a`` (the source's
    ``metadata["dense_axes"]``, e.g. ``[expert, in, out]``): its dequantization is compared in that order."""
    if not isinstance(a, QuantizedTensor):
        # one value stored 0-dim in one format and [1] in the other (ModelOpt vs compressed-tensors
        # input_scale) is the same bytes: a passthrough, with the reshape stated in the row
        one_value = b is not None and a.data.size == b.data.size == 1 and {a.data.shape, b.data.shape} <= {(), (1,)}
        shapes_same = b is not None and (a.data.shape == b.data.shape or one_value)
        if shapes_same and a.data.dtype != b.data.dtype and _widens(a.data.dtype, b.data.dtype):
            same = bytes_equal(a.data.astype(np.float32).reshape(-1), b.data.reshape(-1))
            return {"name": a.name, "kind": "dense", "mode": "exact" if same else "changed", "bit_exact": bool(same),
                    "widened": {"source": a.data.dtype.name, "target": b.data.dtype.name}}
        same = shapes_same and a.data.dtype == b.data.dtype and bytes_equal(a.data.reshape(-1), b.data.reshape(-1))
        row = {"name": a.name, "kind": "dense", "mode": "passthrough" if same else "changed", "bit_exact": bool(same)}
        if same and a.data.shape != b.data.shape:
            row["reshaped"] = [list(a.data.shape), list(b.data.shape)]
        return row
    if b is not None and not isinstance(b, QuantizedTensor):  # a float target: values, not codes
        perm = [a.axes.index(x) for x in dense_axes] if dense_axes and sorted(dense_axes) == sorted(a.axes) else None
        same, diff = _dense_values(a, np.asarray(b.data), perm)
        row = {"name": a.name, "kind": "quantized", "mode": "dequantized" if same else "changed",
               "codes_identical": False, "scales_identical": False, "max_abs_diff": diff, "bit_exact": same}
        if dense_axes:
            row["dense_axes"] = list(dense_axes)
        return row
    if not isinstance(b, QuantizedTensor):
        return {"name": a.name, "kind": "quantized", "mode": "changed", "codes_identical": False,
                "scales_identical": False, "max_abs_diff": None, "bit_exact": False}
    ua, ub = as_unsigned(a), as_unsigned(b)
    codes_same = ua.shape == ub.shape and (_same_words(ua, ub) or bool(np.array_equal(ua.codes, ub.codes)))
    sa, sb = a.scales.astype(np.float32), b.scales.astype(np.float32)
    scales_same = sa.shape == sb.shape and bool(np.array_equal(sa, sb, equal_nan=True))
    if codes_same and scales_same and _same_parameters(ua, ub):
        # dequantize is a function of (codes, float32 scales, zero points, scheme, groups) alone:
        # with all of them identical the values are identical, so they are not recomputed
        diff, exact = 0.0, True
    else:
        da, db = a.dequantize(), b.dequantize()
        diff = float(np.nanmax(np.abs(da - db))) if da.size and not np.isnan(da - db).all() else 0.0
        exact = bool(np.array_equal(da, db, equal_nan=True))  # a NaN code (E4M3 0x7F) decodes to NaN on both sides
    # identical codes are a rounding only when the values agree to a rounding of a parameter (a
    # scale dtype narrowed, per-channel scales repeated over groups: float32 products); another
    # global scale, or other block extents over the same scale grid, move whole values
    rounding = codes_same and not exact and diff <= ROUNDING_REL * _max_abs(a)  # exact: no max |value| needed
    mode = "exact" if exact and codes_same else ("exact_up_to_rounding" if rounding else "changed")
    row = {"name": a.name, "kind": "quantized", "mode": mode, "codes_identical": codes_same,
           "scales_identical": scales_same, "max_abs_diff": diff, "bit_exact": exact,
           "scale_dtype": {"source": a.scheme.scale_dtype, "target": b.scheme.scale_dtype}}
    if mode == "exact_up_to_rounding":
        row["rounding"] = rounding_reason(ua, ub)
    return row


def compare_offset(a, b, offset: float) -> dict[str, Any]:
    """The row of dense ``a`` stored with ``offset`` added in its own dtype and read back as float32 ``b`` minus the
    offset (GGUF's Gemma norm weights): ``exact`` when ``b`` is ``a``, ``exact_up_to_rounding`` when ``b`` is exactly
    ``float32(a + offset) - offset`` but not ``a``, else ``changed``."""
    src = np.asarray(a.data)
    want = (src + src.dtype.type(offset)).astype(np.float32) - np.float32(offset)
    got = np.asarray(b.data)
    row = {"name": a.name, "kind": "dense", "offset": offset}
    if got.shape != want.shape or got.dtype != np.float32 or not np.array_equal(got.view(np.uint32),
                                                                                 want.view(np.uint32)):
        return {**row, "mode": "changed", "bit_exact": False,
                "reason": f"not the source + {offset:g} (stored) - {offset:g} (read back)"}
    exact = bool(np.array_equal(want.view(np.uint32), src.astype(np.float32).view(np.uint32)))
    diff = float(np.max(np.abs(want - src.astype(np.float32)))) if src.size else 0.0
    row.update(mode="exact" if exact else "exact_up_to_rounding", bit_exact=exact, max_abs_diff=diff)
    if not exact:
        row["rounding"] = (f"stored as w + {offset:g} in {src.dtype.name} (the target's convention), "
                           f"read back - {offset:g}")
    return row


def rounding_reason(a: QuantizedTensor, b: QuantizedTensor) -> str:
    """What was rounded when identical codes give values that differ by a rounding (a row's ``rounding``):
    zero points re-expressed as float biases ``-z*s`` in the target's scale dtype, scales narrowed to another
    dtype, or scales repeated over other groups (float32 products)."""
    sa, sb = a.scheme, b.scheme
    parts = []
    if sb.zero_point is ZeroPoint.FLOAT and sa.zero_point is not ZeroPoint.FLOAT:
        exact = _biases_exact(a, b)
        parts.append("zero points stored as float biases -z*s" + (
            f" rounded to {sb.scale_dtype}" if exact is False else
            " (exact); s*q + b evaluated in float32" if exact else f" in {sb.scale_dtype}"))
    if sa.scale_dtype != sb.scale_dtype:
        parts.append(f"scales rounded from {sa.scale_dtype} to {sb.scale_dtype}")
    ga, gb = a.group_map.describe(), b.group_map.describe()
    if ga != gb:
        parts.append(f"scales of {ga} repeated over {gb} (float32 products)")
    return "; ".join(parts) or "the same codes and parameters evaluated in another float32 order"


def _biases_exact(a: QuantizedTensor, b: QuantizedTensor) -> "bool | None":
    """Whether ``b``'s float biases are exactly ``-z*s`` of ``a``'s integer zero points (the scheme's centre when
    symmetric) and scales, both unsigned-domain; None when the parameter grids differ (not compared)."""
    if b.zero_points is None or b.zero_points.shape != a.scales.shape:
        return None
    z = (a.zero_points.astype(np.float64) if a.zero_points is not None
         else np.full(a.scales.shape, float(a.scheme.center)))
    return bool(np.array_equal(b.zero_points.astype(np.float64), -(z * a.scales.astype(np.float64))))


#: Elements per block at most when a quantized source is compared with its float output (float32: 64 MiB a side);
#: fewer under a smaller memory budget (:func:`_block_elements`).
DENSE_BLOCK = 1 << 24


def _block_elements() -> int:
    """Elements per compared block: the per-worker budget over the ~16 bytes an element costs (two float32
    sides, their difference and its absolute value), at most :data:`DENSE_BLOCK`."""
    opts = current()
    return max(1 << 12, min(DENSE_BLOCK, opts.memory // max(1, opts.n_workers) // 16))


def _dense_values(a: QuantizedTensor, db: np.ndarray, perm: "list[int] | None") -> tuple[bool, "float | None"]:
    """(bit-identical, max |difference|) of ``a`` dequantized (axes permuted by ``perm``) against the float
    array ``db``, in blocks of whole leading rows when the permutation keeps the leading axis (a gpt-oss expert
    stack: a few experts at a time), else whole. ``None`` difference: the shapes differ."""
    shape = tuple(a.shape[i] for i in perm) if perm is not None else tuple(a.shape)
    if shape != tuple(db.shape):
        return False, None
    if not db.size:
        return True, 0.0
    rows = int(a.shape[0]) if a.shape else 1
    per_row = max(1, int(db.size) // max(rows, 1))
    blocked = row_splittable(a) and (perm is None or perm[0] == 0)
    step = max(1, _block_elements() // per_row) if blocked else rows
    same, diff = True, 0.0
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        part = a if step >= rows else take_rows(a, r0, r1)
        da = part.dequantize()
        if perm is not None:
            da = np.transpose(da, perm)
        dbb = (db if step >= rows else db[r0:r1]).astype(np.float32)
        same = same and bool(np.array_equal(da, dbb))
        diff = max(diff, float(np.max(np.abs(da - dbb))))
        del da, dbb
        if step < rows:  # the mapped pages of the blocks done (both files) leave the resident set
            drop_pages(db, *source_arrays(a))
    return same, diff


#: The largest difference, relative to max |value|, that a changed group layout may show and still count as
#: a rounding of a derived parameter (bf16: half an ulp is 2^-8 relative; a product of two such, 2^-7).
ROUNDING_REL = 2.0 ** -7


def _max_abs(t: QuantizedTensor) -> float:
    v = t.dequantize()
    return float(np.nanmax(np.abs(v))) if v.size and not np.isnan(v).all() else 0.0


def _widens(src: np.dtype, dst: np.dtype) -> bool:
    """``src`` float16 / bfloat16 and ``dst`` float32: every ``src`` value is exactly a ``dst`` value."""
    return dst == np.float32 and (src == np.float16 or src.name == "bfloat16")


def bytes_equal(a: np.ndarray, b: np.ndarray, block: int = 1 << 24) -> bool:
    """Byte-for-byte equality of two arrays' C-order bytes, in blocks of ``block`` bytes.

    No full-size temporary; blocks whose length is a multiple of 8 are compared as ``uint64``
    words (twice as fast as bytes). Pages of memory-mapped inputs are released as the comparison
    goes (after every block when the arrays span more than four, else at the end), so comparing
    two large mapped tensors leaves neither resident. False when the byte lengths differ.
    """
    va = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    vb = np.ascontiguousarray(b).reshape(-1).view(np.uint8)
    if va.size != vb.size:
        return False
    large = va.size > 4 * block
    for i in range(0, va.size, block):
        x, y = va[i:i + block], vb[i:i + block]
        if x.size % 8 == 0:
            x, y = x.view(np.uint64), y.view(np.uint64)
        if not np.array_equal(x, y):
            return False
        if large:
            drop_pages(a, b)
    drop_pages(a, b)
    return True


def _same_words(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """Codes still packed in compatible words compared word for word (False: compare codes)."""
    pa, pb = a.packed, b.packed
    if pa is None or pb is None or pa.signed != pb.signed:
        return False
    wb = pb.to_stored(pb.amap, pb.axes)
    if wb is None:
        return False
    same = pa.equal_stored(pb.amap, pb.axes, wb)  # a transposed layout, compared in place
    if same is not None:
        return same
    wa = pa.to_stored(pb.amap, pb.axes)
    if wa is None or wa.shape != wb.shape or wa.dtype.itemsize != wb.dtype.itemsize:
        return False
    return bytes_equal(wa, wb)


def _same_layout(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """Same group map (granularity, axis, group size, block extents, ``g_idx``) and axes."""
    ga, gb = a.group_map, b.group_map
    if a.axes != b.axes or (ga.granularity, ga.axis, ga.group_size, ga.block) != (gb.granularity, gb.axis,
                                                                                  gb.group_size, gb.block):
        return False
    return (ga.g_idx is None) == (gb.g_idx is None) and (ga.g_idx is None or np.array_equal(ga.g_idx, gb.g_idx))


def _same_parameters(a: QuantizedTensor, b: QuantizedTensor) -> bool:
    """Same scheme, group map, global scale and zero points (as float32): everything else dequantize
    reads (the scheme's ``rounding``, how a quantizer rounds, is not read by dequantize: GGUF says
    ``half_away``, gpt-oss ``half_even`` for the same MXFP4 bytes)."""
    def read(s):
        return s.replace(scale_dtype="F32", rounding="half_even")
    if read(a.scheme) != read(b.scheme) or not _same_layout(a, b):
        return False
    if (a.global_scale is None) != (b.global_scale is None) or (
            a.global_scale is not None and not bytes_equal(np.asarray(a.global_scale, np.float32).reshape(-1),
                                                           np.asarray(b.global_scale, np.float32).reshape(-1))):
        return False  # NVFP4's second-level scale multiplies (or divides) every group scale
    if (a.zero_points is None) != (b.zero_points is None):
        return False
    return a.zero_points is None or bool(np.array_equal(a.zero_points.astype(np.float32),
                                                        b.zero_points.astype(np.float32)))


def refuse_failed_proof(rows: list[dict[str, Any]], dst: str | Path) -> None:
    """Raise :class:`ProofFailedError` when a tensor read back from the staged output is not what the source
    and the plan promise (a row ``changed``: codes, scales or values other than the source's, beyond a stated
    rounding; a missing tensor); nothing is then renamed into place. Names every such tensor."""
    bad = [r for r in rows if r.get("mode") in ("changed", "missing")]
    if bad:
        names = [r["name"] for r in bad]
        raise ProofFailedError(f"the written output read back differs from the source in {len(bad)} tensor(s); "
                               "nothing was written", file=dst, tensor=names[0], field="read-back proof",
                               expected="every tensor exact, exact up to a stated rounding, or as planned",
                               found=", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
                               + (f" ({bad[0]['reason']})" if bad[0].get("reason") else ""))
