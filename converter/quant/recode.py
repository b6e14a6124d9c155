"""Exact re-expressions of one quantization scheme in another (no requantization).

Formats disagree on the code domain and zero-point family while holding the same grid:
compressed-tensors stores signed codes ``q_s``; GPTQ/AWQ unsigned ``q_u = q_s + 2^(b-1)`` with an
integer zero point; MLX and GGUF ``_1`` types an additive float bias ``b = -z * s``
(FORMATS.md section 0: A -> B: ``beta = -s z``; B -> A exact only when ``-beta/s`` is an integer in
range). Each function returns a new QuantizedTensor whose dequantized values are identical to the
input's (bit-for-bit in float32), or raises :class:`NotRepresentableError`; :func:`as_float_bias`
reports whether casting the bias to the scale dtype rounded.
"""

from __future__ import annotations

import numpy as np

from converter.errors import NotRepresentableError, exact_str
from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor


def _dtype_label(dtype: "np.dtype | str | type") -> str:
    dt = np.dtype(dtype)
    return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dt.name, dt.name)


def exact_cast(arr: np.ndarray, dtype: "np.dtype | str | type", *, tensor: str, field: str, message: str | None = None,
               expected: str | None = None, hint: str | None = None, nan_exact: bool = True) -> np.ndarray:
    """``arr`` cast to ``dtype`` when every value survives the cast exactly, else NotRepresentableError.

    Parameters
    ----------
    arr : ndarray, any float dtype, any shape
    dtype : numpy dtype (float16, ml_dtypes.bfloat16, float32 ...)
    tensor, field : str
        Named in the error.
    message, expected, hint : str, optional
        The caller's wording of the refusal (defaults name the target dtype).
    nan_exact : bool
        Whether NaN -> NaN counts as exact (True, GGUF); False refuses NaN like any rounded value.

    Returns
    -------
    ndarray of ``dtype``, same shape (``arr`` itself when it already has ``dtype``).
    A value is exact when it casts back to the same float32 value (NaN: see ``nan_exact``);
    overflow to inf and underflow to 0 do not.

    Raises
    ------
    NotRepresentableError
        Names the first index that would round and how many of all values would.
    """
    dt = np.dtype(dtype)
    if arr.dtype == dt:
        return arr
    a32 = np.asarray(arr, dtype=np.float32)
    with np.errstate(over="ignore"):
        h = a32.astype(dt)
    h32 = h.astype(np.float32)
    same = h32 == a32
    bad = ~(same | (np.isnan(a32) & np.isnan(h32))) if nan_exact else ~same
    if bad.any():
        label = _dtype_label(dt)
        idx = np.unravel_index(int(np.argmax(bad)), a32.shape)
        raise NotRepresentableError(
            message or f"{field} are not exactly representable in {label}", tensor=tensor, field=field,
            expected=expected or f"values exact in {label}",
            found=f"{exact_str(a32[idx])} at {list(map(int, idx))} ({int(bad.sum())} of {bad.size} would round)",
            hint=hint)
    return h


def as_unsigned(t: QuantizedTensor) -> QuantizedTensor:
    """Signed codes -> unsigned codes ``q + 2^(b-1)``; the centre / zero points shift with them.

    Returns
    -------
    QuantizedTensor
        Same name, axes and shape; codes uint8 (still packed when they were: the fields are
        read with their top bit flipped), integer zero points uint8, float biases moved by
        ``-2^(b-1) * s``. ``t`` itself when already unsigned. Codebook schemes are never shifted.

    Raises
    ------
    NotRepresentableError
        When moving a float bias rounds it in its dtype.
    """
    s = t.scheme
    if not s.signed:
        return t
    off = 1 << (s.bits - 1)
    codes = t.packed.shifted() if t.packed is not None else (t.codes.astype(np.int16) + off).astype(np.uint8)
    zp = t.zero_points
    if s.zero_point is ZeroPoint.INTEGER:
        zp = (zp.astype(np.int16) + off).astype(np.uint8)
    elif s.zero_point is ZeroPoint.FLOAT:  # s*q + b = s*(q + off) + (b - off*s): exact only if the cast is
        b32 = zp.astype(np.float32) - np.float32(off) * t.scales.astype(np.float32)
        zp = b32.astype(zp.dtype)
        if not np.array_equal(zp.astype(np.float32), b32):
            raise NotRepresentableError("shifting signed codes changes the float bias inexactly", tensor=t.name,
                                        field="zero_points", hint="requantize to an unsigned scheme")
    return t.replace(codes=codes, zero_points=zp, scheme=s.replace(signed=False))


