"""GPTQ storage facts: bits, the ``qweight`` / ``qzeros`` / ``scales`` axis maps, and the v1 / v2 zero
conventions of ``qzeros`` (FORMATS.md section 1). See :mod:`converter.formats.gptq.format`.
"""

from __future__ import annotations


import numpy as np

from converter.layout import IN, OUT, AxisMap


FORMAT = "gptq"
SUPPORTED_BITS = (2, 3, 4, 8)
V1, V2 = "gptq", "gptq_v2"
#: Packed "+1 in every field" constant of GPTQModel's v1<->v2 conversion (int32 words).
V1_WORD_OFFSET = {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}
PARTS = ("qweight", "qzeros", "scales", "g_idx")
SCALE_DTYPES = ("F16", "BF16", "F32")
QCKPT_QUANTIZER = "qckpt"


# -- storage description -------------------------------------------------------------------------
def codes_map(bits: int) -> AxisMap:
    """``qweight``: stored ``(in, out)``, packed along ``in`` into int32 words (LSB-first stream)."""
    return AxisMap((IN, OUT), packed_axis=IN, bits=bits, container="I32", packing="stream")


def zeros_map(bits: int) -> AxisMap:
    """``qzeros``: stored ``(group, out)`` (the group axis is ``in``), packed along ``out``."""
    return AxisMap((IN, OUT), packed_axis=OUT, bits=bits, container="I32", packing="stream")


#: ``scales``: stored ``(group, out)``, i.e. transposed relative to the logical ``(out, group)``.
SCALES_MAP = AxisMap((IN, OUT))


def packed_rows(n: int, bits: int) -> int:
    """Words holding ``n`` ``bits``-bit fields: ``ceil(n * bits / 32)`` (GPTQModel sizing)."""
    return -(-n * bits // 32)


def decode_qzeros(words: np.ndarray, bits: int, n_out: int, *, v1: bool, v1_rule: str = "word") -> np.ndarray:
    """Unpack a ``qzeros`` array to logical zero points.

    Parameters
    ----------
    words : ndarray of int32, shape ``(nG, ceil(O*b/32))`` (stored axes ``(group, out)``)
    bits : int, one of 2, 3, 4, 8
    n_out : int, ``O``
    v1 : bool
        Stored values are ``z - 1`` (checkpoint_format ``"gptq"``).
    v1_rule : {"word", "field"}
        ``"word"``: add the packed constant to each word modulo 2^32, then unpack (GPTQModel
        ``convert_gptq_v1_to_v2_format_module``; 3-bit: per-field ``(f + 1) & 7``). ``"field"``:
        unpack, then ``(f + 1) & (2^b - 1)`` per field (AutoGPTQ ``QuantLinear.forward``).

    Returns
    -------
    ndarray of uint8, shape ``(O, nG)`` (logical ``(out, group)``).
    """
    amap = zeros_map(bits)
    sizes = {IN: words.shape[0], OUT: n_out}
    w = np.asarray(words).view(np.uint32)
    if v1 and v1_rule == "word" and bits in V1_WORD_OFFSET:
        w = w + np.uint32(V1_WORD_OFFSET[bits])  # uint32 arithmetic wraps modulo 2^32
        return amap.to_logical(w, (OUT, IN), sizes)
    z = amap.to_logical(w, (OUT, IN), sizes)
    if v1:
        z = ((z.astype(np.uint16) + 1) & ((1 << bits) - 1)).astype(np.uint8)
    return z


def encode_qzeros(zeros: np.ndarray, bits: int, *, v1: bool) -> np.ndarray:
    """Pack logical zero points ``(O, nG)`` (uint8, all >= 1 when ``v1``) into int32 ``(nG, ceil(O*b/32))``.

    v1 stores ``z - 1`` per field; with no zero equal to 0 this equals GPTQModel's word-level
    subtraction of the packed constant (no borrow).
    """
    z = zeros.astype(np.uint8)
    if v1:
        z = z - np.uint8(1)
    return zeros_map(bits).to_stored(z, (OUT, IN))
