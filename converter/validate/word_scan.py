"""Every per-code fact the data checks need, in one pass over the stored words.

For a 2-D ``(out, in)`` tensor whose integer codes are still packed in 32-bit words along ``in`` (GPTQ
``qweight``, compressed-tensors ``weight_packed``; MLX packs its words so too, but its affine scheme's float bias is
not covered below), :func:`scan` reads the words once and returns a
:class:`WordScan`: the saturation counts of the declared grouping and of its alternative, the code-offset sums,
whether every code is equal, and the per-column sums of squared values of the nibble-order profile.
:func:`converter.validate.data_checks.check_saturation`, ``check_zero_offset``, ``check_degenerate`` and
:func:`converter.validate.nibble_order.column_profile` take it instead of each scanning the unpacked codes; the
numbers are theirs exactly (the integers are the same integers, the float64 sums the same additions in the same
order: ``tests/kernels/compiled/test_word_scan.py``). Two implementations: compiled
(:func:`converter.kernels.compiled.word_scan.scan_words`, the ``fast`` extra, when
:func:`converter.kernels.compiled.use_compiled` says so for the tensor's size), else numpy row block by row block
(:func:`_scan_numpy`), whose temporaries stay small.

Covered: 2-, 4- or 8-bit fields in C-contiguous 32-bit words, identity in-word order, no padding fields; a plain
integer scheme (implicit centre or integer zero points; no codebook, float bias, double quantization or global
scale); groups along ``in`` (no ``g_idx``, whole words per group), one scale per ``out`` channel, or one per
tensor; finite scales; at most one alternative grouping (groups along ``out``, or one per ``in`` index). Anything
else returns None and the checks scan the codes themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from converter.errors import ConverterError
from converter.groups import Granularity, GroupMap
from converter.kernels.compiled import use_compiled
from converter.kernels.compiled import code_scans as compiled_scans
from converter.kernels.compiled.word_scan import scan_words
from converter.kernels.dequant import dequantize_block
from converter.layout import IN, OUT, PackedCodes
from converter import rows as rows_module
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor

__all__ = ["WordScan", "scan", "likely_covered", "warm", "STRIP_CODES"]


@dataclass(frozen=True)
class WordScan:
    """What one pass over a tensor's words found.

    ``saturation``: grouping name (``""`` the declared one, else the alternative's name as given) -> (groups
    holding a saturated code, groups). ``offset_sums``: ``(sum(q - z), sum((q - z)**2))`` over every code,
    ``z`` the zero point or the scheme's centre. ``all_equal``: every code equals ``first_code`` (code ``(0, 0)``).
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


@dataclass(frozen=True)
class _Plan:
    """The facts both scans read, checked once (see :func:`scan`)."""

    packed: PackedCodes
    bits: int
    per_word: int
    transposed: bool
    group_words: int
    names: tuple[str, ...]  # the alternative grouping (at most one), counted per runs of rows_per_alt rows
    rows_per_alt: int
    scales: np.ndarray  # float32 (out or 1, groups)
    zeros: np.ndarray | None  # int32 like scales, or None (the centre)
    sat_lo: int
    sat_hi: int
    step: int  # the row blocks of Rows(t): column_profile's sums