def as_signed(t: QuantizedTensor) -> QuantizedTensor:
    """Unsigned codes -> signed ``q - 2^(b-1)`` (zero points shift with them).

    Returns
    -------
    QuantizedTensor
        Same name, axes and shape; codes int8 (still packed when they were), integer zero
        points int8. ``t`` itself when already signed.

    Raises
    ------
    NotRepresentableError
        For codebook schemes (indices, not integers on a grid).
    """
    s = t.scheme
    if s.signed:
        return t
    if s.codebook is not None:
        raise NotRepresentableError("codebook indices have no signed form", tensor=t.name, field="scheme.codebook")
    off = 1 << (s.bits - 1)
    codes = t.packed.shifted() if t.packed is not None else (t.codes.astype(np.int16) - off).astype(np.int8)
    zp = t.zero_points
    if s.zero_point is ZeroPoint.INTEGER:
        zp = (zp.astype(np.int16) - off).astype(np.int8)
    return t.replace(codes=codes, zero_points=zp, scheme=s.replace(signed=True))


def as_integer_zero(t: QuantizedTensor) -> QuantizedTensor:
    """Express ``t`` with explicit integer zero points (``x = s * (q - z)``).

    Symmetric schemes get ``z`` = the centre everywhere. Float biases become ``z = -b / s`` when that
    is an integer within the code range for every group (MLX ``affine_quantize`` makes it so before
    the fp16 cast, FORMATS.md section 4.2), checked in float32.

    Raises
    ------
    NotRepresentableError
        When some ``-b / s`` is not an integer in range (names the first group), or for codebooks.
    """
    s = t.scheme
    if s.zero_point is ZeroPoint.INTEGER:
        return t
    if s.codebook is not None:
        raise NotRepresentableError("a codebook scheme has no integer zero point", tensor=t.name,
                                    field="scheme.codebook")
    if s.zero_point is ZeroPoint.NONE:
        zp = np.full(t.scales.shape, s.center, dtype=s.code_dtype)
        return t.replace(zero_points=zp, scheme=s.replace(zero_point=ZeroPoint.INTEGER))
    sc = t.scales.astype(np.float32)
    b = t.zero_points.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):  # (a zero scale: z is inf / NaN, not ok)
        z = -b / sc
        zr = np.rint(z)
        ok = np.isfinite(z) & (zr == z) & (zr >= s.qmin) & (zr <= s.qmax)
        # exactness: the integer form must reproduce s*q + b exactly, i.e. -z*s == b in float32
        ok &= (-(zr * sc)).astype(np.float32) == b
    if not ok.all():
        idx = np.unravel_index(int(np.argmin(ok)), ok.shape)
        # every number as the shortest decimal that reads back as itself (124.00012 is not 124): -b/s in
        # float32, the stored bias and scale in their own dtype
        stored_b, stored_s, where = t.zero_points[idx], t.scales[idx], f"{_group_axes(t)} {list(map(int, idx))}"
        raise NotRepresentableError("float bias is not an integer zero point", tensor=t.name, field="zero_points",
                                    expected=f"-bias/scale an integer in [{s.qmin}, {s.qmax}]",
                                    found=f"-bias/scale = {exact_str(z[idx])} at {where} "
                                          f"(stored bias {exact_str(stored_b)}, scale {exact_str(stored_s)} "
                                          f"{s.scale_dtype}; {int(ok.size - ok.sum())} of {ok.size} groups)",
                                    hint="requantize with --asym to a target that stores integer zero points")
    return t.replace(zero_points=zr.astype(s.code_dtype), scheme=s.replace(zero_point=ZeroPoint.INTEGER))


def _group_axes(t: QuantizedTensor) -> str:
    """The named axes of ``t``'s scale array, ``in`` counted in groups: ``(out, group)``."""
    return "(" + ", ".join("group" if a == IN else a for a in t.axes) + ")" if t.scales.ndim == len(t.axes) else "group"


def as_float_bias(t: QuantizedTensor) -> tuple[QuantizedTensor, bool]:
    """Express ``t`` with an additive bias ``b = -z * s`` (``x = s * q + b``) in the scale dtype.

    Returns
    -------
    (tensor, exact)
        ``exact`` is False when casting some ``-z * s`` to the scale dtype rounded it (the result
        then differs from the source by at most half an ulp of the bias per element).
    """
    s = t.scheme
    if s.zero_point is ZeroPoint.FLOAT:
        return t, True
    if s.codebook is not None:
        raise NotRepresentableError("a codebook scheme has no float bias", tensor=t.name, field="scheme.codebook")
    t = as_unsigned(t)
    s = t.scheme
    sc = t.scales.astype(np.float32)
    z = np.float32(s.center) if s.zero_point is ZeroPoint.NONE else t.zero_points.astype(np.float32)
    b32 = -(z * sc)
    b = np.asarray(b32, dtype=np.float32).astype(s.scale_np_dtype)
    exact = bool(np.array_equal(b.astype(np.float32), np.broadcast_to(b32, b.shape)))
    return t.replace(zero_points=np.broadcast_to(b, t.scales.shape).copy(),
                     scheme=s.replace(zero_point=ZeroPoint.FLOAT)), exact


