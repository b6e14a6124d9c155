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

import functools
from typing import Sequence

import ml_dtypes
import numpy as np

from converter.errors import LayoutError, QuantizationError
from converter.groups import GroupMap
from converter.scheme import QuantScheme, ZeroPoint
from converter.kernels.rounding import round_values


def dequantize(t) -> np.ndarray:
    """Reconstruct a :class:`~converter.tensor.QuantizedTensor` in float32.

    ``x = s * (q - c)`` (symmetric), ``s * (q - z)`` (integer zero point), ``s * q + b`` (float
    bias) or ``s * codebook[q]``; every operand widened to float32 first (fp16/bf16 scales are
    exact in float32).

    Returns
    -------
    ndarray of float32, shape ``t.shape``.
    """
    from converter.kernels.blocked import dequantize_blocked
    fast = dequantize_blocked(t)
    if fast is not None:  # same arithmetic, in cache-sized row blocks (straight from packed words)
        return fast
    return dequantize_parts(t.codes, t.scales, t.zero_points, t.scheme, t.group_map, t.axes)


def dequantize_parts(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, scheme: QuantScheme,
                     group_map: GroupMap, axes: Sequence[str], zero_shift: float = 0.0) -> np.ndarray:
    """The dequantize formula on loose parts (the one whole-array implementation).

    ``x = s * (q - c)`` (symmetric, implicit centre ``c``), ``s * (q - z)`` (integer zero point),
    ``s * q + b`` (float bias) or ``s * codebook[q]``; every operand widened to float32 first.
    ``zero_shift`` moves the zero point by that many code steps (centre or integer zero + shift,
    float bias - shift * s); 0 leaves the formula untouched (used by the validator's interpretations).

    Parameters
    ----------
    codes : ndarray, logical shape (named by ``axes``), int8 / uint8
    scales, zero_points : ndarray, ``group_map.param_shape(codes.shape, axes)``
    scheme, group_map, axes : the tensor's quantization description

    Returns
    -------
    ndarray of float32, shape ``codes.shape``.
    """
    shape = codes.shape
    scale = group_map.expand(np.asarray(scales).astype(np.float32), shape, axes)
    if scheme.codebook is not None:
        values = np.asarray(scheme.codebook, dtype=np.float32)[codes]
        return values * scale
    q = codes.astype(np.float32)
    if scheme.zero_point is ZeroPoint.NONE:
        c = scheme.center + zero_shift
        if c:
            q -= np.float32(c)
        return q * scale
    z = group_map.expand(np.asarray(zero_points).astype(np.float32), shape, axes)
    if scheme.zero_point is ZeroPoint.INTEGER:
        if zero_shift:
            z = z + np.float32(zero_shift)
        q -= z
        return q * scale
    out = q * scale
    out += z
    if zero_shift:
        out -= np.float32(zero_shift) * scale
    return out


@functools.lru_cache(maxsize=None)
def _finfo(dt: np.dtype):
    return ml_dtypes.finfo(dt)


