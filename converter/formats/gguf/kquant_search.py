"""llama.cpp's K-quant scale searches in numpy, vectorised over sub-blocks, bit-identical in float32.

Every function works on a sub-block *batch* laid out element-major: ``x`` of shape ``(n, G)``
float32, element ``i`` of sub-block ``g`` at ``x[i, g]`` (``n`` = 16 or 32 elements per sub-block,
``G`` sub-blocks). A C loop ``for (i = 0; i < n; ++i) acc += f(x[i])`` is a Python loop over the
``n`` rows adding contiguous ``(G,)`` vectors, so every sum is accumulated in llama.cpp's order
and every intermediate is rounded to float32 as C rounds it (x86-64 SSE, no FMA contraction: the
``ggml-base`` library llama-cpp-python 0.3.36 ships contains no FMA instruction). Branches of the C
code become masks per sub-block.

Source of each convention: ``ggml/src/ggml-quants.c`` (llama.cpp, vendored in llama-cpp-python
0.3.36): ``nearest_int``, ``make_qkx2_quants`` (Q2_K, Q4_K, Q5_K), ``make_qx_quants`` with
``rmse_type = 1`` and no weights (Q6_K), ``make_q3_quants`` with ``do_rmse`` (Q3_K).
"""

from __future__ import annotations

import numpy as np

__all__ = ["nearest_int", "make_qkx2_quants", "make_qx_quants", "make_q3_quants", "GROUP_MAX_EPS"]

F32 = np.float32
GROUP_MAX_EPS = F32(1e-15)
"""``GROUP_MAX_EPS``: a sub-block whose largest magnitude is below this is all zero."""
_MAGIC = F32(12582912.0)  # 1.5 * 2^23


def nearest_int(v: np.ndarray) -> np.ndarray:
    """``nearest_int``: the low mantissa bits of ``v + 1.5*2^23`` (round half to even for
    ``|v| <= 4194303``; outside that range the same bits C produces).

    float32 array -> int32 array of the same shape.
    """
    s = np.asarray(v, dtype=F32) + _MAGIC
    return (s.view(np.int32) & np.int32(0x007FFFFF)) - np.int32(0x00400000)


def _seq_sum(terms: np.ndarray) -> np.ndarray:
    """``float acc = 0; for i: acc += terms[i]`` for every sub-block: ``(n, G)`` -> ``(G,)``."""
    acc = np.zeros(terms.shape[1:], dtype=F32)
    for t in terms:
        acc += t
    return acc


def _seq_sum_from_first(terms: np.ndarray) -> np.ndarray:
    """``float acc = terms[0]; for i >= 1: acc += terms[i]``: ``(n, G)`` -> ``(G,)``."""
    acc = terms[0].copy()
    for t in terms[1:]:
        acc += t
    return acc


