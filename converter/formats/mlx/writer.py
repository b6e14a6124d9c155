"""MLX writer: logical tensors -> ``weight`` / ``scales`` / ``biases`` (affine) or ``weight`` /
``scales`` (``mxfp8``: E4M3 codes, E8M0 scales per 32 along ``in``; ``mxfp4`` / ``nvfp4``: E2M1 codes,
:mod:`converter.formats.mlx.fp4`) and the ``quantization`` config.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import NotRepresentableError
from converter.groups import Granularity, GroupMap
from converter.layout import EXPERT, IN, OUT
from converter.codebooks import E4M3, element_of
from converter.quant.carry import as_mx_groups
from converter.quant.recode import as_float_bias, as_groups, as_unsigned
from converter.scheme import ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, opaque_reason
from converter.write.plan import TensorPlan, rows_plan
from converter.formats.registry import NO_OPTIONS, TargetOptions
from converter.formats.base import plan_tensors, write_directory
from converter.formats.source import module_prefix

from converter.formats.mlx.config import AFFINE_BITS, AFFINE_GROUPS, FLOAT_SCALE_DTYPES, MODES
from converter.formats.mlx.fp4 import check_global_scales, config_entry, fp4_mode, fp4_reason, is_fp4, plan_fp4
from converter.formats.mlx.reader import codes_map

#: The mxfp8 mode's group size (``mlx/ops.cpp`` ``fp_quantize``: 32 elements along ``in`` per E8M0 scale).
MXFP8_GROUP = MODES["mxfp8"][0]


# -- writer -------------------------------------------------------------------------------------
def target_mode(spec: TensorSpec) -> str:
    """``mxfp8`` for an FP8 E4M3 weight (written as MX groups, :func:`converter.quant.carry.as_mx_groups`),
    ``mxfp4`` / ``nvfp4`` for E2M1 with E8M0 / E4M3 scales, else ``affine``."""
    if spec.scheme is not None and is_fp4(spec):
        return fp4_mode(spec) or "affine"
    return "mxfp8" if spec.scheme is not None and spec.scheme.codebook == E4M3 else "affine"


@dataclass(frozen=True)
class MLXTargetOptions(TargetOptions):
    """Write options :func:`check_target` understands.

    Attributes
    ----------
    absmax_scales : bool
        The FP8 scales will be absmax scales (``amax / max_finite``, ``qckpt quantize --fp8``,
        ``convert --fp8``), not powers of two: an mxfp8 target (E8M0 scales) is then refused before
        any data moves instead of when written.
    """

    absmax_scales: bool = False


#: What works instead of mxfp8 for absmax FP8 scales (the refusal's advice).
MXFP8_ABSMAX_ADVICE = ("write the FP8 codes with --to compressed-tensors | fp8 | modelopt, or quantize to MLX "
                       "integers: --bits 8 --group-size 32 --to mlx")


def _mxfp8_reason(spec: TensorSpec, options: TargetOptions = NO_OPTIONS) -> str | None:
    """None when an E4M3 ``spec`` fits mxfp8 groups (from the spec; the scales' powers of two are
    checked on the data when written, or refused here with ``absmax_scales``), else the reason."""
    gm = spec.group_map
    if getattr(options, "absmax_scales", False) and spec.scheme.scale_dtype != "F8_E8M0":
        return ("MLX mxfp8 needs E8M0 (power-of-two) scales, one per 32 along in; absmax FP8 scales "
                f"(amax / 448) are not powers of two: {MXFP8_ABSMAX_ADVICE}")
    n_in = int(spec.shape[-1])
    if n_in % MXFP8_GROUP:
        return f"mxfp8 groups of {MXFP8_GROUP} along in: in_features {n_in} is not a multiple of {MXFP8_GROUP}"
    span = {Granularity.TENSOR: None, Granularity.BLOCK: gm.extent(IN), Granularity.GROUP: gm.group_size,
            Granularity.CHANNEL: None}.get(gm.granularity, -1)
    if (span == -1 or (gm.granularity is Granularity.CHANNEL and gm.axis != OUT) or spec.act_order
            or (gm.granularity is Granularity.GROUP and gm.axis != IN) or (span is not None and span % MXFP8_GROUP)):
        return (f"mxfp8 takes one scale per {MXFP8_GROUP} along in: {gm.describe()} scales are not constant over "
                f"those groups")
    return None


def target_group_size(spec: TensorSpec) -> int | None:
    """The MLX ``group_size`` a quantized ``spec`` is written with, or None if there is none.

    Groups along ``in`` keep their size. Per-tensor and per-output-channel parameters are written
    as the largest MLX group size dividing ``in`` (128, 64, then 32), each group repeating its
    row's scale and bias (:func:`converter.quant.recode.as_groups`): an exact re-expression.
    """
    gm = spec.group_map
    if target_mode(spec) in ("mxfp8", "mxfp4", "nvfp4"):
        return MODES[target_mode(spec)][0]
    if gm.granularity is Granularity.GROUP:
        return gm.group_size
    n_in = int(spec.shape[-1])
    if gm.granularity is Granularity.TENSOR or (gm.granularity is Granularity.CHANNEL and gm.axis == OUT):
        return next((g for g in sorted(AFFINE_GROUPS, reverse=True) if n_in % g == 0), None)
    return None


def check_target(spec: TensorSpec, options: TargetOptions = NO_OPTIONS) -> str | None:
    """None if ``spec`` can be written as MLX affine exactly (up to bias rounding), else the reason."""
    if spec.kind != "quantized":
        return opaque_reason(spec)  # None for dense tensors
    if not spec.name.endswith(".weight"):
        return "MLX stores a quantized weight as '<module>.weight'"
    if tuple(spec.axes) not in ((OUT, IN), (EXPERT, OUT, IN)):
        return f"MLX needs axes (out, in) or (expert, out, in), found {spec.axes}"
    gm, s = spec.group_map, spec.scheme
    if target_mode(spec) == "mxfp8":
        return _mxfp8_reason(spec, options)
    if is_fp4(spec):
        return fp4_reason(spec)
    if s.codebook is not None:
        el = element_of(s.codebook)
        return (f"{s.describe()} cannot be written to MLX: affine takes integer grids and the writer's only fp "
                f"mode is mxfp8 (E4M3 codes)") if el is not None else \
            "codebook schemes (nf4/fp4/mx/nv) cannot be written as MLX affine"
    if gm.granularity is Granularity.GROUP and gm.axis != IN:
        return f"MLX groups run along 'in'; found {gm.describe()}"
    if gm.granularity is Granularity.BLOCK:
        return (f"MLX affine groups run along 'in', one scale per row and group (mlx.core.quantize); a 2-D block "
                f"({gm.describe()}) shared by several rows has no MLX layout")
    if gm.granularity not in (Granularity.GROUP, Granularity.TENSOR, Granularity.CHANNEL) or (
            gm.granularity is Granularity.CHANNEL and gm.axis != OUT):
        return f"MLX groups run along 'in'; found {gm.describe()}"
    if spec.act_order:
        return "MLX has no g_idx (act-order groups)"
    g = target_group_size(spec)
    if g is None:
        return (f"{gm.describe()} parameters need a group size in {AFFINE_GROUPS} dividing "
                f"in_features {spec.shape[-1]} (B15)")
    if g not in AFFINE_GROUPS:
        return f"MLX group_size must be one of {AFFINE_GROUPS}, found {g}"
    if spec.shape[-1] % g:
        return f"in_features {spec.shape[-1]} is not a multiple of group_size {g} (B15)"
    if s.bits not in AFFINE_BITS:
        return f"MLX affine bits must be one of {AFFINE_BITS}, found {s.bits}"
    if s.scale_dtype not in FLOAT_SCALE_DTYPES:
        return f"MLX affine scales must be F16/BF16/F32, found {s.scale_dtype}"
    return None


def as_affine(t: QuantizedTensor) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Re-express ``t`` as MLX affine: unsigned codes, scales, additive biases (scale dtype).

    Uses the shared exact re-expressions :func:`converter.quant.recode.as_unsigned` (signed codes
    shift by ``2^(b-1)`` with their centre / zero point / bias) and
    :func:`converter.quant.recode.as_float_bias` (``bias = -z*s`` in float32, exact for integer
    ``z`` and fp16/bf16 ``s``, then cast to the scale dtype).

    Returns
    -------
    codes : uint8, shape ``t.shape``
    scales : shape ``param_shape``, scale dtype
    biases : like ``scales``
    exact : bool
        False when casting a bias to the scale dtype rounded.

    Raises
    ------
    NotRepresentableError
        A bias overflows the scale dtype; signed codes with a float bias whose shift rounds.
    """
    u, exact = as_float_bias(as_unsigned(t))
    biases = u.zero_points
    if not np.isfinite(biases.astype(np.float32)).all():
        raise NotRepresentableError("bias -z*s overflows the scale dtype", tensor=t.name, field="biases",
                                    expected=f"finite {t.scheme.scale_dtype}", found="inf")
    return u.codes, u.scales, biases, exact