def _plan(t: QuantizedTensor, alternatives: Mapping[str, GroupMap]) -> _Plan | None:
    packed = t.packed
    if packed is None or t.axes != (OUT, IN) or not t.numel or len(alternatives) > 1:
        return None
    amap, s = packed.amap, t.scheme
    bits = amap.bits
    if (amap.packed_axis != IN or amap.word_bits != 32 or bits not in (2, 4, 8) or s.bits != bits
            or (amap.order is not None and tuple(amap.order) != tuple(range(len(amap.order))))
            or tuple(amap.stored_axes) not in ((OUT, IN), (IN, OUT)) or not packed.words.flags.c_contiguous):
        return None
    if (s.codebook is not None or s.zero_point not in (ZeroPoint.NONE, ZeroPoint.INTEGER)
            or t.double_quant is not None or t.global_scale is not None):
        return None
    out, n_in = t.shape
    per_word = 32 // bits
    transposed = tuple(amap.stored_axes) == (IN, OUT)
    n_words = packed.words.shape[0] if transposed else packed.words.shape[1]
    if n_in != n_words * per_word:  # padding fields in the last word
        return None
    group_words = _group_words(t.group_map, per_word, n_words)
    alt_rows = [_alternative_rows(gm, out) for gm in alternatives.values()]
    if group_words is None or any(r is None for r in alt_rows):
        return None
    scales = np.asarray(t.scales)
    if not np.isfinite(scales).all():  # non-finite scales: the float32 rows' path (NaN payloads and all)
        return None
    scales = np.ascontiguousarray(scales.astype(np.float32).reshape(-1, scales.shape[-1]))
    zeros = None
    if s.zero_point is ZeroPoint.INTEGER:
        zeros = np.ascontiguousarray(np.asarray(t.zero_points).reshape(scales.shape).astype(np.int32))
    half = (1 << (bits - 1)) - 1
    center = int(s.center)
    return _Plan(packed, bits, per_word, transposed, group_words, tuple(alternatives), (alt_rows or [max(out, 1)])[0],
                 scales, zeros, max(s.qmin, center - half), min(s.qmax, center + half),
                 max(1, rows_module.SUPER_ELEMENTS // max(1, n_in)))


def scan(t: QuantizedTensor, alternatives: Mapping[str, GroupMap]) -> WordScan | None:
    """The :class:`WordScan` of ``t`` with the saturation of each grouping in ``alternatives`` (name -> map, as
    :func:`converter.validate.data_checks.alternative_maps` names them, at most one), or None when not covered
    (see the module docstring): compiled when :func:`~converter.kernels.compiled.use_compiled` says so for the
    tensor's size, else in numpy, block by block (:func:`_scan_numpy`)."""
    plan = _plan(t, alternatives)
    if plan is None:
        return None
    return _scan_compiled(t, plan) if use_compiled(t.numel) else _scan_numpy(t, plan)


def _first_code(plan: _Plan) -> tuple[int, int]:
    """(the first stored field, the code it holds)."""
    first = int(plan.packed.words.flat[0].view(np.uint32)) & ((1 << plan.bits) - 1)
    code = first ^ ((1 << (plan.bits - 1)) if plan.packed.flip else 0)
    if plan.packed.signed and code >= 1 << (plan.bits - 1):
        code -= 1 << plan.bits
    return first, code


def _scan_compiled(t: QuantizedTensor, p: _Plan) -> WordScan:
    out, n_in = t.shape
    s = t.scheme
    words = p.packed.words.view(np.uint32)
    n_words = n_in // p.per_word
    integer = p.zeros is not None
    zeros_i = p.zeros if integer else np.zeros((1, 1), np.int32)
    zeros_f = zeros_i.astype(np.float32)
    acc = np.zeros((p.per_word, n_words), dtype=np.float64)
    declared = np.zeros((out, -(-n_words // p.group_words)), dtype=np.uint8)
    alt = np.zeros((-(-out // p.rows_per_alt), n_words), dtype=np.uint32)
    stats = np.zeros(2, dtype=np.int64)
    flip = (1 << (p.bits - 1)) if p.packed.flip else 0
    scan_words(words, p.transposed, np.int64(p.bits), np.int64(flip), p.packed.signed, p.scales, zeros_f, zeros_i,
               integer, np.float32(s.center), np.int32(s.center), np.int32(p.sat_lo), np.int32(p.sat_hi),
               np.int32(s.qmin), np.int32(s.qmax), np.int64(p.group_words), np.int64(p.step),
               np.int64(p.rows_per_alt), acc, declared, alt, stats)
    hits = int(declared.any()) if t.group_map.granularity is Granularity.TENSOR else int(np.count_nonzero(declared))
    counts = {"": (hits, 1 if t.group_map.granularity is Granularity.TENSOR else int(declared.size))}
    for name in p.names:
        counts[name] = (int(np.count_nonzero(np.unpackbits(alt.view(np.uint8)))), n_in * alt.shape[0])
    # every code equal: every word equal to the first, whose fields all equal its first (an early-exit scan)
    first, code = _first_code(p)
    flat = words.reshape(-1)
    same = int(flat[0]) == first * sum(1 << (k * p.bits) for k in range(p.per_word)) \
        and bool(compiled_scans.all_equal(flat))
    return WordScan(counts, (int(stats[0]), int(stats[1])), same, code, np.ascontiguousarray(acc.T).reshape(-1))


#: Codes per strip of the numpy scan: its int32 / float64 temporaries stay under glibc's fixed mmap threshold (the CLI
#: sets 4 MiB, :func:`converter.runtime.fixed_mmap_threshold`), so they are reused instead of page-faulted anew.
STRIP_CODES = 1 << 17


def _scan_numpy(t: QuantizedTensor, p: _Plan) -> WordScan:
    """The numpy scan: row blocks of :class:`~converter.rows.Rows` (unpacked from their words), each in column strips
    of whole groups; per strip the saturation mask, the offset sums and the float32 values of
    :func:`converter.kernels.dequant.dequantize_block` squared in float64 and summed over the block's rows (numpy
    reduces a C-contiguous ``(rows, cols)`` array row by row: per column, the same additions in the same order as
    ``column_profile``'s whole-block sums)."""
    out, n_in = t.shape
    s, gm = t.scheme, t.group_map
    G = p.group_words * p.per_word if gm.granularity is Granularity.GROUP else None
    n_groups = p.scales.shape[1]
    zero_kind = "integer" if p.zeros is not None else "none"
    zeros_f = None if p.zeros is None else p.zeros.astype(np.float32)
    center = int(s.center)
    acc = np.zeros(n_in, dtype=np.float64)
    declared = np.zeros((out, n_groups), dtype=bool)
    alt = np.zeros((-(-out // p.rows_per_alt), n_in), dtype=bool)
    s1 = s2 = 0
    first, code = _first_code(p)
    signed = p.packed.signed
    same = True
    for r0 in range(0, out, p.step):
        r1 = min(out, r0 + p.step)
        codes = p.packed.rows(r0, r1).unpack()
        rb = r1 - r0
        # (at least 2 columns: numpy sums a (rows, 1) array pairwise, (rows, >= 2) row by row as column_profile)
        width = max(min(2, n_in), STRIP_CODES // rb)
        if G is not None:
            width = max(G, width // G * G)
        edges = [*range(0, n_in, width), n_in]
        if len(edges) > 2 and edges[-1] - edges[-2] == 1:  # a lone last column joins the strip before it: numpy
            del edges[-2]  # sums a (rows, 1) array pairwise, column_profile's blocks row by row
        for c0, c1 in zip(edges[:-1], edges[1:]):
            q = codes[:, c0:c1]
            same = same and bool((q == code).all())
            g0, g1 = (c0 // G, -(-c1 // G)) if G is not None else (0, n_groups)
            srow = slice(r0, r1) if p.scales.shape[0] != 1 else slice(0, 1)
            if p.zeros is None:  # sums of q and q^2 in the codes' own width (exact), then r = q - c
                mask = (q <= p.sat_lo) | (q >= p.sat_hi)
                q1 = int(q.sum(dtype=np.int32 if signed else np.uint32))  # |sum| < 2^28 (2^20 codes of 8 bits)
                q2 = int(np.multiply(q, q, dtype=np.int16 if signed else np.uint16).sum(dtype=np.int64))
                n = q.size
                s1 += q1 - n * center
                s2 += q2 - 2 * center * q1 + n * center * center
            else:
                q16 = q.astype(np.int16)
                zb = p.zeros[srow, g0:g1].astype(np.int16)
                z = np.repeat(zb, G, axis=1)[:, :c1 - c0] if G is not None else zb
                mask = (q16 <= s.qmin) | (q16 >= s.qmax) | ((z == center) & ((q16 <= p.sat_lo) | (q16 >= p.sat_hi)))
                d = q16 - z
                s1 += int(d.sum(dtype=np.int64))
                s2 += int(np.multiply(d, d, dtype=np.int32).sum(dtype=np.int64))
            if G is not None:
                whole = (c1 - c0) // G * G
                flags = mask[:, :whole].reshape(rb, -1, G).any(axis=2)
                if whole < c1 - c0:
                    flags = np.concatenate([flags, mask[:, whole:].any(axis=1, keepdims=True)], axis=1)
                declared[r0:r1, g0:g1] |= flags
            else:
                declared[r0:r1, 0] |= mask.any(axis=1)
            for run in range(r0 // p.rows_per_alt, (r1 - 1) // p.rows_per_alt + 1):  # runs of rows: views
                a0, a1 = max(r0, run * p.rows_per_alt) - r0, min(r1, (run + 1) * p.rows_per_alt) - r0
                alt[run, c0:c1] |= mask[a0:a1].any(axis=0)
            x = np.empty(q.shape, dtype=np.float32)
            dequantize_block(x, q, p.scales[srow, g0:g1], None if zeros_f is None else zeros_f[srow, g0:g1],
                             zero_kind=zero_kind, group_size=G, full=(c1 - c0) // G * G if G else 0,
                             center=center if p.zeros is None else 0.0)
            sq = x.astype(np.float64)  # float64(x) * float64(x): what np.multiply(x, x, dtype=float64) forms
            np.multiply(sq, sq, out=sq)
            acc[c0:c1] += sq.sum(axis=0)  # (rows, >= 2 columns), C-contiguous: row by row, per column
    if gm.granularity is Granularity.TENSOR:
        counts = {"": (int(declared.any()), 1)}
    else:
        counts = {"": (int(np.count_nonzero(declared)), int(declared.size))}
    for name in p.names:
        counts[name] = (int(np.count_nonzero(alt)), int(alt.size))
    return WordScan(counts, (s1, s2), same, code, acc)


def likely_covered(spec, words_along_in: bool, read: Callable[[str], np.ndarray] | None = None) -> bool:
    """From the header (a :class:`~converter.spec.TensorSpec`), the format's word layout (``words_along_in``:
    :attr:`converter.formats.registry.ValidationHooks.words_along_in`) and a stored ``g_idx``, whether :func:`scan`
    will cover the tensor: integer codes in 32-bit words packed along ``in`` with no padding fields, an integer
    scheme, groups along ``in`` without a ``g_idx`` (nor act-order), or per channel or tensor. It decides which
    compiled kernels load before the workers fork and the working set the validator budgets per tensor.

    ``read``: name -> stored array (:meth:`converter.formats.source.Source.read`). A spec may store a ``g_idx`` array
    under a group map without one (GPTQ ``desc_act: false``: the reader drops a trivial ``i // group_size`` one and
    keeps any other, which the scan does not cover): it is read (``in`` integers) and the tensor is covered only
    when it is trivial; without ``read``, or when it cannot be read, not covered. The one case this cannot see is a
    tensor whose scales are not all finite (a broken file: the per-check scans then run, with their larger working
    set)."""
    s, gm = spec.scheme, spec.group_map
    codes = next((a for a in spec.stored if a.role == "codes"), None)
    if not words_along_in or s is None or gm is None or codes is None or spec.axes != (OUT, IN) or spec.act_order:
        return False
    if s.codebook is not None or s.zero_point not in (ZeroPoint.NONE, ZeroPoint.INTEGER) or spec.double_quant:
        return False
    if codes.dtype not in ("I32", "U32") or s.bits not in (2, 4, 8):
        return False
    per_word = 32 // s.bits
    out, n_in = spec.shape
    if n_in % per_word or int(np.prod(codes.shape)) * per_word != out * n_in:  # padding fields: not covered
        return False
    if gm.granularity is Granularity.TENSOR or (gm.granularity is Granularity.CHANNEL and gm.axis == OUT):
        return True
    if not (gm.granularity is Granularity.GROUP and gm.axis == IN and gm.g_idx is None
            and gm.group_size % per_word == 0):
        return False
    g_idx = next((a for a in spec.stored if a.role == "g_idx"), None)
    return g_idx is None or (read is not None and _trivial_g_idx(read, g_idx.name, gm, n_in))


def _trivial_g_idx(read: Callable[[str], np.ndarray], name: str, gm: GroupMap, n_in: int) -> bool:
    try:
        g_idx = np.asarray(read(name))
    except ConverterError:  # the tensor's own check reports it
        return False
    return g_idx.shape == (n_in,) and GroupMap.per_group(gm.group_size, IN, g_idx).is_trivial_g_idx(n_in)


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
                   np.zeros(2, np.int64))
    compiled_scans.all_equal(words.reshape(-1))
