"""The read-back digest of a tensor given in row blocks (:class:`RowDigest`): the same string as
:func:`converter.ops.readback.digest` of the whole tensor, never holding more than one block.

:func:`~converter.ops.readback.digest` is a CRC-32 over a header, the codes, the float32 scales and the
float32 zero points, in that order, or over the dequantized values when the zero points have no integer
form. Two of its choices depend on every value of the tensor: whether the float biases are integer zero
points (``as_integer_zero``: group by group), and whether every row's groups share the row's parameters
(then it digests per-channel parameters and says so in the header). A row stream cannot know either
before the last block, so :class:`RowDigest` keeps every candidate CRC while it can still be the answer
(codes, full and first-column scales and zero points, values when the biases may turn out float), each
chained over the blocks from zero, and joins the chosen ones at the end with :func:`crc32_combine` (zlib's
``crc32_combine``: the CRC of ``A + B`` from the CRCs of ``A`` and ``B`` and the length of ``B``).
"""

from __future__ import annotations

import numpy as np

from converter.kernels.crc32 import crc32
from converter.ops.code_crc import _canonical_signed, crc_codes, digest_parts
from converter.groups import Granularity
from converter.rows import Rows
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor

__all__ = ["RowDigest", "crc32_combine"]

_POLY = 0xEDB88320  # zlib's CRC-32 polynomial, reflected


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, m) for m in mat]


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """``crc32(A + B)`` from ``crc1 = crc32(A)``, ``crc2 = crc32(B)`` and ``len2 = len(B)``
    (zlib's ``crc32_combine``: ``crc1`` advanced over ``len2`` zero bytes by squaring the one-bit shift
    operator over GF(2), then xor ``crc2``)."""
    if len2 <= 0:
        return crc1
    op = [_POLY] + [1 << n for n in range(31)]  # the operator for one zero bit
    for _ in range(3):  # ... squared to 2, 4, 8 zero bits: one zero byte
        op = _gf2_square(op)
    while True:  # bit k of len2 applies the operator for 2^k zero bytes
        if len2 & 1:
            crc1 = _gf2_times(op, crc1)
        len2 >>= 1
        if not len2:
            return crc1 ^ crc2
        op = _gf2_square(op)


class _Chain:
    """A CRC-32 chained from zero over consecutive byte blocks, and their total length."""

    def __init__(self) -> None:
        self.crc, self.n = 0, 0

    def add(self, data) -> None:
        mv = memoryview(np.ascontiguousarray(data)).cast("B")
        self.crc = crc32(mv, self.crc)
        self.n += mv.nbytes


class RowDigest:
    """:func:`converter.ops.readback.digest` of a 2-D ``(out, in)`` QuantizedTensor fed as consecutive row
    blocks (:meth:`add`, in row order from row 0; each block a QuantizedTensor of the same scheme and group
    map, e.g. :func:`converter.tensor_rows.take_rows` pieces or a row quantizer's blocks), read with
    :meth:`hexdigest` after the last. Groups must run along rows (no ``g_idx``).

    Parameters
    ----------
    shape : ``(out, in)`` of the whole tensor; ``axes`` its logical axes.
    """

    def __init__(self, shape: tuple[int, int], axes: tuple[str, ...]) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.axes = tuple(axes)
        self.rows_seen = 0
        self.scheme = None  # the canonical scheme (of the first block), while the parameters path holds
        self.params_ok = True  # every block so far has integer (or no) zero points
        self.values: "int | None" = None  # the values CRC, kept while the biases may be float
        self.per_channel = True  # every block's groups share their row's parameters (so far)
        self.codes, self.scales, self.zps = _Chain(), _Chain(), _Chain()
        self.col_scales, self.col_zps = _Chain(), _Chain()
        self.zp_none = False
        self.groups = None

    def add(self, t: QuantizedTensor) -> None:
        """The next rows (``t.shape[0]`` of them, after those already added)."""
        if self.rows_seen == 0:
            self._start(t)
        self.rows_seen += int(t.shape[0])
        if self.values is not None:
            vals = Rows(t)
            for r0 in range(0, int(t.shape[0]), vals.step):
                self.values = crc32(memoryview(np.ascontiguousarray(vals[r0:r0 + vals.step])).cast("B"),
                                         self.values)
        if not self.params_ok:
            return
        parts = digest_parts(t)
        if parts is None:
            self.params_ok = False
            return
        scheme, zp, off, raw = parts
        if self.scheme is None:
            self.scheme = scheme
        elif scheme != self.scheme:  # (a scheme that changes between blocks cannot be one tensor's)
            raise ValueError("row blocks of one tensor have different schemes")
        self.codes.crc = crc_codes(raw, self.codes.crc, offset=off)
        self.codes.n += int(np.prod(raw.shape, dtype=np.int64))
        scales = np.asarray(t.scales, dtype=np.float32)
        zp = None if zp is None else np.asarray(zp, dtype=np.float32)
        self.zp_none = zp is None
        self.scales.add(scales)
        if zp is not None:
            self.zps.add(zp)
        if self.per_channel:
            if (scales.ndim == 2 and bool((scales == scales[:, :1]).all())
                    and (zp is None or bool((zp == zp[:, :1]).all()))):
                self.col_scales.add(scales[:, :1])
                if zp is not None:
                    self.col_zps.add(zp[:, :1])
            else:
                self.per_channel = False

    def _start(self, t: QuantizedTensor) -> None:
        gm = t.group_map
        if (gm.g_idx is not None or tuple(t.axes) != self.axes or len(self.shape) != 2
                or gm.granularity not in (Granularity.GROUP, Granularity.CHANNEL)):
            raise ValueError("RowDigest takes row blocks of a 2-D tensor whose groups run along its rows")
        self.groups = (gm.granularity.value, gm.axis, gm.group_size)
        self.per_channel = (gm.granularity is Granularity.GROUP and gm.axis == self.axes[-1])
        s = t.scheme
        if _canonical_signed(t) is None and (s.codebook is not None or s.zero_point is ZeroPoint.FLOAT):
            # the parameters may have no integer form (decided by every group): the values CRC too
            self.values = crc32(repr(self.shape).encode())

    def hexdigest(self) -> str:
        """The digest string, as :func:`converter.ops.readback.digest` gives it for the whole tensor."""
        if self.rows_seen != self.shape[0]:
            raise ValueError(f"RowDigest: {self.rows_seen} of {self.shape[0]} rows added")
        if not self.params_ok or self.scheme is None:
            if self.values is None:
                raise ValueError("RowDigest: no digest path holds")
            return f"v:{self.values:08x}"
        groups, scales, zps = self.groups, self.scales, self.zps
        if self.per_channel:
            groups, scales, zps = (Granularity.CHANNEL.value, self.axes[0], None), self.col_scales, self.col_zps
        head = repr((self.shape, self.axes, self.scheme, *groups)).encode()
        crc = crc32_combine(crc32(head), self.codes.crc, self.codes.n)
        crc = crc32_combine(crc, scales.crc, scales.n)
        if self.zp_none:  # (digest appends float32 of None: one NaN)
            crc = crc32(np.ascontiguousarray(None, dtype=np.float32).data, crc)
        else:
            crc = crc32_combine(crc, zps.crc, zps.n)
        return f"p:{crc:08x}"