def _plan_mxfp8(spec: TensorSpec) -> TensorPlan:
    """``<p>.weight`` U32 (E4M3 bytes packed 4 per word along in) and ``<p>.scales`` U8 (E8M0 bits)
    ``[..., out, in / 32]``: FORMATS.md section 4, ``mlx/ops.cpp`` ``fp_quantize`` (mode mxfp8)."""
    p = module_prefix(spec.name)
    sizes = dict(zip(spec.axes, spec.shape))
    cmap = codes_map(tuple(spec.axes), 8)
    pshape = GroupMap.per_group(MXFP8_GROUP, axis=IN).param_shape(spec.shape, spec.axes)
    outs = [(f"{p}.weight", "U32", cmap.stored_shape(sizes)), (f"{p}.scales", "U8", pshape)]
    notes = ["exact: E4M3 codes carried, power-of-two scales as E8M0 per 32 along in (mxfp8)"]

    def encode(t: QuantizedTensor) -> dict[str, np.ndarray]:
        m = as_mx_groups(t, MXFP8_GROUP)  # refuses scales that are not powers of two, naming the block
        return {f"{p}.weight": cmap.to_stored(m.codes, t.axes),
                f"{p}.scales": np.ascontiguousarray(m.scales).view(np.uint8)}
    return TensorPlan(spec.name, outs, encode, notes)


