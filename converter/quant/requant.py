"""Requantize a QuantizedTensor to another granularity, bit width, symmetry or scale dtype.

Two routes, chosen per tensor *before any data moves* by :func:`classify` (from the spec alone):

- **exact**: the target grid contains every source value, so codes are carried, never recomputed:
  per-tensor -> per-channel -> per-group and group ``G`` -> group ``G/k`` (scales repeated),
  symmetric -> asymmetric (zero point = the implicit centre), more bits with the same scale (codes
  shifted into the wider domain), a wider scale dtype (F16/BF16 -> F32 ...).
- **lossy**: everything else (per-group -> per-channel, group 32 -> 128, fewer bits, asym -> sym,
  a narrower scale dtype, act-order groups to a target without ``g_idx``): unpack, dequantize in
  float32 (bf16/fp16 scales widened first, CASES.md B24/B25), requantize with round-half-to-even
  through :func:`converter.quant.quantize.choose_params` / :func:`~converter.quant.quantize.codes_for`
  (the one RTN quantizer), optionally with an MSE clipping search (:func:`mse_scale_search`).
  A target format that defines its types by a reference quantizer (GGUF: llama.cpp's) supplies a
  :class:`~converter.quant.format_quant.FormatQuantizer`; its ``quantize`` then replaces the RTN
  step for the targets it accepts, on the same float32 source values.

When a lossy plan meets data whose parameters happen to be constant within every target group
(e.g. per-channel -> group -> per-channel), the codes are still carried and the result is exact;
the report shows the plan and the measured error side by side.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from converter.codebooks import element_of
from converter.errors import QuantizationError
from converter.groups import Granularity, GroupMap
from converter.kernels.error_sums import ErrorSums
from converter.kernels.rtn import quantize_rows
from converter.quant.carry import carry, carry_rounded_bias, carry_rounded_zero, exact_regroup
from converter.quant.classify import classify
from converter.quant.float_quant import quantize_float
from converter.quant.format_quant import FormatQuantizer, quantize_with, streamable
from converter.quant.quantize import choose_params, codes_for
from converter.quant.result import RequantResult
from converter.quant.search import DEFAULT_RATIOS, mse_scale_search
from converter.quant.target import Target, resolve
from converter.quant.widen import widen_to_e4m3, widens
from converter.rows import Rows
from converter.scheme import QuantScheme, ZeroPoint
from converter.dtypes import dtype_name
from converter.spec import StoredArray
from converter.tensor import QuantizedTensor, TensorSpec

__all__ = ["Target", "resolve", "classify", "carry", "exact_regroup", "mse_scale_search", "requantize",
           "target_spec", "quantized_spec", "RequantResult", "DEFAULT_RATIOS", "format_rows_target"]


def format_rows_target(t: "QuantizedTensor | TensorSpec", target: Target, fmt: FormatQuantizer | None
                       ) -> "tuple[QuantScheme, GroupMap, str] | None":
    """``(scheme, group_map, quantizer label)`` when :func:`requantize` of ``t`` (a tensor or its spec) to
    ``target`` is ``fmt``'s own quantizer on a type only the format defines (``fmt.same_type`` False: a GGUF
    K-quant, never carried) over rows a :class:`~converter.quant.format_quant.QuantizedRows` stream can
    produce (:func:`~converter.quant.format_quant.streamable`); else None (requantize it whole)."""
    if fmt is None or fmt.same_type is None or target.scale_search != "none":
        return None
    scheme, gm = resolve(t.scheme, t.group_map, target, fmt)
    if fmt.same_type(t, scheme, gm) is not False or widens(t.scheme, t.group_map, scheme, gm):
        return None
    label = fmt.accepts(scheme, gm, tuple(t.shape), tuple(t.axes))
    if label is None or not streamable(t.shape, gm, t.axes):
        return None
    gm.check_shape(t.shape, t.axes)
    return scheme, gm, label


def requantize(t: QuantizedTensor, target: Target, *, allow_carry: bool = True,
               fmt: FormatQuantizer | None = None) -> RequantResult:
    """Requantize ``t`` to ``target`` (exact carry when possible, else unpack -> float32 -> RTN).

    Parameters
    ----------
    t : QuantizedTensor (any scheme; bf16/fp16 scales are widened to float32 before arithmetic).
    target : Target
    allow_carry : carry codes whenever the data allow it (also under a lossy plan).
    fmt : FormatQuantizer of the target format, optional. The target is adapted to the format
        (:func:`resolve`); when the data are not carried, the format's own quantizer produces
        the targets it accepts (:func:`converter.quant.format_quant.quantize_with`: from the
        source's float32 dequantized values), unless ``--scale-search mse`` is asked for.

    Returns
    -------
    RequantResult
        The tensor, its route (``"carried"`` | ``"requantized"``), for ``--scale-search mse`` the
        search totals, ``quantizer`` (the format quantizer's label) when one produced the
        result, and what the error report reuses (figures summed in the quantizer's blocks, or
        the source values).

    Raises
    ------
    QuantizationError
        Non-finite source values, or a scale that overflows the target scale dtype (names the
        group; hint: a wider ``--scale-dtype``).
    """
    scheme, gm = resolve(t.scheme, t.group_map, target, fmt)
    same = fmt.same_type(t, scheme, gm) if fmt is not None and fmt.same_type is not None else None
    if same:  # the source is stored in the very type the format defines: kept as it is
        return RequantResult(t, "carried", identical=True)
    if allow_carry and target.scale_search == "none" and widens(t.scheme, t.group_map, scheme, gm):
        # FP4 -> FP8: every E2M1 value is an E4M3 value, scales carried (refused when the scale dtype
        # cannot hold them exactly): lossless, checked bit for bit
        return RequantResult(widen_to_e4m3(t, scheme, gm), "carried", identical=True,
                             note="E2M1 codes widened to E4M3 (the same values), group scales carried")
    if allow_carry and target.scale_search == "none" and same is None:
        out = carry(t, scheme, gm)
        if out is not None:  # carry() checked the values identical
            return RequantResult(out, "carried", identical=True)
    label = fmt.accepts(scheme, gm, tuple(t.shape), tuple(t.axes)) \
        if fmt is not None and target.scale_search == "none" else None
    if label is not None:  # the format's own quantizer defines this target (its bytes, not a closer carry)
        gm.check_shape(t.shape, t.axes)
        return dataclasses.replace(quantize_with(fmt, t, scheme, gm), quantizer=label)
    rounded_bias = None
    if allow_carry and target.scale_search == "none":  # integer zero points -> fp16 float biases (MLX, Q4_1 g128)
        rounded_bias = carry_rounded_bias(t, scheme, gm)
    if scheme.codebook is not None:  # a float element (FP8) target: its own round-to-nearest
        return _to_float_element(t, scheme, gm)
    scheme = scheme.replace(rounding="half_even")
    alt = None
    if (allow_carry and target.scale_search == "none" and t.scheme.zero_point is ZeroPoint.FLOAT
            and scheme.zero_point is ZeroPoint.INTEGER):
        alt = carry_rounded_zero(t, scheme, gm)
    gm.check_shape(t.shape, t.axes)
    fast = vs_source = search = None
    if (target.scale_search != "mse" and len(t.shape) == 2 and t.numel and gm.row_local(t.axes)
            and gm.granularity is not Granularity.TENSOR):
        # choose_params + codes_for in cache-sized row blocks (bit-identical), the source dequantized
        # block by block as it goes (the float32 matrix is never held whole), the error figures
        # summed inside the same blocks (no second pass over the tensor)
        sums = ErrorSums(*t.shape, gm.group_size if gm.granularity is Granularity.GROUP else None)
        # (the row quantizer uses each block's rows before reading the next: one reused block buffer)
        fast = quantize_rows(Rows(t, reuse=True), scheme, group_size=sums.G if sums.grouped else None,
                             tensor=t.name, compare=sums)
        if fast is not None:
            vs_source = sums.figures()
    x = None
    if fast is not None:
        scales, zps, codes, degenerate = fast.scales, fast.zero_points, fast.codes, fast.degenerate_groups
    else:
        x = t.dequantize()
        if target.scale_search == "mse":
            scales, zps, search = mse_scale_search(x, scheme, gm, t.axes, tensor=t.name)
        else:
            scales, zps = choose_params(x, scheme, gm, t.axes, tensor=t.name)
        if zps is not None and scheme.zero_point is ZeroPoint.INTEGER:
            zps = zps.astype(scheme.code_dtype)
        codes = codes_for(x, scales, zps, scheme, gm, t.axes)
        degenerate = int(np.count_nonzero(gm.reduce(np.abs(x), np.maximum, t.axes) == 0))
    out = QuantizedTensor(t.name, t.axes, codes, scales, scheme, gm, zero_points=zps, stored={})
    result = RequantResult(out, "requantized", degenerate_groups=degenerate, vs_source=vs_source,
                           values=x, scale_search=search)
    if rounded_bias is not None:
        return _closer(t, result, rounded_bias)
    if alt is not None:
        x = x if x is not None else t.dequantize()
        e_rtn = float(np.sum((out.dequantize() - x).astype(np.float64) ** 2))
        e_alt = float(np.sum((alt.dequantize() - x).astype(np.float64) ** 2))
        if e_alt <= e_rtn:
            return dataclasses.replace(
                result, tensor=alt, route="carried", vs_source=None,
                note="float biases rounded to the nearest integer zero point; codes and scales carried")
    return result


def _closer(t: QuantizedTensor, result: RequantResult, rounded_bias: QuantizedTensor | None) -> RequantResult:
    """``result``, or the codes-and-scales carry with rounded float biases (:func:`carry_rounded_bias`)
    when its squared error against ``t``'s float32 values is not larger."""
    if rounded_bias is None:
        return result
    x = result.values if result.values is not None else t.dequantize()
    e_req = float(np.sum((result.tensor.dequantize() - x).astype(np.float64) ** 2))
    e_bias = float(np.sum((rounded_bias.dequantize() - x).astype(np.float64) ** 2))
    if e_bias > e_req:
        return result
    return dataclasses.replace(result, tensor=rounded_bias, route="carried", vs_source=None, values=x,
                               quantizer=None, scale_search=None,
                               note="codes and scales carried; integer zero points as float biases -z*s "
                                    f"rounded to {rounded_bias.scheme.scale_dtype}")


def _to_float_element(t: QuantizedTensor, scheme: QuantScheme, gm: GroupMap) -> RequantResult:
    """Requantize ``t`` to a float-element scheme (FP8 E4M3 / E5M2) with
    :func:`converter.quant.float_quant.quantize_float` (float32 arithmetic on the source's float32
    values, read in row blocks; error figures summed in the same blocks).

    Raises
    ------
    QuantizationError
        Another codebook (NF4 ...), a granularity other than tensor / channel / block, or a
        tensor that is not 2-D.
    """
    el = element_of(scheme.codebook)
    if el is None or el.bits != 8 or len(t.shape) != 2:
        raise QuantizationError("requantizing to this codebook is not supported", tensor=t.name,
                                field="scheme.codebook", expected="an FP8 element on an (out, in) matrix",
                                found=f"{scheme.describe()} {list(t.shape)}")
    gm.check_shape(t.shape, t.axes)
    q, degenerate, fig = quantize_float(Rows(t), el, gm, scale_dtype=scheme.scale_dtype, arith_dtype="F32",
                                        name=t.name, axes=t.axes, figures=True)
    return RequantResult(q, "requantized", degenerate_groups=degenerate, vs_source=fig)


def target_spec(spec: TensorSpec, target: Target, fmt: FormatQuantizer | None = None) -> TensorSpec:
    """The spec of ``spec`` requantized to ``target`` (``fmt``: the target format's quantizer, see
    :func:`resolve`), from the shapes alone: no array is allocated, so a planner can test many
    targets on a large checkpoint, and a requantizing view plans every tensor without touching data.

    ``stored`` lists the logical arrays (codes, scales, zero points, ``g_idx`` under act-order: the
    source's act-order kept when the target leaves the granularity alone) with their dtypes and byte
    sizes; ``double_quant`` is None (a requantized tensor has no K-quant fields).
    """
    scheme, gm = resolve(spec.scheme, spec.group_map, target, fmt)
    act = bool(spec.act_order) and target.granularity is None
    return quantized_spec(spec.name, spec.shape, spec.axes, scheme, gm, act_order=act)


def quantized_spec(name: str, shape, axes, scheme: QuantScheme, gm: GroupMap, *, act_order: bool = False,
                   integer_zero: bool = True) -> TensorSpec:
    """The spec of a QuantizedTensor ``name`` of ``shape`` (named ``axes``) in ``scheme`` / groups ``gm``, as
    :func:`converter.tensor.spec_of` gives it for the arrays a quantizer returns, without the arrays.

    ``stored``: codes (``U<bits>``, ceil(numel * bits / 8) bytes), scales (the scheme's scale dtype, the
    group map's parameter shape), zero points when the scheme has them (integer: the code dtype, float
    biases: the scale dtype; ``integer_zero=False`` leaves integer zero points out, as a quantizer of
    float weights that keeps them implicit does), ``g_idx`` (int32, one per ``gm.axis`` index) under
    ``act_order``.
    """
    shape = tuple(int(n) for n in shape)
    ps = gm.param_shape(shape, tuple(axes))
    n_params = int(np.prod(ps, dtype=np.int64))
    numel = int(np.prod(shape, dtype=np.int64))
    sd = scheme.scale_np_dtype
    stored = [StoredArray(name + ".codes", "codes", f"U{scheme.bits}", shape, -(-numel * scheme.bits // 8)),
              StoredArray(name + ".scales", "scales", scheme.scale_dtype, tuple(ps), n_params * sd.itemsize)]
    if scheme.zero_point is ZeroPoint.FLOAT or (scheme.zero_point is ZeroPoint.INTEGER and integer_zero):
        zd = scheme.code_dtype if scheme.zero_point is ZeroPoint.INTEGER else sd
        stored.append(StoredArray(name + ".zero_points", "zero_points", dtype_name(zd), tuple(ps),
                                  n_params * zd.itemsize))
    if act_order:
        n = int(shape[list(axes).index(gm.axis)])
        stored.append(StoredArray(name + ".g_idx", "g_idx", "I32", (n,), 4 * n))
    return TensorSpec(name, "quantized", shape, tuple(stored), axes=tuple(axes), scheme=scheme,
                      group_map=GroupMap(gm.granularity, gm.axis, gm.group_size, block=gm.block), act_order=act_order)
