"""Lossless widening of FP4 (E2M1) codes to FP8 (E4M3) codes, scales carried: no rounding anywhere.

Every E2M1 value (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; OCP MX spec v1.0 section 5.3.3)
is an E4M3 value (3 mantissa bits hold 1.5 and 3, the exponents -1 .. 2 are normal), so an E2M1 code
maps to one E4M3 byte of the same value (signed zero to signed zero: E2M1 0x8 -> E4M3 0x80).
``codebook[q] * s`` is then the same float32 product under either code, and a group's scale can be
carried unchanged: MXFP4 (E2M1 x E8M0 per 32 along ``in``) becomes E4M3 codes with a power-of-two
scale per 32-element block of one row (MLX ``mxfp8``; compressed-tensors ``float-quantized``
strategy block ``[1, 32]``; the FP8 ``1x32`` block of ``--fp8 e4m3 --block 1x32``). An NVFP4 source
widens the same way with its effective float32 scales (``s`` and the global scale combined,
:func:`converter.values.effective_scales`) stored as F32.

The only thing that can fail is the scale's dtype: the target scale dtype must hold every carried
scale exactly (E8M0: any E8M0; F32: any E8M0 / any float32 effective scale; BF16: all E8M0 exponents
-127 .. 127, as bf16 has 8 exponent bits and subnormals down to 2^-133; F16 only 2^-24 .. 2^15).
A scale outside is refused (:class:`converter.errors.NotRepresentableError` naming the tensor, the
scales field, the first group index, the target dtype and the value), never rounded.
"""

from __future__ import annotations

import numpy as np

from converter.codebooks import ELEMENTS
from converter.errors import NotRepresentableError
from converter.groups import Granularity, GroupMap
from converter.layout import IN
from converter.rows import Rows
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor
from converter.values import effective_scales

E2M1, E4M3 = ELEMENTS["e2m1"], ELEMENTS["e4m3"]


def _e2m1_to_e4m3() -> np.ndarray:
    """uint8 (16,): E2M1 code -> the E4M3 byte of the same value, sign of zero included (checked)."""
    src = np.asarray(E2M1.values, dtype=np.float32)
    dst = np.asarray(E4M3.values, dtype=np.float32)
    table = np.zeros(16, dtype=np.uint8)
    for q, v in enumerate(src):
        hits = np.flatnonzero((dst == v) & (np.signbit(dst) == np.signbit(v)))
        if hits.size != 1:  # cannot happen for OCP E2M1 / E4M3 fn; guards a changed codebook
            raise AssertionError(f"E2M1 code {q} ({v}) has {hits.size} E4M3 bytes of the same value")
        table[q] = hits[0]
    return table


#: E2M1 code -> E4M3 byte of the same value.
E2M1_TO_E4M3 = _e2m1_to_e4m3()


def widens(source: QuantScheme, source_groups: GroupMap, target: QuantScheme, target_groups: GroupMap) -> bool:
    """True when ``source`` (E2M1 codes) widens exactly onto ``target`` (E4M3 codes) with the same
    groups: ``group(in, G)`` (no ``g_idx``) onto ``group(in, G)`` or a ``1 x G`` block."""
    if source.codebook != E2M1.values or target.codebook != E4M3.values:
        return False
    sg = source_groups
    if sg.granularity is not Granularity.GROUP or sg.axis != IN or sg.g_idx is not None:
        return False
    g = source_groups.group_size
    if target_groups.granularity is Granularity.GROUP:
        return target_groups.axis == IN and target_groups.group_size == g and target_groups.g_idx is None
    if target_groups.granularity is Granularity.BLOCK:
        return target_groups.extent("out") == 1 and target_groups.extent(IN) == g
    return False


