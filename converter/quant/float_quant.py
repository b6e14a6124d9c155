"""Quantize float values to a float element (FP8 E4M3 / E5M2): the typed side of
:mod:`converter.kernels.fp_rtn`.

The result is a codebook :class:`~converter.tensor.QuantizedTensor`
(``QuantScheme(8, False, scale_dtype=..., codebook=<element values>)``, codes the element bytes as
uint8) with one scale per tensor, per output channel, or per ``block_out`` x ``block_in`` tile
(``GroupMap.per_block``). The arithmetic is compressed-tensors' (see the kernel's docstring):
scale ``D(absmax / max_finite)`` and codes ``cast(clamp(D(w / scale)))`` in the weight's dtype
``D``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from converter.codebooks import FloatElement
from converter.dtypes import float_dtype
from converter.errors import QuantizationError
from converter.groups import Granularity, GroupMap
from converter.kernels.error_sums import ErrorSums
from converter.kernels.fp_rtn import quantize_fp_rows
from converter.kernels.metrics import Figures
from converter.layout import IN, OUT
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor

__all__ = ["ARITH_DTYPES", "FLOAT_SCALE_DTYPES", "arith_dtype_of", "float_scheme", "tile_extents", "quantize_float"]

#: Weight dtypes whose arithmetic the quantizer reproduces (others are computed in float32).
ARITH_DTYPES = ("BF16", "F16", "F32")
#: Scale dtypes of a float-element target.
FLOAT_SCALE_DTYPES = ("F32", "BF16", "F16")


def arith_dtype_of(weight_dtype: str | None) -> str:
    """The dtype the quantizer computes in for a weight stored as ``weight_dtype``: the weight's own
    (BF16 / F16 / F32, as compressed-tensors does in torch), float32 for anything else (F64 ...)."""
    return weight_dtype if weight_dtype in ARITH_DTYPES else "F32"


def float_scheme(element: FloatElement, scale_dtype: str) -> QuantScheme:
    """``QuantScheme(8, False, scale_dtype, codebook=element.values)`` of an 8-bit float element."""
    if element.bits != 8 or element.numpy is None:
        raise QuantizationError("only 8-bit float elements are quantized to", field="element",
                                expected="e4m3 | e5m2", found=element.name)
    if scale_dtype not in FLOAT_SCALE_DTYPES:
        raise QuantizationError("unsupported scale dtype for a float element", field="scale_dtype",
                                expected=list(FLOAT_SCALE_DTYPES), found=scale_dtype)
    return QuantScheme(8, False, scale_dtype=scale_dtype, codebook=element.values)


def tile_extents(group_map: GroupMap, axes: Sequence[str] = (OUT, IN)) -> tuple[int | None, int | None]:
    """``(block_out, block_in)`` of a float-element target's group map (None: the axis whole).

    Raises
    ------
    QuantizationError
        A granularity other than tensor, channel along ``out`` or 2-D block, or axes other than
        ``(out, in)``.
    """
    g = group_map.granularity
    if tuple(axes) == (OUT, IN):
        if g is Granularity.TENSOR:
            return None, None
        if g is Granularity.CHANNEL and group_map.axis == OUT:
            return 1, None
        if g is Granularity.BLOCK:
            return group_map.extent(OUT), group_map.extent(IN)
    raise QuantizationError("float-element quantization takes per-tensor, per-channel (out) or block scales of "
                            "an (out, in) matrix", field="group_map", expected="tensor | channel(out) | block",
                            found=f"{group_map.describe()} on {list(axes)}")


def quantize_float(values, element: FloatElement, group_map: GroupMap, *, scale_dtype: str,
                   arith_dtype: str = "F32", name: str = "tensor", axes: Sequence[str] = (OUT, IN),
                   figures: bool = False) -> tuple[QuantizedTensor, int, Figures | None]:
    """Round-to-nearest quantization of a 2-D ``(out, in)`` matrix to ``element``.

    Parameters
    ----------
    values : ndarray ``(out, in)`` of float, or a :class:`converter.rows.Rows` (read in row blocks).
    element : the float element (:data:`converter.codebooks.ELEMENTS` ``e4m3`` / ``e5m2``).
    group_map : tensor, channel(out) or block (:func:`tile_extents`).
    scale_dtype : ``F32 | BF16 | F16`` (stored scales).
    arith_dtype : the weight's dtype (:func:`arith_dtype_of`): scale and quotient are rounded to it.
    name, axes : tensor name and its axes (``("out", "in")``).
    figures : also return the error figures against ``values`` (summed in the same row blocks).

    Returns
    -------
    (QuantizedTensor, all-zero tiles, Figures or None)

    Raises
    ------
    QuantizationError
        Non-finite values, a scale overflowing the scale dtype, an unsupported element, scale dtype
        or granularity.
    """
    scheme = float_scheme(element, scale_dtype)
    bo, bi = tile_extents(group_map, axes)
    rows, n = values.shape
    sums = ErrorSums(rows, n, bi, per_tensor=group_map.granularity is Granularity.TENSOR) \
        if figures and rows and n else None
    got = quantize_fp_rows(values, element.numpy, element.max_finite, block_out=bo, block_in=bi,
                           arith=float_dtype(arith_dtype), scale_dtype=scheme.scale_np_dtype, tensor=name,
                           compare=sums)
    q = QuantizedTensor(name, tuple(axes), got.codes, np.ascontiguousarray(got.scales), scheme, group_map)
    return q, got.degenerate_groups, sums.figures() if sums is not None else None
