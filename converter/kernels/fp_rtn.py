"""Round-to-nearest FP8 (E4M3 / E5M2) quantizer of a 2-D ``(out, in)`` float matrix, in row blocks.

One scale per tile of ``block_out`` x ``block_in`` elements (either extent may be None: that axis
is covered whole), so per tensor (``None x None``), per output channel (``1 x None``) and per
128 x 128 block (DeepSeek-V3 ``weight_block_size``, compressed-tensors ``FP8_BLOCK``) are one
kernel; partial edge tiles use their own absmax.

Arithmetic (compressed-tensors 0.19-0.20, ``quantization/utils/helpers.py`` ``calculate_qparams``
and ``quantization/lifecycle/forward_helpers.py`` ``_quantize`` with
``quant_args.py`` ``round_to_quantized_type_args``; llm-compressor's observers feed it the per-tile
min / max; auto-round 0.15 ``FP8_BLOCK`` writes the same bytes, FP_MANIFEST.json
``fp8_block_ct_fp8_bytes_vs_autoround_equal_frac`` = 1.0), every step in the *weight's* dtype
``D`` (BF16 / F16 / F32; torch evaluates a BF16 / F16 operation in float32 and rounds the result
to nearest even, which is what is done here):

1. ``amax = max |w|`` over the tile (exact in ``D``);
2. ``scale = D(amax / max_finite)`` (``max_finite`` 448 for E4M3, 57344 for E5M2;
   compressed-tensors divides by ``(q_max - q_min) / 2``, the same number); an all-zero tile gets
   scale 1 (qckpt contract 2: never NaN, reconstructs exactly; compressed-tensors writes
   ``finfo(D).eps`` there, whose codes are the same zeros); a scale of a non-zero tile that underflows
   to 0 (in ``D`` or in the scale dtype) becomes the scale dtype's ``finfo(...).eps`` (F16 ``2^-10``, BF16
   ``2^-7``, F32 ``2^-23``), as compressed-tensors 0.20.1 ``calculate_qparams`` step 5 ``_get_dtype_eps``
   of ``scale_dtype`` (else the scale's own dtype);
3. the scale is stored in the scale dtype (default ``D``, cast exactly or rounded to nearest;
   overflow raises), and codes are computed from the *stored* scale;
4. ``q = D(w / scale)`` (rounded to ``D`` **before** the element cast: FP_MANIFEST.json
   ``fp8_encoder_rounding``, 2-4% of codes differ from a single rounding of the float32
   quotient), clamped to ``[-max_finite, max_finite]`` (saturation), then cast to the element with
   round-to-nearest-even (``ml_dtypes``, OCP FP8 spec). The code is the element's byte. A quotient
   that is ``-0.0`` (a ``-0.0`` weight, or one whose quotient underflows ``D``) becomes ``+0.0`` ->
   ``0x00``: compressed-tensors 0.20.1 ``forward.py`` ``_quantize`` adds the zero point (zeros for
   symmetric FP8) before the cast; a negative quotient that rounds to zero only in the element cast
   keeps its sign (``0x80``), as torch's cast.

The value of a code is ``element[code] * scale`` in float32 (:func:`converter.values.dequantize`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from converter.errors import QuantizationError, exact_str
from converter.kernels.error_sums import ErrorSums

#: Elements per row block of :func:`quantize_fp_rows` (rows are rounded to whole tile rows).
FP_BLOCK_ELEMENTS = 1 << 18


@dataclass(frozen=True, eq=False)
class FpQuantized:
    """What :func:`quantize_fp_rows` made of a ``(out, in)`` matrix.

    Attributes
    ----------
    scales : ndarray, ``(ceil(out / block_out), ceil(in / block_in))`` (1 along a whole axis),
        the scale dtype.
    codes : ndarray of uint8, ``(out, in)``: the element bytes.
    degenerate_groups : int
        Tiles whose values are all zero (scale 1).
    """

    scales: np.ndarray
    codes: np.ndarray
    degenerate_groups: int


def _tile_amax(a: np.ndarray, block_out: int, block_in: int | None) -> np.ndarray:
    """``max`` of ``a`` (``(k, in)``, non-negative float32) over tiles: ``(ceil(k / bo), tiles_in)``."""
    k, n = a.shape
    r = np.maximum.reduceat(a, np.arange(0, n, block_in), axis=1) if block_in is not None \
        else a.max(axis=1, keepdims=True)
    return np.maximum.reduceat(r, np.arange(0, k, block_out), axis=0)


def fp_scales(amax: np.ndarray, max_finite: float, *, arith: np.dtype, scale_dtype: np.dtype,
              tensor: str | None = None) -> tuple[np.ndarray, int]:
    """Scales of tiles from their absmax: ``arith(amax / max_finite)``, 1 for an all-zero tile,
    stored in ``scale_dtype``.

    Parameters
    ----------
    amax : ndarray of float32, any shape: ``max |w|`` per tile (finite, checked by the caller).
    max_finite : the element's largest finite value (448 E4M3, 57344 E5M2).
    arith : the weight's dtype (float32, float16 or ``ml_dtypes.bfloat16``): the quotient is
        rounded to it (torch's BF16 / F16 division: float32 quotient rounded to nearest even).
    scale_dtype : the stored dtype (float32 / float16 / bfloat16).
    tensor : name, for errors.

    Returns
    -------
    (scales in ``scale_dtype``, number of all-zero tiles)

    Raises
    ------
    QuantizationError
        A scale that overflows ``arith`` or ``scale_dtype`` (names the tile).
    """
    with np.errstate(over="ignore"):
        q = (amax.astype(np.float32) / np.float32(max_finite)).astype(arith)
        zero = amax == 0
        q = np.where(zero, np.asarray(1, dtype=arith), q)
        s = q.astype(scale_dtype)
    tiny = (s == 0) & ~zero  # underflow to 0 (in ``arith`` or the scale dtype): the scale dtype's eps
    if tiny.any():
        s = np.where(tiny, np.asarray(ml_dtypes.finfo(scale_dtype).eps, dtype=scale_dtype), s)
    bad = ~np.isfinite(s.astype(np.float32))
    if bad.any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), s.shape))
        raise QuantizationError("scale overflows the scale dtype", tensor=tensor, field="scales",
                                expected=f"finite {np.dtype(scale_dtype).name} (and {np.dtype(arith).name})",
                                found=f"absmax {exact_str(amax[idx])} / {max_finite:g} at tile {list(idx)}",
                                hint="use --scale-dtype f32 (or bf16)")
    return s, int(np.count_nonzero(zero))


def fp_codes(x: np.ndarray, s32: np.ndarray, block_in: int | None, element: np.dtype, max_finite: float, *,
             arith: np.dtype) -> np.ndarray:
    """Element bytes of a row block for given scales: ``cast(clamp(arith(x / s)))``.

    Parameters
    ----------
    x : ndarray of float32, ``(k, in)``.
    s32 : ndarray of float32, ``(k, tiles_in)``: each row's scale per tile along ``in``.
    block_in : tile extent along ``in`` (None: one tile per row).
    element : the ``ml_dtypes`` float8 dtype.
    max_finite : saturation bound.
    arith : the weight's dtype (the quotient is rounded to it first).

    Returns
    -------
    ndarray of uint8, ``(k, in)``.
    """
    k, n = x.shape
    if block_in is None:
        q = x / s32
    else:
        q = x / np.repeat(s32, block_in, axis=1)[:, :n]
    if np.dtype(arith) != np.float32:
        q = q.astype(arith).astype(np.float32)
    q += np.float32(0)  # compressed-tensors adds the (zero) zero point: -0.0 becomes +0.0
    np.clip(q, -max_finite, max_finite, out=q)  # (+-inf from a tiny scale saturates too)
    return q.astype(element).view(np.uint8)


def _check_finite(amax: np.ndarray, r0: int, block_out: int, block_in: int | None, tensor: str | None) -> None:
    bad = ~np.isfinite(amax)
    if bad.any():
        i, j = (int(v) for v in np.unravel_index(int(np.argmax(bad)), amax.shape))
        where = f"rows from {r0 + i * block_out}" + (f", columns from {j * block_in}" if block_in else "")
        raise QuantizationError("input values are not all finite", tensor=tensor, field="values",
                                found=f"NaN/inf in the tile at {where}")


def quantize_fp_rows(values: Any, element: np.dtype, max_finite: float, *, block_out: int | None,
                     block_in: int | None, arith: np.dtype, scale_dtype: np.dtype, tensor: str | None = None,
                     compare: ErrorSums | None = None) -> FpQuantized:
    """FP8 round-to-nearest of a 2-D ``(out, in)`` float matrix, tile by tile, in row blocks.

    Parameters
    ----------
    values : ndarray ``(out, in)`` (float32 / float16 / bfloat16) or a row source
        (:class:`converter.rows.Rows`: ``values[r0:r1]`` gives float32 rows): read block by block,
        never held whole as floats. Per tensor (``block_out=None``) it is read twice (absmax, then
        codes).
    element, max_finite : the ``ml_dtypes`` float8 dtype and its largest finite value.
    block_out, block_in : tile extents along ``out`` / ``in``; None covers the axis whole.
    arith : the weight's dtype (see the module docstring); ``scale_dtype`` the stored one.
    tensor : name, for errors.
    compare : :class:`~converter.kernels.error_sums.ErrorSums` of the matrix, optional: fed each
        block's values and their reconstruction ``element[code] * scale`` (float32, the dequantize
        formula) while in cache.

    Returns
    -------
    FpQuantized

    Raises
    ------
    QuantizationError
        Non-finite values (names the tile), a scale overflowing the scale dtype.
    """
    rows, n = values.shape
    bo = rows if block_out is None else int(block_out)
    bo = max(bo, 1)
    table = np.arange(256, dtype=np.uint8).view(element).astype(np.float32)
    tiles_out = -(-rows // bo) if block_out is not None else 1
    tiles_in = -(-n // block_in) if block_in is not None else 1
    scales = np.empty((tiles_out, tiles_in), dtype=scale_dtype)
    codes = np.empty((rows, n), dtype=np.uint8)
    if rows == 0 or n == 0:
        scales[...] = 1
        return FpQuantized(scales, codes, 0)
    per_tensor = block_out is None
    step = bo * max(1, FP_BLOCK_ELEMENTS // max(1, bo * n)) if not per_tensor else max(1, FP_BLOCK_ELEMENTS // n)
    degenerate = 0
    if per_tensor:  # first pass: the absmax of every tile along ``in`` over all rows
        amax = None
        for r0 in range(0, rows, step):
            x = np.asarray(values[r0:min(rows, r0 + step)], dtype=np.float32)
            a = _tile_amax(np.abs(x), x.shape[0], block_in)
            _check_finite(a, r0, rows, block_in, tensor)
            amax = a if amax is None else np.maximum(amax, a)
        scales[...], degenerate = fp_scales(amax, max_finite, arith=arith, scale_dtype=scale_dtype, tensor=tensor)
    bbuf = None
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        x = np.asarray(values[r0:r1], dtype=np.float32)
        if per_tensor:
            sc = scales
        else:
            a = _tile_amax(np.abs(x), bo, block_in)
            _check_finite(a, r0, bo, block_in, tensor)
            sc, deg = fp_scales(a, max_finite, arith=arith, scale_dtype=scale_dtype, tensor=tensor)
            degenerate += deg
            scales[r0 // bo: r0 // bo + sc.shape[0]] = sc
        s_rows = np.repeat(sc.astype(np.float32), bo, axis=0)[:r1 - r0] if not per_tensor \
            else np.broadcast_to(sc.astype(np.float32), (r1 - r0, sc.shape[1]))
        with np.errstate(over="ignore"):
            q = fp_codes(x, s_rows, block_in, element, max_finite, arith=arith)
        codes[r0:r1] = q
        if compare is not None:
            if bbuf is None:
                bbuf = np.empty((step, n), dtype=np.float32)
            b = table[q]
            if block_in is None:
                b *= s_rows
            else:
                b *= np.repeat(s_rows, block_in, axis=1)[:, :n]
            compare.add(r0, x, b, bbuf[:r1 - r0])
    return FpQuantized(scales, codes, degenerate)
