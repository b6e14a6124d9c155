"""GGUF ``MXFP4`` (ggml type 39) and ``NVFP4`` (type 40) block codecs: E2M1 codes and their group-scale bytes.

Layouts (ggml ``ggml/src/ggml-common.h``, ggml-org/ggml d99724f2, 2026-08-21):

- ``block_mxfp4`` (17 bytes, 32 elements): ``e`` (one E8M0 byte), then ``qs[16]``.
- ``block_nvfp4`` (36 bytes, 64 elements = 4 groups of 16): ``d[4]`` (one UE4M3 byte per 16-element
  group), then ``qs[32]``, group ``s`` in ``qs[8s : 8s + 8]``.

**Nibble order: split, per group** (:data:`NIBBLE_ORDER`). In a group of ``G`` elements (32 MXFP4, 16
NVFP4) byte ``j`` holds element ``j`` in its low nibble and element ``j + G/2`` in its high nibble
(``dequantize_row_mxfp4``: ``y[j] = kvalues[qs[j] & 0xF]``, ``y[j + qk/2] = kvalues[qs[j] >> 4]``). This is
not the even-low order of compressed-tensors / ModelOpt / gpt-oss (element ``2j`` low, ``2j + 1`` high).

Values (``ggml-quants.c`` ``dequantize_row_mxfp4`` / ``dequantize_row_nvfp4``, ``ggml-impl.h``): ggml's
table ``kvalues_mxfp4`` is E2M1 **doubled** (0, 1, 2, 3, 4, 6, 8, 12, ...) and both scale decoders halve
(``ggml_e8m0_to_fp32_half(e) = 2^(e - 128)``, ``ggml_ue4m3_to_fp32(d) = E4M3(d) / 2``), so a value is
``E2M1[q] * 2^(e - 127)`` (the OCP E8M0 byte, as is) or ``E2M1[q] * E4M3(d)``; both products are exact in
float32, which is why the logical tensor (E2M1 codes, E8M0 / E4M3 scales) decodes to ggml's values
exactly; the one bit-level difference is the sign of zero: ggml's int8 table gives code 0x8 as +0.0,
E2M1 (and qckpt) as -0.0.

Scale bytes ggml's decode does not read as OCP E8M0 / E4M3 (refused here, :func:`check_scale_bytes`):
E8M0 ``0xFF`` (NaN; ``ggml_validate_row_data`` rejects it: "found invalid e value"), UE4M3 ``0x7F`` (ggml
decodes it as 0, E4M3 as NaN) and ``0x80..0xFF`` (ggml ignores the sign bit; llama.cpp's converter strips
it, ``_nvfp4_pack``: ``& 0x7F``).

Encoders: llama.cpp's reference quantizers ``quantize_row_mxfp4_ref`` / ``quantize_row_nvfp4_ref`` in
numpy, the same float32 operations: MXFP4 ``e = floor(log2(amax)) - 2 + 127`` (0 when ``amax == 0``), NVFP4
``d = fp32_to_ue4m3(amax / 6)`` (truncate-and-round-up mantissa, ``[256, 448]`` -> 0x7E, clamp at 448),
then each code the first index of least ``|kvalues[i] * d - x|`` (``best_index_mxfp4``). Checked byte for
byte against those C functions compiled from ggml (``tests/data/gguf_fp4/PROVENANCE.json``).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from converter.errors import FormatError, QuantizationError
from converter.formats.gguf.block_fields import BlockFields, block_view, join_nibbles, map_row_chunks, split_nibbles

__all__ = ["FP4Codec", "FP4_CODECS", "NIBBLE_ORDER", "KVALUES", "check_scale_bytes"]

#: How a group's codes sit in its bytes: ``"split"`` (element j low nibble, j + G/2 high nibble of byte j).
NIBBLE_ORDER = "split"
#: ``kvalues_mxfp4`` (``ggml-common.h`` ``kvalues_fp4``): E2M1 by code, doubled.
KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=np.float32)
#: E8M0 byte 0xFF (NaN), rejected by ``validate_e_e8m0``.
E8M0_NAN = 0xFF
#: Largest UE4M3 byte whose ggml decode equals the E4M3 value (0x7F decodes as 0, bit 7 is dropped).
UE4M3_MAX_BYTE = 0x7E


@dataclass(frozen=True)
class FP4Codec:
    """One FP4 ggml block type.

    Attributes
    ----------
    name : ``"MXFP4"`` or ``"NVFP4"``.
    group_size : elements per scale byte (32 / 16), along ``in``.
    groups_per_block : scale bytes per block (1 / 4); ``block_size = group_size * groups_per_block``.
    scale_dtype : logical scale dtype, ``"F8_E8M0"`` / ``"F8_E4M3"`` (the byte read as that type).
    """

    name: str
    group_size: int
    groups_per_block: int
    scale_dtype: str
    bits: int = 4
    code_offset: int = 0

    @property
    def block_size(self) -> int:
        return self.group_size * self.groups_per_block

    @property
    def type_size(self) -> int:
        return self.groups_per_block + self.block_size // 2

    @property
    def scale_np_dtype(self) -> np.dtype:
        return np.dtype(ml_dtypes.float8_e8m0fnu if self.scale_dtype == "F8_E8M0" else ml_dtypes.float8_e4m3fn)

    # -- storage <-> fields -------------------------------------------------------------------
    def decode(self, raw: np.ndarray) -> BlockFields:
        """``(rows, row_bytes)`` uint8 -> fields: ``codes`` uint8 E2M1 ``(rows, row_len)`` in element order,
        ``scales`` ``(rows, row_len / group_size)`` the scale bytes viewed as E8M0 / E4M3.

        Raises
        ------
        CorruptFileError
            A row that is not whole blocks.
        FormatError
            Scale bytes ggml does not decode as E8M0 / E4M3 (:func:`check_scale_bytes`).
        """
        blocks = block_view(raw, self.name, self.type_size)
        rows, nb, _ = blocks.shape
        n, g = self.groups_per_block, self.group_size
        scale_bytes = np.ascontiguousarray(blocks[..., :n]).reshape(rows, nb * n)
        check_scale_bytes(self.name, scale_bytes)
        qs = blocks[..., n:].reshape(rows, nb * n, g // 2)
        codes = split_nibbles(qs).reshape(rows, nb * self.block_size)
        return BlockFields(self.name, codes, scales=scale_bytes.view(self.scale_np_dtype))

    def pack(self, fields: BlockFields) -> np.ndarray:
        """Inverse of :meth:`decode`: fields -> ``(rows, row_bytes)`` uint8 (codes 0..15, one scale byte per group)."""
        codes = np.asarray(fields.codes, dtype=np.uint8)
        rows, row_len = codes.shape
        n, g = self.groups_per_block, self.group_size
        nb = row_len // self.block_size
        scale_bytes = np.ascontiguousarray(fields.scales).view(np.uint8).reshape(rows, nb, n)
        check_scale_bytes(self.name, scale_bytes)
        qs = join_nibbles(codes.reshape(rows, nb * n, g)).reshape(rows, nb, n * g // 2)
        return np.concatenate([scale_bytes, qs], axis=-1).reshape(rows, nb * self.type_size)

    # -- llama.cpp's reference quantizer ------------------------------------------------------
    def encode(self, values: np.ndarray) -> np.ndarray:
        """float ``(rows, row_len)`` -> block bytes ``(rows, row_bytes)``, as ``quantize_row_<type>_ref``.

        Raises
        ------
        QuantizationError
            ``row_len`` not a multiple of the block, non-finite input, or (MXFP4) a block whose absmax is
            below ``2^-125`` (llama.cpp's exponent ``floor(log2 amax) + 125`` would be negative: its uint8
            cast is undefined in C).
        """
        x = np.asarray(values, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] % self.block_size:
            raise QuantizationError(f"{self.name} rows are whole blocks of {self.block_size}", field="shape",
                                    expected=f"(rows, k * {self.block_size})", found=list(x.shape))
        if not np.isfinite(x).all():
            raise QuantizationError(f"{self.name} input is not finite", field="values", expected="finite",
                                    found="NaN/inf")
        rows, row_len = x.shape
        out = np.empty((rows, row_len // self.block_size * self.type_size), dtype=np.uint8)
        return map_row_chunks(out, row_len, lambda a, b: self._encode_rows(x[a:b]))

    def _encode_rows(self, x: np.ndarray) -> np.ndarray:
        rows, row_len = x.shape
        g = self.group_size
        groups = x.reshape(rows, row_len // g, g)
        amax = np.abs(groups).max(axis=-1)
        scale_bytes, d = (_mx_scale if self.name == "MXFP4" else _nv_scale)(amax)
        err = np.abs(KVALUES * d[..., None, None] - groups[..., None])  # (rows, ng, g, 16)
        codes = np.argmin(err, axis=-1).astype(np.uint8)  # first least error, as best_index_mxfp4
        fields = BlockFields(self.name, codes.reshape(rows, row_len), scales=scale_bytes.view(self.scale_np_dtype))
        return self.pack(fields)


def _mx_scale(amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_row_mxfp4_ref``: E8M0 byte ``floor(log2f(amax)) - 2 + 127`` (0 for amax 0) and
    ``d = ggml_e8m0_to_fp32_half(e)`` (``2^(e - 128)``, float32 bits ``0x00200000 << e`` below e = 2)."""
    with np.errstate(divide="ignore"):
        e = np.where(amax > 0, np.floor(np.log2(amax.astype(np.float32))) - np.float32(2) + np.float32(127),
                     np.float32(0))
    if (e < 0).any():
        raise QuantizationError("MXFP4 block absmax below 2^-125: llama.cpp's E8M0 exponent would be negative "
                                "(an undefined uint8 cast in quantize_row_mxfp4_ref)", field="values",
                                expected="block absmax 0 or >= 2^-125", found=float(amax[(e < 0)].max()))
    eb = e.astype(np.uint8)
    bits = np.where(eb < 2, np.uint32(0x00200000) << eb.astype(np.uint32),
                    (eb.astype(np.uint32) - np.uint32(1)) << np.uint32(23)).astype(np.uint32)
    return eb, bits.view(np.float32)


