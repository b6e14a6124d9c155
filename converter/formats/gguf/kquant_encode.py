"""llama.cpp's reference K-quant quantizers (no importance matrix) in numpy, bit-identical.

``quantize_row_q2_K_ref``, ``quantize_row_q3_K_ref``, ``quantize_row_q4_K_ref``,
``quantize_row_q5_K_ref`` and ``quantize_row_q6_K_ref`` of ``ggml/src/ggml-quants.c`` (llama.cpp as
vendored in llama-cpp-python 0.3.36; ``llama-quantize`` calls them through ``ggml_quantize_chunk``
when no imatrix is given), vectorised over super-blocks: the sub-block searches of
:mod:`converter.formats.gguf.kquant_search`, the 4/6-bit quantization of the sub-block scales
against the fp16 super-block scales ``d`` / ``dmin`` (``GGML_FP32_TO_FP16``: round to nearest
even, as numpy's float16 cast), and the final codes recomputed from the fp16-rounded scales.

:func:`quantize_kquant` returns the fields (:class:`~converter.formats.gguf.block_fields.BlockFields`
of one batch of super-blocks); :mod:`converter.formats.gguf.kquant_pack` lays them out as bytes.
"""

from __future__ import annotations

import numpy as np

from converter.formats.gguf.block_fields import QK_K
from converter.formats.gguf.kquant_search import (GROUP_MAX_EPS, make_q3_quants, make_qkx2_quants, make_qx_quants,
                                                  nearest_int)

__all__ = ["quantize_kquant", "KQuantBlocks"]

F32 = np.float32


class KQuantBlocks:
    """Fields of ``N`` super-blocks, element-major per sub-block as the searches use them.

    Attributes
    ----------
    codes : ndarray of uint8, shape (N, 256)
        Stored codes in element order (Q3_K 0..7, Q6_K 0..63, Q2_K 0..3, Q4_K 0..15, Q5_K 0..31).
    d : ndarray of float16, shape (N,)
        Super-block scale.
    dmin : ndarray of float16, shape (N,), or None
        Super-block min scale (Q2_K, Q4_K, Q5_K).
    sc : ndarray, shape (N, n_sub)
        Integer sub-block scales: uint8 (Q2_K 0..15, Q4_K/Q5_K 0..63), int8 (Q3_K -32..31, Q6_K).
    m : ndarray of uint8, shape (N, n_sub), or None
        Integer sub-block mins (Q2_K 0..15, Q4_K/Q5_K 0..63).
    """

    __slots__ = ("codes", "d", "dmin", "sc", "m")

    def __init__(self, codes, d, dmin, sc, m):
        self.codes, self.d, self.dmin, self.sc, self.m = codes, d, dmin, sc, m


def _sub_major(blocks: np.ndarray, n: int) -> np.ndarray:
    """``(N, 256)`` -> ``(n, N*256/n)``: element ``i`` of sub-block ``g`` (``g = N_index*k + j``) at ``[i, g]``."""
    return np.ascontiguousarray(blocks.reshape(-1, n).T)


def _elem_major_back(L: np.ndarray, N: int) -> np.ndarray:
    """Inverse of :func:`_sub_major` for codes: ``(n, G)`` -> ``(N, 256)``."""
    return np.ascontiguousarray(L.T).reshape(N, QK_K)


def _running_max(v: np.ndarray) -> np.ndarray:
    """``float m = 0; for j: if (v[j] > m) m = v[j];``: ``(N, k)`` -> ``(N,)``."""
    return np.maximum(v.max(axis=1), F32(0))


