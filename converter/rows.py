"""Float32 values of a 2-D ``(out, in)`` tensor produced block by block, never whole."""

from __future__ import annotations

import numpy as np

from converter.groups import Granularity
from converter.layout import EXPERT, IN, OUT
from converter.tensor import QuantizedTensor, Tensor
from converter.tensor_rows import row_splittable, take_rows
from converter.values import RowPlan, row_plan

#: Elements per super-block when values are produced on demand (:class:`Rows`).
SUPER_ELEMENTS = 1 << 20


class Rows:
    """Float32 values of a 2-D ``(out, in)`` tensor produced block by block, never whole.

    ``Rows(t)`` dequantizes rows of a QuantizedTensor on demand (``take_rows(t, r0, r1)``; codes
    still packed are sliced as words), so a kernel reading it holds one super-block of floats at a
    time instead of the whole matrix. ``Rows(array)`` wraps an array. ``rows[r0:r1]`` returns
    float32 rows ``(r1 - r0, in)``; a one-block cache makes consecutive small reads inside a
    super-block cheap. The row kernels read it through ``shape``, ``dtype``, ``step``,
    ``[r0:r1]`` and :meth:`fork` (:class:`converter.kernels.rtn.RowSource`).

    ``reuse=True``: each super-block is dequantized into the same buffer, over the previous one's values (a
    reader that uses a block's rows before asking for the next block, as the row quantizers do, and keeps none:
    a million-value block is otherwise 4 MiB of new pages to zero).
    """

    def __init__(self, source: "Tensor | np.ndarray", *, reuse: bool = False) -> None:
        self.source = source
        self.reuse = reuse
        self._buf: np.ndarray | None = None
        self.shape = tuple(source.shape)
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.dtype = np.dtype(np.float32)
        self._lazy = not isinstance(source, np.ndarray)
        if self._lazy:
            self._lazy = row_splittable(source)
            if not self._lazy:
                self.source = source.dequantize()
        self._cache: tuple[int, int, np.ndarray] | None = None
        self.step = max(1, SUPER_ELEMENTS // max(1, self.shape[-1])) if self.shape else 1

    def fork(self) -> "Rows":
        """A reader of the same values with its own cache (one per thread)."""
        return Rows(self.source, reuse=self.reuse)

    def decode_plan(self, r0: int, r1: int) -> "RowPlan | None":
        """How rows ``r0:r1`` decode (:func:`converter.values.row_plan` of those rows: the arrays and
        formula ``self[r0:r1]`` dequantizes by), for a kernel that decodes them itself; None when
        the rows are not a row-local quantized ``(out, in)`` tensor's."""
        if not self._lazy or not isinstance(self.source, QuantizedTensor):
            return None
        return row_plan(take_rows(self.source, r0, r1))

    def array(self) -> np.ndarray:
        """All values at once (for whole-array fallbacks)."""
        return self.source.dequantize() if self._lazy else np.asarray(self.source, dtype=np.float32)

    def __getitem__(self, idx: slice) -> np.ndarray:
        if not isinstance(idx, slice) or idx.step not in (None, 1):
            raise TypeError("Rows supports [r0:r1] only")
        r0, r1, _ = idx.indices(self.shape[0])
        if not self._lazy:
            return np.asarray(self.source[r0:r1], dtype=np.float32)
        c = self._cache
        if c is None or not (c[0] <= r0 and r1 <= c[1]):
            b0 = r0
            b1 = max(r1, min(self.shape[0], b0 + self.step))
            c = (b0, b1, self._block(b0, b1))
            self._cache = c
        return c[2][r0 - c[0]:r1 - c[0]]


    def _block(self, b0: int, b1: int) -> np.ndarray:
        """Values of rows ``b0:b1``; with ``reuse``, of a row-local integer tensor, written over the previous
        block's (one buffer per reader: no new pages per block)."""
        part = take_rows(self.source, b0, b1)
        plan = row_plan(part) if self.reuse and isinstance(part, QuantizedTensor) else None
        if plan is None or plan.codebook is not None:  # (codebooks: dequantize's own, maybe compiled, route)
            return part.dequantize()
        shape = (b1 - b0, self.shape[1])
        if self._buf is None or self._buf.shape[0] < shape[0]:
            self._buf = np.empty((max(shape[0], self.step), shape[1]), dtype=np.float32)
        return plan.dequantize(out=self._buf[:shape[0]])


def values_of(source: "QuantizedTensor | np.ndarray | Rows") -> np.ndarray:
    """All float32 values of ``source`` at once."""
    if isinstance(source, Rows):
        return source.array()
    if isinstance(source, np.ndarray):
        return source
    return source.dequantize()


def pieces(t: QuantizedTensor, elements: int = SUPER_ELEMENTS):
    """``t`` as smaller tensors of the same kind whose values, taken in order, are ``t``'s: an
    ``(expert, out, in)`` stack expert by expert (each an ``(out, in)`` tensor), an ``(out, in)``
    tensor in row blocks of about ``elements`` (:func:`~converter.tensor_rows.take_rows`: block maps come
    back as row groups), anything else whole. For reductions (sums, maxima) that must not build a
    full-size temporary; each piece's scales / group map describe exactly its own values."""
    axes = tuple(t.axes)
    if (axes == (EXPERT, OUT, IN) and t.double_quant is None and t.group_map.granularity is not Granularity.FLAT_BLOCK
            and t.packed is None):
        for e in range(t.shape[0]):
            sub = QuantizedTensor(t.name, (OUT, IN), t.codes[e], t.scales[e], t.scheme, t.group_map,
                                  zero_points=None if t.zero_points is None else t.zero_points[e], stored={})
            yield from pieces(sub, elements)
        return
    if axes == (OUT, IN) and t.shape[0] and row_splittable(t):
        step = max(1, elements // max(1, t.shape[1]))
        if step >= t.shape[0]:
            yield t
            return
        for r0 in range(0, t.shape[0], step):
            yield take_rows(t, r0, min(t.shape[0], r0 + step))
        return
    yield t