def as_groups(t: QuantizedTensor, group_size: int) -> QuantizedTensor:
    """Re-express ``t`` with groups of ``group_size`` consecutive elements along ``in``.

    Each new group takes the parameters (scale, zero point or bias) of the tensor, row, or larger
    group it lies in, so every element keeps exactly the parameters it had: codes untouched,
    values bit-identical. Used by writers whose format only has small groups along ``in``: MLX
    affine (``mlx/ops.cpp`` ``affine_quantize``: 32/64/128 along the last axis), GGUF legacy
    blocks (32 elements, ``ggml-common.h``).

    Parameters
    ----------
    t : QuantizedTensor
        Axes ending in ``in`` (``(out, in)`` or ``(expert, out, in)``); granularity tensor, channel
        along ``out``, or groups along ``in`` of a multiple of ``group_size`` without ``g_idx``.
    group_size : int
        Must divide ``in_features``.

    Raises
    ------
    NotRepresentableError
        ``in % group_size != 0``, act-order ``g_idx``, a group size that ``group_size`` does not
        divide, another granularity, or no ``in`` axis.
    """
    gm = t.group_map
    if gm.granularity is Granularity.GROUP and gm.axis == IN and gm.group_size == group_size and gm.g_idx is None:
        return t
    if IN not in t.axes:
        raise NotRepresentableError("no 'in' axis to group along", tensor=t.name, field="axes",
                                    expected="an 'in' axis", found=list(t.axes))
    ax = t.axes.index(IN)
    n_in = int(t.shape[ax])
    g = gm.granularity
    ok = (g is Granularity.TENSOR or (g is Granularity.CHANNEL and gm.axis == OUT)
          or (g is Granularity.GROUP and gm.axis == IN and gm.g_idx is None and group_size > 0
              and gm.group_size % group_size == 0))
    if not ok or group_size <= 0 or n_in % group_size:
        raise NotRepresentableError("parameters cannot be regrouped along 'in' exactly", tensor=t.name,
                                    field="group_map",
                                    expected=f"per-tensor, per-channel(out) or groups of a multiple of {group_size} "
                                             f"along in (no g_idx), with in % {group_size} == 0",
                                    found=f"{gm.describe()}{' with g_idx' if gm.g_idx is not None else ''}, in={n_in}")
    new = GroupMap.per_group(group_size, axis=IN)
    pshape = new.param_shape(t.shape, t.axes)

    def spread(a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            return None
        if g is Granularity.GROUP:  # each old group covers group_size_old / group_size new ones
            a = np.repeat(a, gm.group_size // group_size, axis=ax)[(slice(None),) * ax + (slice(0, pshape[ax]),)]
        return np.ascontiguousarray(np.broadcast_to(a, pshape))
    return t.replace(scales=spread(t.scales), zero_points=spread(t.zero_points), group_map=new)


def as_positive_scales(t: QuantizedTensor) -> QuantizedTensor:
    """Make every scale non-negative by flipping the grid of negatively scaled groups (exact).

    MLX's ``affine_quantize`` picks a negative scale when the group's largest magnitude is its
    maximum (FORMATS.md section 4.2); GPTQ, AWQ and compressed-tensors expect positive scales. For an
    integer zero point, ``s (q - z) = (-s) ((qmin + qmax - q) - (qmin + qmax - z))`` holds exactly and
    the flipped codes stay in range. Other families are returned unchanged (their flip is not exact).

    Returns
    -------
    QuantizedTensor with ``scales >= 0`` (integer zero points), else ``t`` itself.
    """
    s = t.scheme
    if s.zero_point is not ZeroPoint.INTEGER:
        return t
    sc = t.scales.astype(np.float32)
    neg = sc < 0
    if not neg.any():
        return t
    total = s.qmin + s.qmax
    mask = t.group_map.expand(neg, t.shape, t.axes)
    codes = np.where(mask, total - t.codes.astype(np.int16), t.codes).astype(s.code_dtype)
    zp = np.where(neg, total - t.zero_points.astype(np.int16), t.zero_points).astype(t.zero_points.dtype)
    scales = np.where(neg, -t.scales, t.scales).astype(t.scales.dtype)
    return t.replace(codes=codes, zero_points=zp, scales=scales)
