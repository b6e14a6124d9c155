"""A target format's own quantizer, called by the generic requantize for the types it defines.

Some formats define a quantized type by its reference quantizer, not only by its layout: a GGUF
``Q4_0`` tensor is what llama.cpp's ``quantize_row_q4_0_ref`` makes of the float values (gguf-py
``gguf.quants.quantize``), with its own scale rule and rounding. Such a format's handler carries a
:class:`FormatQuantizer` (``FormatHandler.quantizer``, made in its module in
``converter/formats/``); the requantize operation takes it from the ``--to`` format's handler and
passes it to
:func:`converter.quant.requant.requantize`, which then

1. lets it ``adapt`` every resolved target scheme / group map to the format's own conventions
   (or refuse a request the format cannot meet), before any data moves, and
2. on the lossy route, for the targets it ``accepts``, calls its ``quantize`` instead of the
   generic round-to-nearest: :func:`quantize_with` feeds it the source's float32 dequantized values
   row block by row block and sums the error report's figures in the same blocks.

Nothing in this module knows a format.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from converter.groups import Granularity, GroupMap
from converter.kernels.blas import blas_threads
from converter.kernels.error_sums import ErrorSums
from converter.kernels import rtn
from converter.kernels.dequant import block_rows
from converter.kernels.threads import kernel_threads, run_rows
from converter.quant.result import RequantResult
from converter.rows import Rows
from converter.runtime import drop_pages
from converter.scheme import QuantScheme
from converter.tensor import DoubleQuant, QuantizedTensor, TensorSpec, spec_of

__all__ = ["FormatQuantizer", "quantize_with", "QuantizedRows", "streamable", "STREAM_ELEMENTS"]


@dataclass(frozen=True)
class FormatQuantizer:
    """A format's quantizer for the target schemes it defines.

    Attributes
    ----------
    format : str
        Registry name of the format (``--to`` name).
    adapt : callable(scheme, group_map, target) -> (scheme, group_map)
        The format's form of a resolved target (:func:`converter.quant.requant.resolve`); raises a
        :class:`~converter.errors.NotRepresentableError` naming the option when the request cannot
        be met in the format. Called from specs only (no data).
    accepts : callable(scheme, group_map, shape, axes) -> str or None
        A label of the quantizer used (e.g. the reference function) when ``quantize`` produces
        this adapted target for a tensor of logical ``shape`` / ``axes``; None: the generic
        round-to-nearest applies.
    quantize : callable(values, scheme, group_map, axes, name) -> QuantizedTensor
        ``values`` float32 of logical shape (2-D: a block of consecutive ``out`` rows); the result
        has exactly ``scheme`` and ``group_map`` (what :meth:`adapt` returned). Rows must be
        quantized independently of each other (a block of rows gives the rows of the whole).
    stored : callable(QuantizedTensor) -> QuantizedTensor, optional
        The same values in the form the format's reader returns them (e.g. a group-128 scale
        repeated over the format's 32-element blocks); the read-back check digests this form.
        None: the tensor as written.
    same_type : callable(spec_or_tensor, scheme, group_map) -> bool or None, optional
        For a target the format's quantizer alone defines (a type whose parameters are not a
        grid qckpt can carry into, e.g. GGUF's K-quant super-blocks): True when the source is
        stored in exactly that type (kept as it is: the exact route), False when it must be
        requantized by ``quantize`` (no generic carry); None: the generic exact route applies.
    """

    format: str
    adapt: Callable[..., tuple[Any, Any]]
    accepts: Callable[..., Optional[str]]
    quantize: Callable[..., Any]
    stored: Optional[Callable[[Any], Any]] = None
    same_type: Optional[Callable[..., Optional[bool]]] = None


def _concat_rows(parts: Sequence[QuantizedTensor]) -> QuantizedTensor:
    """One QuantizedTensor from blocks of consecutive ``out`` rows of a 2-D ``(out, in)`` tensor."""
    p0 = parts[0]
    if len(parts) == 1:
        return p0

    def cat(name: str) -> np.ndarray | None:
        arrs = [getattr(p, name) for p in parts]
        return None if arrs[0] is None else np.concatenate(arrs, axis=0)
    dq = p0.double_quant
    if dq is not None:  # two-level scales (GGUF K-quants): the per-row records joined the same way
        def cat_dq(field: str) -> np.ndarray | None:
            arrs = [getattr(p.double_quant, field) for p in parts]
            return None if arrs[0] is None else np.concatenate(arrs, axis=0)
        dq = DoubleQuant(dq.kind, dq.super_block, cat_dq("super_scales"), cat_dq("sub_scales"),
                         cat_dq("super_mins"), cat_dq("sub_mins"))
    return QuantizedTensor(p0.name, p0.axes, cat("codes"), cat("scales"), p0.scheme, p0.group_map,
                           zero_points=cat("zero_points"), double_quant=dq, stored={})


def _degenerate(x: np.ndarray, group_map: GroupMap, axes: Sequence[str]) -> int:
    """Groups whose values are all zero."""
    return int(np.count_nonzero(group_map.reduce(np.abs(x), np.maximum, axes) == 0))


def quantize_with(fq: FormatQuantizer, t: "QuantizedTensor | np.ndarray", scheme: QuantScheme, group_map: GroupMap,
                  *, axes: Sequence[str] | None = None, name: str | None = None) -> RequantResult:
    """Requantize QuantizedTensor ``t`` with the format quantizer ``fq`` to ``scheme`` / ``group_map``.

    ``t`` may also be the float32 values of a float source tensor (an ndarray; then ``axes`` and
    ``name`` are given): the quantizer sees them as they are.

    The quantizer sees the source's float32 dequantized values in logical orientation. A 2-D
    ``(out, in)`` tensor with row-local groups (:meth:`converter.groups.GroupMap.row_local`) is
    produced in row blocks (source rows dequantized on demand, :class:`converter.rows.Rows`;
    ranges of rows on the kernel threads) and each block's error against the source is summed
    while both are in cache (:class:`~converter.kernels.error_sums.ErrorSums`, figures
    independent of the blocking); any other tensor is quantized whole and compared afterwards.

    Returns
    -------
    RequantResult
        Route ``"requantized"``, ``degenerate_groups``, and ``vs_source`` (the summed figures)
        or ``values`` (the source values, for :func:`~converter.quant.error_report.tensor_report`).
    """
    shape = tuple(int(s) for s in t.shape)
    axes = tuple(axes if axes is not None else t.axes)
    name = name if name is not None else t.name
    if not (len(shape) == 2 and shape[0] * shape[1] and group_map.row_local(axes)):
        x = np.asarray(t, dtype=np.float32) if isinstance(t, np.ndarray) else t.dequantize()
        return RequantResult(fq.quantize(x, scheme, group_map, axes, name), "requantized",
                             degenerate_groups=_degenerate(x, group_map, axes), values=x)
    stream = QuantizedRows(fq, t, scheme, group_map, axes=axes, name=name)
    out = _concat_rows([q for _, q in stream])
    return stream.result(out)


def spec_of_rows(block: QuantizedTensor, rows: int) -> TensorSpec:
    """:func:`~converter.tensor.spec_of` of the 2-D ``(out, in)`` tensor of ``rows`` rows whose first row block
    is ``block`` (parameters per row: every stored array's outer axis is ``rows`` long), never built whole."""
    part = spec_of(block)
    n = int(block.shape[0])
    whole = []
    for a in part.stored:
        shape = (int(rows), *a.shape[1:])
        size = int(np.prod(shape, dtype=np.int64))
        if a.role == "codes":
            nbytes = -(-size * block.scheme.bits // 8)
        elif a.shape and a.shape[0] == n:
            nbytes = size * (a.nbytes // max(1, int(np.prod(a.shape, dtype=np.int64))))
        else:
            raise ValueError(f"{block.name}: stored {a.role} does not run along the rows")
        whole.append(dataclasses.replace(a, shape=shape, nbytes=nbytes))
    return dataclasses.replace(part, shape=(int(rows), *part.shape[1:]), stored=tuple(whole))


#: Elements per block a :class:`QuantizedRows` stream yields (about; whole quantizer blocks per kernel thread).
STREAM_ELEMENTS = 1 << 20


def streamable(shape: Sequence[int], group_map: GroupMap, axes: Sequence[str]) -> bool:
    """True when :class:`QuantizedRows` takes a tensor of logical ``shape`` / ``axes`` quantized over ``group_map``:
    2-D ``(out, in)``, not empty, groups within rows (no ``g_idx``, not one group for the whole tensor)."""
    return (len(shape) == 2 and int(shape[0]) * int(shape[1]) > 0 and group_map.row_local(tuple(axes))
            and group_map.granularity in (Granularity.GROUP, Granularity.CHANNEL) and group_map.g_idx is None)


class QuantizedRows:
    """``fq``'s quantization of a 2-D ``(out, in)`` tensor produced as row blocks in row order, never whole.

    Iterating yields ``(r0, block)``: ``block`` the QuantizedTensor of rows ``r0 : r0 + block.shape[0]``
    (about :data:`STREAM_ELEMENTS` elements; the rows of the whole, since the quantizer quantizes rows
    independently), each made from the source's float32 values of those rows only (source rows
    dequantized on demand, :class:`converter.rows.Rows`; the quantizer's blocks of a stream block on the
    kernel threads) while the error report's figures are summed over the same rows
    (:class:`~converter.kernels.error_sums.ErrorSums`, independent of the blocking). After the last block,
    :meth:`result` gives the :class:`RequantResult` (the figures, the degenerate groups), whose tensor is
    the whole result's :class:`~converter.tensor.TensorSpec` (:meth:`spec`) unless one is passed.

    Parameters
    ----------
    fq : FormatQuantizer
    t : QuantizedTensor or ndarray
        The source (an ndarray: a float tensor's values, ``axes`` and ``name`` given; a memory map's
        pages are released after each block, :func:`converter.runtime.drop_pages`).
    scheme, group_map : the adapted target (:func:`streamable` must hold).
    figures : False: the blocks only, no error figures (nor :meth:`result`), for a caller that reads values.
    """

    def __init__(self, fq: FormatQuantizer, t: "QuantizedTensor | np.ndarray", scheme: QuantScheme,
                 group_map: GroupMap, *, axes: Sequence[str] | None = None, name: str | None = None,
                 figures: bool = True) -> None:
        self.fq, self.t, self.scheme, self.group_map = fq, t, scheme, group_map
        self.shape = tuple(int(s) for s in t.shape)
        self.axes = tuple(axes if axes is not None else t.axes)
        self.name = name if name is not None else t.name
        rows, n = self.shape
        self.sums = ErrorSums(rows, n, group_map.group_size if group_map.granularity is Granularity.GROUP else None,
                              per_tensor=group_map.granularity is Granularity.TENSOR) if figures else None
        self.degenerate = 0
        self.rows_done = 0
        self._first: QuantizedTensor | None = None

    def __iter__(self) -> Iterator[tuple[int, QuantizedTensor]]:
        fq, scheme, group_map, axes, name = self.fq, self.scheme, self.group_map, self.axes, self.name
        rows, n = self.shape
        values = Rows(self.t)
        step = max(1, min(block_rows(n, rtn.QUANT_BLOCK_ELEMENTS), values.step))
        threads = kernel_threads(rows * n)
        per_chunk = max(step * threads, block_rows(n, STREAM_ELEMENTS) // step * step)

        def work(c0: int, a: int, b: int) -> tuple[list[QuantizedTensor], int, ErrorSums]:
            """Rows ``c0 + a : c0 + b`` with this thread's own value cache, buffer and error sums."""
            vals = values if a == 0 else values.fork()
            part = None if self.sums is None else self.sums if a == 0 else self.sums.part()
            ebuf = np.empty((step, n), dtype=np.float32) if part is not None else None
            pieces, degenerate = [], 0
            for r0 in range(c0 + a, c0 + b, step):
                r1 = min(c0 + b, r0 + step)
                x = vals[r0:r1]
                q = fq.quantize(x, scheme, group_map, axes, name)
                if part is not None:
                    part.add(r0, x, q.dequantize(), ebuf[:r1 - r0])
                    degenerate += _degenerate(x, group_map, axes)
                pieces.append(q)
            return pieces, degenerate, part

        for c0 in range(0, rows, per_chunk):
            c1 = min(rows, c0 + per_chunk)
            with blas_threads():  # the error sums' products: one BLAS thread per row range
                parts = run_rows(lambda a, b, c0=c0: work(c0, a, b), c1 - c0, step, threads)
            for _, _, part in parts[1:]:
                if part is not None:
                    self.sums.absorb(part)
            self.degenerate += sum(d for _, d, _ in parts)
            block = _concat_rows([q for pieces, _, _ in parts for q in pieces])
            del parts
            if isinstance(self.t, np.ndarray):
                drop_pages(self.t)  # (a memory map: the rows read are not kept resident)
            if self._first is None:
                self._first = block
            self.rows_done = c1
            yield c0, block

    def spec(self) -> TensorSpec:
        """The whole result's spec (:func:`converter.tensor.spec_of` of the tensor the blocks form)."""
        if self._first is None:
            raise ValueError("QuantizedRows: no block produced yet")
        return spec_of_rows(self._first, self.shape[0])

    def result(self, tensor: "QuantizedTensor | None" = None) -> RequantResult:
        """The RequantResult, after every block: ``tensor`` (the blocks joined) or else :meth:`spec`."""
        if self.rows_done != self.shape[0] or self.sums is None:
            raise ValueError(f"QuantizedRows: {self.rows_done} of {self.shape[0]} rows produced"
                             + ("" if self.sums is not None else " (made without figures)"))
        return RequantResult(tensor if tensor is not None else self.spec(), "requantized",
                             degenerate_groups=self.degenerate, vs_source=self.sums.figures())
