"""The validator's per-code scans on the compiled path (:mod:`converter.kernels.compiled.code_scans`).

Each function returns the same numbers as the numpy code in :mod:`converter.validate.data_checks` for the
cases it covers and ``None`` for the rest (the caller then runs numpy): 2-D one-byte codes, groupings by
tensor, channel, group (``g_idx`` only along the column axis, every group non-empty) or 2-D block. The
compiled path runs when :func:`converter.kernels.compiled.use_compiled` says so for the tensor's size.
"""

from __future__ import annotations

import numpy as np

from converter.groups import Granularity, GroupMap
from converter.kernels.compiled import use_compiled
from converter.kernels.compiled import code_scans as scans
from converter.kernels.compiled.column_sums import add_column_squares
from converter.layout import EXPERT
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor

__all__ = ["byte_tables", "group_max_table", "count_table", "saturation_counts", "offset_histogram", "offset_sums",
           "all_codes_equal", "warm"]


def _eligible(t: QuantizedTensor) -> bool:
    return (t.numel > 0 and len(t.shape) == 2 and EXPERT not in t.axes and use_compiled(t.numel)
            and t.codes.dtype.itemsize == 1)


def _byte_values(dtype: np.dtype) -> np.ndarray:
    """int16 (256,): the code value of each byte (two's complement for int8 codes)."""
    b = np.arange(256, dtype=np.int16)
    return np.where(b >= 128, b - 256, b).astype(np.int16) if dtype == np.int8 else b


def _view(t: QuantizedTensor) -> tuple[np.ndarray, tuple[str, str]]:
    """The codes as a 2-D uint8 array with the declared group axis last (a transposed view otherwise)."""
    codes = t.codes.view(np.uint8)
    axes = tuple(t.axes)
    gm = t.group_map
    if gm.granularity is Granularity.GROUP and gm.axis == axes[0]:
        return codes.T, (axes[1], axes[0])
    return codes, axes


