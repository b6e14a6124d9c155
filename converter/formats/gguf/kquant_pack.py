"""K-quant super-block byte layouts (``ggml-common.h`` ``block_q2_K`` ... ``block_q6_K``): fields -> bytes.

The inverse of :class:`converter.formats.gguf.block_kquants.KQuantCodec` ``decode``: codes in
element order, ``d`` / ``dmin`` fp16, integer sub-block scales and mins, packed as
``quantize_row_q*_K_ref`` stores them (``ggml/src/ggml-quants.c``), including the 6-bit scale
packing whose reader is ``get_scale_min_k4`` (Q4_K, Q5_K) and the 12-byte Q3_K scale layout.
Every function maps ``N`` super-blocks to ``(N, type_size)`` uint8.
"""

from __future__ import annotations

import numpy as np

from converter.formats.gguf.block_fields import f16_bytes

__all__ = ["PACKERS", "pack_scale_min_k4", "pack_q3k_scales"]

U8 = np.uint8


def _crumbs(L: np.ndarray) -> np.ndarray:
    """2-bit codes ``(N, 256)`` -> ``qs[64]``: per 128-element half, byte ``l`` holds elements
    ``l, l+32, l+64, l+96`` in bits 0-1, 2-3, 4-5, 6-7."""
    N = L.shape[0]
    q = (L & U8(3)).reshape(N, 2, 4, 32)
    out = q[:, :, 0] | (q[:, :, 1] << U8(2)) | (q[:, :, 2] << U8(4)) | (q[:, :, 3] << U8(6))
    return out.reshape(N, 64)


def _nibbles64(L: np.ndarray) -> np.ndarray:
    """4-bit codes ``(N, 256)`` -> ``qs[128]``: per 64 elements, byte ``l`` = element ``l`` | element ``l+32`` << 4."""
    N = L.shape[0]
    q = (L & U8(0x0F)).reshape(N, 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << U8(4))).reshape(N, 128)


def _high_bits(L: np.ndarray, bit: int) -> np.ndarray:
    """``qh[32]`` (Q5_K; Q3_K ``hmask``): bit ``k`` of byte ``j`` = bit ``bit`` of element ``32k + j``."""
    N = L.shape[0]
    h = ((L >> U8(bit)) & U8(1)).reshape(N, 8, 32)  # (N, 2n + half, j)
    shifts = np.arange(8, dtype=U8)[None, :, None]
    return np.bitwise_or.reduce(h << shifts, axis=1).astype(U8)


def pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and mins ``(N, 8)`` -> ``scales[12]`` (the inverse of ``get_scale_min_k4``).

    ``j < 4``: ``s[j] = sc[j]``, ``s[j+4] = m[j]``; ``j >= 4``: ``s[j+4] = (sc[j] & 15) | (m[j] & 15) << 4``,
    and the top two bits of ``sc[j]`` / ``m[j]`` go to bits 6-7 of ``s[j-4]`` / ``s[j]``.
    """
    sc, m = sc.astype(U8), m.astype(U8)
    lo_s, hi_s = sc[:, :4], sc[:, 4:]
    lo_m, hi_m = m[:, :4], m[:, 4:]
    a = lo_s | ((hi_s >> U8(4)) << U8(6))
    b = lo_m | ((hi_m >> U8(4)) << U8(6))
    c = (hi_s & U8(0x0F)) | ((hi_m & U8(0x0F)) << U8(4))
    return np.concatenate([a, b, c], axis=1)


def pack_q3k_scales(stored: np.ndarray) -> np.ndarray:
    """Sixteen 6-bit values ``(N, 16)`` (scale + 32) -> ``scales[12]``: low nibble of value ``j`` in
    nibble ``j // 8`` of byte ``j % 8``; its top two bits at bits ``2*(j // 4)`` of byte ``8 + j % 4``."""
    v = stored.astype(U8)
    low = (v[:, :8] & U8(0x0F)) | ((v[:, 8:] & U8(0x0F)) << U8(4))
    hi = (v >> U8(4)).reshape(-1, 4, 4)  # [.., j // 4, j % 4]
    shifts = (2 * np.arange(4, dtype=U8))[None, :, None]
    high = np.bitwise_or.reduce(hi << shifts, axis=1).astype(U8)
    return np.concatenate([low, high], axis=1)