def _fp32_to_ue4m3(x: np.ndarray) -> np.ndarray:
    """``ggml_fp32_to_ue4m3`` (``ggml-impl.h``) on a float32 array: the UE4M3 byte."""
    x = np.minimum(np.asarray(x, dtype=np.float32), np.float32(448))
    bits = x.view(np.uint32)
    exp = ((bits >> 23) & 0xFF).astype(np.int32) - 127 + 7
    man = ((bits >> 20) & 0x7).astype(np.int32) + ((bits >> 19) & 1).astype(np.int32)
    carry = man > 7
    man = np.where(carry, 0, man)
    exp_r = np.where(carry, exp + 1, exp)
    normal = np.where((exp >= 15) | (exp_r >= 15), 0x7E, (exp_r << 3) | man)
    sub = (x * np.float32(512) + np.float32(0.5)).astype(np.int32)  # C (int) truncation; x >= 0 here
    sub = np.where(sub > 7, 7, np.where(sub < 1, 0, sub))
    out = np.where(exp <= 0, sub, normal)
    return np.where(x > 0, out, 0).astype(np.uint8)


def _ue4m3_half(b: np.ndarray) -> np.ndarray:
    """``ggml_ue4m3_to_fp32`` (E4M3 / 2; 0 for bytes 0 and 0x7F) as float32."""
    b = b.astype(np.int32)
    exp, man = (b >> 3) & 0xF, (b & 0x7).astype(np.float32)
    raw = np.where(exp == 0, np.ldexp(man, -9), np.ldexp(np.float32(1) + man / np.float32(8), exp - 7))
    return np.where((b == 0) | (b == 0x7F), np.float32(0), raw.astype(np.float32) * np.float32(0.5)).astype(np.float32)


