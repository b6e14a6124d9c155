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

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np

from converter.groups import Granularity, GroupMap
from converter.kernels.blas import blas_threads
from converter.kernels.error_sums import ErrorSums
from converter.kernels import rtn
from converter.kernels.dequant import block_rows
from converter.kernels.threads import kernel_threads, run_rows
from converter.quant.result import RequantResult
from converter.rows import Rows
from converter.scheme import QuantScheme
from converter.tensor import DoubleQuant, QuantizedTensor

__all__ = ["FormatQuantizer", "quantize_with"]


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
    rows, n = shape
    sums = ErrorSums(rows, n, group_map.group_size if group_map.granularity is Granularity.GROUP else None,
                     per_tensor=group_map.granularity is Granularity.TENSOR)
    values = Rows(t)
    step = max(1, min(block_rows(n, rtn.QUANT_BLOCK_ELEMENTS), values.step))

    def work(a: int, b: int) -> tuple[list[QuantizedTensor], int, ErrorSums]:
        """Rows ``a:b`` with this thread's own value cache, buffer and error sums."""
        vals = values if a == 0 else values.fork()
        part = sums if a == 0 else sums.part()
        ebuf = np.empty((step, n), dtype=np.float32)
        pieces, degenerate = [], 0
        for r0 in range(a, b, step):
            r1 = min(b, r0 + step)
            x = vals[r0:r1]
            q = fq.quantize(x, scheme, group_map, axes, name)
            part.add(r0, x, q.dequantize(), ebuf[:r1 - r0])
            degenerate += _degenerate(x, group_map, axes)
            pieces.append(q)
        return pieces, degenerate, part

    with blas_threads():  # the error sums' products: one BLAS thread per row range
        parts = run_rows(work, rows, step, kernel_threads(rows * n))
    for _, _, part in parts[1:]:
        sums.absorb(part)
    out = _concat_rows([q for pieces, _, _ in parts for q in pieces])
    return RequantResult(out, "requantized", degenerate_groups=sum(d for _, d, _ in parts), vs_source=sums.figures())
