"""The one round-to-nearest quantizer kernel: scales, zero points and codes of a ``(out, in)``
float matrix in row blocks (symmetric absmax or asymmetric min/max, per ``out`` row or in groups
along ``in``).

Formulas (DEVELOPERS.md contracts): symmetric ``scale = max|x| / (2^(b-1) - 1)``; asymmetric
(integer zero point) the range widened to include 0, ``scale = (max - min) / (2^b - 1)``,
``z = round(-min / scale)``; an all-zero group gets scale 1; scales are cast to the scale dtype
*before* codes are computed (:func:`safe_cast_scales`), codes ``clamp(round(x / s) + z)``.
The whole-array quantizer (:mod:`converter.quant.quantize`) uses :func:`params_from_extrema` and
:func:`safe_cast_scales` on its group extrema: one set of formulas, bit-identical results.

The kernels take the scheme as a :class:`Grid` (any object with its fields, such as
:class:`converter.scheme.QuantScheme`), never importing the model.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Protocol

import ml_dtypes
import numpy as np

from converter.errors import QuantizationError, exact_str
from converter.kernels import buffers
from converter.kernels.compiled import use_compiled
from converter.kernels.compiled.rtn_rows import quantize_rows_compiled
from converter.kernels.dequant import _apply, block_rows
from converter.kernels.error_sums import ErrorSums
from converter.kernels.rounding import round_values
from converter.kernels.threads import run_row_parts

#: Blocks of :func:`quantize_rows`, about 25 numpy calls each (the compiled path: two kernels, the error
#: sums' GEMMs and einsums): per-call overhead falls with the block. Measured 2026-12-06 on GPTQ g128 ->
#: int8 per channel (down / up / q_proj of a 7B layer, CPU ns per weight, best of 4): 2^17 numpy 4.86 /
#: compiled 3.59, 2^18 4.52 / 3.55, 2^19 4.40 / 3.28 (2 MiB float32 blocks: still cache-resident enough).
QUANT_BLOCK_ELEMENTS = 1 << 19


class Grid(Protocol):
    """The integer grid a kernel quantizes onto (the fields of :class:`converter.scheme.QuantScheme`)."""

    bits: int
    signed: bool
    rounding: str
    scale_dtype: str
    codebook: Any

    @property
    def symmetric(self) -> bool: ...
    @property
    def center(self) -> int: ...
    @property
    def qmin(self) -> int: ...
    @property
    def qmax(self) -> int: ...
    @property
    def code_dtype(self) -> np.dtype: ...
    @property
    def scale_np_dtype(self) -> np.dtype: ...
    @property
    def zero_point(self) -> Any: ...


class RowSource(Protocol):
    """Float32 rows read block by block (:class:`converter.rows.Rows`): ``src[r0:r1]`` is
    ``(r1 - r0, in)`` float32; ``step`` the rows it produces at once; :meth:`fork` a reader for
    another thread."""

    shape: tuple[int, ...]
    dtype: np.dtype
    step: int

    def __getitem__(self, idx: slice) -> np.ndarray: ...
    def fork(self) -> "RowSource": ...


@functools.lru_cache(maxsize=None)
def _finfo(dt: np.dtype):
    return ml_dtypes.finfo(dt)


def safe_cast_scales(scales: np.ndarray, grid: Grid, *, tensor: str | None) -> np.ndarray:
    """Cast float32 scales to the grid's scale dtype without producing 0, inf or NaN.

    A scale that underflows the dtype is raised to its smallest positive value.

    Parameters
    ----------
    scales : ndarray of float32, any shape (the parameter shape).
    grid : the target scheme (its ``scale_np_dtype``).
    tensor : name, for errors.

    Returns
    -------
    ndarray like ``scales``, dtype ``grid.scale_np_dtype``.

    Raises
    ------
    QuantizationError
        When a scale exceeds the dtype's largest finite value.
    """
    dt = grid.scale_np_dtype
    info = _finfo(dt)
    if scales.size and np.abs(scales).max() <= float(info.max):  # the usual case, in two passes (NaN: below)
        cast = scales.astype(dt)
        if cast.all():
            return cast
    big = np.abs(scales) > float(info.max)
    if big.any():
        idx = np.unravel_index(int(np.argmax(big)), scales.shape)
        raise QuantizationError("scale overflows the scale dtype", tensor=tensor, field="scales",
                                expected=f"|scale| <= {float(info.max):g} ({grid.scale_dtype})",
                                found=f"{exact_str(scales[idx])} at group {list(map(int, idx))} "
                                      "(a scale computed from the source's values)",
                                hint="use --scale-dtype f32 (or bf16)")
    cast = scales.astype(dt)
    tiny = (cast == 0) & (scales != 0)
    if tiny.any():
        smallest = np.array(float(info.smallest_subnormal), dtype=np.float32).astype(dt)
        cast = np.where(tiny, np.copysign(smallest, scales.astype(dt)), cast)
    return cast


def _reduce(x3: np.ndarray, tail: np.ndarray | None, ufunc: np.ufunc) -> np.ndarray:
    """Per-group reduction of a block: ``x3`` ``(rows, nfull, G)`` plus an optional partial tail."""
    parts = []
    if x3.shape[1]:
        parts.append(ufunc.reduce(x3, axis=2))
    if tail is not None:
        parts.append(ufunc.reduce(tail, axis=1, keepdims=True))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def _no_underflow(scales: np.ndarray) -> np.ndarray:
    """Float32 scales of non-zero groups that the division by the code range rounded to 0 (an extremum
    among float32's smallest subnormals, e.g. ``3 * 2**-149 / 7``) raised to the smallest positive float32
    (``2**-149``), as :func:`safe_cast_scales` raises a scale its dtype cannot hold; a scale of 0 would
    give NaN codes. Every group that reaches here with a 0 scale is non-zero (all-zero groups get 1)."""
    if scales.all():
        return scales
    return np.where(scales == 0, np.float32(np.finfo(np.float32).smallest_subnormal), scales).astype(np.float32)


def params_from_extrema(s: Grid, *, amax: np.ndarray | None = None, mx: np.ndarray | None = None,
                        mn: np.ndarray | None = None, tensor: str | None = None
                        ) -> tuple[np.ndarray, np.ndarray | None, int] | None:
    """Round-to-nearest parameters of groups from their extrema.

    Parameters
    ----------
    s : the target grid (symmetric, integer zero point or float bias; no codebook).
    amax : ndarray of float32, parameter shape: ``max |x|`` per group (symmetric schemes).
    mx, mn : ndarray of float32, parameter shape: ``max x`` / ``min x`` per group (asymmetric).
    tensor : name, for errors.

    Returns
    -------
    ``(scales, zero_points, degenerate)``: scales in the grid's scale dtype; int16 integer zero
    points, scale-dtype float biases ``-z * s`` or None (symmetric); the number of all-zero
    groups. None when an extremum is not finite (the caller raises the precise error).

    Raises
    ------
    QuantizationError
        A scale that overflows the scale dtype.
    """
    # NaN propagates through abs / max / min and inf survives them: checking the (small)
    # reductions is checking every element
    if s.symmetric:
        if not np.isfinite(amax).all():
            return None
        degenerate = int(np.count_nonzero(amax == 0))
        qpos = np.float32((1 << (s.bits - 1)) - 1)
        with np.errstate(divide="ignore", invalid="ignore"):
            sc = np.where(amax > 0, amax / qpos, np.float32(1.0)).astype(np.float32)  # finite / positive
        return safe_cast_scales(_no_underflow(sc), s, tensor=tensor), None, degenerate
    if not (np.isfinite(mx).all() and np.isfinite(mn).all()):
        return None
    degenerate = int(np.count_nonzero((mx == 0) & (mn == 0)))
    levels = np.float32((1 << s.bits) - 1)
    lo = np.minimum(mn, 0).astype(np.float32)
    hi = np.maximum(mx, 0).astype(np.float32)
    rng = hi - lo
    sc = np.where(rng > 0, rng / levels, np.float32(1.0)).astype(np.float32)
    sc = safe_cast_scales(_no_underflow(sc), s, tensor=tensor)
    s32 = sc.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = round_values(-lo / s32, s.rounding)  # sc > 0: finite
    z = np.clip(z, 0, levels)
    if s.zero_point.value == "float":
        return sc, (-z * s32).astype(s.scale_np_dtype), degenerate
    if s.signed:
        z = z - np.float32(1 << (s.bits - 1))
    return sc, z.astype(np.int16), degenerate


@dataclass(frozen=True, eq=False)
class QuantizedRows:
    """What :func:`quantize_rows` made of a ``(out, in)`` matrix.

    Attributes
    ----------
    scales : ndarray, ``(out, groups)``, the grid's scale dtype.
    zero_points : ndarray, ``(out, groups)``, the grid's code dtype (integer zero points), or None.
    codes : ndarray, ``(out, in)``, the grid's code dtype.
    degenerate_groups : int
        Groups whose values are all zero (scale 1).
    """

    scales: np.ndarray
    zero_points: np.ndarray | None
    codes: np.ndarray
    degenerate_groups: int


def quantize_rows(values: "np.ndarray | RowSource", s: Grid, *, group_size: int | None, tensor: str | None = None,
                  compare: ErrorSums | None = None) -> QuantizedRows | None:
    """Round-to-nearest scales, zero points and codes of a 2-D ``(out, in)`` float matrix in row
    blocks, or None when not applicable (the caller takes the whole-array path, which also
    produces the precise error for non-finite inputs or overflowing scales).

    Parameters
    ----------
    values : ndarray ``(out, in)`` of float32 / float16 / bfloat16, or a :class:`RowSource`.
    s : the target grid: symmetric (2 bits or more) or integer zero point, no codebook; other
        grids return None.
    group_size : groups of this many elements along ``in`` (the last possibly partial); None:
        one group per ``out`` row.
    tensor : name, for errors.
    compare : the :class:`~converter.kernels.error_sums.ErrorSums` of the matrix, optional: it
        receives each block's values and their reconstruction from the new codes (the target's
        dequantize formula, bit-identical) while both are in cache: the error report without a
        second pass over the tensor.

    Returns
    -------
    QuantizedRows or None
        Same formulas and operation order as :func:`converter.quant.quantize.choose_params` and
        :func:`~converter.quant.quantize.codes_for` (bit-identical results). When
        :func:`~converter.kernels.compiled.use_compiled` says so (the ``fast`` extra), the work runs in
        :func:`~converter.kernels.compiled.rtn_rows.quantize_rows_compiled` instead: the same
        results and ``compare`` sums, bit for bit.
    """
    if len(values.shape) != 2 or s.codebook is not None or s.zero_point.value == "float":
        return None
    if s.symmetric and s.bits < 2:
        return None
    rows, n = values.shape
    if rows == 0 or n == 0:
        return None
    if use_compiled(rows * n) and (compare is None or compare.G == (n if group_size is None else group_size)):
        got = quantize_rows_compiled(values, s, group_size=group_size, tensor=tensor, compare=compare,
                                     params_from_extrema=params_from_extrema, block_elements=QUANT_BLOCK_ELEMENTS)
        return None if got is None else QuantizedRows(*got)
    G = n if group_size is None else int(group_size)
    nfull, full = n // G, (n // G) * G
    n_groups = nfull + (1 if full < n else 0)
    scales = np.empty((rows, n_groups), dtype=s.scale_np_dtype)
    zps = None if s.symmetric else np.empty((rows, n_groups), dtype=np.int16)
    codes = buffers.empty((rows, n), s.code_dtype)  # (a reused slab: no fresh pages to zero per tensor)
    step = block_rows(n, QUANT_BLOCK_ELEMENTS)
    fork = getattr(values, "fork", None)  # a RowSource: one reader (and value cache) per thread
    if fork is not None:
        step = max(1, min(step, values.step))

    def work(a: int, b: int):
        """Rows ``a:b`` with this thread's own buffers, value cache and error sums."""
        vals = values if a == 0 or fork is None else fork()
        part = compare if a == 0 or compare is None else compare.part()
        buf = np.empty((step, n), dtype=np.float32)
        xbuf = np.empty((step, n), dtype=np.float32) if values.dtype != np.float32 else None
        if part is not None:
            bbuf = np.empty((step, n), dtype=np.float32)
            ebuf = np.empty((step, n), dtype=np.float32)
        deg_total = 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # per thread, once
            for r0 in range(a, b, step):
                r1 = min(b, r0 + step)
                k = r1 - r0
                x = vals[r0:r1]
                if xbuf is not None:
                    x = xbuf[:k]
                    np.copyto(x, vals[r0:r1], casting="unsafe")
                q = buf[:k]
                if s.symmetric:
                    np.abs(x, out=q)
                    # |x| orders as its bit pattern read as int32 (+0 < finite < inf < NaN): the
                    # integer max is the float max, without the NaN-aware float reduction (~3x faster)
                    qi = q.view(np.int32)
                    amax = _reduce(qi[:, :full].reshape(k, nfull, G), qi[:, full:] if full < n else None,
                                   np.maximum).view(np.float32)
                    ext = {"amax": amax}
                else:
                    x3 = x[:, :full].reshape(k, nfull, G)
                    tail = x[:, full:] if full < n else None
                    mx = _reduce(x3, tail, np.maximum)
                    mn = _reduce(x3, tail, np.minimum)
                    ext = {"mx": mx, "mn": mn}
                got = params_from_extrema(s, tensor=tensor, **ext)  # None: NaN / inf somewhere
                if got is None:
                    return None  # (this range)
                sc, z, deg = got
                deg_total += deg
                scales[r0:r1] = sc
                if zps is not None:
                    zps[r0:r1] = z
                s32 = sc.astype(np.float32)
                zf = z.astype(np.float32) if z is not None else None
                # x / s is monotone in x, so a group's codes lie between those of its extremes:
                # when those are in range for every group, the clip changes nothing
                if s.symmetric:
                    top = round_values(amax / s32, s.rounding)
                    bottom = -top
                else:
                    top, bottom = round_values(mx / s32, s.rounding), round_values(mn / s32, s.rounding)
                if zf is not None:
                    top, bottom = top + zf, bottom + zf
                elif s.center:
                    top, bottom = top + np.float32(s.center), bottom + np.float32(s.center)
                # no NaN can arise here (finite values over finite non-zero scales), so the
                # nan_to_num pass is skipped; an overflow to +-inf is clipped like any large value
                # (a tiny scale may overflow x / s to inf)
                codes_block(q, x, s32, zf, s, group_size=G, full=full, finite=True,
                            clip=not ((top <= s.qmax).all() and (bottom >= s.qmin).all()))
                codes[r0:r1] = q
                if part is not None:  # the target's dequantize, (q - c) * s or (q - z) * s, in cache
                    bq = bbuf[:k]  # (dequantize_block's float32 operations, without its copy of q first)
                    if zf is not None:
                        _apply_to(bq, q, zf, G, full, np.subtract)
                        _apply(bq, s32, G, full, np.multiply)
                    elif s.center:
                        np.subtract(q, np.float32(s.center), out=bq)
                        _apply(bq, s32, G, full, np.multiply)
                    else:
                        _apply_to(bq, q, s32, G, full, np.multiply)
                    part.add(r0, x, bq, ebuf[:k])
        return deg_total, part

    degenerate = run_row_parts(work, rows, step, rows * n, compare)  # row ranges on the cores allowed
    if degenerate is None:  # a NaN / inf somewhere: the whole-array path says where
        return None
    if zps is not None:
        zps = zps.astype(s.code_dtype)
    return QuantizedRows(scales, zps, codes, degenerate)


