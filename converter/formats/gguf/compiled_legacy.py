"""Compiled GGUF legacy block encoders (the ``fast`` extra): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, one 32-element block
per loop iteration, straight to bytes.

A second implementation of :meth:`LegacyCodec.encode <converter.formats.gguf.block_legacy.LegacyCodec.encode>` (the
numpy reference, bit-identical with gguf-py and llama.cpp's ``quantize_row_*_ref``): same float32 operations in
the same order, same byte layouts (``ggml-common.h``), **byte-identical output**
(``tests/formats/test_gguf_compiled_encode.py`` runs both on the same rows). The K-quant encoders and the shared
rules (flags instead of errors, the numpy path for the rare blocks) are in
:mod:`converter.formats.gguf.compiled_encode`.
"""

from __future__ import annotations

import numpy as np

from converter.kernels.compiled import jit
from numba.extending import register_jitable

from converter.formats.gguf.compiled_scalar import put_f16

__all__ = ["encode_legacy_blocks"]

_F16_MAX = np.float32(65504.0)

@register_jitable
def _finite_and_zero_signs(x):
    """``(all finite, holds +0.0, holds -0.0)`` of one 32-element block."""
    bad = 0
    plus_zero = False
    minus_zero = False
    for i in range(32):
        bad |= np.float32(x[i]).view(np.int32) & 0x7F800000 == 0x7F800000  # inf or NaN
    if bad:
        return False, False, False
    for i in range(32):
        if x[i] == 0:
            if np.signbit(x[i]):
                minus_zero = True
            else:
                plus_zero = True
    return True, plus_zero, minus_zero


@jit
def _q8_0(blocks, out):  # pragma: no cover - compiled (tests run it through numba)
    """Q8_0: ``d = amax / 127``, ``q = roundf(x / d)``; ``blocks`` (M, 32) -> ``out`` (M, 34). 1: defer."""
    for b in range(blocks.shape[0]):
        x = blocks[b]
        amax = np.float32(0.0)
        bad = 0
        for i in range(32):
            bad |= np.float32(x[i]).view(np.int32) & 0x7F800000 == 0x7F800000  # inf or NaN
            a = abs(x[i])
            amax = a if a > amax else amax
        if bad:
            return 1
        d = amax / np.float32(127.0)
        if not d <= _F16_MAX:
            return 1
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        if not np.isfinite(inv):  # d subnormal: numpy's casts of inf / NaN codes decide
            return 1
        put_f16(out, b, 0, d)
        for i in range(32):
            t = x[i] * inv
            a = abs(t)
            fl = np.floor(a)
            if a - fl >= np.float32(0.5):
                fl += np.float32(1.0)
            r = np.int32(fl)
            r = -r if t < 0 else r
            out[b, 2 + i] = min(max(r, -128), 127) & 0xFF
    return 0


@jit
def _q_0(blocks, bits, out):  # pragma: no cover - compiled
    """Q4_0 (``bits`` 4) / Q5_0 (5): ``d = mx / -2^(bits-1)`` with ``mx`` the first element of largest
    magnitude, ``q = min(2^bits - 1, trunc(x/d + 2^(bits-1) + 0.5))``. Returns 1 to defer to numpy."""
    off = 8 if bits == 4 else 16
    top = np.float32(15.0) if bits == 4 else np.float32(31.0)
    half = np.float32(off + 0.5)
    q = np.empty(32, np.int32)
    for b in range(blocks.shape[0]):
        x = blocks[b]
        bad = 0
        pmax = x[0]
        nmin = x[0]
        for i in range(32):
            bad |= np.float32(x[i]).view(np.int32) & 0x7F800000 == 0x7F800000  # inf or NaN
            pmax = x[i] if x[i] > pmax else pmax
            nmin = x[i] if x[i] < nmin else nmin
        if bad:
            return 1
        # the first element of largest magnitude: the max or the min, unless |max| == |min| (then scan)
        if pmax > -nmin:
            mx = pmax
        elif pmax < -nmin:
            mx = nmin
        else:
            k = 0
            while abs(x[k]) != pmax:
                k += 1
            mx = x[k]
        d = mx / np.float32(-off)
        if not abs(d) <= _F16_MAX:
            return 1
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        if not np.isfinite(inv):
            return 1
        put_f16(out, b, 0, d)
        if bits == 4:  # byte j: element j (low nibble) | element j + 16 (high nibble)
            for j in range(16):
                lo = x[j] * inv + half
                hi = x[j + 16] * inv + half
                out[b, 2 + j] = np.int32(top if lo > top else lo) | (np.int32(top if hi > top else hi) << 4)
            continue
        for i in range(32):
            t = x[i] * inv + half
            q[i] = np.int32(top if t > top else t)
        pos = 2
        if bits == 5:  # qh: bit j = bit 4 of element j
            for j in range(4):
                h = 0
                for t in range(8):
                    h |= ((q[8 * j + t] >> 4) & 1) << t
                out[b, 2 + j] = h
            pos = 6
        for j in range(16):
            out[b, pos + j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4)
    return 0


@jit
def _q_1(blocks, bits, out):  # pragma: no cover - compiled
    """Q4_1 (``bits`` 4) / Q5_1 (5): ``d = (max - min) / (2^bits - 1)``, ``m = min``,
    ``q = trunc((x - min)/d + 0.5)``. Returns 1 to defer to numpy."""
    top = 15 if bits == 4 else 31
    q = np.empty(32, np.int32)
    for b in range(blocks.shape[0]):
        x = blocks[b]
        finite, plus_zero, minus_zero = _finite_and_zero_signs(x)
        if not finite or (plus_zero and minus_zero):
            return 1
        mn = x[0]
        mx = x[0]
        for i in range(1, 32):
            mn = x[i] if x[i] < mn else mn
            mx = x[i] if x[i] > mx else mx
        d = (mx - mn) / np.float32(top)
        if not abs(mn) <= _F16_MAX or not abs(d) <= _F16_MAX:
            return 1
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        if not np.isfinite(inv):
            return 1
        for i in range(32):
            t = np.int32((x[i] - mn) * inv + np.float32(0.5))
            q[i] = top if t > top else t
        put_f16(out, b, 0, d)
        put_f16(out, b, 2, mn)
        pos = 4
        if bits == 5:
            for j in range(4):
                h = 0
                for t in range(8):
                    h |= ((q[8 * j + t] >> 4) & 1) << t
                out[b, 4 + j] = h
            pos = 8
        for j in range(16):
            out[b, pos + j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4)
    return 0


def encode_legacy_blocks(type_name: str, blocks: np.ndarray, type_size: int) -> tuple[np.ndarray, int]:
    """``blocks`` (M, 32) float32 C-contiguous -> ``(bytes (M, type_size) uint8, flag)``; flag 1: use numpy."""
    out = np.empty((blocks.shape[0], type_size), dtype=np.uint8)
    if type_name == "Q8_0":
        flag = _q8_0(blocks, out)
    elif type_name in ("Q4_0", "Q5_0"):
        flag = _q_0(blocks, int(type_name[1]), out)
    else:
        flag = _q_1(blocks, int(type_name[1]), out)
    return out, int(flag)
