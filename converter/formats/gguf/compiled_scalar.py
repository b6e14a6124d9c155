"""Scalar helpers of the compiled GGUF encoders (numba ``register_jitable``: plain Python functions
that compile into the kernels calling them): ``nearest_int``, float32 <-> IEEE half bits, and the
per-sub-block scale searches of :mod:`converter.formats.gguf.kquant_search` written as C loops.

Imported only when a compiled kernel runs (it imports numba). Every float is float32 and every
operation is in the order of the numpy port (which is llama.cpp's order): literals are wrapped in
``np.float32`` and integers converted with ``np.float32(...)`` before they meet a float, so no
operation is promoted to float64. Sources: ``ggml/src/ggml-quants.c`` (llama.cpp as vendored in
llama-cpp-python 0.3.36) and ``ggml-impl.h`` (``GGML_FP32_TO_FP16``: IEEE round to nearest even,
as numpy's ``astype(np.float16)``).

numba's on-disk cache of a kernel is keyed on the kernel's own source file only: a change here must
come with a change of :mod:`converter.formats.gguf.compiled_encode` and
:mod:`converter.formats.gguf.compiled_legacy` (or a cleared cache), else a
cached kernel keeps the old helper.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

F32 = np.float32


@register_jitable
def nearest_int(v):
    """``nearest_int``: the low 23 bits of ``float32(v + 1.5*2^23)`` minus ``2^22`` (int)."""
    s = np.float32(v + np.float32(12582912.0))
    return (np.int64(s.view(np.int32)) & 0x007FFFFF) - 0x00400000


@register_jitable
def f16_bits(v):
    """float32 -> the uint16 bits of the nearest IEEE half (ties to even; overflow to inf; NaN to
    a quiet NaN), as numpy's ``float32.astype(float16)``."""
    u = np.int64(np.float32(v).view(np.uint32))
    sign = (u >> 16) & 0x8000
    exp = (u >> 23) & 0xFF
    mant = u & 0x7FFFFF
    if exp == 0xFF:
        if mant == 0:
            return sign | 0x7C00
        return sign | 0x7E00 | (mant >> 13)
    e = exp - 112  # exponent rebiased to half (127 - 15)
    if e >= 31:
        return sign | 0x7C00
    if e >= 1:
        h = (e << 10) | (mant >> 13)
        rest = mant & 0x1FFF
        if rest > 0x1000 or (rest == 0x1000 and (h & 1) == 1):
            h += 1  # a carry into the exponent is the right rounding (up to inf)
        return sign | h
    if e < -10:
        return sign
    m = mant | 0x800000
    shift = 14 - e
    h = m >> shift
    rest = m & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rest > half or (rest == half and (h & 1) == 1):
        h += 1
    return sign | h


@register_jitable
def f16_value(h):
    """The uint16 bits of an IEEE half -> its float32 value (exact)."""
    sign = -1.0 if (h & 0x8000) else 1.0
    e = (h >> 10) & 0x1F
    m = h & 0x3FF
    if e == 0:
        return np.float32(sign * m * 5.9604644775390625e-08)  # m * 2^-24, exact
    if e == 31:
        return np.float32(sign * np.inf) if m == 0 else np.float32(np.nan)
    return np.float32(sign * (1024 + m) * 2.0 ** (e - 25))


@register_jitable
def put_f16(out, row, pos, v):
    """Store ``v`` as a little-endian half at ``out[row, pos:pos+2]``; return the half's bits."""
    h = f16_bits(v)
    out[row, pos] = h & 0xFF
    out[row, pos + 1] = h >> 8
    return h


@register_jitable
def clamp(v, lo, hi):
    return lo if v < lo else (hi if v > hi else v)


@register_jitable
def first_absmax(x, start, n):
    """``(amax, max)``: the largest ``|x[start+i]|`` and the first element reaching it (0 if all zero)."""
    amax = np.float32(0.0)
    mx = np.float32(0.0)
    for i in range(n):
        ax = abs(x[start + i])
        if ax > amax:
            amax = ax
            mx = x[start + i]
    return amax, mx


_EXACT_LIMIT = np.float32(4194303.0)
"""``|v|`` up to which ``(v + 1.5*2^23) - 1.5*2^23`` in float32 is ``nearest_int(v)`` exactly: the sum
lies in [2^23, 2^24), where float32 spacing is 1, so the add rounds ``v`` half to even and the
subtraction is exact; the integer trick of ``nearest_int`` reads the same bits."""


@register_jitable
def in_exact_range(lo, hi):
    """Both bounds finite and within :data:`_EXACT_LIMIT` (False for NaN)."""
    return lo > -_EXACT_LIMIT and lo < _EXACT_LIMIT and hi > -_EXACT_LIMIT and hi < _EXACT_LIMIT