def codes_block(q: np.ndarray, x: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, s: Grid, *,
                group_size: int | None = None, full: int = 0, clip: bool = True, finite: bool = False) -> None:
    """Codes of one block for given parameters, written into ``q`` (float32, ``x``'s shape):
    ``clamp(round(x / s) + z)`` (integer zero point), ``clamp(round(x / s) + c)`` (symmetric) or
    ``clamp(round((x - b) / s))`` (float bias), in that order, every operand float32.

    Parameters
    ----------
    q : ndarray of float32, the block's shape (may be ``x`` itself).
    x : ndarray of float32, the values; ``(rows, in)`` with ``group_size``, else any shape.
    scales, zero_points : float32 parameters: ``(rows, groups)`` per group of ``group_size`` along
        ``in`` (``full`` = the columns in whole groups), or, with ``group_size=None``, any shape
        broadcasting against ``x`` (a whole tensor with its parameters expanded: one block).
    s : the grid (its zero-point kind, centre, rounding and code range).
    clip : clamp to ``[qmin, qmax]`` (skip only when the caller knows every code in range).
    finite : the caller knows ``x / s`` has no NaN (skips the NaN -> 0 pass).
    """
    kind = s.zero_point.value
    if kind == "float":
        _apply_to(q, x, zero_points, group_size, full, np.subtract)
        x = q
    _apply_to(q, x, scales, group_size, full, np.divide)
    round_values(q, s.rounding, out=q)
    if kind == "integer":
        _apply(q, zero_points, group_size, full, np.add)
    elif kind == "none" and s.center:
        q += np.float32(s.center)
    if not finite:
        np.nan_to_num(q, copy=False, nan=0.0)
    if clip:
        np.clip(q, s.qmin, s.qmax, out=q)


def _apply_to(out: np.ndarray, x: np.ndarray, p: np.ndarray, G: int | None, full: int, ufunc: np.ufunc) -> None:
    """``out = ufunc(x, p expanded per group of G along in)`` (``out`` may be ``x``); ``G=None``:
    ``p`` broadcasts as it is."""
    if G is None:
        ufunc(x, p, out=out)
        return
    rows, n = x.shape
    nfull = full // G
    if nfull:
        ufunc(x[:, :full].reshape(rows, nfull, G), p[:, :nfull, None], out=out[:, :full].reshape(rows, nfull, G))
    if full < n:
        ufunc(x[:, full:], p[:, nfull:nfull + 1], out=out[:, full:])