def _f16(v: np.ndarray) -> np.ndarray:
    return f16_bytes(np.asarray(v, dtype=np.float16).reshape(-1, 1)).reshape(-1, 2)


def pack_q2k(codes, d, dmin, sc, m) -> np.ndarray:
    """``block_q2_K``: ``scales[16]`` (sc | m << 4), ``qs[64]``, ``d``, ``dmin`` (84 bytes)."""
    scales = (sc.astype(U8) & U8(0x0F)) | (m.astype(U8) << U8(4))
    return np.concatenate([scales, _crumbs(codes), _f16(d), _f16(dmin)], axis=1)


def pack_q3k(codes, d, dmin, sc, m) -> np.ndarray:  # noqa: ARG001 - uniform signature
    """``block_q3_K``: ``hmask[32]``, ``qs[64]``, ``scales[12]``, ``d`` (110 bytes)."""
    hmask = _high_bits(codes, 2)
    stored = (sc.astype(np.int16) + 32).astype(U8)
    return np.concatenate([hmask, _crumbs(codes), pack_q3k_scales(stored), _f16(d)], axis=1)


def pack_q4k(codes, d, dmin, sc, m) -> np.ndarray:
    """``block_q4_K``: ``d``, ``dmin``, ``scales[12]``, ``qs[128]`` (144 bytes)."""
    return np.concatenate([_f16(d), _f16(dmin), pack_scale_min_k4(sc, m), _nibbles64(codes)], axis=1)


def pack_q5k(codes, d, dmin, sc, m) -> np.ndarray:
    """``block_q5_K``: ``d``, ``dmin``, ``scales[12]``, ``qh[32]``, ``qs[128]`` (176 bytes)."""
    return np.concatenate([_f16(d), _f16(dmin), pack_scale_min_k4(sc, m), _high_bits(codes, 4),
                           _nibbles64(codes)], axis=1)


def pack_q6k(codes, d, dmin, sc, m) -> np.ndarray:  # noqa: ARG001 - uniform signature
    """``block_q6_K``: ``ql[128]``, ``qh[64]``, ``scales[16]`` (int8), ``d`` (210 bytes).

    Per 128-element half ``h``: ``ql[64h + l] = q[l] | q[l+64] << 4`` and ``ql[64h + 32 + l] =
    q[l+32] | q[l+96] << 4`` (low nibbles); ``qh[32h + l]`` holds the top two bits of
    ``q[l], q[l+32], q[l+64], q[l+96]``.
    """
    N = codes.shape[0]
    q = codes.reshape(N, 2, 4, 32)
    lo = q & U8(0x0F)
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << U8(4)), lo[:, :, 1] | (lo[:, :, 3] << U8(4))], axis=2)
    hi = q >> U8(4)
    qh = hi[:, :, 0] | (hi[:, :, 1] << U8(2)) | (hi[:, :, 2] << U8(4)) | (hi[:, :, 3] << U8(6))
    return np.concatenate([ql.reshape(N, 128), qh.reshape(N, 64), sc.astype(np.int8).view(U8), _f16(d)], axis=1)


PACKERS = {"Q2_K": pack_q2k, "Q3_K": pack_q3k, "Q4_K": pack_q4k, "Q5_K": pack_q5k, "Q6_K": pack_q6k}
"""``type_name -> pack(codes (N,256) uint8, d (N,) f16, dmin (N,) f16 | None, sc (N,k), m (N,k) | None)``."""
