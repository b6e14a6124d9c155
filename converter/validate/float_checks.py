"""Checks of float-element weights (FP8 E4M3 / E5M2, FP4 E2M1: :mod:`converter.codebooks`): the 2-D block
grid against the shape, codes that decode to NaN or infinity, per-block saturation, and the static
activation scales stored beside weights.

They read only the logical model (a codebook scheme whose table is a float element, its group map and
scales), so every FP8 / FP4 reader is checked the same way.

Saturation. An absmax quantizer (DeepSeek-V3 ``fp8_cast``, compressed-tensors / llm-compressor FP8,
auto-round FP8, ModelOpt FP8) sets each block's scale to ``amax / max_finite`` and rounds ``w / s``
to the element (some through a bf16 intermediate: FP_MANIFEST.json of the real samples), so the
block's largest code is the element's largest finite value (448 for E4M3) in every block that is not
all zero: the scale's own rounding (bf16, f16) moves ``amax / s`` by less than half the element's top
gap. Power-of-two scales (E8M0, MX; or F32 / BF16 scales that are all exact powers of two, as DeepSeek
V3.1 ``scale_fmt: "ue8m0"`` writes ``weight_scale_inv = 2^ceil(log2(amax / 448))`` in F32) round the scale
up to the next power of two, so there the largest code only reaches half of ``max_finite`` or more.
Calibrated on the real samples
``deepseek_fp8_block_smollm2tiny`` (7 tensors, 128x128 blocks, BF16 ``weight_scale_inv``) and
``ct_fp8_channel_smollm2`` (4 tensors, BF16 per-channel scales): 100 % of the blocks and channels
reach 448. A group that does not is reported (info; a warning when most non-zero groups miss it,
which absmax quantizers never produce: codes of another element type, or scales not fitted per
group); a per-tensor scale that does not is reported as info only (a scale shared by fused
projections, e.g. q/k/v, is legitimate).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.codebooks import E2M1_VALUES, FloatElement, element_of
from converter.groups import Granularity
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec
from converter.validate import code_scans
from converter.validate.findings import Finding, finding

#: ``unsaturated`` becomes a warning when at least this fraction of the non-zero groups misses the top code.
UNSATURATED_WARNING_FRACTION = 0.5
#: Indices listed in evidence (the count is always complete).
MAX_LISTED = 8


def float_element(t: QuantizedTensor | TensorSpec) -> FloatElement | None:
    """The float element of ``t``'s codebook (E4M3 ...), or None for integer and learned-codebook schemes."""
    scheme = t.scheme
    return element_of(scheme.codebook) if scheme is not None else None


def _listed(mask: np.ndarray) -> list[list[int]]:
    return [[int(i) for i in idx] for idx in np.argwhere(mask)[:MAX_LISTED]]