@register_jitable
def qkx2_lanes(xt, w, G, n, nmax, rmin, rdelta, nstep, use_mad, L, la, scale, the_min, mn, mx, sum_w, sum_x,
               best, isc, s1, s2, s3, cur, tsc, tmn, xmin, take, flat):
    """``make_qkx2_quants`` on ``G`` sub-blocks at once, element-major: ``xt[i, g]`` is element ``i``
    of sub-block ``g``, ``w[i, g]`` its weight. Codes into ``L[:n, :G]`` (int32; ``la`` float32
    scratch), scales and ``-min`` into ``scale[:G]`` / ``the_min[:G]``; the other arrays are (G,) scratch.

    Each sub-block's sums are accumulated in llama.cpp's order (a lane of its own), so the
    results equal :func:`kquant_search.make_qkx2_quants`; the lanes only give the CPU independent
    work (and SIMD) where one sub-block alone is a chain of dependent float adds. A search step
    rounds in float32 (``(v + 1.5*2^23) - 1.5*2^23``, clamped) when every non-flat lane's
    ``iscale * (x - min)`` is bounded inside :data:`_EXACT_LIMIT` (``x - min`` and the product are
    monotonic in ``x``, so the bounds are the lane's extremes), else with ``nearest_int``'s bits.
    """
    nm = np.float32(nmax)
    magic = np.float32(12582912.0)
    for g in range(G):
        mn[g] = xt[0, g]
        mx[g] = xt[0, g]
        sum_w[g] = w[0, g]
        sum_x[g] = w[0, g] * xt[0, g]
    for i in range(1, n):
        for g in range(G):
            v = xt[i, g]
            mn[g] = v if v < mn[g] else mn[g]
            mx[g] = v if v > mx[g] else mx[g]
            sum_w[g] += w[i, g]
            sum_x[g] += w[i, g] * v
    for g in range(G):
        xmin[g] = mn[g]
        if mn[g] > 0:
            mn[g] = np.float32(0.0)
        flat[g] = mx[g] == mn[g]
        isc[g] = nm / (mx[g] - mn[g])
        scale[g] = np.float32(1.0) / isc[g]
        best[g] = np.float32(0.0)
    for i in range(n):
        for g in range(G):
            v = xt[i, g]
            li = clamp(nearest_int(isc[g] * (v - mn[g])), 0, nmax)
            L[i, g] = li
            diff = scale[g] * np.float32(li) + mn[g] - v
            diff = abs(diff) if use_mad else diff * diff
            best[g] += w[i, g] * diff
    for step in range(nstep + 1):
        top = rmin + rdelta * np.float32(step) + nm
        exact = True
        for g in range(G):
            isc[g] = top / (mx[g] - mn[g])
            s1[g] = np.float32(0.0)
            s2[g] = np.float32(0.0)
            s3[g] = np.float32(0.0)
            if not flat[g]:
                exact = exact and in_exact_range(isc[g] * (xmin[g] - mn[g]), isc[g] * (mx[g] - mn[g]))
        if exact:
            for i in range(n):
                for g in range(G):
                    v = xt[i, g]
                    lf = (isc[g] * (v - mn[g]) + magic) - magic
                    lf = np.float32(0.0) if lf < 0 else lf
                    lf = nm if lf > nm else lf
                    la[i, g] = lf
                    wl = w[i, g] * lf
                    s1[g] += wl
                    s2[g] += wl * lf
                    s3[g] += wl * v
        else:
            for i in range(n):
                for g in range(G):
                    v = xt[i, g]
                    lf = np.float32(clamp(nearest_int(isc[g] * (v - mn[g])), 0, nmax))
                    la[i, g] = lf
                    wl = w[i, g] * lf
                    s1[g] += wl
                    s2[g] += wl * lf
                    s3[g] += wl * v
        for g in range(G):
            D = sum_w[g] * s2[g] - s1[g] * s1[g]
            ts = (sum_w[g] * s3[g] - sum_x[g] * s1[g]) / D
            tm = (s2[g] * sum_x[g] - s1[g] * s3[g]) / D
            if tm > 0:
                tm = np.float32(0.0)
                ts = s3[g] / s2[g]
            tsc[g] = ts
            tmn[g] = tm
            take[g] = D > 0
            cur[g] = np.float32(0.0)
        for i in range(n):
            for g in range(G):
                diff = tsc[g] * la[i, g] + tmn[g] - xt[i, g]
                diff = abs(diff) if use_mad else diff * diff
                cur[g] += w[i, g] * diff
        changed = False
        for g in range(G):
            t = take[g] and cur[g] < best[g] and not flat[g]
            take[g] = t
            if t:
                best[g] = cur[g]
                scale[g] = tsc[g]
                mn[g] = tmn[g]
                changed = True
        if changed:
            for i in range(n):
                for g in range(G):
                    if take[g]:
                        L[i, g] = np.int32(la[i, g])
    for g in range(G):
        the_min[g] = -mn[g]
        if flat[g]:  # mn is unchanged for a flat sub-block: it never takes a step
            scale[g] = np.float32(0.0)
            for i in range(n):
                L[i, g] = 0


