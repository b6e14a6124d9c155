"""The compiled twin of :func:`converter.kernels.rtn.quantize_rows` (the ``fast`` extra): the same
row blocks, threads and parameter formulas, with the per-element passes in the compiled kernels of
:mod:`converter.kernels.compiled.requant` (every result bit-identical: see there)."""

from __future__ import annotations

from typing import Any, Callable, TYPE_CHECKING

import numpy as np

from converter.kernels import buffers
from converter.kernels.compiled.requant import codes_errors, decode_extrema, decode_source
from converter.kernels.dequant import block_rows
from converter.kernels.error_sums import ErrorSums
from converter.kernels.threads import run_row_parts

if TYPE_CHECKING:  # (annotations only: converter.kernels.rtn calls this module)
    from converter.kernels.rtn import Grid, RowSource

__all__ = ["quantize_rows_compiled", "warm"]

#: Values per chunk whose extrema and parameters are formed in one call (a few row blocks).
CHUNK_ELEMENTS = 1 << 20


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
    codes = buffers.empty((rows, n), s.code_dtype)  # (a reused slab: no fresh pages to zero per tensor)
    step = block_rows(n, block_elements)
    fork = getattr(values, "fork", None)
    if fork is not None:
        step = max(1, min(step, values.step))
    center = float(s.center)

    # extrema and parameters per chunk of several blocks (fewer small numpy calls; the parameters
    # of a group do not depend on which groups share a call), codes and sums per block as numpy has them
    chunk = step * max(1, CHUNK_ELEMENTS // (step * n))

    def work(a: int, b: int):
        vals = values if a == 0 or fork is None else fork()
        part = compare if a == 0 or compare is None else compare.part()
        planner = getattr(vals, "decode_plan", None)
        xbuf = np.empty((chunk, n), dtype=np.float32)
        ext = np.empty((2, chunk, n_groups), dtype=np.float32)
        if part is not None:
            bbuf = np.empty((step, n), dtype=np.float32)
            ebuf = np.empty((step, n), dtype=np.float32)
        deg_total = 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            for c0 in range(a, b, chunk):
                c1 = min(b, c0 + chunk)
                xc = xbuf[:c1 - c0]
                src = decode_source(planner(c0, c1), n) if planner is not None else None
                if src is None:  # this source decodes through numpy
                    planner = None
                    np.copyto(xc, vals[c0:c1], casting="unsafe")
                hi_, lo_ = ext[0, :c1 - c0], ext[1, :c1 - c0]
                if not decode_extrema(xc, src, G, s.symmetric, hi_, hi_, lo_):
                    return None  # a NaN / inf: the whole-array path says where
                extrema = {"amax": hi_} if s.symmetric else {"mx": hi_, "mn": lo_}
                got = params_from_extrema(s, tensor=tensor, **extrema)
                if got is None:
                    return None
                sc, z, deg = got
                deg_total += deg
                scales[c0:c1] = sc
                if zps is not None:
                    zps[c0:c1] = z
                s32 = np.ascontiguousarray(sc, dtype=np.float32)
                zf = None if z is None else np.ascontiguousarray(z, dtype=np.float32)
                for r0 in range(c0, c1, step):
                    r1 = min(c1, r0 + step)
                    k, lo, hi = r1 - r0, r0 - c0, r1 - c0
                    x = xc[lo:hi]
                    bq, eq = (bbuf[:k], ebuf[:k]) if part is not None else (None, None)
                    changed, worst = codes_errors(x, s32[lo:hi], None if zf is None else zf[lo:hi],
                                                  center if zf is None else 0.0, G, s.rounding, s.qmin, s.qmax,
                                                  codes[r0:r1], bq, eq)
                    if part is not None:  # the counts from the kernel, the sums by the reference's own code
                        part.changed += changed
                        part.max_abs = max(part.max_abs, worst)
                        part.add_sums(r0, x, bq, eq)
        return deg_total, part

    degenerate = run_row_parts(work, rows, step, rows * n, compare)  # row ranges on the cores allowed
    if degenerate is None:  # a NaN / inf somewhere: the whole-array path says where
        return None
    if zps is not None:
        zps = zps.astype(s.code_dtype)
    return scales, zps, codes, degenerate


def warm(code_dtypes) -> None:
    """Call the kernels of :func:`quantize_rows_compiled` once on a tiny block with the argument types it
    passes them (C-contiguous float32 blocks, ``code_dtypes`` codes): their machine code is loaded (or
    compiled) now, not in the first tensor's call (:func:`converter.kernels.compiled.warm_up`)."""
    x = np.zeros((1, 8), dtype=np.float32)
    ext = np.zeros((1, 1), dtype=np.float32)
    decode_extrema(x, None, 8, True, ext, ext, ext)
    for dt in code_dtypes:
        codes_errors(x, np.ones((1, 1), dtype=np.float32), None, 0.0, 8, "half_even", -1, 1,
                     np.zeros((1, 8), dtype=dt), np.zeros_like(x), np.zeros_like(x))