def _plan(spec: TensorSpec) -> TensorPlan:
    if target_mode(spec) == "mxfp8":
        return _plan_mxfp8(spec)
    if is_fp4(spec):
        return plan_fp4(spec)
    p = module_prefix(spec.name)
    sizes = dict(zip(spec.axes, spec.shape))
    cmap = codes_map(tuple(spec.axes), spec.scheme.bits)
    g = target_group_size(spec)
    pshape = GroupMap.per_group(g, axis=IN).param_shape(spec.shape, spec.axes)
    sd = spec.scheme.scale_dtype
    outs = [(f"{p}.weight", "U32", cmap.stored_shape(sizes)), (f"{p}.scales", sd, pshape), (f"{p}.biases", sd, pshape)]
    notes = []
    if spec.scheme.zero_point is not ZeroPoint.FLOAT or spec.scheme.signed:
        notes.append("exact up to scale-dtype rounding of biases (bias = -z*s)")
    else:
        notes.append("exact repack")
    if spec.group_map.granularity is not Granularity.GROUP:
        notes.append(f"{spec.group_map.describe()} scales repeated over groups of {g} along in (exact)")

    def encode(t: QuantizedTensor) -> dict[str, np.ndarray]:
        codes, scales, biases, _exact = as_affine(as_groups(t, g))
        return {f"{p}.weight": cmap.to_stored(codes, t.axes), f"{p}.scales": np.ascontiguousarray(scales),
                f"{p}.biases": np.ascontiguousarray(biases)}
    plan = TensorPlan(spec.name, outs, encode, notes)
    # weight [out, in*b/32], scales / biases [out, n_groups]: every array is a block of rows
    row_blocks = tuple(spec.axes) == ("out", "in") and spec.group_map.granularity.value == "group"
    return rows_plan(plan) if row_blocks else plan