def _exact_scales(t: QuantizedTensor, scale_dtype: str) -> np.ndarray:
    s32 = effective_scales(t.scales, t.global_scale, t.scheme.global_scale)
    target = QuantScheme(8, False, scale_dtype=scale_dtype, codebook=E4M3.values).scale_np_dtype
    if scale_dtype == t.scheme.scale_dtype and t.global_scale is None:
        out = np.array(t.scales)
    else:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            out = s32.astype(target)
    back = out.astype(np.float32)
    bad = ~((back.view(np.uint32) == s32.view(np.uint32)) & np.isfinite(s32))
    if bad.any():
        i = tuple(int(x) for x in np.unravel_index(int(np.argmax(bad)), bad.shape))
        raise NotRepresentableError(
            "a group scale is not exactly representable in the target scale dtype: the widening to E4M3 "
            "would round it", tensor=t.name, field="scales", expected=f"finite {scale_dtype} equal to the "
            f"float32 scale", found=f"{float(s32[i])!r} at group index {list(i)} ({int(bad.sum())} of {bad.size})",
            hint="a wider --scale-dtype (f32 holds every E8M0 and float32 scale)")
    return out


def widen_to_e4m3(t: QuantizedTensor, scheme: QuantScheme, group_map: GroupMap) -> QuantizedTensor:
    """``t`` (E2M1 codes, groups of G along ``in``) as E4M3 codes on ``group_map`` (``group(in, G)`` or a
    ``1 x G`` block) with the same per-group scales in ``scheme.scale_dtype``.

    Parameters
    ----------
    t : QuantizedTensor, E2M1 codebook, axes ``(out, in)`` or ``(expert, out, in)``, uint8 codes.
    scheme : target, an E4M3 codebook scheme (8 bits, unsigned codes), any scale dtype.
    group_map : target groups (see :func:`widens`).

    Returns
    -------
    QuantizedTensor with codes uint8 E4M3 bytes (same shape), scales ``group_map.param_shape`` in
    ``scheme.scale_dtype`` (the global scale folded in, none kept), dequantizing to bit-identical
    float32 values (checked row block by row block).

    Raises
    ------
    NotRepresentableError
        A scale the target scale dtype cannot hold exactly (or NaN), naming tensor, field and group;
        or (checked, cannot happen) a decoded value that differs.
    ValueError
        ``widens`` is False for these schemes and groups.
    """
    if not widens(t.scheme, t.group_map, scheme, group_map):
        raise ValueError(f"{t.scheme.describe()} {t.group_map.describe()} does not widen onto "
                         f"{scheme.describe()} {group_map.describe()}")
    scales = _exact_scales(t, scheme.scale_dtype)
    codes = E2M1_TO_E4M3[np.asarray(t.codes)]
    target = scheme.replace(global_scale=None)
    out = QuantizedTensor(t.name, t.axes, codes, scales.reshape(group_map.param_shape(t.shape, t.axes)), target,
                          group_map, stored={})
    _check_bits(t, out)
    return out


def _check_bits(a: QuantizedTensor, b: QuantizedTensor) -> None:
    """Both decode to the same float32 bits (row blocks; experts one at a time)."""
    if len(a.shape) == 3:
        pairs = [(a.replace(codes=a.codes[e], scales=a.scales[e], axes=a.axes[1:]),
                  b.replace(codes=b.codes[e], scales=b.scales[e], axes=b.axes[1:])) for e in range(a.shape[0])]
    else:
        pairs = [(a, b)]
    for x, y in pairs:
        rx, ry = Rows(x), Rows(y)
        for r0 in range(0, x.shape[0], rx.step):
            u = np.asarray(rx[r0:r0 + rx.step], dtype=np.float32)
            v = np.asarray(ry[r0:r0 + rx.step], dtype=np.float32)
            if not np.array_equal(u.view(np.uint32), v.view(np.uint32)):
                at = tuple(int(i) for i in np.argwhere(u.view(np.uint32) != v.view(np.uint32))[0])
                raise NotRepresentableError("widened E4M3 values differ from the E2M1 source", tensor=a.name,
                                            field="codes", expected=float(u[at]), found=float(v[at]))