def _nv_scale(amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_row_nvfp4_ref``: ``ue = ggml_fp32_to_ue4m3(amax / 6.0f)``, ``d = ggml_ue4m3_to_fp32(ue)``."""
    ue = _fp32_to_ue4m3(amax.astype(np.float32) / np.float32(6))
    return ue, _ue4m3_half(ue)


def check_scale_bytes(type_name: str, scale_bytes: np.ndarray) -> None:
    """Refuse scale bytes whose ggml decode is not the OCP E8M0 / E4M3 value (see the module docstring).

    Raises
    ------
    FormatError
        MXFP4 ``e == 0xFF``; NVFP4 ``d`` > 0x7E. Names the first offending (row, group) and byte.
    """
    b = np.asarray(scale_bytes).view(np.uint8)
    bad = b == E8M0_NAN if type_name == "MXFP4" else b > UE4M3_MAX_BYTE
    if not bad.any():
        return
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    if type_name == "MXFP4":
        raise FormatError("MXFP4 E8M0 scale byte 0xFF is NaN (ggml_validate_row_data rejects it)", field="e",
                          expected="0x00..0xFE", found=f"0xFF at (row, group) {where[:2]} ({int(bad.sum())} bytes)")
    raise FormatError("NVFP4 UE4M3 scale byte above 0x7E: ggml decodes 0x7F as 0 and ignores bit 7, so it is not "
                      "the E4M3 value", field="d", expected="0x00..0x7E",
                      found=f"0x{int(b[bad].flat[0]):02X} at (row, group) {where[:2]} ({int(bad.sum())} bytes)")


FP4_CODECS: dict[str, FP4Codec] = {
    "MXFP4": FP4Codec("MXFP4", 32, 1, "F8_E8M0"),
    "NVFP4": FP4Codec("NVFP4", 16, 4, "F8_E4M3"),
}
"""The FP4 codecs by ggml type name."""
