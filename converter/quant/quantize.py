"""Quantize and dequantize for every granularity (vectorized numpy, float32 arithmetic).

Conventions (DEVELOPERS.md contracts):

- Symmetric: ``scale = max|x| / (2^(b-1) - 1)``, ``q = round(x / scale)``, ``x_hat = q * scale``
  (signed codes in ``[-(2^(b-1)-1), 2^(b-1)-1]``).
- Asymmetric (integer zero point, unsigned codes): the range is widened to include 0 (as
  AutoGPTQ ``Quantizer.find_params`` does, so the zero point is a valid code),
  ``scale = (max - min) / (2^b - 1)``, ``z = round(-min / scale)``, ``q = clamp(round(x/scale) + z)``.
- Zero-range safeguard: an all-zero group gets scale 1 and reconstructs exactly (never 0/0).
- Scales are cast to the scheme's scale dtype *before* codes are computed, so the codes are the
  best ones for the scale actually stored. A scale that underflows the dtype is raised to its
  smallest positive value; one that overflows raises :class:`QuantizationError`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from converter.errors import LayoutError, QuantizationError
from converter.groups import Granularity, GroupMap
from converter.kernels.rounding import round_values
from converter.kernels.rtn import codes_block, params_from_extrema, quantize_rows
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor
from converter.values import dequantize_parts

__all__ = ["dequantize", "dequantize_parts", "choose_params", "codes_for", "quantize", "quantize_codes"]


def dequantize(t: QuantizedTensor) -> np.ndarray:
    """Reconstruct a :class:`~converter.tensor.QuantizedTensor` in float32 (:meth:`QuantizedTensor.dequantize`).

    Returns
    -------
    ndarray of float32, shape ``t.shape`` (named by ``t.axes``).
    """
    return t.dequantize()


def choose_params(values: np.ndarray, scheme: QuantScheme, group_map: GroupMap, axes: Sequence[str], *,
                  tensor: str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Round-to-nearest parameters for ``values`` (absmax for symmetric, min/max for asymmetric).

    Parameters
    ----------
    values : ndarray of float32, logical shape.
    scheme : QuantScheme (``none`` or ``integer`` zero point; ``float`` bias = ``-z * s``).
    group_map : GroupMap

    Returns
    -------
    scales : ndarray, ``group_map.param_shape``, dtype ``scheme.scale_dtype``
    zero_points : ndarray or None
        int16 integer zero points (``integer``), scale-dtype biases (``float``), or None.

    Raises
    ------
    QuantizationError
        Non-finite input values, or a scale that overflows the scale dtype.
    """
    x = np.asarray(values, dtype=np.float32)
    if x.size and not np.isfinite(x).all():
        raise QuantizationError("input values are not all finite", tensor=tensor, field="values",
                                found=f"{int((~np.isfinite(x)).sum())} NaN/inf")
    if scheme.codebook is not None:
        raise QuantizationError("round-to-nearest parameters for codebook schemes are not supported",
                                tensor=tensor, field="scheme.codebook")
    if scheme.symmetric:
        if scheme.bits < 2:
            raise QuantizationError("symmetric quantization needs at least 2 bits", tensor=tensor, field="bits",
                                    expected=">= 2", found=scheme.bits)
        got = params_from_extrema(scheme, amax=group_map.reduce(np.abs(x), np.maximum, axes), tensor=tensor)
    else:
        got = params_from_extrema(scheme, mx=group_map.reduce(x, np.maximum, axes),
                                  mn=group_map.reduce(x, np.minimum, axes), tensor=tensor)
    scales, zero_points, _ = got  # (finite: checked above)
    return scales, zero_points


def codes_for(values: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, scheme: QuantScheme,
              group_map: GroupMap, axes: Sequence[str]) -> np.ndarray:
    """Codes for given parameters: ``clamp(round(x / s) + z)`` (float bias: ``round((x - b) / s)``).

    Returns
    -------
    ndarray, logical shape, ``scheme.code_dtype``.
    """
    x = np.asarray(values, dtype=np.float32)
    shape = x.shape
    q = np.empty(shape, dtype=np.float32)
    if q.size == 0:
        return q.astype(scheme.code_dtype)
    # one block: the whole tensor, parameters expanded (broadcast views) to every element
    s = group_map.expand(scales.astype(np.float32), shape, axes)
    z = None
    if scheme.zero_point is not ZeroPoint.NONE:
        z = group_map.expand(zero_points.astype(np.float32), shape, axes)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes_block(q, x, s, z, scheme)
    return q.astype(scheme.code_dtype)