def _grouping(gm: GroupMap, shape: tuple[int, int], axes: tuple[str, str]):
    """``(row_div, col_group int64 (cols,), n_col_groups)`` of ``gm`` on a ``(rows, cols)`` view, or None."""
    rows, cols = shape
    g = gm.granularity
    if g is Granularity.TENSOR:
        return max(rows, 1), np.zeros(cols, dtype=np.int64), 1
    if g is Granularity.CHANNEL:
        if gm.axis == axes[0]:
            return 1, np.zeros(cols, dtype=np.int64), 1
        return max(rows, 1), np.arange(cols, dtype=np.int64), cols
    if g is Granularity.GROUP:
        if gm.axis == axes[1]:
            if gm.g_idx is None:
                return 1, np.arange(cols, dtype=np.int64) // gm.group_size, -(-cols // gm.group_size)
            n = gm.n_groups((rows, cols), axes)
            if (np.bincount(gm.g_idx, minlength=n) == 0).any():
                return None  # numpy raises the empty-group LayoutError
            return 1, np.asarray(gm.g_idx, dtype=np.int64), n
        if gm.g_idx is not None:
            return None
        return gm.group_size, np.arange(cols, dtype=np.int64), cols
    if g is Granularity.BLOCK:
        br, bc = gm.extent(axes[0]), gm.extent(axes[1])
        col_group = (np.arange(cols, dtype=np.int64) // bc) if bc is not None else np.zeros(cols, dtype=np.int64)
        return (br if br is not None else max(rows, 1)), col_group, (-(-cols // bc) if bc is not None else 1)
    return None


def _zeros(t: QuantizedTensor, shape: tuple[int, int], axes: tuple[str, str]):
    """``(zeros int16 (rows or 1, params), zero_cols int64 (cols,))`` of the declared grouping, or None."""
    gm = t.group_map
    if gm.granularity is Granularity.BLOCK or t.zero_points is None:
        return None
    grouping = _grouping(gm, shape, axes)
    if grouping is None or grouping[0] not in (1, max(shape[0], 1)):
        return None
    z = np.asarray(t.zero_points).astype(np.int16)
    z = z.reshape(gm.param_shape(t.shape, t.axes))
    if tuple(axes) != tuple(t.axes):
        z = z.T
    if grouping[0] != 1:  # one parameter row for every code row
        z = z[:1]
    return np.ascontiguousarray(z), grouping[1]


def _run_length(col_group: np.ndarray) -> int:
    """``L`` when ``col_group[c] == c // L`` for every column (consecutive groups of ``L``), else 0."""
    n = col_group.size
    for length in ({1, n} | ({int(np.argmax(col_group != 0))} if col_group.any() else set())) - {0}:
        if np.array_equal(col_group, np.arange(n, dtype=np.int64) // length):
            return length
    return 0


def byte_tables(t: QuantizedTensor) -> tuple[np.ndarray, np.ndarray, bool]:
    """(ends uint8 (256,), values int16 (256,), use_zero): the per-byte saturation facts."""
    s = t.scheme
    values = _byte_values(t.codes.dtype)
    if s.codebook is not None:
        cb = np.abs(np.asarray(s.codebook, dtype=np.float32))
        top = np.flatnonzero(cb == np.max(cb[np.isfinite(cb)]))
        return np.isin(values, top).astype(np.uint8), values, False
    ends = (values == s.qmin) | (values == s.qmax)
    if s.zero_point is ZeroPoint.NONE:
        ends |= np.abs(values - np.int16(int(s.center))) >= (1 << (s.bits - 1)) - 1
    return ends.astype(np.uint8), values, s.zero_point is ZeroPoint.INTEGER


def saturation_counts(t: QuantizedTensor, maps: dict[str, GroupMap]) -> dict[str, tuple[int, int]] | None:
    """name -> (groups holding a saturated code, groups) for each grouping in ``maps``; None when not covered."""
    if not _eligible(t):
        return None
    codes, axes = _view(t)
    ends, values, use_zero = byte_tables(t)
    if use_zero:
        zz = _zeros(t, codes.shape, axes)
        if zz is None:
            return None
        zeros, zero_cols = zz
    else:
        zeros, zero_cols = np.zeros((1, 1), dtype=np.int16), np.zeros(codes.shape[1], dtype=np.int64)
    groupings = {name: _grouping(gm, codes.shape, axes) for name, gm in maps.items()}
    if any(g is None for g in groupings.values()):
        return None
    half = (1 << (t.scheme.bits - 1)) - 1
    names = list(groupings)
    sizes = [-(-codes.shape[0] // groupings[name][0]) * groupings[name][2] for name in names]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    flags = np.zeros(int(sum(sizes)), dtype=np.uint8)
    scans.group_saturation(codes, ends, values, zeros, zero_cols, use_zero, np.int32(int(t.scheme.center)),
                           np.int32(half), np.array([groupings[name][0] for name in names], dtype=np.int64),
                           np.stack([groupings[name][1] for name in names]),
                           np.array([groupings[name][2] for name in names], dtype=np.int64),
                           np.array([_run_length(groupings[name][1]) for name in names], dtype=np.int64),
                           offsets, flags)
    return {name: (int(np.count_nonzero(flags[o:o + n])), n) for name, o, n in zip(names, offsets, sizes)}


def group_max_table(t: QuantizedTensor, table: np.ndarray) -> np.ndarray | None:
    """``t.group_map.reduce(table[t.codes], np.maximum, t.axes)`` for a uint8 ``table`` (256,): the same uint8
    array, parameter shape; None when not covered. ``(expert, out, in)`` stacks matrix by matrix."""
    if not (t.numel > 0 and use_compiled(t.numel) and t.codes.dtype.itemsize == 1 and table.dtype == np.uint8):
        return None
    stack = len(t.shape) == 3 and t.axes[0] == EXPERT
    if not (len(t.shape) == 2 and EXPERT not in t.axes) and not stack:
        return None
    gm = t.group_map
    axes = tuple(t.axes[1:]) if stack else tuple(t.axes)
    if gm.granularity is Granularity.GROUP and gm.axis == axes[0] and gm.g_idx is None:
        transposed = True
    elif gm.granularity in (Granularity.TENSOR, Granularity.CHANNEL, Granularity.GROUP, Granularity.BLOCK):
        transposed = False
    else:
        return None
    codes = t.codes.view(np.uint8)
    mats = [codes[e] for e in range(codes.shape[0])] if stack else [codes]
    parts = []
    for m in mats:
        view, vaxes = (m.T, (axes[1], axes[0])) if transposed else (m, axes)
        grouping = _grouping(gm, view.shape, vaxes)
        if grouping is None:
            return None
        row_div, col_group, ncg = grouping
        out = np.zeros((-(-view.shape[0] // row_div), ncg), dtype=np.uint8)
        scans.group_max(view, table, np.int64(row_div), col_group, np.int64(ncg), out.reshape(-1))
        parts.append(out.T if transposed else out)
    full = gm.param_shape(t.shape, t.axes)
    result = np.stack(parts) if stack else parts[0]
    return np.ascontiguousarray(result) if tuple(result.shape) == tuple(full) else None


def count_table(t: QuantizedTensor, table: np.ndarray) -> int | None:
    """How many codes have a nonzero entry in ``table`` (uint8 (256,)); None when not covered."""
    if not (t.numel > 0 and use_compiled(t.numel) and t.codes.dtype.itemsize == 1):
        return None
    return int(scans.count_flagged(np.ascontiguousarray(t.codes).reshape(-1).view(np.uint8), table.astype(np.uint8)))


def offset_histogram(t: QuantizedTensor) -> np.ndarray | None:
    """int64 (256,): how many codes hold each byte value; None when not covered."""
    if not (t.numel > 0 and use_compiled(t.numel) and t.codes.dtype.itemsize == 1):
        return None
    counts = np.zeros(256, dtype=np.int64)
    scans.byte_histogram(np.ascontiguousarray(t.codes).reshape(-1).view(np.uint8), counts)
    return counts


def offset_sums(t: QuantizedTensor) -> tuple[int, int] | None:
    """``(sum(q - z), sum((q - z)**2))`` for integer zero points; None when not covered."""
    if not _eligible(t) or t.scheme.zero_point is not ZeroPoint.INTEGER:
        return None
    codes, axes = _view(t)
    zz = _zeros(t, codes.shape, axes)
    if zz is None:
        return None
    s1, s2 = scans.offset_sums(codes, _byte_values(t.codes.dtype), *zz)
    return int(s1), int(s2)


def all_codes_equal(t: QuantizedTensor) -> bool | None:
    """Every code equals the first; None when not covered."""
    if not (t.numel > 0 and use_compiled(t.numel) and t.codes.dtype.itemsize == 1):
        return None
    return bool(scans.all_equal(np.ascontiguousarray(t.codes).reshape(-1).view(np.uint8)))


def warm(largest: int) -> None:
    """Compile (or load from the cache) the scans once in this process when a tensor of ``largest`` values will
    use them: forked worker processes then inherit them instead of each importing numba and loading them."""
    if not use_compiled(largest):
        return
    u8 = np.zeros((2, 2), dtype=np.uint8)
    i16 = np.zeros((1, 1), dtype=np.int16)
    cols = np.zeros(2, dtype=np.int64)
    one = np.ones(1, dtype=np.int64)
    scans.group_saturation(u8, np.zeros(256, np.uint8), np.zeros(256, np.int16), i16, cols, False, np.int32(0),
                           np.int32(1), one, cols.reshape(1, 2), one, one - 1, one - 1, np.zeros(2, np.uint8))
    scans.byte_histogram(u8.reshape(-1), np.zeros(256, np.int64))
    scans.all_equal(u8.reshape(-1))
    scans.group_max(u8, np.zeros(256, np.uint8), np.int64(1), cols, np.int64(1), np.zeros(2, np.uint8))
    scans.count_flagged(u8.reshape(-1), np.zeros(256, np.uint8))
    add_column_squares(np.zeros((2, 2), np.float32), np.zeros(2))