def _requant(x: np.ndarray, d: np.ndarray, dm: np.ndarray | None, L: np.ndarray, lo: int, hi: int,
             signed_offset: int) -> np.ndarray:
    """The final pass: ``l = nearest_int((x + dm)/d)`` (or ``x/d``) clamped to ``lo..hi``, plus
    ``signed_offset``, for sub-blocks whose ``d`` is non-zero; others keep ``L`` (C's ``continue``).

    ``x`` (n, G) float32, ``d``/``dm`` (G,) float32, ``L`` (n, G) uint8.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        num = x + dm[None, :] if dm is not None else x
        q = np.clip(nearest_int(num / d[None, :]), lo, hi) + signed_offset
    return np.where((d != 0)[None, :], q, L).astype(np.uint8)


def _affine(blocks: np.ndarray, n: int, nmax: int, rmin: float, rdelta: float, nstep: int,
            use_mad: bool, weights) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per sub-block ``make_qkx2_quants``: ``(x (n,G), scales (N,k), mins (N,k), L (n,G))``."""
    N = blocks.shape[0]
    x = _sub_major(blocks, n)
    w = weights(x)
    scale, the_min, L = make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep, use_mad)
    k = QK_K // n
    return x, scale.reshape(N, k), the_min.reshape(N, k), L


def _q4k_weights(x: np.ndarray) -> np.ndarray:
    """``av_x = sqrtf(sum_x2/32); weights[l] = av_x + fabsf(x[l])`` (Q4_K, Q5_K)."""
    sum_x2 = np.zeros(x.shape[1], dtype=F32)
    for row in x:
        sum_x2 += row * row
    av_x = np.sqrt(sum_x2 / F32(x.shape[0]))
    return av_x[None, :] + np.abs(x)


def _q45k(blocks: np.ndarray, nmax: int, rmin: float, nstep: int) -> KQuantBlocks:
    """``quantize_row_q4_K_ref`` (nmax 15, rmin -1, 20 steps) / ``quantize_row_q5_K_ref`` (31, -0.5, 15)."""
    N = blocks.shape[0]
    x, scales, mins, L = _affine(blocks, 32, nmax, rmin, 0.1, nstep, False, _q4k_weights)
    max_scale, max_min = _running_max(scales), _running_max(mins)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales).astype(np.uint8), np.uint8(63))
    lm = np.minimum(nearest_int(inv_min[:, None] * mins).astype(np.uint8), np.uint8(63))
    d = (max_scale / F32(63)).astype(np.float16)
    dmin = (max_min / F32(63)).astype(np.float16)
    dj = (d.astype(F32)[:, None] * ls.astype(F32)).reshape(-1)
    dmj = (dmin.astype(F32)[:, None] * lm.astype(F32)).reshape(-1)
    codes = _requant(x, dj, dmj, L, 0, nmax, 0)
    return KQuantBlocks(_elem_major_back(codes, N), d, dmin, ls, lm)


def _q2k(blocks: np.ndarray) -> KQuantBlocks:
    """``quantize_row_q2_K_ref``: 16-element sub-blocks, weights ``|x|``, 4-bit scales and mins."""
    N = blocks.shape[0]
    x, scales, mins, L = _affine(blocks, 16, 3, -0.5, 0.1, 15, True, np.abs)
    max_scale, max_min = _running_max(scales), _running_max(mins)
    q4 = F32(15)
    with np.errstate(divide="ignore"):
        iscale = q4 / max_scale
        imin = q4 / max_min
    with np.errstate(invalid="ignore", over="ignore"):
        ls = np.where((max_scale > 0)[:, None], nearest_int(iscale[:, None] * scales), 0)
        lm = np.where((max_min > 0)[:, None], nearest_int(imin[:, None] * mins), 0)
    packed = ((ls | (lm << 4)) & 0xFF).astype(np.uint8)  # y[i].scales[j] = l; |= l << 4 (uint8 stores)
    d = np.where(max_scale > 0, max_scale / q4, F32(0)).astype(np.float16)
    dmin = np.where(max_min > 0, max_min / q4, F32(0)).astype(np.float16)
    sc, m = packed & np.uint8(0x0F), packed >> np.uint8(4)
    dj = (d.astype(F32)[:, None] * sc.astype(F32)).reshape(-1)
    dmj = (dmin.astype(F32)[:, None] * m.astype(F32)).reshape(-1)
    codes = _requant(x, dj, dmj, L, 0, 3, 0)
    return KQuantBlocks(_elem_major_back(codes, N), d, dmin, sc, m)