def quantize(values: np.ndarray, scheme: QuantScheme, group_map: GroupMap, *, name: str = "tensor",
             axes: Sequence[str] = ("out", "in")):
    """Round-to-nearest quantization of float values into a QuantizedTensor.

    Parameters
    ----------
    values : ndarray of float (any float dtype; computed in float32), logical shape.
    scheme, group_map : target scheme and grouping.
    name : tensor name; axes : logical axes of ``values``.

    Returns
    -------
    QuantizedTensor

    Raises
    ------
    QuantizationError, LayoutError
    """
    x = np.asarray(values)
    if x.dtype not in (np.float32, np.float16) and not (x.dtype.kind == "V" or "bfloat16" in str(x.dtype)):
        x = x.astype(np.float32)
    group_map.check_shape(x.shape, axes)
    if group_map.row_local(axes) and group_map.granularity is not Granularity.TENSOR:
        fast = quantize_rows(x, scheme, tensor=name,
                             group_size=group_map.group_size if group_map.granularity is Granularity.GROUP else None)
        if fast is not None:  # same formulas in cache-sized row blocks (bit-identical)
            return QuantizedTensor(name=name, axes=tuple(axes), codes=fast.codes, scales=fast.scales, scheme=scheme,
                                   group_map=group_map, zero_points=fast.zero_points)
    x = np.asarray(x, dtype=np.float32)
    scales, zps = choose_params(x, scheme, group_map, axes, tensor=name)
    if zps is not None and scheme.zero_point is ZeroPoint.INTEGER:
        zps = zps.astype(scheme.code_dtype)
    codes = codes_for(x, scales, zps, scheme, group_map, axes)
    return QuantizedTensor(name=name, axes=tuple(axes), codes=codes, scales=scales, scheme=scheme,
                           group_map=group_map, zero_points=zps)


def quantize_codes(values: np.ndarray, scales: np.ndarray, *, axis: str, zero_points: np.ndarray | None = None,
                   bits: int | None = None, rounding: str = "half_even") -> np.ndarray:
    """The primitive: integer codes of ``values`` for scales that run along a named axis.

    ``q = round(values / scale) (+ zero_point)``, the scale (and zero point) of each element
    taken along ``axis`` — never along the contiguous or packed axis by accident.

    Parameters
    ----------
    values : array_like of float, shape ``(out, in)``
    scales : array_like of float, shape ``(in,)`` when ``axis="in"`` (one scale per column) or
        ``(out,)`` when ``axis="out"`` (one scale per row)
    axis : ``"in"`` or ``"out"``
    zero_points : array_like of int, same shape as ``scales``, optional
        Added after rounding; codes are then unsigned ``[0, 2^bits - 1]`` when ``bits`` is given.
    bits : int, optional
        Clamp to the code range: signed ``[-2^(b-1), 2^(b-1)-1]`` without zero points, unsigned
        with them. No clamping when omitted.
    rounding : ``"half_even"`` (default) or ``"half_away"``

    Returns
    -------
    ndarray of int32, shape ``(out, in)``.

    Raises
    ------
    LayoutError
        Unknown axis, wrong scale length, non-2-D values.
    QuantizationError
        A zero or non-finite scale (the arithmetic cannot be done).

    Examples
    --------
    >>> quantize_codes([[2, 6], [4, 8]], [2, 4], axis="in").tolist()
    [[1, 2], [2, 2]]
    """
    x = np.asarray(values, dtype=np.float32)
    if x.size == 0:
        return np.zeros(x.shape, dtype=np.int32)
    if x.ndim != 2:
        raise LayoutError("values must be a 2-D (out, in) matrix", field="values", expected=2, found=x.ndim)
    if axis not in ("in", "out"):
        raise LayoutError("unknown axis name", field="axis", expected=["in", "out"], found=axis)
    ax = 1 if axis == "in" else 0
    s = np.asarray(scales, dtype=np.float32).reshape(-1)
    if s.shape[0] != x.shape[ax]:
        raise LayoutError(f"one scale per '{axis}' index expected", field="scales", expected=x.shape[ax],
                          found=s.shape[0])
    if (s == 0).any() or not np.isfinite(s).all():
        raise QuantizationError("scales must be finite and non-zero", field="scales", expected="finite, != 0",
                                found=s[(s == 0) | ~np.isfinite(s)][:4].tolist())
    bshape = (1, -1) if ax == 1 else (-1, 1)
    q = round_values(x / s.reshape(bshape), rounding)
    if zero_points is not None:
        z = np.asarray(zero_points).reshape(-1)
        if z.shape != s.shape:
            raise LayoutError("zero points must match scales", field="zero_points", expected=s.shape[0],
                              found=z.shape[0])
        q = q + z.astype(np.float32).reshape(bshape)
    if bits is not None:
        lo, hi = (0, (1 << bits) - 1) if zero_points is not None else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        q = np.clip(q, lo, hi)
    return q.astype(np.int32)