def _first_absmax(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``if (ax > amax) { amax = ax; max = x[i]; }`` from 0: ``(amax, max)`` per sub-block (the
    first element of largest magnitude keeps its sign)."""
    ax = np.abs(x)
    amax = ax.max(axis=0)
    first = np.argmax(ax == amax[None, :], axis=0)
    mx = np.take_along_axis(x, first[None, :], axis=0)[0]
    # amax = 0 (all zero): C's max stays 0 (no element is > 0)
    return amax, np.where(amax > 0, mx, F32(0))


def make_qkx2_quants(x: np.ndarray, weights: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
                     use_mad: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``make_qkx2_quants``: a weighted affine fit ``x ~ scale*L - the_min`` with ``L`` in 0..nmax.

    Parameters
    ----------
    x, weights : ndarray of float32, shape (n, G)
    nmax : int
        Largest code (3, 15, 31).
    rmin, rdelta, nstep : float, float, int
        The search over ``iscale = (rmin + rdelta*is + nmax) / (max - min)``, ``is = 0..nstep``.
    use_mad : bool
        Absolute (True) or squared (False) error.

    Returns
    -------
    scale : ndarray of float32, shape (G,)
    the_min : ndarray of float32, shape (G,)
        ``-min`` (non-negative).
    L : ndarray of uint8, shape (n, G)
    """
    n, G = x.shape
    nm = F32(nmax)
    mn = x.min(axis=0)
    mx = x.max(axis=0)
    sum_w = _seq_sum_from_first(weights)
    sum_x = _seq_sum_from_first(weights * x)
    mn = np.where(mn > 0, F32(0), mn)
    flat = mx == mn
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rng = mx - mn
        iscale = nm / rng
        scale = F32(1) / iscale
        L = np.clip(nearest_int(iscale[None, :] * (x - mn[None, :])), 0, nmax)
        Lf = L.astype(F32)
        diff = scale[None, :] * Lf + mn[None, :] - x
        diff = np.abs(diff) if use_mad else diff * diff
        best = _seq_sum(weights * diff)
        for step in range(nstep + 1):
            iscale = (F32(rmin) + F32(rdelta) * F32(step) + nm) / (mx - mn)
            la = np.clip(nearest_int(iscale[None, :] * (x - mn[None, :])), 0, nmax)
            laf = la.astype(F32)
            wl = weights * laf
            sum_l = _seq_sum(wl)
            sum_l2 = _seq_sum(wl * laf)
            sum_xl = _seq_sum(wl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            ok = D > 0
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, F32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            diff = this_scale[None, :] * laf + this_min[None, :] - x
            diff = np.abs(diff) if use_mad else diff * diff
            cur = _seq_sum(weights * diff)
            take = ok & (cur < best) & ~flat
            if take.any():
                L = np.where(take[None, :], la, L)
                best = np.where(take, cur, best)
                scale = np.where(take, this_scale, scale)
                mn = np.where(take, this_min, mn)
    scale = np.where(flat, F32(0), scale)
    L = np.where(flat[None, :], 0, L)
    return scale.astype(F32), (-mn).astype(F32), L.astype(np.uint8)


def make_qx_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL)``: a symmetric fit ``x ~ scale*(L - nmax)``
    weighted by ``x*x``, searching ``iscale = -(nmax + 0.1*is) / max`` for ``is`` in -9..9.

    ``x`` (n, G) float32 -> ``scale`` (G,) float32 and ``L`` (n, G) uint8 in 0..2*nmax-1.
    """
    amax, mx = _first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    nm = F32(nmax)
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = -nm / mx
        l0 = np.clip(nearest_int(iscale[None, :] * x), -nmax, nmax - 1)
        lf = l0.astype(F32)
        wx = w * x
        sumlx = _seq_sum(wx * lf)
        suml2 = _seq_sum(w * lf * lf)
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
        best = scale * sumlx
        L = l0
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(nm + F32(0.1) * F32(step)) / mx
            li = np.clip(nearest_int(iscale[None, :] * x), -nmax, nmax - 1)
            lf = li.astype(F32)
            sumlx = _seq_sum(wx * lf)
            suml2 = _seq_sum(w * lf * lf)
            take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            if take.any():
                L = np.where(take[None, :], li, L)
                scale = np.where(take, sumlx / suml2, scale)
                best = np.where(take, scale * sumlx, best)
    scale = np.where(zero, F32(0), scale)
    L = np.where(zero[None, :], 0, L + nmax)
    return scale.astype(F32), L.astype(np.uint8)


def make_q3_quants(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """``make_q3_quants(n, nmax, x, L, do_rmse=true)``: a symmetric fit weighted by ``x*x``, then up to
    five passes moving single codes while that raises ``sumlx^2 / suml2``.

    A pass that changes nothing leaves the state as it was, so running all five passes on every
    sub-block equals C's early ``break``. ``x`` (n, G) float32 -> ``scale`` (G,) float32 and ``L``
    (n, G) uint8 in 0..2*nmax-1.
    """
    n = x.shape[0]
    amax, mx = _first_absmax(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    wx = w * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = -F32(nmax) / mx
        L = np.clip(nearest_int(iscale[None, :] * x), -nmax, nmax - 1)
        lf = L.astype(F32)
        sumlx = _seq_sum(wx * lf)
        suml2 = _seq_sum(w * lf * lf)
        for _ in range(5):
            for i in range(n):
                li = L[i].astype(F32)
                slx = sumlx - wx[i] * li
                sl2 = suml2 - w[i] * li * li
                new_l = np.clip(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1)
                nf = new_l.astype(F32)
                slx2 = slx + wx[i] * nf
                sl22 = sl2 + w[i] * nf * nf
                take = ((slx > 0) & (new_l != L[i]) & (sl22 > 0)
                        & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22))
                L[i] = np.where(take, new_l, L[i])
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    scale = np.where(zero, F32(0), scale)
    L = np.where(zero[None, :], 0, L + nmax)
    return scale.astype(F32), L.astype(np.uint8)
