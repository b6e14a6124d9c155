"""Compiled GGUF block encoders (the ``fast`` extra): the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, one super-block
per loop iteration, straight to bytes (the legacy types: :mod:`converter.formats.gguf.compiled_legacy`).

A second implementation of :meth:`LegacyCodec.encode <converter.formats.gguf.block_legacy.LegacyCodec.encode>`
and :meth:`KQuantCodec.encode <converter.formats.gguf.block_kquants.KQuantCodec.encode>` (the numpy
reference, itself bit-identical with gguf-py and llama.cpp's ``quantize_row_*_ref``): same float32
operations in the same order, same byte layouts (``ggml-common.h``), **byte-identical output**
(``tests/formats/test_gguf_compiled_encode.py`` runs both on the same rows). Kernels are compiled on
first use through :func:`converter.kernels.compiled.jit`; the codecs call them only when
:func:`converter.kernels.compiled.use_compiled` says so.

Every kernel returns a flag instead of raising: non-zero when a block holds a non-finite value,
a scale outside float16 or so small that its inverse overflows,
or signed zeros whose sign numpy's reductions would choose (a min / max
of ``+0.0`` and ``-0.0``). The codec then encodes that row chunk with the numpy path, which gives
the reference bytes or the reference error, so the rare cases never need a second rule.
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit
from numba.extending import register_jitable

from converter.formats.gguf.compiled_scalar import (clamp, f16_value, first_absmax, nearest_int, put_f16,
                                                    q3, qkx2_lanes, qx_lanes)

__all__ = ["encode_kquant_blocks"]

_F16_MAX = np.float32(65504.0)




#: Super-blocks searched together (their sub-blocks are the lanes of the searches): 8 x 8 or 8 x 16
#: lanes, the working set of a batch (a few 32-element x lanes float32 arrays) stays in L1.
_BATCH = 8


@jit
def _affine_kquant(blocks, q5, q2, out):  # pragma: no cover - compiled
    """Q4_K (``q5 = q2 = False``), Q5_K (``q5``), Q2_K (``q2``): ``make_qkx2_quants`` per sub-block,
    quantized sub-block scales / mins, final codes, packed. Returns 1 to defer to numpy."""
    n = 16 if q2 else 32
    nsub = 256 // n
    nmax = 3 if q2 else (31 if q5 else 15)
    rmin = np.float32(-0.5) if (q2 or q5) else np.float32(-1.0)
    nstep = 15 if (q2 or q5) else 20
    rdelta = np.float32(0.1)
    G = _BATCH * nsub
    xt = np.empty((n, G), np.float32)
    w = np.empty((n, G), np.float32)
    L = np.empty((n, G), np.int32)
    la = np.empty((n, G), np.float32)
    lane = np.empty((14, G), np.float32)
    take = np.empty(G, np.bool_)
    flat = np.empty(G, np.bool_)
    scales = np.empty(G, np.float32)
    mins = np.empty(G, np.float32)
    ls = np.empty(16, np.int64)
    lm = np.empty(16, np.int64)
    q = np.empty(256, np.int32)  # codes of one super-block in element order
    N = blocks.shape[0]
    for b0 in range(0, N, _BATCH):
        nb = min(_BATCH, N - b0)
        gn = nb * nsub
        for t in range(nb):
            for j in range(nsub):
                for i in range(n):
                    xt[i, t * nsub + j] = blocks[b0 + t, j * n + i]
        if q2:
            for i in range(n):
                for g in range(gn):
                    w[i, g] = abs(xt[i, g])
        else:
            av = lane[0]
            for g in range(gn):
                av[g] = np.float32(0.0)
            for i in range(n):
                for g in range(gn):
                    av[g] += xt[i, g] * xt[i, g]
            for g in range(gn):
                av[g] = np.sqrt(av[g] / np.float32(n))
            for i in range(n):
                for g in range(gn):
                    w[i, g] = av[g] + abs(xt[i, g])
        qkx2_lanes(xt, w, gn, n, nmax, rmin, rdelta, nstep, q2, L, la, scales, mins, lane[1], lane[2], lane[3],
                   lane[4], lane[5], lane[6], lane[7], lane[8], lane[9], lane[10], lane[11], lane[12], lane[13], take,
                   flat)
        for g in range(gn):
            if not (np.isfinite(scales[g]) and np.isfinite(mins[g])):
                return 1
        for t in range(nb):
            b = b0 + t
            g0 = t * nsub
            max_scale = np.float32(0.0)
            max_min = np.float32(0.0)
            for j in range(nsub):
                if scales[g0 + j] > max_scale:
                    max_scale = scales[g0 + j]
                if mins[g0 + j] > max_min:
                    max_min = mins[g0 + j]
            if q2:
                q4 = np.float32(15.0)
                iscale = q4 / max_scale
                imin = q4 / max_min
                for j in range(nsub):
                    a = nearest_int(iscale * scales[g0 + j]) if max_scale > 0 else 0
                    c = nearest_int(imin * mins[g0 + j]) if max_min > 0 else 0
                    packed = (a | (c << 4)) & 0xFF
                    ls[j] = packed & 0x0F
                    lm[j] = packed >> 4
                    out[b, j] = packed
                dh = put_f16(out, b, 80, max_scale / q4 if max_scale > 0 else np.float32(0.0))
                mh = put_f16(out, b, 82, max_min / q4 if max_min > 0 else np.float32(0.0))
            else:
                inv_scale = np.float32(63.0) / max_scale if max_scale > 0 else np.float32(0.0)
                inv_min = np.float32(63.0) / max_min if max_min > 0 else np.float32(0.0)
                for j in range(nsub):
                    ls[j] = min(nearest_int(inv_scale * scales[g0 + j]) & 0xFF, 63)
                    lm[j] = min(nearest_int(inv_min * mins[g0 + j]) & 0xFF, 63)
                dh = put_f16(out, b, 0, max_scale / np.float32(63.0))
                mh = put_f16(out, b, 2, max_min / np.float32(63.0))
                for j in range(4):  # scales[12]: the inverse of get_scale_min_k4
                    out[b, 4 + j] = ls[j] | ((ls[j + 4] >> 4) << 6)
                    out[b, 8 + j] = lm[j] | ((lm[j + 4] >> 4) << 6)
                    out[b, 12 + j] = (ls[j + 4] & 0x0F) | ((lm[j + 4] & 0x0F) << 4)
            if (dh & 0x7C00) == 0x7C00 or (mh & 0x7C00) == 0x7C00:
                return 1
            d = f16_value(dh)
            dmin = f16_value(mh)
            x = blocks[b]
            for j in range(nsub):
                dj = d * np.float32(ls[j])
                dmj = dmin * np.float32(lm[j])
                for i in range(n):
                    if dj == 0:
                        q[j * n + i] = L[i, g0 + j]
                    else:
                        q[j * n + i] = clamp(nearest_int((x[j * n + i] + dmj) / dj), 0, nmax)
            _pack_affine(out, b, q, q5, q2)
    return 0


@register_jitable
def _pack_affine(out, b, q, q5, q2):
    """Codes ``q[:256]`` of super-block ``b`` -> the ``qs`` (and Q5_K ``qh``) bytes of ``out[b]``."""
    if q2:  # qs[64] at 16: byte 32h + l = elements 128h + 32s + l, 2 bits each
        for h in range(2):
            for lo in range(32):
                e = 128 * h + lo
                out[b, 16 + 32 * h + lo] = (q[e] | (q[e + 32] << 2) | (q[e + 64] << 4) | (q[e + 96] << 6)) & 0xFF
        return
    pos = 16
    if q5:  # qh[32]: bit k of byte j = bit 4 of element 32k + j
        for j in range(32):
            h = 0
            for k in range(8):
                h |= ((q[32 * k + j] >> 4) & 1) << k
            out[b, 16 + j] = h
        pos = 48
    for c in range(4):  # qs[128]: byte 32c + l = element 64c + l | element 64c + 32 + l << 4
        for lo in range(32):
            out[b, pos + 32 * c + lo] = (q[64 * c + lo] & 0x0F) | ((q[64 * c + 32 + lo] & 0x0F) << 4)


@jit
def _symmetric_kquant(blocks, q6, out):  # pragma: no cover - compiled
    """Q6_K (``q6``: ``make_qx_quants(16, 32)``, int8 scales) or Q3_K (``make_q3_quants(16, 4)``,
    6-bit signed scales): per 16-element sub-block, then packed. Returns 1 to defer to numpy."""
    G = _BATCH * 16
    xt = np.empty((16, G), np.float32)
    L = np.empty((16, G), np.int32)
    la = np.empty((16, G), np.float32)
    lane = np.empty((8, G), np.float32)
    scales = np.empty(G, np.float32)
    Ls = np.empty(256, np.int64)
    q = np.empty(256, np.int64)
    sc = np.empty(16, np.int64)
    N = blocks.shape[0]
    for b0 in range(0, N, _BATCH):
        nb = min(_BATCH, N - b0)
        gn = nb * 16
        if q6:
            for t in range(nb):
                for j in range(16):
                    for i in range(16):
                        xt[i, t * 16 + j] = blocks[b0 + t, 16 * j + i]
            qx_lanes(xt, gn, 16, 32, L, la, scales, lane[0], lane[1], lane[2], lane[3], lane[4], lane[5], lane[6],
                     lane[7])
        for t in range(nb):
            b = b0 + t
            x = blocks[b]
            g0 = t * 16
            for j in range(16):
                if q6:
                    for i in range(16):
                        Ls[16 * j + i] = L[i, g0 + j]
                else:
                    scales[g0 + j] = q3(x, 16 * j, 16, 4, Ls)
                if not np.isfinite(scales[g0 + j]):
                    return 1
            amax, max_scale = first_absmax(scales, g0, 16)
            if q6:
                if amax < np.float32(1e-15):
                    for t2 in range(210):
                        out[b, t2] = 0
                    continue
                iscale = np.float32(-128.0) / max_scale
                dh = put_f16(out, b, 208, np.float32(1.0) / iscale)
                for j in range(16):
                    sc[j] = ((min(nearest_int(iscale * scales[g0 + j]), 127) + 128) & 0xFF) - 128  # int8 cast
                    out[b, 192 + j] = sc[j] & 0xFF
                lo_q, hi_q, off = -32, 31, 32
            else:
                if max_scale != 0:
                    iscale = np.float32(-32.0) / max_scale
                    for j in range(16):
                        l8 = ((nearest_int(iscale * scales[g0 + j]) + 128) & 0xFF) - 128  # int8_t l = nearest_int()
                        sc[j] = clamp(l8, -32, 31)
                    dh = put_f16(out, b, 108, np.float32(1.0) / iscale)
                else:
                    for j in range(16):
                        sc[j] = -32
                    dh = put_f16(out, b, 108, np.float32(0.0))
                for j in range(8):  # scales[12]: stored = sc + 32; low nibbles, then top two bits
                    out[b, 96 + j] = ((sc[j] + 32) & 0x0F) | (((sc[j + 8] + 32) & 0x0F) << 4)
                for j in range(4):
                    h = 0
                    for a in range(4):
                        h |= (((sc[4 * a + j] + 32) >> 4) & 3) << (2 * a)
                    out[b, 104 + j] = h
                lo_q, hi_q, off = -4, 3, 4
            if (dh & 0x7C00) == 0x7C00:
                return 1
            d = f16_value(dh)
            for j in range(16):
                dj = d * np.float32(sc[j])
                for i in range(16 * j, 16 * j + 16):
                    q[i] = Ls[i] if dj == 0 else clamp(nearest_int(x[i] / dj), lo_q, hi_q) + off
            _pack_symmetric(out, b, q, q6)
    return 0


@register_jitable
def _pack_symmetric(out, b, q, q6):
    """Codes ``q[:256]`` of super-block ``b`` -> Q6_K ``ql`` / ``qh`` or Q3_K ``hmask`` / ``qs`` bytes."""
    if q6:
        for h in range(2):
            for lo in range(32):
                e = 128 * h + lo
                out[b, 64 * h + lo] = (q[e] & 0x0F) | ((q[e + 64] & 0x0F) << 4)
                out[b, 64 * h + 32 + lo] = (q[e + 32] & 0x0F) | ((q[e + 96] & 0x0F) << 4)
                out[b, 128 + 32 * h + lo] = ((q[e] >> 4) | ((q[e + 32] >> 4) << 2) | ((q[e + 64] >> 4) << 4)
                                             | ((q[e + 96] >> 4) << 6)) & 0xFF
        return
    for j in range(32):  # hmask[32]: bit k of byte j = bit 2 of element 32k + j
        h = 0
        for k in range(8):
            h |= ((q[32 * k + j] >> 2) & 1) << k
        out[b, j] = h
    for h in range(2):  # qs[64] at 32: 2-bit crumbs as Q2_K
        for lo in range(32):
            e = 128 * h + lo
            out[b, 32 + 32 * h + lo] = ((q[e] & 3) | ((q[e + 32] & 3) << 2) | ((q[e + 64] & 3) << 4)
                                        | ((q[e + 96] & 3) << 6))


_KQUANT_SIZES = {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def encode_kquant_blocks(type_name: str, blocks: np.ndarray) -> tuple[np.ndarray, int]:
    """``blocks`` (N, 256) float32 C-contiguous, finite -> ``(bytes (N, type_size) uint8, flag)``;
    flag 1: encode these blocks with numpy instead (a scale overflowed float16 or went non-finite)."""
    out = np.empty((blocks.shape[0], _KQUANT_SIZES[type_name]), dtype=np.uint8)
    if type_name in ("Q3_K", "Q6_K"):
        flag = _symmetric_kquant(blocks, type_name == "Q6_K", out)
    else:
        flag = _affine_kquant(blocks, type_name == "Q5_K", type_name == "Q2_K", out)
    return out, int(flag)