def block_of(t: QuantizedTensor, index: tuple[int, ...]) -> list[int]:
    """The parameter (block / channel / group) index of the element at logical ``index``."""
    gm, out = t.group_map, []
    pshape = gm.param_shape(t.shape, t.axes)
    for a, i, n in zip(t.axes, index, pshape):
        if n == 1:
            out.append(0)
        elif gm.granularity is Granularity.BLOCK and gm.extent(a) is not None:
            out.append(int(i) // gm.extent(a))
        elif gm.granularity is Granularity.GROUP and a == gm.axis and gm.g_idx is None:
            out.append(int(i) // gm.group_size)
        else:
            out.append(int(i))
    return out


#: Elements per row block of the code reductions (:func:`reduce_codes`).
CHUNK_ELEMENTS = 1 << 20


def _row_chunks(shape: tuple[int, ...], unit: int, elements: int = CHUNK_ELEMENTS) -> list[tuple[int, int]]:
    """``(r0, r1)`` ranges of the leading axis, each a multiple of ``unit`` rows (but the last) of
    about ``elements`` values."""
    if not shape:
        return [(0, 0)]
    n, row = int(shape[0]), int(np.prod(shape[1:], dtype=np.int64)) or 1
    step = max(unit, (elements // row) // unit * unit)
    return [(r0, min(n, r0 + step)) for r0 in range(0, n, step)] or [(0, 0)]


def reduce_codes(t: QuantizedTensor, table: np.ndarray, ufunc: np.ufunc) -> np.ndarray:
    """``t.group_map.reduce(table[t.codes], ufunc, t.axes)`` computed in row blocks of the leading
    axis (experts, or ``out`` rows in multiples of the groups' extent along it), so the
    ``table[codes]`` temporary is one block, never the whole tensor; the same result (groups whose
    parameter runs over the whole leading axis combine the blocks' partial results with ``ufunc``).
    """
    gm, codes, axes = t.group_map, t.codes, tuple(t.axes)
    if codes.ndim == 0 or gm.granularity is Granularity.FLAT_BLOCK:
        return gm.reduce(table[codes], ufunc, axes)
    full = gm.param_shape(codes.shape, axes)
    n0 = int(codes.shape[0])
    if gm.granularity is Granularity.BLOCK:
        unit = gm.extent(axes[0]) or 1
    elif gm.granularity is Granularity.GROUP and gm.axis == axes[0]:
        if gm.g_idx is not None:
            return gm.reduce(table[codes], ufunc, axes)
        unit = gm.group_size
    else:
        unit = 1
    chunks = _row_chunks(codes.shape, unit)
    if len(chunks) == 1:
        return gm.reduce(table[codes], ufunc, axes)
    parts = [gm.reduce(table[codes[r0:r1]], ufunc, axes) for r0, r1 in chunks]
    if full[0] == 1 and n0 > 1:  # one parameter over the whole leading axis: combine the blocks
        out = parts[0]
        for p in parts[1:]:
            out = ufunc(out, p)
    else:
        out = np.concatenate(parts, axis=0)
    if tuple(out.shape) != tuple(full):  # (a layout the row blocks do not follow: whole)
        return gm.reduce(table[codes], ufunc, axes)
    return out


# -- header level ------------------------------------------------------------------------------------
def check_block_grid(spec: TensorSpec) -> list[Finding]:
    """A ``block`` map's stored scale grid against the shape: ``ceil(n / extent)`` blocks per tiled axis.

    ``shape`` (error) when no stored scales array holds that many values (the evidence says when it
    holds ``floor`` as many: the partial edge blocks have no scale); ``block-tail`` (info) naming the
    partial edge blocks otherwise (legal: their scale covers the remainder).
    """
    gm = spec.group_map
    if spec.kind != "quantized" or gm is None or gm.granularity is not Granularity.BLOCK:
        return []
    axes, shape = tuple(spec.axes), tuple(int(n) for n in spec.shape)
    sizes = dict(zip(axes, shape))
    grid = gm.param_shape(shape, axes)
    want = int(np.prod(grid, dtype=np.int64))
    per_matrix = gm.n_groups(shape, axes)
    matrices = want // per_matrix if per_matrix else 0
    floor = matrices * int(np.prod([sizes[a] // b for a, b in gm.block], dtype=np.int64))  # whole blocks only
    extents = dict(gm.block)
    out: list[Finding] = []
    scales = [s for s in spec.stored if s.role == "scales"]
    counts = [int(np.prod(s.shape, dtype=np.int64)) for s in scales]
    if scales and want not in counts:
        first = scales[0]
        why = (": one scale per whole block only, the partial edge blocks have none" if counts[0] == floor
               and floor != want else "")
        out.append(finding("shape", spec.name, f"stored scales {first.name} {list(first.shape)} hold {counts[0]} "
                           f"values; the {gm.describe()} grid of a {'x'.join(map(str, shape))} tensor has "
                           f"{' x '.join(map(str, grid))} = {want} blocks (ceil of each extent){why}",
                           stored_tensor=first.name, expected=list(grid), found=list(first.shape), block=extents,
                           expected_blocks=want, found_values=counts[0], whole_blocks_only=bool(why)))
    edges = {a: sizes[a] % b for a, b in gm.block if sizes[a] % b}
    if edges:
        partial = gm.partial_blocks(shape, axes)
        pads = {a: -(-sizes[a] // extents[a]) * extents[a] for a in edges}
        out.append(finding("block-tail", spec.name, "partial edge blocks (legal; each scale covers what is left): "
                           + ", ".join(f"{a} {sizes[a]} = {sizes[a] // extents[a]} x {extents[a]} + {r}"
                                       for a, r in edges.items())
                           + f"; {partial} of {per_matrix} blocks per matrix are partial. Consumers that take whole "
                             f"blocks only (transformers 5.24 FP8 dequantize) need "
                           + ", ".join(f"{a} padded to {p}" for a, p in pads.items()),
                           severity="info", block=extents, grid=list(grid), edges=edges, partial_blocks=partial,
                           blocks_per_matrix=per_matrix, padded=pads))
    return out


# -- data level --------------------------------------------------------------------------------------
def check_nonfinite_codes(t: QuantizedTensor) -> list[Finding]:
    """``code-nonfinite`` when codes decode to NaN or infinity (E4M3 0x7F / 0xFF; E5M2 0x7C.. ; fnuz 0x80)."""
    el = float_element(t)
    if el is None or t.numel == 0:
        return []
    cb = np.asarray(el.values, dtype=np.float32)
    bad_codes = np.flatnonzero(~np.isfinite(cb))
    if not bad_codes.size:
        return []
    table = np.zeros(256, dtype=bool)
    table[bad_codes] = True
    if code_scans.count_table(t, table) == 0:  # the compiled count (fast extra): clean, nothing to locate
        return []
    codes = t.codes
    k, first, hist = 0, None, np.zeros(256, dtype=np.int64)
    for r0, r1 in _row_chunks(codes.shape, 1):  # row blocks: no full-size mask
        mask = table[codes[r0:r1]]
        n = int(np.count_nonzero(mask))
        if not n:
            continue
        if first is None:
            at = np.unravel_index(int(np.argmax(mask)), mask.shape)
            first = (int(at[0]) + r0,) + tuple(int(i) for i in at[1:])
        k += n
        hist += np.bincount(codes[r0:r1][mask], minlength=256)
    if not k:
        return []
    by_code = {f"0x{int(v):02X}": int(hist[v]) for v in np.flatnonzero(hist)}
    blk = block_of(t, first)
    return [finding("code-nonfinite", t.name, f"{k} of {t.numel} {el.name.upper()} codes decode to NaN or infinity "
                    f"({', '.join(f'{c}: {n}' for c, n in by_code.items())}); first at element {list(first)}, "
                    f"{t.group_map.describe()} index {blk}: no quantizer writes them, the bytes are not "
                    f"{el.name.upper()} or are corrupt", count=k, codes=by_code, first_index=list(first),
                    first_block=blk, element=el.name)]


def _rank_table(el: FloatElement) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 table: code -> rank of its |value| among the finite magnitudes, NaN / inf -> 0 like zero;
    the sorted finite magnitudes)."""
    mags = np.abs(np.asarray(el.values, dtype=np.float64))
    finite = np.isfinite(mags)
    levels = np.unique(mags[finite])
    rank = np.zeros(len(mags), dtype=np.uint8)
    rank[finite] = np.searchsorted(levels, mags[finite]).astype(np.uint8)
    return rank, levels


def powers_of_two(scales: np.ndarray) -> bool:
    """True when every scale is a finite positive exact power of two (whatever its stored dtype)."""
    s = np.asarray(scales, dtype=np.float64)
    if s.size == 0 or not np.all(np.isfinite(s)) or not np.all(s > 0):
        return False
    mant, _ = np.frexp(s)
    return bool(np.all(mant == 0.5))


def saturation_bound(el: FloatElement, scale_dtype: str, pow2_scales: bool = False) -> float:
    """The magnitude an absmax quantizer's largest code reaches in every non-zero group:
    ``max_finite``, or half of it for power-of-two scales (E8M0, or ``pow2_scales``: every scale of the
    tensor an exact power of two, e.g. DeepSeek V3.1 ``scale_fmt: "ue8m0"`` F32 scales; module docstring)."""
    return el.max_finite / 2 if scale_dtype == "F8_E8M0" or pow2_scales else el.max_finite


def block_saturation(t: QuantizedTensor) -> dict[str, Any] | None:
    """Per group: does the largest |code value| reach :func:`saturation_bound`? None when ``t`` is not
    a float-element tensor.

    Returns
    -------
    dict with ``bound``, ``groups``, ``all_zero`` (groups of zeros only, fine), ``unsaturated``,
    ``unsaturated_fraction`` (of the non-zero groups) and ``first_unsaturated`` (parameter indices).
    """
    el = float_element(t)
    if el is None:
        return None
    rank, levels = _rank_table(el)
    bound = saturation_bound(el, t.scheme.scale_dtype, powers_of_two(t.scales))
    top = int(np.searchsorted(levels, bound))  # first level >= bound
    if t.numel == 0:
        return {"bound": bound, "groups": 0, "all_zero": 0, "unsaturated": 0, "unsaturated_fraction": 0.0,
                "first_unsaturated": []}
    peak = code_scans.group_max_table(t, rank)  # the compiled scan (fast extra), else numpy in row blocks
    if peak is None:
        peak = reduce_codes(t, rank, np.maximum)
    zero = peak == 0
    unsat = (peak < top) & ~zero
    n, z, u = int(peak.size), int(zero.sum()), int(unsat.sum())
    return {"bound": bound, "groups": n, "all_zero": z, "unsaturated": u,
            "unsaturated_fraction": round(u / (n - z), 4) if n > z else 0.0, "first_unsaturated": _listed(unsat)}


def _only_e2m1_values(t: QuantizedTensor, el: FloatElement, rows: int = 4096) -> bool:
    """Whether every code of a 1-byte float-element tensor decodes to an E2M1 value (+-0, 0.5, 1, 1.5,
    2, 3, 4, 6): code counts taken in row blocks, so no temporary of the tensor's size."""
    codes = np.asarray(t.codes)
    if codes.dtype.itemsize != 1 or len(el.values) != 256:
        return False
    counts = code_scans.offset_histogram(t)  # the compiled histogram (fast extra)
    if counts is None:
        counts = np.zeros(256, dtype=np.int64)
        flat = codes.reshape(codes.shape[0], -1) if codes.ndim else codes.reshape(1, 1)
        for i in range(0, flat.shape[0], rows):
            counts += np.bincount(flat[i:i + rows].view(np.uint8).ravel(), minlength=256)
    e2m1 = np.isin(np.abs(np.asarray(el.values, np.float64)), np.abs(np.asarray(E2M1_VALUES, np.float64)))
    return bool(counts.any() and not counts[~e2m1].any())


def check_unsaturated(t: QuantizedTensor) -> tuple[list[Finding], dict[str, Any] | None]:
    """``unsaturated`` for groups whose largest |code value| stays below :func:`saturation_bound`."""
    stats = block_saturation(t)
    if stats is None or not stats["unsaturated"]:
        return [], stats
    el = float_element(t)
    gm = t.group_map
    u, n, z, frac = stats["unsaturated"], stats["groups"], stats["all_zero"], stats["unsaturated_fraction"]
    if el.name != "e2m1" and _only_e2m1_values(t, el):
        # qckpt's lossless FP4 -> FP8 widening (quant/widen.py): E2M1 values (|v| <= 6) held as E4M3 codes
        return [finding("unsaturated", t.name, f"every code is an E2M1 value (|v| <= 6) held as {el.name.upper()}: "
                        f"a lossless FP4 -> FP8 widening, whose groups reach 6, not {stats['bound']:g}",
                        severity="info", **stats, element=el.name, scale_dtype=t.scheme.scale_dtype)], stats
    if gm.granularity is Granularity.TENSOR:
        sev = "info"
        why = "a scale shared with other tensors (fused q/k/v or gate/up) or a static calibrated scale"
    else:
        sev = "warning" if frac >= UNSATURATED_WARNING_FRACTION and u >= 2 else "info"
        why = ("absmax quantizers never leave most groups short of it: codes of another element type, or scales not "
               "fitted per group" if sev == "warning" else
               "tuned or clipped scales (or a few groups rounded short); wrong only if the quantizer was absmax")
    return [finding("unsaturated", t.name, f"{u} of {n - z} non-zero {gm.describe()} groups never reach "
                    f"|{el.name.upper()}| = {stats['bound']:g} (an absmax quantizer reaches it in every non-zero "
                    f"group; {z} all-zero groups not counted): {why}", severity=sev, **stats,
                    element=el.name, scale_dtype=t.scheme.scale_dtype)], stats


# -- checkpoint level --------------------------------------------------------------------------------
def check_activation_scales(ckpt: Checkpoint) -> list[Finding]:
    """``activation-scale`` (info) listing the static activation (input) scales stored beside weights
    (role ``activation_scale``: runtime metadata, never applied to the weight by any decode here)."""
    arrays = [(spec.name, st.name) for spec in ckpt.specs() for st in spec.stored if st.role == "activation_scale"]
    if not arrays:
        return []
    tensors = sorted({t for t, _ in arrays})
    return [finding("activation-scale", None, f"{len(arrays)} static activation (input) scales are stored beside "
                    f"{len(tensors)} weights: runtime metadata for activation quantization, not applied to the "
                    f"weights (dequantized values and conversions ignore them)", arrays=[a for _, a in arrays],
                    tensors=tensors, count=len(arrays))]
