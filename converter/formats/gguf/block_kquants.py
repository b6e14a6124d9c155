"""The K-quant ggml block codecs Q2_K..Q6_K (256-element super-blocks with quantized sub-block scales):
decode (``dequantize_row_q*_K`` of ``ggml-quants.c``), encode (llama.cpp's reference quantizers,
:mod:`converter.formats.gguf.kquant_encode`) and pack (:mod:`converter.formats.gguf.kquant_pack`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter.errors import QuantizationError
from converter.kernels.compiled import use_compiled
from converter.formats.gguf.block_fields import (BlockFields, QK_K, BIT_SHIFTS, CRUMB_SHIFTS, NIBBLE_SHIFTS,
                                                 block_view, f16_at, map_row_chunks, split_nibbles)


#: numpy time of one value's K-quant encode in plain numpy passes (about 100-300 ns against ~1): the
#: compiled kernel's size cut-over (:func:`converter.kernels.compiled.use_compiled`) weighs a call's
#: values by it, so the row blocks the requantize path hands over (2^17 values) take the compiled path.
NUMPY_COST = 64

# --------------------------------------------------------------------------------------------
# K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (256-element super-blocks)
# --------------------------------------------------------------------------------------------

def _unpack_q4k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack ``scales[12]`` of ``block_q4_K`` / ``block_q5_K`` (``get_scale_min_k4``).

    ``(..., 12)`` uint8 -> two ``(..., 8)`` uint8 arrays (6-bit scales, 6-bit mins). For ``j < 4``:
    ``sc = s[j] & 63``, ``m = s[j+4] & 63``; else ``sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4`` and
    ``m = (s[j+4] >> 4) | (s[j] >> 6) << 4``.
    """
    a, b, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    six = np.uint8(0x3F)
    sc = np.concatenate([a & six, (c & np.uint8(0x0F)) | ((a >> np.uint8(6)) << np.uint8(4))], axis=-1)
    mn = np.concatenate([b & six, (c >> np.uint8(4)) | ((b >> np.uint8(6)) << np.uint8(4))], axis=-1)
    return sc, mn


def _unpack_q3k_scales(s: np.ndarray) -> np.ndarray:
    """Unpack ``scales[12]`` of ``block_q3_K`` to sixteen signed scales (``dequantize_row_q3_K``).

    ``(..., 12)`` uint8 -> ``(..., 16)`` int8 in -32..31: the low 4 bits of scale ``i`` are nibble
    ``i // 8`` of byte ``i % 8``; the high 2 bits are bits ``2*(i // 4)`` of byte ``8 + i % 4``.
    """
    low = split_nibbles(s[..., 0:8])
    high = (s[..., None, 8:12] >> CRUMB_SHIFTS[:, None]) & np.uint8(3)
    high = high.reshape(*s.shape[:-1], 16)
    six = low | (high << np.uint8(4))
    return (six.astype(np.int16) - np.int16(32)).astype(np.int8)


def _crumbs(qs: np.ndarray, width: int) -> np.ndarray:
    """2-bit fields: ``(..., n*width)`` uint8 -> ``(..., n*4*width)``.

    Chunk ``c`` of ``width`` bytes gives 4 runs of ``width`` elements, run ``s`` = bits ``2s..2s+1``.
    """
    lead = qs.shape[:-1]
    chunks = qs.reshape(*lead, -1, 1, width)
    out = (chunks >> CRUMB_SHIFTS[:, None]) & np.uint8(3)
    return out.reshape(*lead, -1)


def _bit_planes(mask: np.ndarray) -> np.ndarray:
    """``(..., 32)`` uint8 -> ``(..., 256)``: element ``32*j + l`` = bit ``j`` of ``mask[l]``."""
    out = (mask[..., None, :] >> BIT_SHIFTS[:, None]) & np.uint8(1)
    return out.reshape(*mask.shape[:-1], 8 * mask.shape[-1])


def _nibble_chunks(qs: np.ndarray, width: int) -> np.ndarray:
    """4-bit fields: chunk ``c`` of ``width`` bytes gives its low nibbles then its high nibbles."""
    lead = qs.shape[:-1]
    chunks = qs.reshape(*lead, -1, 1, width)
    out = (chunks >> NIBBLE_SHIFTS[:, None]) & np.uint8(0x0F)
    return out.reshape(*lead, -1)


#: Super-blocks (256 weights each) decoded at once by :meth:`KQuantCodec.decode` (about 4 M weights).
DECODE_CHUNK_SUPER_BLOCKS = 1 << 14


