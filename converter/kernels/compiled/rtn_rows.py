"""The compiled twin of :func:`converter.kernels.rtn.quantize_rows` (the ``fast`` extra): the same
row blocks, threads and parameter formulas, with the per-element passes in the compiled kernels of
:mod:`converter.kernels.compiled.requant` (every result bit-identical: see there)."""

from __future__ import annotations

from typing import Any, Callable, TYPE_CHECKING

import numpy as np

from converter.errors import QuantizationError
from converter.kernels.blas import blas_threads
from converter.kernels.compiled.requant import codes_errors, decode_extrema, decode_source
from converter.kernels.dequant import block_rows
from converter.kernels.error_sums import ErrorSums
from converter.kernels.threads import kernel_threads, run_rows

if TYPE_CHECKING:  # (annotations only: converter.kernels.rtn calls this module)
    from converter.kernels.rtn import Grid, RowSource

__all__ = ["quantize_rows_compiled"]


def quantize_rows_compiled(values: "np.ndarray | RowSource", s: "Grid", *, group_size: int | None,
                           tensor: str | None, compare: ErrorSums | None, params_from_extrema: Callable[..., Any],
                           block_elements: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, int] | None:
    """:func:`converter.kernels.rtn.quantize_rows` by the compiled kernels: the same arguments,
    preconditions (checked by the caller) and results as ``(scales, zero_points, codes,
    degenerate_groups)`` (bit-identical; ``params_from_extrema`` and ``block_elements`` are the
    reference's own formulas and block size, passed in by it), or None where it returns None;
    ``compare`` receives the same sums (bit for bit). A row
    source offering ``decode_plan(r0, r1)`` (:class:`converter.rows.Rows` of a quantized tensor)
    whose codes decode bytewise is unpacked and dequantized inside the kernel; any other source
    gives its float32 rows."""
    rows, n = values.shape
    G = n if group_size is None else int(group_size)
    n_groups = -(-n // G)
    scales = np.empty((rows, n_groups), dtype=s.scale_np_dtype)
    zps = None if s.symmetric else np.empty((rows, n_groups), dtype=np.int16)
    codes = np.empty((rows, n), dtype=s.code_dtype)
    step = block_rows(n, block_elements)
    fork = getattr(values, "fork", None)
    if fork is not None:
        step = max(1, min(step, values.step))
    center = float(s.center)

    def work(a: int, b: int):
        vals = values if a == 0 or fork is None else fork()
        part = compare if a == 0 or compare is None else compare.part()
        planner = getattr(vals, "decode_plan", None)
        super_step = max(step, getattr(vals, "step", step))
        xbuf = np.empty((step, n), dtype=np.float32)
        ext = np.empty((2, step, n_groups), dtype=np.float32)
        if part is not None:
            bbuf = np.empty((step, n), dtype=np.float32)
            ebuf = np.empty((step, n), dtype=np.float32)
        plan, p0, p1 = None, 0, 0
        deg_total = 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for r0 in range(a, b, step):
                r1 = min(b, r0 + step)
                k = r1 - r0
                x = xbuf[:k]
                if planner is not None and not (p0 <= r0 and r1 <= p1):
                    p0, p1 = r0, min(rows, r0 + super_step)
                    plan = decode_source(planner(p0, p1), n)
                    if plan is None:
                        planner = None  # this source decodes through numpy
                if planner is not None:
                    lo, hi = r0 - p0, r1 - p0
                    src = (plan[0][lo:hi], plan[1], plan[2][lo:hi] if plan[2].shape[0] > 1 else plan[2],
                           plan[3][lo:hi] if plan[3].shape[0] > 1 else plan[3], plan[4], plan[5])
                else:
                    np.copyto(x, vals[r0:r1], casting="unsafe")
                    src = None
                hi_, lo_ = ext[0, :k], ext[1, :k]
                if not decode_extrema(x, src, G, s.symmetric, hi_, hi_, lo_):
                    return None  # a NaN / inf: the whole-array path says where
                extrema = {"amax": hi_} if s.symmetric else {"mx": hi_, "mn": lo_}
                got = params_from_extrema(s, tensor=tensor, **extrema)
                if got is None:
                    return None
                sc, z, deg = got
                deg_total += deg
                scales[r0:r1] = sc
                if zps is not None:
                    zps[r0:r1] = z
                s32 = np.ascontiguousarray(sc, dtype=np.float32)
                zf = None if z is None else np.ascontiguousarray(z, dtype=np.float32)
                bq, eq = (bbuf[:k], ebuf[:k]) if part is not None else (None, None)
                changed, worst = codes_errors(x, s32, zf, center if zf is None else 0.0, G, s.rounding, s.qmin,
                                              s.qmax, codes[r0:r1], bq, eq)
                if part is not None:  # the counts from the kernel, the sums by the reference's own code
                    part.changed += changed
                    part.max_abs = max(part.max_abs, worst)
                    part.add_sums(r0, x, bq, eq)
        return deg_total, part

    try:
        with blas_threads():  # the error sums' products: one BLAS thread per row range
            parts = run_rows(work, rows, step, kernel_threads(rows * n))
    except QuantizationError:
        return None
    if any(p is None for p in parts):
        return None
    degenerate = sum(p[0] for p in parts)
    for p in parts[1:]:
        if compare is not None:
            compare.absorb(p[1])
    if zps is not None:
        zps = zps.astype(s.code_dtype)
    return scales, zps, codes, degenerate
