"""Alternative interpretations of a quantized tensor's stored arrays (DESIGN.md section 4).

A reader declares one interpretation (axes, group axis, nibble order, zero offset). Each function
here rebuilds what a *different* reader would decode from the same bytes, generically on the
logical model and the stored :class:`~converter.layout.AxisMap` records:

- ``transposed storage``: the stored ``(in, out)`` buffer read as ``(out, in)`` (``C.T`` reshaped);
- ``reversed dims``: GGUF-style ``ne`` reversal (the buffer reshaped as ``(in, out)`` and transposed);
- ``scales transposed`` / ``scales reshaped``: the scale (and zero) array in the other orientation;
- ``groups along <other axis>``: scales applied along the other logical axis (square tensors, B06);
- ``scales shifted one group forward / back``: every group given a neighbour's scale (wrong groups);
- ``nibble order <o>``: codes repacked with the declared AxisMap and unpacked with another in-word
  order (sequential, reversed, AWQ interleave and its inverse; B09);
- ``zero +1`` / ``zero -1``: the zero point (or implicit centre, or float bias) one step off (B01);
- ``sequential groups``: ``g_idx`` ignored (B11);
- stacked experts ``(expert, out, in)`` only: ``expert order reversed``, ``scales of the neighbouring expert``,
  ``each expert stored transposed`` (``[E, in, out]``, a BF16 export's orientation, read as ``[E, out, in]``),
  ``out rows de-interleaved`` (rows ``0::2`` then ``1::2``: a fused gate / up read as halves), and the scales
  shifted one group along ``in``;
- float elements (FP8 / FP4) only: ``scales as divisors`` (``codebook[q] / s``: a ``*_scale_inv`` or
  global scale taken the wrong way), ``transposed blocks`` (codes and block scales of a square
  tensor transposed together), ``block <2b>`` / ``block <b/2>`` (the stored block grid read with
  twice or half the block extent; past the stored grid the last block's scale, as a reader that
  clamps its index would).

Decoding here is plain float32 arithmetic with no invariants checked, because an alternative may
be out of range by construction (``z + 1 = 2^b``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Callable

import numpy as np

from converter.errors import LayoutError, QuantizationError
from converter.groups import Granularity, GroupMap
from converter.layout import EXPERT, AxisMap
from converter.formats.registry import word_orders
from converter.quant.quantize import dequantize_parts
from converter.tensor import QuantizedTensor
from converter.validate.float_checks import float_element


def decode(t: QuantizedTensor, *, codes: np.ndarray | None = None, scales: np.ndarray | None = None,
           zero_points: np.ndarray | None = None, group_map: GroupMap | None = None,
           zero_shift: float = 0.0) -> np.ndarray:
    """Float32 decode of ``t`` with any of its parts replaced (shapes must stay consistent).

    ``zero_shift`` moves the zero point by that many code steps (integer zero, implicit centre, or
    a float bias shifted by ``-zero_shift * scale``).
    """
    return dequantize_parts(t.codes if codes is None else codes, t.scales if scales is None else scales,
                            t.zero_points if zero_points is None else zero_points, t.scheme,
                            t.group_map if group_map is None else group_map, t.axes, zero_shift)


def _orders(n: int) -> dict[str, tuple[int, ...]]:
    out = {"sequential": tuple(range(n)), "reversed": tuple(reversed(range(n)))}
    for label, order in word_orders(n).items():
        out[label] = order
        out[f"inverse {label}"] = tuple(int(i) for i in np.argsort(order))
    return out


def nibble_alternatives(t: QuantizedTensor) -> dict[str, np.ndarray]:
    """Codes as another in-word order would read the same words (empty when codes are not packed)."""
    return {name: codes() for name, codes in lazy_nibble_alternatives(t).items()}


def lazy_nibble_alternatives(t: QuantizedTensor) -> dict[str, Callable[[], np.ndarray]]:
    """:func:`nibble_alternatives` as functions making each one's codes when called (one at a time in memory)."""
    amap: AxisMap | None = (t.stored or {}).get("codes")
    if amap is None or amap.packed_axis is None or set(amap.stored_axes) != set(t.axes):
        return {}
    if amap.word_bits % amap.bits or amap.packing not in ("stream", "padded"):
        return {}
    n = amap.word_bits // amap.bits
    if n < 2:
        return {}
    sizes = dict(zip(t.axes, t.shape))
    declared = tuple(amap.order) if amap.order else tuple(range(n))
    try:
        words = amap.to_stored(t.codes, t.axes)
    except (LayoutError, QuantizationError):  # a layout we cannot repack has no nibble alternative
        return {}
    out = {}
    dtype = t.codes.dtype

    def read(alt: AxisMap) -> np.ndarray:
        codes = alt.to_logical(words, t.axes, sizes, signed=t.scheme.signed)
        return np.ascontiguousarray(codes).astype(dtype, copy=False)
    for label, order in _orders(n).items():
        if order == declared:
            continue
        alt = replace(amap, order=None if order == tuple(range(n)) else order)
        out[f"nibble order {label}"] = partial(read, alt)
    return out


