"""Write compressed-tensors ``pack-quantized`` (default) or ``int-quantized`` / ``naive-quantized``.

Output follows what compressed-tensors 0.20.1 ``ModelCompressor.compress_model`` wrote for
sample_checkpoints/ct_*: arrays ``weight_packed`` (int32, ``q + 2^(b-1)`` LSB-first along ``in``),
``weight_scale`` (``[O, nG]`` / ``[O, 1]`` / ``[1]``, scale dtype kept), ``weight_shape`` (int64
``[O, I]``), asymmetric ``weight_zero_point`` (int32 packed along ``out`` for group/channel, int8
``[1]`` for tensor); ``config.json`` gets the ``quantization_config`` of
:func:`~converter.formats.compressed_tensors.config_emit.emit_config`.

Options
-------
ct_version : str, default ``"0.20.1"``
    Version written to the config. Below 0.18, 3/5/6/7-bit codes use the padded ``32 // b`` layout
    (FORMATS.md section 3.4). At or below 0.12, a non-trivial act-order ``g_idx`` is written as
    ``weight_g_idx`` with ``actorder: "group"``; newer versions cannot hold it.
ct_format : ``"pack-quantized"`` (default), ``"int-quantized"`` or ``"naive-quantized"``
    The latter two store int8 ``weight`` ``[O, I]`` and unpacked int8 zero points.

Unsigned-code schemes (GPTQ, AWQ, MLX, GGUF legacy) are re-expressed exactly as signed codes
(``recode.as_signed``); float biases must be ``-z * s`` with an integer ``z`` (``recode.as_integer_zero``),
else :class:`~converter.errors.NotRepresentableError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import FormatError, NotRepresentableError
from converter.groups import Granularity
from converter.layout import IN, OUT
from converter.kernels.packing import packed_length
from converter.scheme import ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, opaque_reason
from converter.formats import activations
from converter.formats.base import write_directory
from converter.formats.registry import TargetOptions
from converter.formats.source import module_prefix
from converter.write.plan import TensorPlan, rows_plan
from converter.codebooks import element_of
from converter.formats.compressed_tensors.config import (DEFAULT_VERSION, G_IDX_UNTIL,
                                                         READ_FORMATS, WeightArgs,
                                                         packing_for, parse_version)
from converter.formats.compressed_tensors.config_emit import emit_config
from converter.formats.compressed_tensors.int_layout import AXES, codes_map, zero_map
from converter.formats.compressed_tensors.float_writer import (activation_json, dense_plan_of, dynamic_args,
                                                               float_plan, float_target)
from converter.formats.compressed_tensors.fp4_writer import (NVFP4_ACTIVATIONS, PRESET_NAME, divisor_global_scale,
                                                             fp4_plan, fp4_target, is_fp4)
from converter.formats.compressed_tensors.fp4_writer import args_of as fp4_args
from converter.quant import recode


def _recode():
    """``as_signed`` / ``as_integer_zero`` (converter.quant.recode)."""
    return recode.as_signed, recode.as_integer_zero


def _options(ct_version: str | None, ct_format: str | None) -> tuple[str, tuple[int, ...], str]:
    version = ct_version or DEFAULT_VERSION
    vt = parse_version(version)
    if vt is None:
        raise FormatError("ct_version is not a version string", field="ct_version", expected="e.g. 0.20.1",
                          found=ct_version)
    fmt = ct_format or "pack-quantized"
    if fmt not in READ_FORMATS:
        raise FormatError("unsupported ct_format", field="ct_format", expected=list(READ_FORMATS), found=fmt)
    return version, vt, fmt


@dataclass(frozen=True)
class CTTargetOptions(TargetOptions):
    """The write options :func:`check_target` understands: ``ct_version`` (a version that still
    stores ``weight_g_idx`` accepts act-order) and ``ct_format`` (``pack-quantized`` ...)."""

    ct_version: str | None = None
    ct_format: str | None = None


def check_target(spec: TensorSpec, options: CTTargetOptions = CTTargetOptions()) -> str | None:
    """``None`` when ``spec`` can be written exactly as compressed-tensors, else the reason.

    Float-bias schemes pass here and are checked per value at write time (an integer ``-bias/scale``
    is exact; anything else raises NotRepresentableError).
    """
    if spec.kind != "quantized":
        return opaque_reason(spec)  # None for dense tensors
    s, gm = spec.scheme, spec.group_map
    if is_fp4(spec):
        try:
            _, vt, _ = _options(options.ct_version, options.ct_format)
        except FormatError as exc:
            return str(exc)
        return fp4_target(spec, vt)
    if s.codebook is not None and element_of(s.codebook) is not None and element_of(s.codebook).bits == 8:
        return float_target(spec)
    if s.codebook is not None:
        return "compressed-tensors int formats have no codebook (NF4/FP4 need requantization)"
    if s.bits > 8:
        return f"{s.bits}-bit codes exceed compressed-tensors int (1..8 bits)"
    if s.scale_dtype not in ("F16", "BF16", "F32"):
        return f"scale dtype {s.scale_dtype} is not an int-format weight_scale dtype (F16/BF16/F32)"
    if tuple(spec.axes) != AXES:
        return f"axes {list(spec.axes)}: only 2-D [out, in] weights are written"
    if gm.granularity is Granularity.FLAT_BLOCK:
        return "flat blocks (bitsandbytes) straddle rows; compressed-tensors groups run along in"
    if gm.granularity is Granularity.BLOCK:
        return (f"{gm.describe()} integer scales: compressed-tensors writes the block strategy for float-quantized "
                "(FP8) weights only; int pack-quantized strategies are tensor, channel and group; requantize")
    if gm.granularity is Granularity.CHANNEL and gm.axis != OUT:
        return "per-column (channel along in) scales have no compressed-tensors strategy"
    if gm.granularity is Granularity.GROUP and gm.axis != IN:
        return "groups along out have no compressed-tensors strategy"
    if spec.act_order:
        try:
            _, vt, _ = _options(options.ct_version, options.ct_format)
        except FormatError as exc:
            return str(exc)
        if vt[:2] > G_IDX_UNTIL:
            return ("act-order g_idx: compressed-tensors >= 0.13 stores no weight_g_idx (0.20 rejects "
                    "actorder=group); write with ct_version='0.12.2' or requantize")
    return None


def _args_of(t: QuantizedTensor | TensorSpec, g_idx: bool) -> WeightArgs:
    gm = t.group_map
    if t.scheme.codebook is not None:  # an FP8 element (float_target accepted it)
        strategy = {Granularity.TENSOR: "tensor", Granularity.CHANNEL: "channel",
                    Granularity.BLOCK: "block"}[gm.granularity]
        block = (gm.extent(OUT), gm.extent(IN)) if strategy == "block" else None
        return WeightArgs(bits=8, symmetric=True, strategy=strategy, group_size=None, type="float", block=block)
    strategy = {Granularity.TENSOR: "tensor", Granularity.CHANNEL: "channel",
                Granularity.GROUP: "group"}[gm.granularity]
    return WeightArgs(bits=t.scheme.bits, symmetric=t.scheme.zero_point is ZeroPoint.NONE, strategy=strategy,
                      group_size=gm.group_size if strategy == "group" else None,
                      actorder="group" if g_idx else None)


def to_ct(t: QuantizedTensor) -> QuantizedTensor:
    """Exact re-expression of ``t`` as signed codes with no or integer zero points."""
    as_signed, as_integer_zero = _recode()
    if t.scheme.zero_point is ZeroPoint.FLOAT:
        t = as_integer_zero(t)
    return as_signed(t)


class _SignedView:
    """The parameters of an unsigned tensor as :func:`to_ct` would give them (scheme signed, integer
    zero points shifted by ``-2^(b-1)``), without computing its signed codes (the caller stores the
    unsigned codes, which are the stored fields)."""

    def __init__(self, t: QuantizedTensor, zero_points) -> None:
        self.scheme = t.scheme.replace(signed=True)
        self.shape, self.axes, self.group_map, self.scales = t.shape, t.axes, t.group_map, t.scales
        self.zero_points = zero_points
        self.packed = None


def encode(t: QuantizedTensor, prefix: str, *, fmt: str, version: tuple[int, ...], keep_g_idx: bool) -> dict:
    """Stored arrays of one module (names ``<prefix>.weight_*``)."""
    u = None
    if fmt == "pack-quantized" and not t.scheme.signed and t.packed is None \
            and t.scheme.zero_point is not ZeroPoint.FLOAT and t.scheme.codebook is None:
        # stored fields q_s + 2^(b-1) are the unsigned codes themselves: take them as they are and
        # shift only the (small) parameters, rather than codes -> signed -> fields again
        u = t.codes
        zp = t.zero_points
        if zp is not None:
            zp = (zp.astype(np.int16) - (1 << (t.scheme.bits - 1))).astype(np.int8)
        t = _SignedView(t, zp)
    else:
        t = to_ct(t)
    b = t.scheme.bits
    off = 1 << (b - 1)
    o, i = t.shape
    strategy = t.group_map.granularity
    out: dict[str, np.ndarray] = {}
    if fmt == "pack-quantized":
        # stored fields are q + 2^(b-1); codes still packed move as words (a top-bit flip)
        if u is None:
            u = t.packed.shifted() if t.packed is not None else (t.codes.astype(np.int16) + off).astype(np.uint8)
        out[prefix + ".weight_packed"] = codes_map(b, packing_for(version, b)).store_codes(u, AXES)
    else:
        out[prefix + ".weight"] = np.ascontiguousarray(t.codes.astype(np.int8))
    scales = np.ascontiguousarray(t.scales)
    out[prefix + ".weight_scale"] = scales.reshape(1) if strategy is Granularity.TENSOR else scales
    if fmt == "pack-quantized":
        out[prefix + ".weight_shape"] = np.array([o, i], dtype=np.int64)
    if t.zero_points is not None:
        z = t.zero_points.astype(np.int16)
        if fmt == "pack-quantized" and strategy is not Granularity.TENSOR:
            zu = (z + off).astype(np.uint8)
            out[prefix + ".weight_zero_point"] = zero_map(b, packing_for(version, b)).to_stored(zu, AXES)
        else:
            zz = z.astype(np.int8)
            out[prefix + ".weight_zero_point"] = zz.reshape(1) if strategy is Granularity.TENSOR else zz
    if keep_g_idx:  # legacy (<= 0.12) actorder=group; -1 = "not initialised", i.e. column order
        g = t.group_map.g_idx
        out[prefix + ".weight_g_idx"] = (np.full(i, -1, dtype=np.int32) if g is None
                                         else np.ascontiguousarray(g.astype(np.int32)))
    return out


def _outputs(spec: TensorSpec, prefix: str, fmt: str, version: tuple[int, ...], keep_g_idx: bool) -> list:
    """(name, dtype, shape) of every array :func:`encode` returns, from the spec alone."""
    s, gm = spec.scheme, spec.group_map
    o, i = spec.shape
    b = s.bits
    pshape = gm.param_shape(spec.shape, spec.axes)
    tensor = gm.granularity is Granularity.TENSOR
    outs = []
    if fmt == "pack-quantized":
        outs.append((prefix + ".weight_packed", "I32", (o, packed_length(i, b, layout=packing_for(version, b)))))
    else:
        outs.append((prefix + ".weight", "I8", (o, i)))
    outs.append((prefix + ".weight_scale", s.scale_dtype, (1,) if tensor else tuple(pshape)))
    if fmt == "pack-quantized":
        outs.append((prefix + ".weight_shape", "I64", (2,)))
    if s.zero_point is not ZeroPoint.NONE:
        if fmt == "pack-quantized" and not tensor:
            outs.append((prefix + ".weight_zero_point", "I32",
                         (packed_length(o, b, layout=packing_for(version, b)), pshape[1])))
        else:
            outs.append((prefix + ".weight_zero_point", "I8", (1,) if tensor else tuple(pshape)))
    if keep_g_idx:
        outs.append((prefix + ".weight_g_idx", "I32", (i,)))
    return outs


def _row_split(plan: TensorPlan, spec: TensorSpec, prefix: str, fmt: str) -> TensorPlan:
    """Mark a plan row-splittable: every array is ``[out, ...]`` except ``weight_shape`` (fixed from
    the spec), ``weight_g_idx`` and per-tensor parameters (row-independent). Zero points packed
    along ``out`` (asymmetric pack-quantized) would split words: such plans stay whole."""
    tensor = spec.group_map.granularity is Granularity.TENSOR
    names = [o[0] for o in plan.outputs]
    zname = prefix + ".weight_zero_point"
    if zname in names and fmt == "pack-quantized" and not tensor:
        return plan
    once = [n for n in names if n.endswith(".weight_g_idx")]
    if tensor:
        once += [n for n in names if n in (prefix + ".weight_scale", zname)]
    fixed = {}
    if prefix + ".weight_shape" in names:
        fixed[prefix + ".weight_shape"] = np.array(spec.shape, dtype=np.int64)
    return rows_plan(plan, once=once, fixed=fixed)


#: the key standing for the NVFP4 preset's input_activations (holds a nested dict, so not frozen itself)
_NVFP4_ACTS = (("preset", "NVFP4"),)


def _freeze(obj: dict | None) -> tuple | None:
    return None if obj is None else tuple(sorted(obj.items()))


def _has_unquantized_head(ckpt: Checkpoint, by_args: dict[tuple, list[str]]) -> bool:
    """True when the model has an output head ``lm_head`` that is not among the quantized modules:
    stored dense, or not stored because it is tied to the embedding (``tie_word_embeddings``), or
    implied by a causal-LM architecture in ``config.json``."""
    if any("lm_head" in mods for mods in by_args.values()):
        return False
    cfg = ckpt.config or {}
    archs = cfg.get("architectures") or []
    return ("lm_head.weight" in ckpt or cfg.get("tie_word_embeddings") is True
            or any(isinstance(a, str) and a.endswith("ForCausalLM") for a in archs))


def _fp4_divisors(ckpt: Checkpoint, fp4_mods: set[str], static: dict, options: "CTTargetOptions") -> dict:
    """Up front, before any data moves: every FP4 spec's target reason, its ``weight_global_scale``
    divisor (:func:`~converter.formats.compressed_tensors.fp4_writer.divisor_global_scale`) and its
    static activation scale, which must already be compressed-tensors' ``<p>.input_global_scale``
    (a divisor; other spellings hold the activation scale in another direction).

    Raises
    ------
    NotRepresentableError
        A spec compressed-tensors FP4 cannot hold, a global scale with no exact divisor, an FP4
        module's activation scale in another spelling.
    """
    out = {}
    for spec in ckpt.specs():
        if not is_fp4(spec):
            continue
        reason = check_target(spec, options)
        if reason:
            raise NotRepresentableError(f"cannot write as compressed-tensors: {reason}", tensor=spec.name,
                                        field="scheme", hint="requantize to a scheme compressed-tensors holds")
        out[spec.name] = divisor_global_scale(ckpt, spec)
    for mod in fp4_mods:
        act = static.get(mod)  # spellings of converter.formats.activations (input_scale ...)
        if f"{mod}.input_global_scale" in ckpt and ckpt.spec(f"{mod}.weight").scheme.scale_dtype == "F8_E8M0":
            raise NotRepresentableError("MXFP4 modules declare dynamic activations: no input_global_scale",
                                        tensor=f"{mod}.input_global_scale", field="name", expected="absent",
                                        found="present")
        if act is not None:
            raise NotRepresentableError("FP4 activation scale in another convention: compressed-tensors stores "
                                        "input_global_scale, a divisor", tensor=act.name, field="name",
                                        expected=f"{mod}.input_global_scale", found=act.name,
                                        hint="--to gguf drops the static activation scale (llama.cpp quantizes "
                                             "activations at run time); or requantize to compressed-tensors FP8: "
                                             "--fp8 e4m3 --block 128x128")
    return out


def write_ct(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, ct_version: str | None = None,
             ct_format: str | None = None, max_shard_bytes: int | None = None, **_: Any) -> dict:
    """Write ``ckpt`` as a compressed-tensors model directory (atomically).

    Raises
    ------
    NotRepresentableError
        A tensor :func:`check_target` refuses, or a float bias that is not an integer zero.
    FormatError
        Bad options.
    """
    ckpt.refuse_opaque("compressed-tensors")
    version, vt, fmt = _options(ct_version, ct_format)
    plans: list[TensorPlan] = []
    by_args: dict[tuple, list[str]] = {}
    ignore: list[str] = []
    notes: dict[str, list[str]] = {}
    static = activations.activation_scales(ckpt)
    fp4_mods = {module_prefix(sp.name) for sp in ckpt.specs() if is_fp4(sp) and sp.name.endswith(".weight")}
    divisors = _fp4_divisors(ckpt, fp4_mods, static, CTTargetOptions(ct_version=version, ct_format=fmt))
    for spec in ckpt.specs():
        if spec.kind == "dense":
            plans.append(dense_plan_of(ckpt, spec))
            if spec.name.endswith(".weight") and len(spec.shape) == 2:
                ignore.append(module_prefix(spec.name))  # a Linear-like weight left unquantized
            continue
        reason = check_target(spec, CTTargetOptions(ct_version=version, ct_format=fmt))
        if reason:
            raise NotRepresentableError(f"cannot write as compressed-tensors: {reason}", tensor=spec.name,
                                        field="scheme", hint="requantize to an int scheme first")
        if not spec.name.endswith(".weight"):
            raise NotRepresentableError("compressed-tensors stores quantized weights as <module>.weight_*",
                                        tensor=spec.name, field="name", expected="<module>.weight", found=spec.name)
        prefix = module_prefix(spec.name)
        if is_fp4(spec):  # nvfp4- / mxfp4-pack-quantized
            # a stored <p>.input_global_scale passes through as a dense tensor (NVFP4 W4A4 preset)
            act = _NVFP4_ACTS if f"{prefix}.input_global_scale" in ckpt else None
            by_args.setdefault((fp4_args(spec), act), []).append(prefix)
            plans.append(fp4_plan(spec, prefix, divisors.get(spec.name), vt))
            continue
        if spec.scheme.codebook is not None:  # FP8: float-quantized
            act = activation_json(ckpt, prefix, static)
            if act is not None and act.get("strategy") == "group" and spec.shape[-1] % act["group_size"]:
                # compressed-tensors' forward unflattens the activations into whole groups and fails on
                # a partial one (576 = 4 x 128 + 64): declare per-token dynamic FP8 instead, and say so
                notes[spec.name] = [f"warning: dynamic activations per group of {act['group_size']} do not tile "
                                    f"in_features {spec.shape[-1]}: declared per token (compressed-tensors "
                                    "cannot run a partial activation group)"]
                act = dynamic_args("dynamic")
            by_args.setdefault((_args_of(spec, False), _freeze(act)), []).append(prefix)
            plans.append(float_plan(spec, prefix))
            continue
        keep = bool(spec.act_order) and vt[:2] <= G_IDX_UNTIL
        by_args.setdefault((_args_of(spec, keep), None), []).append(prefix)
        mnotes = []
        if spec.group_map.granularity is Granularity.GROUP and spec.shape[1] % spec.group_map.group_size:
            mnotes.append("partial final group: compressed-tensors >= 0.20 kernels require I % G == 0")
        if not spec.scheme.signed:
            mnotes.append("unsigned codes re-expressed as signed (q - 2^(b-1)), exact")
        notes[spec.name] = mnotes

        def enc(t, prefix=prefix, keep=keep):
            return encode(t, prefix, fmt=fmt, version=vt, keep_g_idx=keep)
        plans.append(_row_split(TensorPlan(spec.name, _outputs(spec, prefix, fmt, vt, keep), enc, mnotes), spec, prefix,
                                fmt))
    if _has_unquantized_head(ckpt, by_args) and "lm_head" not in ignore:
        # targets match every Linear, lm_head included: a head stored dense (or tied to the
        # embedding, not stored) must be ignored or the loader expects a compressed lm_head
        ignore.append("lm_head")
    if len(by_args) == 1:
        keyed = [(next(iter(by_args)), ["Linear"])]
    else:
        keyed = [(a, sorted(mods)) for a, mods in sorted(by_args.items(), key=lambda kv: kv[1][0])]
    groups = [(key[0], mods) for key, mods in keyed]
    acts = [(NVFP4_ACTIVATIONS if key[1] == _NVFP4_ACTS else dict(key[1])) if key[1] is not None else None
            for key, _ in keyed]
    names = None
    if len(keyed) == 1 and keyed[0][0][0].fp4_format is not None:  # llm-compressor names the group by its preset
        preset = PRESET_NAME[keyed[0][0][0].fp4_format]
        names = [preset[: -len("A16")] if acts[0] is not None else preset]
    qc = emit_config(groups, fmt=fmt, version=version, ignore=sorted(ignore), activations=acts, names=names)
    config = {k: v for k, v in (ckpt.config or {}).items() if k not in ("quantization_config", "quantization")}
    config["quantization_config"] = qc
    summary = write_directory(ckpt, dst, plans, config=config, max_shard_bytes=max_shard_bytes, overwrite=overwrite,
                              notes=lambda: {k: v for k, v in notes.items() if v})
    return activations.declare(summary, plans)
