"""The legacy ggml block codecs Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: decode, encode (llama.cpp's reference
quantization, bit-identical with ``gguf.quants.quantize``) and pack (``ggml-common.h`` layouts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter.errors import ErrorKind, QuantizationError
from converter.kernels.compiled import use_compiled
from converter.kernels.rounding import round_half_away
from converter.formats.gguf.block_fields import (BlockFields, block_view, check_f16_range,
                                                 f16_at, f16_bytes, join_nibbles,
                                                 map_row_chunks, split_nibbles)


#: numpy time of one value's encode in plain numpy passes (about 5-20 ns against ~1): the compiled
#: kernel's size cut-over (:func:`converter.kernels.compiled.use_compiled`) weighs a call's values by
#: it, so the row blocks the requantize path hands over (2^17 values) take the compiled path.
NUMPY_COST = 8

#: The legacy types, in the order of the codec registry (the types qckpt writes).
LEGACY_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")


# --------------------------------------------------------------------------------------------
# Legacy types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-element blocks)
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LegacyCodec:
    """Codec for a 32-element legacy ggml block type.

    Parameters
    ----------
    name : str
        ``"Q4_0"``, ``"Q4_1"``, ``"Q5_0"``, ``"Q5_1"`` or ``"Q8_0"``.
    bits : int
        Code width: 4, 5 or 8.
    affine : bool
        True for the ``_1`` types (float min ``m``), False for the symmetric ``_0`` types.

    Notes
    -----
    Byte layout per block (``ggml-common.h``): ``d: f16``, [``m: f16``], [``qh: u8[4]``],
    ``qs``. 4/5-bit: byte ``j`` of ``qs`` holds element ``j`` (low nibble) and ``j+16`` (high
    nibble); bit ``j`` of little-endian uint32 ``qh`` is the 5th bit of element ``j``.
    """

    name: str
    bits: int
    affine: bool
    block_size: int = 32

    @property
    def type_size(self) -> int:
        """Bytes per block (34, 18, 20, 22, 24)."""
        header = 4 if self.affine else 2
        qh = 4 if self.bits == 5 else 0
        qs = self.block_size if self.bits == 8 else self.block_size // 2
        return header + qh + qs

    @property
    def code_offset(self) -> int:
        """Implicit zero point subtracted from stored codes (8 Q4_0, 16 Q5_0, else 0)."""
        return 0 if (self.affine or self.bits == 8) else 1 << (self.bits - 1)

    @property
    def code_max(self) -> int:
        """Largest stored code (15, 31; 127 for the signed Q8_0)."""
        return 127 if self.bits == 8 else (1 << self.bits) - 1

    @property
    def code_min(self) -> int:
        """Smallest stored code (0; -128 for Q8_0)."""
        return -128 if self.bits == 8 else 0

    # ---- decode ------------------------------------------------------------------------

    def decode(self, raw: np.ndarray) -> BlockFields:
        """Split raw blocks into codes, scales and mins.

        Parameters
        ----------
        raw : ndarray of uint8, shape (rows, n_blocks * type_size)

        Returns
        -------
        BlockFields
            ``codes`` (rows, n_blocks*32) uint8 (int8 for Q8_0), ``scales`` (rows, n_blocks) float16,
            ``mins`` (rows, n_blocks) float16 for Q4_1/Q5_1 else None.

        Raises
        ------
        CorruptFileError
            If ``raw`` is not ``(rows, k*type_size)`` uint8.
        """
        blocks = block_view(raw, self.name, self.type_size)
        rows, n_blocks, _ = blocks.shape
        d = f16_at(blocks, 0)
        m = f16_at(blocks, 2) if self.affine else None
        pos = 4 if self.affine else 2
        if self.bits == 8:
            codes = np.ascontiguousarray(blocks[..., pos:]).view(np.int8)
        else:
            qh = blocks[..., pos:pos + 4] if self.bits == 5 else None
            pos += 4 if self.bits == 5 else 0
            codes = split_nibbles(blocks[..., pos:pos + 16])
            if qh is not None:
                high = np.unpackbits(qh, axis=-1, bitorder="little")
                codes = codes | (high << np.uint8(4))
        return BlockFields(self.name, codes.reshape(rows, n_blocks * self.block_size), scales=d, mins=m)

    # ---- encode / pack ------------------------------------------------------------------

    def _check_values(self, values: np.ndarray) -> np.ndarray:
        """Validate ``(rows, row_len)`` finite values; return them as float32 ``(rows, row_len)``."""
        values = np.asarray(values)
        if values.ndim != 2:
            raise QuantizationError(f"{self.name} encode needs a 2-D (rows, row_len) array",
                                    field="shape", expected="2-D", found=values.shape)
        rows, row_len = values.shape
        if row_len % self.block_size:
            raise QuantizationError(f"{self.name} row length is not a multiple of the block size",
                                    field="row_len", expected=f"multiple of {self.block_size}",
                                    found=row_len)
        return values.astype(np.float32, copy=False)

    @staticmethod
    def _inverse(d: np.ndarray) -> np.ndarray:
        """``1/d`` in float32 with ``id = 0`` where ``d == 0`` (all-zero blocks)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = np.float32(1.0) / d
        return np.where(d == 0, np.float32(0.0), inv).astype(np.float32)

    def encode(self, values: np.ndarray) -> np.ndarray:
        """Quantize float32 rows with llama.cpp's reference quantizer; bytes equal gguf-py's.

        Q8_0 (``quantize_row_q8_0_ref``): ``d = amax/127``, ``q = roundf(x/d)``.
        Q4_0/Q5_0 (``quantize_row_q4_0_ref``, ``_q5_0_ref``): ``d = mx / -2^(b-1)`` with ``mx`` the
        signed element of largest magnitude (first on ties), ``q = min(2^b-1, trunc(x/d + 2^(b-1)+0.5))``.
        Q4_1/Q5_1 (``quantize_row_q4_1_ref``, ``_q5_1_ref``): ``d = (max-min)/(2^b-1)``, ``m = min``,
        ``q = trunc((x-min)/d + 0.5)``. ``x/d`` is ``x * (1/d)`` in float32, with ``1/d := 0`` for ``d == 0``.

        Parameters
        ----------
        values : array_like of float, shape (rows, row_len)
            ``row_len`` a multiple of 32.

        Returns
        -------
        ndarray of uint8, shape (rows, row_len/32 * type_size)

        Raises
        ------
        QuantizationError
            Row length not a multiple of 32, non-finite values, or a scale/min that overflows float16.
        """
        values = self._check_values(values)
        rows, row_len = values.shape
        if use_compiled(values.size * NUMPY_COST):
            # the kernel needs no temporaries: one call on all rows, straight into the output; the
            # numpy path (below) when it defers (non-finite values, a scale outside float16, mixed
            # signed zeros: the reference bytes or error)
            from converter.formats.gguf.compiled_legacy import encode_legacy_blocks

            raw, deferred = encode_legacy_blocks(self.name, np.ascontiguousarray(values).reshape(-1, self.block_size),
                                                 self.type_size)
            if not deferred:
                return raw.reshape(rows, -1)
        out = np.empty((rows, row_len // self.block_size * self.type_size), dtype=np.uint8)
        return map_row_chunks(out, row_len, lambda a, b: self._encode_rows(values[a:b]))

    def _encode_rows_transposed(self, values: np.ndarray) -> np.ndarray:
        """Q4_0 / Q8_0 :meth:`encode` of one chunk with the blocks transposed to ``(32, n_blocks)``.

        Per-block reductions over 32 contiguous floats are slow in numpy (one short inner loop
        per block); on the transposed chunk they are 31 element-wise passes over long rows. The
        arithmetic is unchanged: Q8_0 ``amax = max|x|``; Q4_0 ``mx`` = the element of largest
        magnitude, taken from the block max / min, with the first-on-ties rule of
        ``quantize_row_q4_0_ref`` (and the sign of an all-zero block's first element) resolved by
        ``argmax`` on the few blocks where ``max == -min``. Q8_0's codes are then formed on the
        blocks as laid out (one byte per value: no nibble pairing that the transposed rows ease).
        """
        rows, row_len = values.shape
        blocks = values.reshape(-1, self.block_size)
        t = np.ascontiguousarray(blocks.T)  # (32, M)
        out = np.empty((blocks.shape[0], self.type_size), dtype=np.uint8)
        if self.bits == 8:
            self._q8_0_blocks(blocks, t, out)
            return out.reshape(rows, -1)
        pmax, nmin = t.max(axis=0), t.min(axis=0)
        mx = np.where(pmax > -nmin, pmax, nmin)
        tie = pmax == -nmin
        if tie.any():
            sub = blocks[tie]
            mx[tie] = sub[np.arange(sub.shape[0]), np.abs(sub).argmax(axis=1)]
        d = mx / np.float32(-self.code_offset)
        check_f16_range("d", d, self.name)
        t *= self._inverse(d)
        out[:, :2] = f16_bytes(d.astype(np.float16))
        t += np.float32(self.code_offset + 0.5)
        np.minimum(t, np.float32(self.code_max), out=t)  # in [0, 2^b + 0.5]: the cast truncates
        codes = t.astype(np.uint8)
        half = self.block_size // 2
        codes[half:] <<= np.uint8(4)
        codes[half:] |= codes[:half]
        out[:, 2:] = codes[half:].T
        return out.reshape(rows, -1)

    def _q8_0_blocks(self, blocks: np.ndarray, t: np.ndarray, out: np.ndarray) -> None:
        """Q8_0 blocks ``(M, 32)`` (float32; ``t`` their transposed copy, overwritten) into ``out``
        ``(M, 34)``: ``d = amax / 127``, ``q = roundf(x * (1/d))``, as :meth:`encode` states.

        The codes are formed on the blocks as laid out (one byte per value: a transposed store
        costs more than it saves). ``x / d`` is clipped to ``[-128, 127]`` before rounding, which
        gives the codes of rounding first (every value that rounds outside clips to the same end,
        and ``1/d = inf`` for a block of float32 subnormals gives the ends, as before), so the
        rounding sees finite values or NaN and runs as :func:`~converter.kernels.rounding.round_half_away`
        does (``trunc(q) - trunc(2 (trunc(q) - q))``) without its infinity guard."""
        np.abs(t, out=t)
        d = t.max(axis=0) / np.float32(127)
        check_f16_range("d", d, self.name)
        out[:, :2] = f16_bytes(d.astype(np.float16))
        q = blocks * self._inverse(d)[:, None]
        np.clip(q, -128, 127, out=q)
        tq = np.trunc(q)
        np.subtract(tq, q, out=q)  # minus the fraction, exact
        q *= 2
        np.trunc(q, out=q)  # -1, 0 or 1 (the fraction is at least one half in magnitude: away from zero)
        np.subtract(tq, q, out=tq)
        out[:, 2:] = tq.astype(np.int8).view(np.uint8)

    def _encode_rows(self, values: np.ndarray) -> np.ndarray:
        """:meth:`encode` on one chunk of shape-checked float32 rows."""
        if self.name in ("Q4_0", "Q8_0"):
            return self._encode_rows_transposed(values)
        rows, row_len = values.shape
        blocks = values.reshape(rows, row_len // self.block_size, self.block_size)
        d, mn = self._block_scales(blocks)
        inv = self._inverse(d)[..., None]
        if self.bits == 8:
            codes = np.clip(round_half_away(blocks * inv), -128, 127).astype(np.int8)
        elif self.affine:
            scaled = (blocks - mn[..., None]) * inv + np.float32(0.5)
            codes = np.clip(np.trunc(scaled), 0, self.code_max).astype(np.uint8)
        else:
            scaled = blocks * inv
            scaled += np.float32(self.code_offset + 0.5)
            # |x| <= |mx| puts x/d + off + 0.5 in [0, 2^b + 0.5]: trunc is the float -> uint8 cast
            # there, and only the upper clip can bite
            np.minimum(scaled, np.float32(self.code_max), out=scaled)
            codes = scaled.astype(np.uint8)
        mins = None if mn is None else mn.astype(np.float16)
        fields = BlockFields(self.name, codes.reshape(rows, -1), scales=d.astype(np.float16), mins=mins)
        return self.pack(fields)

    def _block_scales(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Reference scale ``d`` (and min ``m`` for ``_1`` types) per block, float32 ``(rows, n_blocks)``.

        Raises QuantizationError if a scale is not finite (NaN/inf input) or overflows float16.
        """
        mn = None
        if self.bits == 8:
            d = np.abs(blocks).max(axis=-1) / np.float32(127)
        elif self.affine:
            mn = blocks.min(axis=-1)
            d = (blocks.max(axis=-1) - mn) / np.float32(self.code_max)
            check_f16_range("m", mn, self.name)
        else:
            idx = np.abs(blocks).argmax(axis=-1)[..., None]
            mx = np.take_along_axis(blocks, idx, axis=-1)[..., 0]
            d = mx / np.float32(-self.code_offset)
        check_f16_range("d", d, self.name)
        return d, mn

    def _check_fields(self, fields: BlockFields) -> tuple[int, int]:
        """Check shapes, dtypes and code range of ``fields``; return ``(rows, n_blocks)``."""
        codes = fields.codes
        if codes.ndim != 2 or codes.shape[1] % self.block_size:
            raise QuantizationError(f"{self.name} codes must be (rows, k*{self.block_size})",
                                    field="codes", expected=f"(rows, multiple of {self.block_size})",
                                    found=codes.shape)
        rows, n_blocks = codes.shape[0], codes.shape[1] // self.block_size
        if codes.size and (int(codes.min()) < self.code_min or int(codes.max()) > self.code_max):
            raise QuantizationError(f"{self.name} codes out of range", field="codes",
                                    expected=f"{self.code_min}..{self.code_max}",
                                    found=f"{int(codes.min())}..{int(codes.max())}")
        wanted = {"scales": fields.scales, "mins": fields.mins if self.affine else None}
        for name, arr in wanted.items():
            if (name == "scales" or self.affine) and (arr is None or arr.shape != (rows, n_blocks)):
                raise QuantizationError(f"{self.name} {name} has the wrong shape", field=name,
                                        expected=(rows, n_blocks), found=getattr(arr, "shape", None),
                                        kind=ErrorKind.SHAPE)
        return rows, n_blocks

    def pack(self, fields: BlockFields) -> np.ndarray:
        """Write codes and float16 scales/mins as raw blocks; exact inverse of :meth:`decode`.

        Parameters
        ----------
        fields : BlockFields
            ``codes`` (rows, n_blocks*32) in ``code_min..code_max``; ``scales`` (and ``mins`` for the
            ``_1`` types) (rows, n_blocks), cast to float16 (pass float16 to keep them exact).

        Returns
        -------
        ndarray of uint8, shape (rows, n_blocks * type_size)

        Raises
        ------
        QuantizationError
            Codes out of range or arrays of the wrong shape.
        """
        rows, n_blocks = self._check_fields(fields)
        q = fields.codes.reshape(rows, n_blocks, self.block_size)
        parts = [f16_bytes(fields.scales.astype(np.float16))]
        if self.affine:
            parts.append(f16_bytes(fields.mins.astype(np.float16)))
        if self.bits == 8:
            parts.append(q.astype(np.int8).view(np.uint8))
        else:
            q = q.astype(np.uint8)
            if self.bits == 5:
                high = (q >> np.uint8(4)) & np.uint8(1)
                parts.append(np.packbits(high, axis=-1, bitorder="little"))
            parts.append(join_nibbles(q))
        out = np.concatenate(parts, axis=-1)
        return out.reshape(rows, n_blocks * self.type_size)