@dataclass(frozen=True)
class KQuantCodec:
    """Codec for a ggml K-quant super-block type (``QK_K = 256``).

    Parameters
    ----------
    name : str
        ``"Q2_K"``, ``"Q3_K"``, ``"Q4_K"``, ``"Q5_K"`` or ``"Q6_K"``.
    bits : int
        Code width (2, 3, 4, 5, 6).
    type_size : int
        Bytes per super-block (84, 110, 144, 176, 210).
    sub_block_size : int
        Elements per sub-block (16 or 32).
    code_offset : int
        Implicit offset of the unsigned codes (4 for Q3_K, 32 for Q6_K, else 0).
    has_mins : bool
        Whether the type carries ``dmin`` and integer sub-block mins.

    Notes
    -----
    gguf-py (0.19.0) has no K-quant quantizer; :meth:`encode` is llama.cpp's reference one in numpy.
    """

    name: str
    bits: int
    type_size: int
    sub_block_size: int
    code_offset: int
    has_mins: bool
    block_size: int = QK_K

    def decode(self, raw: np.ndarray) -> BlockFields:
        """Split raw super-blocks into codes, super-block scales and sub-block scales/mins.

        Parameters
        ----------
        raw : ndarray of uint8, shape (rows, n_super * type_size)

        Returns
        -------
        BlockFields
            See :class:`BlockFields` for per-type dtypes and ranges.

        Raises
        ------
        CorruptFileError
            If ``raw`` is not ``(rows, k*type_size)`` uint8.
        """
        blocks = block_view(raw, self.name, self.type_size)
        rows, n_super, _ = blocks.shape
        # decoded in row chunks into the whole-tensor fields: the per-type unpacking makes several
        # temporaries the size of the codes, which for a 32000 x 4096 head were ~0.5 GB at once
        step = max(1, DECODE_CHUNK_SUPER_BLOCKS // max(1, n_super))
        outs = None
        for r0 in range(0, rows, step):
            parts = getattr(self, f"_decode_{self.name}")(blocks[r0:r0 + step])
            if outs is None:
                outs = [None if p is None else np.empty((rows, *p.shape[1:]), dtype=p.dtype) for p in parts]
            for o, p in zip(outs, parts):
                if o is not None:
                    o[r0:r0 + p.shape[0]] = p
        codes, d, dmin, sc, mn = outs
        n_sub = n_super * (QK_K // self.sub_block_size)
        return BlockFields(
            self.name, codes.reshape(rows, n_super * QK_K), super_scales=d, super_mins=dmin,
            sub_scales=sc.reshape(rows, n_sub), sub_mins=None if mn is None else mn.reshape(rows, n_sub),
            sub_block_size=self.sub_block_size)

    # Layout of each type, in byte order (ggml-common.h). Each returns
    # (codes (r, S, 256) uint8, d (r, S) f16, dmin (r, S) f16 | None, sc (r, S, k), mins (r, S, k) | None).

    @staticmethod
    def _decode_Q2_K(b: np.ndarray):
        """``block_q2_K``: ``scales[16]`` (lo nibble sc, hi nibble m), ``qs[64]``, ``d``, ``dmin``."""
        scales, qs = b[..., 0:16], b[..., 16:80]
        return (_crumbs(qs, 32), f16_at(b, 80), f16_at(b, 82),
                scales & np.uint8(0x0F), scales >> np.uint8(4))

    @staticmethod
    def _decode_Q3_K(b: np.ndarray):
        """``block_q3_K``: ``hmask[32]``, ``qs[64]``, ``scales[12]``, ``d``; q3 = low2 | hbit << 2."""
        hmask, qs, scales = b[..., 0:32], b[..., 32:96], b[..., 96:108]
        codes = _crumbs(qs, 32) | (_bit_planes(hmask) << np.uint8(2))
        return codes, f16_at(b, 108), None, _unpack_q3k_scales(scales), None

    @staticmethod
    def _decode_Q4_K(b: np.ndarray):
        """``block_q4_K``: ``d``, ``dmin``, ``scales[12]``, ``qs[128]`` (32-byte chunks, lo then hi)."""
        sc, mn = _unpack_q4k_scales(b[..., 4:16])
        return _nibble_chunks(b[..., 16:144], 32), f16_at(b, 0), f16_at(b, 2), sc, mn

    @staticmethod
    def _decode_Q5_K(b: np.ndarray):
        """``block_q5_K``: ``d``, ``dmin``, ``scales[12]``, ``qh[32]``, ``qs[128]``."""
        sc, mn = _unpack_q4k_scales(b[..., 4:16])
        codes = _nibble_chunks(b[..., 48:176], 32) | (_bit_planes(b[..., 16:48]) << np.uint8(4))
        return codes, f16_at(b, 0), f16_at(b, 2), sc, mn

    @staticmethod
    def _decode_Q6_K(b: np.ndarray):
        """``block_q6_K``: ``ql[128]``, ``qh[64]``, ``scales: int8[16]``, ``d`` (last).

        Per 128-element half ``h``: element ``r`` takes nibble ``r // 64`` of ``ql[64h + r % 64]`` and
        bits ``2*(r // 32)`` of ``qh[32h + r % 32]`` as its top two bits.
        """
        low = _nibble_chunks(b[..., 0:128], 64)
        high = _crumbs(b[..., 128:192], 32)
        scales = np.ascontiguousarray(b[..., 192:208]).view(np.int8)
        return low | (high << np.uint8(4)), f16_at(b, 208), None, scales, None

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Quantize float rows with llama.cpp's ``quantize_row_<type>_ref`` (no importance matrix).

        Bit-identical with ``ggml_quantize_chunk`` of llama.cpp (llama-cpp-python 0.3.36) without
        an imatrix, i.e. what ``llama-quantize`` writes (:mod:`converter.formats.gguf.kquant_encode`).

        Parameters
        ----------
        values : ndarray of float32, shape (rows, row_len)
            ``row_len`` a multiple of 256.

        Returns
        -------
        ndarray of uint8, shape (rows, row_len / 256 * type_size)

        Raises
        ------
        QuantizationError
            Row length not a multiple of 256, non-finite values, or a super-block scale that
            overflows fp16.
        """
        from converter.formats.gguf.kquant_encode import quantize_kquant
        from converter.formats.gguf.kquant_pack import PACKERS

        values = np.asarray(values, dtype=np.float32)
        if values.ndim != 2 or values.shape[1] % QK_K:
            raise QuantizationError(f"{self.name} rows must be a whole number of {QK_K}-element super-blocks",
                                    field="row_len", expected=f"multiple of {QK_K}",
                                    found=values.shape[-1] if values.ndim else None)
        rows, row_len = values.shape
        n_super = row_len // QK_K
        out = np.empty((rows, n_super * self.type_size), dtype=np.uint8)
        pack = PACKERS[self.name]
        compiled = use_compiled(values.size * NUMPY_COST)
        if compiled:
            from converter.formats.gguf.compiled_encode import encode_kquant_blocks

        def chunk(a: int, b: int) -> np.ndarray:
            x = values[a:b]
            if not np.isfinite(x).all():
                raise QuantizationError(f"{self.name} input is not finite (NaN/inf)", field="values",
                                        expected="finite", found="NaN/inf")
            if compiled:
                raw, deferred = encode_kquant_blocks(self.name, np.ascontiguousarray(x).reshape(-1, QK_K))
                if not deferred:  # else: a scale overflowed; numpy gives the reference bytes or error
                    return raw.reshape(x.shape[0], -1)
            f = quantize_kquant(self.name, x.reshape(-1, QK_K))
            for field, v in (("d", f.d), ("dmin", f.dmin)):
                if v is not None and not np.isfinite(v).all():
                    raise QuantizationError(f"{self.name} super-block scale {field} overflows float16",
                                            field=field, expected=f"|{field}| <= 65504", found="inf")
            return pack(f.codes, f.d, f.dmin, f.sc, f.m).reshape(x.shape[0], -1)
        return map_row_chunks(out, row_len, chunk)

    def pack(self, fields: BlockFields) -> np.ndarray:
        """Lay out decoded fields as super-block bytes (the inverse of :meth:`decode`).

        ``fields`` as :meth:`decode` returns them (``codes`` (rows, row_len), ``super_scales``
        (rows, n_super), ``sub_scales`` / ``sub_mins`` (rows, n_sub)). Returns uint8
        ``(rows, n_super * type_size)``.
        """
        from converter.formats.gguf.kquant_pack import PACKERS

        rows, row_len = fields.codes.shape
        per_row = row_len // QK_K
        n = rows * per_row
        k = QK_K // self.sub_block_size
        d = np.asarray(fields.super_scales, dtype=np.float16).reshape(n)
        dmin = None if fields.super_mins is None else np.asarray(fields.super_mins, dtype=np.float16).reshape(n)
        sc = np.asarray(fields.sub_scales).reshape(n, k)
        m = None if fields.sub_mins is None else np.asarray(fields.sub_mins).reshape(n, k)
        codes = fields.codes.reshape(n, QK_K)
        pack = PACKERS[self.name]

        def chunk(a: int, b: int) -> np.ndarray:  # rows a:b: the packers' temporaries stay chunk-sized
            s = slice(a * per_row, b * per_row)
            return pack(codes[s].astype(np.uint8, copy=False), d[s], None if dmin is None else dmin[s], sc[s],
                        None if m is None else m[s]).reshape(-1, per_row * self.type_size)
        out = np.empty((rows, per_row * self.type_size), dtype=np.uint8)
        return map_row_chunks(out, row_len, chunk)