def _param_alternatives(t: QuantizedTensor) -> dict[str, tuple[np.ndarray, np.ndarray | None, GroupMap]]:
    """name -> (scales, zero_points, group map) for scales on the wrong axis or the wrong groups."""
    out: dict[str, tuple[np.ndarray, np.ndarray | None, GroupMap]] = {}
    s, z, gm, axes = t.scales, t.zero_points, t.group_map, t.axes
    if s.ndim != 2 or EXPERT in axes:
        return out
    a, b = s.shape

    def both(f: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
        return f(s), (f(z) if z is not None else None)

    if a > 1 and b > 1:
        if a == b:
            out["scales transposed"] = (*both(lambda x: np.ascontiguousarray(x.T)), gm)
        out["scales stored in the other orientation"] = (*both(lambda x: x.T.reshape(a, b)), gm)
        out["scales read in the other orientation"] = (*both(lambda x: x.reshape(b, a).T), gm)
    O, I = t.shape
    if gm.granularity is Granularity.GROUP and O == I and gm.g_idx is None:
        other = [x for x in axes if x != gm.axis][0]
        out[f"groups along {other}"] = (*both(lambda x: np.ascontiguousarray(x.T)),
                                        GroupMap.per_group(gm.group_size, other))
    if gm.granularity is Granularity.CHANNEL and O == I:
        other = [x for x in axes if x != gm.axis][0]
        shape = (1, I) if gm.axis == axes[0] else (O, 1)
        out[f"one scale per {other} index"] = (*both(lambda x: x.reshape(shape)), GroupMap.per_channel(other))
    if gm.granularity is Granularity.GROUP:
        ax = axes.index(gm.axis)
        if s.shape[ax] > 1:
            out["scales shifted one group forward"] = (*both(lambda x: np.roll(x, 1, axis=ax)), gm)
            out["scales shifted one group back"] = (*both(lambda x: np.roll(x, -1, axis=ax)), gm)
    return out


def alternatives(t: QuantizedTensor) -> dict[str, np.ndarray]:
    """Every alternative decode of ``t`` (float32, logical shape), keyed by a readable name.

    Only 2-D ``(out, in)`` tensors get the reshape alternatives; alternatives identical to the
    declared arrays (a 1-wide scale array "transposed") are dropped. All of them at once in memory:
    a caller comparing each with something uses :func:`lazy_alternatives` instead.
    """
    return {name: make() for name, make in lazy_alternatives(t).items()}


def lazy_alternatives(t: QuantizedTensor) -> dict[str, Callable[[], np.ndarray]]:
    """:func:`alternatives` as functions, each making its decode when called: a caller that drops each result
    before calling the next holds one alternative (and its temporaries) at a time, not a dozen (issue 15:
    ``validate --reference`` on a 268 MB float32 tensor peaked at 5.1 GB)."""
    out: dict[str, Callable[[], np.ndarray]] = {}
    q = t.codes
    if q.ndim == 2 and EXPERT not in t.axes:
        O, I = q.shape
        if O == I:
            out["transposed codes"] = lambda: decode(t, codes=np.ascontiguousarray(q.T))
        else:
            out["transposed storage"] = lambda: decode(t, codes=np.ascontiguousarray(q.T).reshape(O, I))
            out["reversed dims"] = lambda: decode(t, codes=np.ascontiguousarray(q.reshape(I, O).T))
        for name, (sc, zp, gm) in _param_alternatives(t).items():
            if gm is t.group_map and np.array_equal(sc, t.scales):
                continue
            out[name] = partial(decode, t, scales=sc, zero_points=zp, group_map=gm)
    if q.ndim == 3 and t.axes[0] == EXPERT:
        out.update(lazy_expert_alternatives(t))
    for name, codes in lazy_nibble_alternatives(t).items():
        out[name] = lambda codes=codes: decode(t, codes=codes())
    if t.scheme.codebook is None:
        out["zero +1"] = partial(decode, t, zero_shift=1.0)
        out["zero -1"] = partial(decode, t, zero_shift=-1.0)
    gm = t.group_map
    if gm.granularity is Granularity.GROUP and gm.g_idx is not None:
        seq = GroupMap.per_group(gm.group_size, gm.axis)
        if seq.param_shape(t.shape, t.axes) == tuple(t.scales.shape):
            out["sequential groups (g_idx ignored)"] = partial(decode, t, group_map=seq)
    if float_element(t) is not None:
        out.update(lazy_float_alternatives(t))
    return out


def expert_alternatives(t: QuantizedTensor) -> dict[str, np.ndarray]:
    """Alternative decodes of a stacked ``(expert, out, in)`` tensor (see the module docstring)."""
    return {name: make() for name, make in lazy_expert_alternatives(t).items()}


def lazy_expert_alternatives(t: QuantizedTensor) -> dict[str, Callable[[], np.ndarray]]:
    """:func:`expert_alternatives` as functions making each decode when called."""
    out: dict[str, Callable[[], np.ndarray]] = {}
    q, s, z, gm = t.codes, t.scales, t.zero_points, t.group_map
    E, O, I = q.shape

    def flip(a):
        return None if a is None else np.ascontiguousarray(a[::-1])
    if E > 1:
        out["expert order reversed"] = lambda: decode(t, codes=flip(q), scales=flip(s), zero_points=flip(z))
        if s.shape[0] == E:
            out["scales of the neighbouring expert"] = lambda: decode(
                t, scales=np.roll(s, 1, axis=0), zero_points=None if z is None else np.roll(z, 1, axis=0))

    def moved() -> np.ndarray:  # square: transposed; else the buffer read [E, out, in]
        m = np.ascontiguousarray(q.transpose(0, 2, 1))
        return m if O == I else m.reshape(E, O, I)
    out["each expert stored transposed ([E, in, out])"] = lambda: decode(t, codes=moved())
    if O % 2 == 0 and O > 2:
        perm = np.r_[0:O:2, 1:O:2]

        def rows(a):
            return None if a is None else (np.ascontiguousarray(a[:, perm]) if a.shape[1] == O else a)
        out["out rows de-interleaved (0::2 then 1::2)"] = lambda: decode(t, codes=rows(q), scales=rows(s),
                                                                         zero_points=rows(z))
    if gm.granularity is Granularity.GROUP and gm.axis == "in" and s.shape[2] > 1:
        out["scales shifted one group forward"] = lambda: decode(
            t, scales=np.roll(s, 1, axis=2), zero_points=None if z is None else np.roll(z, 1, axis=2))
        out["scales shifted one group back"] = lambda: decode(
            t, scales=np.roll(s, -1, axis=2), zero_points=None if z is None else np.roll(z, -1, axis=2))
    return out


def _reblocked(t: QuantizedTensor, factor: float) -> np.ndarray:
    """Float32 decode of a 2-D block tensor whose stored scale grid is read with ``factor`` times the
    block extents (indices past the grid clamped to its last block)."""
    s = np.asarray(t.scales, dtype=np.float32)
    index = []
    for ax, (a, n) in enumerate(zip(t.axes, t.shape)):
        b = t.group_map.extent(a)
        if b is None:
            index.append(np.zeros(n, dtype=np.int64))
        else:
            index.append(np.minimum(np.arange(n) // max(1, int(b * factor)), s.shape[ax] - 1))
    cb = np.asarray(t.scheme.codebook, dtype=np.float32)
    out = cb[t.codes]
    rows, cols = index
    for r in np.unique(rows):  # one block row of scales at a time: never a full-size scale array
        sel = slice(int(np.searchsorted(rows, r)), int(np.searchsorted(rows, r, side="right")))
        out[sel] *= s[r][cols]
    return out


def float_alternatives(t: QuantizedTensor) -> dict[str, np.ndarray]:
    """The float-element (FP8 / FP4) alternatives of a 2-D or stacked tensor (see the module docstring)."""
    return {name: make() for name, make in lazy_float_alternatives(t).items()}


def lazy_float_alternatives(t: QuantizedTensor) -> dict[str, Callable[[], np.ndarray]]:
    """:func:`float_alternatives` as functions making each decode when called."""
    out: dict[str, Callable[[], np.ndarray]] = {}
    s = np.asarray(t.scales, dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero scale stays 0 (its block decodes to 0 either way)
        recip = np.where(s != 0, np.float32(1.0) / s, np.float32(0.0)).astype(np.float32)
    out["scales as divisors (codebook[q] / s)"] = partial(decode, t, scales=recip)
    gm, q = t.group_map, t.codes
    if gm.granularity is not Granularity.BLOCK or q.ndim != 2 or EXPERT in t.axes:
        return out
    O, I = q.shape
    bo, bi = gm.extent("out"), gm.extent("in")
    if O == I and bo == bi:
        out["transposed blocks (codes and scales)"] = lambda: decode(t, codes=np.ascontiguousarray(q.T),
                                                                     scales=np.ascontiguousarray(s.T))
    for factor, word in ((2.0, "twice"), (0.5, "half")):
        ext = " x ".join(f"{a} {max(1, int(b * factor))}" for a, b in gm.block)
        out[f"block {ext} (the scale grid read with {word} the block size)"] = partial(_reblocked, t, factor)
    return out