def _flatten_rope(cfg: dict) -> None:
    """Give ``cfg`` the top-level rope keys mlx-lm reads, from a transformers-5 ``rope_parameters``.

    transformers 5 writes ``rope_parameters: {"rope_type", "rope_theta", ...}`` and no top-level
    ``rope_theta``; mlx-lm 0.32's model arguments (``models/llama.py`` ``ModelArgs``) read
    ``rope_theta`` (default 10000) and ``rope_scaling`` at top level, so without them a model with
    another base frequency loads and computes wrong logits. Keys already present are kept.
    """
    rp = cfg.get("rope_parameters")
    if not isinstance(rp, dict) or any(isinstance(v, dict) for v in rp.values()):
        return  # absent, or per-layer-type parameters (models that read rope_parameters themselves)
    if "rope_theta" in rp:
        cfg.setdefault("rope_theta", rp["rope_theta"])
    if rp.get("rope_type", "default") != "default" and not cfg.get("rope_scaling"):
        cfg["rope_scaling"] = {k: copy.deepcopy(v) for k, v in rp.items() if k != "rope_theta"}


def mlx_config(ckpt: Checkpoint) -> dict:
    """``config.json`` for the written model: defaults = most common (group_size, bits), overrides per module."""
    q = [s for s in ckpt.specs() if s.kind == "quantized"]
    pairs = Counter((target_group_size(s), s.scheme.bits, target_mode(s)) for s in q)
    g, b, mode = pairs.most_common(1)[0][0] if pairs else (64, 4, "affine")
    quant: dict[str, Any] = {"group_size": g, "bits": b, "mode": mode}
    for s in q:
        key = (target_group_size(s), s.scheme.bits, target_mode(s))
        entry: dict[str, Any] | None = config_entry(s)
        if entry is None and key != (g, b, mode):
            entry = {"group_size": key[0], "bits": key[1]}
            if key[2] != mode:
                entry["mode"] = key[2]
        if entry is not None:
            quant[module_prefix(s.name)] = entry
    cfg = {k: copy.deepcopy(v) for k, v in (ckpt.config or {}).items()
           if k not in ("quantization", "quantization_config")}
    _flatten_rope(cfg)
    cfg["quantization"] = quant
    cfg["quantization_config"] = copy.deepcopy(quant)
    return cfg


def write_mlx(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, max_shard_bytes: int | None = None,
              **_: Any) -> dict:
    """Write ``ckpt`` as an MLX model directory (``model.safetensors`` + ``config.json``): affine
    integer weights, FP8 E4M3 weights with power-of-two scales as ``mxfp8``, E2M1 weights as
    ``mxfp4`` (E8M0 scales) / ``nvfp4`` (E4M3 scales, optional ``global_scale``).

    Raises
    ------
    NotRepresentableError
        A quantized tensor :func:`check_target` refuses, or an NVFP4 global scale with no exact
        MLX amax (``field="global_scale"``); nothing is written.
    """
    ckpt.refuse_opaque("mlx")
    ckpt = check_global_scales(ckpt)  # (an identity global scale is left out: exact, and mlx_lm loads it)

    def encode(spec: TensorSpec) -> TensorPlan:
        reason = check_target(spec)
        if reason:
            raise NotRepresentableError(reason, tensor=spec.name, field="scheme",
                                        expected="MLX affine, mxfp8, mxfp4 or nvfp4",
                                        found=f"{spec.scheme.describe()} {spec.group_map.describe()}",
                                        hint="requantize to an MLX affine scheme")
        return _plan(spec)
    plans = plan_tensors(ckpt, encode)
    return write_directory(ckpt, dst, plans, config=mlx_config(ckpt), metadata={"format": "mlx"},
                           max_shard_bytes=max_shard_bytes, overwrite=overwrite)
