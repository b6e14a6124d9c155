"""The MSE clipping search of ``--scale-search mse`` (:func:`mse_scale_search`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from converter.groups import GroupMap
from converter.kernels.rtn import safe_cast_scales
from converter.quant.quantize import choose_params, codes_for
from converter.quant.result import ScaleSearch
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor

#: default clipping ratios of the MSE scale search (1.0 = plain absmax / min-max, tried first).
DEFAULT_RATIOS = tuple(np.round(np.linspace(1.0, 0.5, 26), 4).tolist())


def _group_sse(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, zps: np.ndarray | None, scheme: QuantScheme,
               gm: GroupMap, axes: Sequence[str]) -> np.ndarray:
    """Squared reconstruction error per group (float64, parameter shape)."""
    zp = zps.astype(scheme.code_dtype) if zps is not None and scheme.zero_point is ZeroPoint.INTEGER else zps
    t = QuantizedTensor("search", tuple(axes), codes, scales, scheme, gm, zero_points=zp, stored={})
    e = t.dequantize() - x
    return gm.reduce((e.astype(np.float64)) ** 2, np.add, axes)


def mse_scale_search(values: np.ndarray, scheme: QuantScheme, group_map: GroupMap, axes: Sequence[str], *,
                     ratios: Sequence[float] = DEFAULT_RATIOS, tensor: str | None = None
                     ) -> tuple[np.ndarray, np.ndarray | None, ScaleSearch]:
    """Per group, the clipped scale that minimises the squared error (vectorized over groups).

    For each clipping ratio ``r`` (a loop over the few ratios, never over groups) the absmax
    (symmetric) or min/max (asymmetric) scale is multiplied by ``r``, cast to the scale dtype,
    codes are computed with :func:`codes_for` (clamped, half-to-even) and the squared error of every
    group is compared with the best so far. Ratio 1.0 comes first and wins ties, so the result is
    never worse than plain absmax. Idea from llama.cpp ``make_qx_quants`` (ggml-quants.c), which
    searches a grid of inverse scales around ``nmax / max`` per block.

    Parameters
    ----------
    values : ndarray of float32, logical shape.
    scheme, group_map, axes : the target.
    ratios : clipping ratios in (0, 1].

    Returns
    -------
    scales : ndarray, parameter shape, scheme's scale dtype
    zero_points : ndarray or None (int16 integer zero points or scale-dtype biases)
    search : ScaleSearch (``absmax_sse``, ``search_sse`` totals and the ``ratios_chosen`` counts).
    """
    x = np.asarray(values, dtype=np.float32)
    base_s, base_z = choose_params(x, scheme, group_map, axes, tensor=tensor)
    s32 = base_s.astype(np.float32)
    if scheme.symmetric:
        lo = None
    else:
        lo = np.minimum(group_map.reduce(x, np.minimum, axes), 0).astype(np.float32)
    best_s, best_z, best_e, best_r = base_s, base_z, None, None
    levels = np.float32((1 << scheme.bits) - 1)
    ratios = [1.0] + [float(r) for r in ratios if float(r) != 1.0]
    for i, r in enumerate(ratios):
        if i == 0:
            sc, zp = base_s, base_z
        else:
            raw = (s32 * np.float32(r)).astype(np.float32)
            raw = np.where(raw > 0, raw, s32)
            sc = safe_cast_scales(raw, scheme, tensor=tensor)
            zp = None
            if not scheme.symmetric:
                c32 = sc.astype(np.float32)
                with np.errstate(divide="ignore", invalid="ignore"):
                    z = np.clip(np.nan_to_num(np.rint(-lo / c32)), 0, levels)
                if scheme.zero_point is ZeroPoint.INTEGER:
                    zp = (z - np.float32(1 << (scheme.bits - 1)) if scheme.signed else z).astype(np.int16)
                else:
                    zp = (-z * c32).astype(scheme.scale_np_dtype)
        zc = zp.astype(scheme.code_dtype) if zp is not None and scheme.zero_point is ZeroPoint.INTEGER else zp
        codes = codes_for(x, sc, zc, scheme, group_map, axes)
        err = _group_sse(x, codes, sc, zp, scheme, group_map, axes)
        if best_e is None:
            best_e, base_e = err, err
            best_r = np.zeros(err.shape, dtype=np.int16)
            continue
        better = err < best_e
        if better.any():
            best_e = np.where(better, err, best_e)
            best_s = np.where(better, sc, best_s).astype(sc.dtype)
            if zp is not None:
                best_z = np.where(better, zp, best_z).astype(zp.dtype)
            best_r = np.where(better, i, best_r)
    hist = np.bincount(best_r.reshape(-1), minlength=len(ratios))
    search = ScaleSearch(absmax_sse=float(base_e.sum()), search_sse=float(best_e.sum()),
                         ratios_chosen={f"{ratios[k]:g}": int(c) for k, c in enumerate(hist) if c})
    return best_s, best_z, search