@register_jitable
def qx_lanes(xt, G, n, nmax, L, la, scale, amax, mx, best, isc, s1, s2, xmin, xmax):
    """``make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL)`` on ``G`` sub-blocks at once
    (``xt[i, g]``, as :func:`qkx2_lanes`): stored codes (``L + nmax``, 0 for an all-zero sub-block)
    into ``L[:n, :G]`` (int32; ``la`` float32 scratch), scales into ``scale[:G]`` (as
    :func:`kquant_search.make_qx_quants`); float32 rounding under the rule of :func:`qkx2_lanes`."""
    nm = np.float32(nmax)
    lo_q = np.float32(-nmax)
    hi_q = np.float32(nmax - 1)
    magic = np.float32(12582912.0)
    for g in range(G):
        amax[g] = np.float32(0.0)
        mx[g] = np.float32(0.0)
        xmin[g] = xt[0, g]
        xmax[g] = xt[0, g]
    for i in range(n):
        for g in range(G):
            v = xt[i, g]
            a = abs(v)
            if a > amax[g]:
                amax[g] = a
                mx[g] = v
            xmin[g] = v if v < xmin[g] else xmin[g]
            xmax[g] = v if v > xmax[g] else xmax[g]
    for step in range(-10, 10):  # -10: the first guess (is = 0), then is = -9..9 without 0
        if step == 0:
            continue
        sstep = 0 if step == -10 else step
        exact = True
        for g in range(G):
            isc[g] = -(nm + np.float32(0.1) * np.float32(sstep)) / mx[g] if sstep != 0 else -nm / mx[g]
            s1[g] = np.float32(0.0)
            s2[g] = np.float32(0.0)
            if amax[g] >= np.float32(1e-15):
                exact = exact and in_exact_range(isc[g] * xmin[g], isc[g] * xmax[g])
        if exact:
            for i in range(n):
                for g in range(G):
                    v = xt[i, g]
                    lf = (isc[g] * v + magic) - magic
                    lf = lo_q if lf < lo_q else lf
                    lf = hi_q if lf > hi_q else lf
                    la[i, g] = lf
                    wv = v * v
                    s1[g] += wv * v * lf
                    s2[g] += wv * lf * lf
        else:
            for i in range(n):
                for g in range(G):
                    v = xt[i, g]
                    lf = np.float32(clamp(nearest_int(isc[g] * v), -nmax, nmax - 1))
                    la[i, g] = lf
                    wv = v * v
                    s1[g] += wv * v * lf
                    s2[g] += wv * lf * lf
        if step == -10:
            for g in range(G):
                scale[g] = s1[g] / s2[g] if s2[g] != 0 else np.float32(0.0)
                best[g] = scale[g] * s1[g]
            for i in range(n):
                for g in range(G):
                    L[i, g] = np.int32(la[i, g])
            continue
        changed = False
        for g in range(G):
            t = s2[g] > 0 and s1[g] * s1[g] > best[g] * s2[g]
            if t:
                scale[g] = s1[g] / s2[g]
                best[g] = scale[g] * s1[g]
                changed = True
            s2[g] = np.float32(1.0) if t else np.float32(0.0)  # reused as the lane's take mask
        if changed:
            for i in range(n):
                for g in range(G):
                    if s2[g] != 0:
                        L[i, g] = np.int32(la[i, g])
    for g in range(G):
        zero = amax[g] < np.float32(1e-15)
        if zero:
            scale[g] = np.float32(0.0)
        for i in range(n):
            L[i, g] = 0 if zero else L[i, g] + nmax


@register_jitable
def q3(x, start, n, nmax, L):
    """``make_q3_quants(n, nmax, x, L, do_rmse=true)``: stored codes (``L + nmax``, 0 for an all-zero
    sub-block) into ``L[start:]``; returns the scale (as :func:`kquant_search.make_q3_quants`)."""
    amax, mx = first_absmax(x, start, n)
    if amax < np.float32(1e-15):
        for i in range(n):
            L[start + i] = 0
        return np.float32(0.0)
    iscale = -np.float32(nmax) / mx
    sumlx = np.float32(0.0)
    suml2 = np.float32(0.0)
    for i in range(n):
        v = x[start + i]
        li = clamp(nearest_int(iscale * v), -nmax, nmax - 1)
        L[start + i] = li
        lf = np.float32(li)
        w = v * v
        sumlx += w * v * lf
        suml2 += w * lf * lf
    for _ in range(5):
        for i in range(n):
            v = x[start + i]
            w = v * v
            wx = w * v
            li = np.float32(L[start + i])
            slx = sumlx - wx * li
            sl2 = suml2 - w * li * li
            new_l = clamp(nearest_int(v * sl2 / slx), -nmax, nmax - 1)
            nf = np.float32(new_l)
            slx2 = slx + wx * nf
            sl22 = sl2 + w * nf * nf
            if (slx > 0 and new_l != L[start + i] and sl22 > 0
                    and slx2 * slx2 * suml2 > sumlx * sumlx * sl22):
                L[start + i] = new_l
                sumlx = slx2
                suml2 = sl22
    for i in range(n):
        L[start + i] += nmax
    return sumlx / suml2 if suml2 > 0 else np.float32(0.0)
