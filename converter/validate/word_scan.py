"""Every per-code fact the data checks need, in one compiled pass over the stored words (``fast`` extra).

For a 2-D ``(out, in)`` tensor whose integer codes are still packed in 32-bit words along ``in`` (GPTQ
``qweight``, compressed-tensors ``weight_packed``, MLX), :func:`scan` reads the words once
(:func:`converter.kernels.compiled.word_scan.scan_words`) and returns a :class:`WordScan`: the saturation counts
of the declared grouping and of its alternative, the code-offset sums, whether every code is equal, and the
per-column sums of squared values of the nibble-order profile. :func:`converter.validate.data_checks.check_saturation`,
``check_zero_offset``, ``check_degenerate`` and :func:`converter.validate.nibble_order.column_profile` take it
instead of scanning the unpacked codes once each; the numbers are the numpy scans' exactly (the integers are
the same integers, the float64 sums the same additions in the same order: ``tests/kernels/compiled``).

Covered: the compiled path chosen for the tensor's size (:func:`converter.kernels.compiled.use_compiled`);
2-, 4- or 8-bit fields in 32-bit words, identity in-word order, no padding fields; a plain integer scheme
(implicit centre or integer zero points; no codebook, float bias, double quantization or global scale);
groups along ``in`` (no ``g_idx``, whole words per group), one scale per ``out`` channel, or one per tensor;
finite scales. Anything else returns None and the checks scan the codes themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from converter.groups import Granularity, GroupMap
from converter.kernels.compiled import use_compiled
from converter.kernels.compiled.word_scan import scan_words
from converter.layout import IN, OUT
from converter import rows as rows_module
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor

__all__ = ["WordScan", "scan", "warm"]


@dataclass(frozen=True)
class WordScan:
    """What one pass over a tensor's words found.

    ``saturation``: grouping name (``""`` the declared one, else the alternative's name as given) -> (groups
    holding a saturated code, groups). ``offset_sums``: ``(sum(q - z), sum((q - z)**2))`` over every code,
    ``z`` the zero point or the scheme's centre. ``all_equal``: every code equals ``first_code``.
    ``column_squares``: float64 ``(in,)``, each ``in`` column's sum of squared dequantized values, summed over
    the row blocks of :class:`converter.rows.Rows` (``column_profile`` divides by ``out``)."""

    saturation: dict[str, tuple[int, int]]
    offset_sums: tuple[int, int]
    all_equal: bool
    first_code: int
    column_squares: np.ndarray


def _alternative_rows(gm: GroupMap, out: int) -> int | None:
    """Rows per group of an alternative grouping the kernel counts (runs of rows for each ``in`` index)."""
    if gm.granularity is Granularity.GROUP and gm.axis == OUT and gm.g_idx is None:
        return int(gm.group_size)
    if gm.granularity is Granularity.CHANNEL and gm.axis == IN:
        return max(out, 1)
    return None


def _group_words(gm: GroupMap, per_word: int, words: int) -> int | None:
    g = gm.granularity
    if g is Granularity.GROUP and gm.axis == IN and gm.g_idx is None and gm.group_size % per_word == 0:
        return gm.group_size // per_word
    if (g is Granularity.CHANNEL and gm.axis == OUT) or g is Granularity.TENSOR:
        return words
    return None


def scan(t: QuantizedTensor, alternatives: Mapping[str, GroupMap]) -> WordScan | None:
    """The :class:`WordScan` of ``t`` with the saturation of each grouping in ``alternatives`` (name -> map, as
    :func:`converter.validate.data_checks.alternative_maps` names them, at most one), or None when not covered
    (see the module docstring)."""
    packed = t.packed
    if packed is None or t.axes != (OUT, IN) or not t.numel or not use_compiled(t.numel) or len(alternatives) > 1:
        return None
    amap, s = packed.amap, t.scheme
    bits = amap.bits
    if (amap.packed_axis != IN or amap.word_bits != 32 or bits not in (2, 4, 8) or s.bits != bits
            or (amap.order is not None and tuple(amap.order) != tuple(range(len(amap.order))))
            or tuple(amap.stored_axes) not in ((OUT, IN), (IN, OUT))):
        return None
    if (s.codebook is not None or s.zero_point not in (ZeroPoint.NONE, ZeroPoint.INTEGER)
            or t.double_quant is not None or t.global_scale is not None):
        return None
    out, n_in = t.shape
    per_word = 32 // bits
    words = packed.words
    transposed = tuple(amap.stored_axes) == (IN, OUT)
    n_words = words.shape[0] if transposed else words.shape[1]
    if n_in != n_words * per_word:  # padding fields in the last word
        return None
    group_words = _group_words(t.group_map, per_word, n_words)
    alt_rows = {name: _alternative_rows(gm, out) for name, gm in alternatives.items()}
    if group_words is None or any(r is None for r in alt_rows.values()):
        return None
    scales = np.asarray(t.scales)
    if not np.isfinite(scales).all():  # non-finite scales: the float32 rows' path (NaN payloads and all)
        return None
    scales = np.ascontiguousarray(scales.astype(np.float32).reshape(-1, scales.shape[-1]))
    integer = s.zero_point is ZeroPoint.INTEGER
    if integer:
        zeros = np.asarray(t.zero_points).reshape(scales.shape)
        zeros_f, zeros_i = np.ascontiguousarray(zeros.astype(np.float32)), np.ascontiguousarray(zeros.astype(np.int32))
    else:
        zeros_f, zeros_i = np.zeros((1, 1), np.float32), np.zeros((1, 1), np.int32)
    half = (1 << (bits - 1)) - 1
    center = int(s.center)
    rows_per_alt = next(iter(alt_rows.values()), max(out, 1))
    n_groups = -(-n_words // group_words)
    acc = np.zeros((per_word, n_words), dtype=np.float64)
    declared = np.zeros((out, n_groups), dtype=np.uint8)
    alt = np.zeros((-(-out // rows_per_alt), n_words), dtype=np.uint32)
    stats = np.zeros(4, dtype=np.int64)
    flip = (1 << (bits - 1)) if packed.flip else 0
    step = max(1, rows_module.SUPER_ELEMENTS // max(1, n_in))  # the row blocks of Rows(t) (column_profile's sums)
    scan_words(words.view(np.uint32), transposed, np.int64(bits), np.int64(flip), packed.signed, scales, zeros_f,
               zeros_i, integer, np.float32(s.center), np.int32(center), np.int32(max(s.qmin, center - half)),
               np.int32(min(s.qmax, center + half)), np.int32(s.qmin), np.int32(s.qmax), np.int64(group_words),
               np.int64(step), np.int64(rows_per_alt), acc, declared, alt, stats)
    if t.group_map.granularity is Granularity.TENSOR:
        counts = {"": (int(declared.any()), 1)}
    else:
        counts = {"": (int(np.count_nonzero(declared)), int(declared.size))}
    for name in alt_rows:
        counts[name] = (int(np.count_nonzero(np.unpackbits(alt.view(np.uint8)))), n_in * alt.shape[0])
    return WordScan(counts, (int(stats[0]), int(stats[1])), bool(stats[2] == stats[3]), int(stats[2]),
                    np.ascontiguousarray(acc.T).reshape(-1))


def warm(largest: int) -> None:
    """Compile (or load from the cache) the scan once in this process when a tensor of ``largest`` values will use
    it: forked worker processes then inherit it instead of each loading it."""
    if not use_compiled(largest):
        return
    one = np.ones((1, 1), np.float32)
    zi = np.zeros((1, 1), np.int32)
    words = np.zeros((2, 2), np.uint32)
    words.flags.writeable = False  # as a file's memory map is (numba compiles read-only arrays apart)
    for transposed in (False, True):
        scan_words(words, transposed, np.int64(4), np.int64(0), False, one, one, zi, False,
                   np.float32(8), np.int32(8), np.int32(1), np.int32(15), np.int32(0), np.int32(15), np.int64(2),
                   np.int64(1), np.int64(2), np.zeros((8, 2)), np.zeros((2, 1), np.uint8), np.zeros((1, 2), np.uint32),
                   np.zeros(4, np.int64))