def _safe_cast_scales(scales: np.ndarray, scheme: QuantScheme, *, tensor: str | None) -> np.ndarray:
    """Cast float32 scales to the scheme's dtype without producing 0, inf or NaN.

    Raises
    ------
    QuantizationError
        When a scale exceeds the dtype's largest finite value.
    """
    dt = scheme.scale_np_dtype
    info = _finfo(dt)
    if scales.size and np.abs(scales).max() <= float(info.max):  # the usual case, in two passes (NaN: below)
        cast = scales.astype(dt)
        if cast.all():
            return cast
    big = np.abs(scales) > float(info.max)
    if big.any():
        idx = np.unravel_index(int(np.argmax(big)), scales.shape)
        raise QuantizationError("scale overflows the scale dtype", tensor=tensor, field="scales",
                                expected=f"|scale| <= {float(info.max):g} ({scheme.scale_dtype})",
                                found=f"{float(scales[idx]):g} at group {list(map(int, idx))}",
                                hint="use --scale-dtype f32 (or bf16)")
    cast = scales.astype(dt)
    tiny = (cast == 0) & (scales != 0)
    if tiny.any():
        smallest = np.array(float(info.smallest_subnormal), dtype=np.float32).astype(dt)
        cast = np.where(tiny, np.copysign(smallest, scales.astype(dt)), cast)
    return cast


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
        amax = group_map.reduce(np.abs(x), np.maximum, axes)
        qpos = (1 << (scheme.bits - 1)) - 1
        if qpos == 0:
            raise QuantizationError("symmetric quantization needs at least 2 bits", tensor=tensor, field="bits",
                                    expected=">= 2", found=scheme.bits)
        with np.errstate(divide="ignore", invalid="ignore"):
            scales = np.where(amax > 0, amax / np.float32(qpos), np.float32(1.0)).astype(np.float32)
        return _safe_cast_scales(scales, scheme, tensor=tensor), None
    lo = np.minimum(group_map.reduce(x, np.minimum, axes), 0).astype(np.float32)
    hi = np.maximum(group_map.reduce(x, np.maximum, axes), 0).astype(np.float32)
    levels = np.float32((1 << scheme.bits) - 1)
    rng = hi - lo
    scales = np.where(rng > 0, rng / levels, np.float32(1.0)).astype(np.float32)
    scales = _safe_cast_scales(scales, scheme, tensor=tensor)
    s32 = scales.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = round_values(-lo / s32, scheme.rounding)
    z = np.clip(z, 0, levels)
    if scheme.zero_point is ZeroPoint.INTEGER:
        if scheme.signed:
            z = z - np.float32(1 << (scheme.bits - 1))
        return scales, z.astype(np.int16)
    bias = (-z * s32).astype(scheme.scale_np_dtype)
    return scales, bias


def codes_for(values: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, scheme: QuantScheme,
              group_map: GroupMap, axes: Sequence[str]) -> np.ndarray:
    """Codes for given parameters: ``clamp(round(x / s) + z)`` (float bias: ``round((x - b) / s)``).

    Returns
    -------
    ndarray, logical shape, ``scheme.code_dtype``.
    """
    x = np.asarray(values, dtype=np.float32)
    shape = x.shape
    s = group_map.expand(scales.astype(np.float32), shape, axes)
    if scheme.zero_point is ZeroPoint.FLOAT:
        x = x - group_map.expand(zero_points.astype(np.float32), shape, axes)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = x / s
    q = round_values(q, scheme.rounding, out=q)
    if scheme.zero_point is ZeroPoint.INTEGER:
        q += group_map.expand(zero_points.astype(np.float32), shape, axes)
    elif scheme.zero_point is ZeroPoint.NONE and scheme.center:
        q += np.float32(scheme.center)
    np.nan_to_num(q, copy=False, nan=0.0)
    np.clip(q, scheme.qmin, scheme.qmax, out=q)
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
    from converter.tensor import QuantizedTensor

    from converter.kernels.blocked import quantize_blocked
    x = np.asarray(values)
    if x.dtype not in (np.float32, np.float16) and not (x.dtype.kind == "V" or "bfloat16" in str(x.dtype)):
        x = x.astype(np.float32)
    group_map.check_shape(x.shape, axes)
    fast = quantize_blocked(x, scheme, group_map, axes, tensor=name)
    if fast is not None:  # same formulas in cache-sized row blocks (bit-identical)
        scales, zps, codes = fast
        return QuantizedTensor(name=name, axes=tuple(axes), codes=codes, scales=scales, scheme=scheme,
                               group_map=group_map, zero_points=zps)
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
            raise LayoutError("zero points must match scales", field="zero_points", expected=s.shape[0], found=z.shape[0])
        q = q + z.astype(np.float32).reshape(bshape)
    if bits is not None:
        lo, hi = (0, (1 << bits) - 1) if zero_points is not None else (-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
        q = np.clip(q, lo, hi)
    return q.astype(np.int32)