def _q3k(blocks: np.ndarray) -> KQuantBlocks:
    """``quantize_row_q3_K_ref``: ``make_q3_quants`` per 16 elements, 6-bit signed scales against
    ``d = 1/iscale`` with ``iscale = -32/max_scale`` (``max_scale`` the scale of largest magnitude)."""
    N = blocks.shape[0]
    x = _sub_major(blocks, 16)
    scale, L = make_q3_quants(x, 4)
    scales = scale.reshape(N, 16)
    _, max_scale = _first_absmax_rows(scales)
    nz = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-32) / max_scale
        l8 = nearest_int(iscale[:, None] * scales).astype(np.int8)  # int8_t l = nearest_int(...)
    l6 = np.clip(l8.astype(np.int32), -32, 31) + 32
    with np.errstate(divide="ignore"):
        d = np.where(nz, F32(1) / iscale, F32(0)).astype(np.float16)
    # memset(scales, 0): with max_scale == 0 every stored 6-bit value is 0, i.e. sc = -32, but d = 0
    stored = np.where(nz[:, None], l6, 0)
    sc = (stored - 32).astype(np.int8)
    dj = (d.astype(F32)[:, None] * sc.astype(F32)).reshape(-1)
    codes = _requant(x, dj, None, L, -4, 3, 4)
    return KQuantBlocks(_elem_major_back(codes, N), d, None, sc, None)


def _first_absmax_rows(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``if (fabsf(v[j]) > amax) { amax = fabsf(v[j]); max = v[j]; }`` from 0 along axis 1."""
    av = np.abs(v)
    amax = av.max(axis=1)
    first = np.argmax(av == amax[:, None], axis=1)
    mx = np.take_along_axis(v, first[:, None], axis=1)[:, 0]
    return amax, np.where(amax > 0, mx, F32(0))


def _q6k(blocks: np.ndarray) -> KQuantBlocks:
    """``quantize_row_q6_K_ref``: ``make_qx_quants(16, 32)`` per sub-block, int8 scales against
    ``d = 1/iscale`` with ``iscale = -128/max_scale``; a block whose scales are all below
    ``GROUP_MAX_EPS`` is all zero bytes."""
    N = blocks.shape[0]
    x = _sub_major(blocks, 16)
    scale, L = make_qx_quants(x, 32)
    scales = scale.reshape(N, 16)
    amax, max_scale = _first_absmax_rows(scales)
    zero = amax < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-128) / max_scale
        d = np.where(zero, F32(0), F32(1) / iscale).astype(np.float16)
        sc = np.minimum(nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
    sc = np.where(zero[:, None], np.int8(0), sc)
    dj = (d.astype(F32)[:, None] * sc.astype(F32)).reshape(-1)
    codes = _elem_major_back(_requant(x, dj, None, L, -32, 31, 32), N)
    codes = np.where(zero[:, None], np.uint8(0), codes)  # memset(&y[i], 0, ...)
    return KQuantBlocks(codes, d, None, sc, None)


_QUANTIZERS = {
    "Q2_K": _q2k,
    "Q3_K": _q3k,
    "Q4_K": lambda b: _q45k(b, 15, -1.0, 20),
    "Q5_K": lambda b: _q45k(b, 31, -0.5, 15),
    "Q6_K": _q6k,
}


def quantize_kquant(type_name: str, blocks: np.ndarray) -> KQuantBlocks:
    """Quantize super-blocks with llama.cpp's ``quantize_row_<type>_ref``.

    Parameters
    ----------
    type_name : ``"Q2_K" | "Q3_K" | "Q4_K" | "Q5_K" | "Q6_K"``
    blocks : ndarray of float32, shape (N, 256)
        Finite values (the caller checks), one super-block per row.

    Returns
    -------
    KQuantBlocks
    """
    return _QUANTIZERS[type_name](np.ascontiguousarray(blocks, dtype=F32))
