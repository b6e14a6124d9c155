"""GPTQ writer: logical tensors -> ``qweight`` / ``qzeros`` / ``scales`` / ``g_idx`` (v1 or v2) and the
``quantization_config`` that names the modules written dense.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from converter.errors import FormatError, NotRepresentableError, QuantizationError, exact_str
from converter.groups import Granularity
from converter.layout import IN, OUT
from converter.quant.recode import as_integer_zero, as_unsigned, exact_cast
from converter.scheme import ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, opaque_reason
from converter.write.plan import TensorPlan, dense_plan
from converter.formats.base import write_directory
from converter.formats.registry import NO_OPTIONS, TargetOptions
from converter.formats.source import module_prefix
from converter.formats.modules import dense_linear_modules

from converter.formats.gptq.layout import (V1, V2, QCKPT_QUANTIZER, SCALES_MAP, SUPPORTED_BITS, codes_map,
                                           encode_qzeros,
                                           packed_rows)


# -- writer ----------------------------------------------------------------------------------------
def check_target(spec: TensorSpec, options: TargetOptions = NO_OPTIONS) -> str | None:
    """``None`` when ``spec`` can be stored in GPTQ without requantizing, else the reason.

    Accepted: 2/3/4/8-bit codes (signed codes are shifted to unsigned, an exact re-expression),
    symmetric or integer zero points (a float bias is accepted here and checked per group at write
    time: exact only when ``-bias/scale`` is an integer in range, :func:`as_integer_zero`), groups along ``in`` (any
    size, act-order ``g_idx``) or one scale per output channel (or per tensor, broadcast), F16 scales, or BF16 /
    F8_E4M3 scales whose cast to fp16 is checked exact at write time. F32 scales are refused here: GPTQ stores
    fp16 and the cast is exact only for fp16-representable values (write with ``allow_scale_rounding=True``).
    """
    if spec.kind != "quantized":
        return opaque_reason(spec)  # None for dense tensors
    s, gm = spec.scheme, spec.group_map
    if tuple(spec.axes or ()) != (OUT, IN):
        return f"GPTQ stores 2-D (out, in) linear weights, not axes {list(spec.axes or ())}"
    if s.codebook is not None:
        return "GPTQ stores integer grids, not codebook indices (NF4/FP4); requantize"
    if s.bits not in SUPPORTED_BITS:
        return f"GPTQ supports bits {list(SUPPORTED_BITS)}, not {s.bits}; requantize"
    if gm.granularity is Granularity.GROUP and gm.axis != IN:
        return f"GPTQ groups run along in, not {gm.axis}"
    if gm.granularity is Granularity.CHANNEL and gm.axis != OUT:
        return "GPTQ per-channel scales are per output channel, not per input column"
    if gm.granularity is Granularity.FLAT_BLOCK:
        return "flat blocks over the flattened tensor (bitsandbytes) do not map onto GPTQ groups; requantize"
    if gm.granularity is Granularity.BLOCK:
        return (f"{gm.describe()}: GPTQ scales are per output channel and group along in (scales [nG, out]); "
                "a 2-D block shared by several rows has no GPTQ layout; requantize")
    if s.scale_dtype == "F32":
        return ("GPTQ stores fp16 scales; F32 scales round unless each is fp16-representable "
                "(requantize with --scale-dtype f16)")
    if s.scale_dtype == "F8_E8M0":
        return "E8M0 (power-of-two) scales exceed the fp16 range; requantize"
    return None


def check_model(specs) -> str | None:
    """The model-wide rule (``FormatHandler.check_model``): one ``bits`` / ``group_size`` in config.json for
    every quantized layer (per-module ``dynamic`` overrides are not written). None, or the reason."""
    layouts = sorted({(s.scheme.bits, _gptq_params(s)[3]) for s in specs if s.kind == "quantized"})
    if len(layouts) > 1:
        shown = ", ".join(f"{b}-bit {'per channel' if g == -1 else f'group {g}'}" for b, g in layouts)
        return f"GPTQ config holds one bits/group_size for all layers; the layers have {shown}"
    return None


def _gptq_params(spec: TensorSpec) -> tuple[int, int, int, int]:
    """(O, I, nG, group_size_cfg) for a writable spec (group_size_cfg -1 = per channel)."""
    O, I = (int(x) for x in spec.shape)
    gm = spec.group_map
    if gm.granularity is Granularity.GROUP:
        return O, I, -(-I // gm.group_size), int(gm.group_size)
    return O, I, 1, -1


def _scales_fp16(scales: np.ndarray, name: str, allow_rounding: bool) -> tuple[np.ndarray, str | None]:
    if scales.dtype == np.float16:
        return scales, None
    s32 = scales.astype(np.float32)
    with np.errstate(over="ignore"):
        s16 = s32.astype(np.float16)
    if not np.all(np.isfinite(s16[np.isfinite(s32)])) or np.any((s16 == 0) & (s32 != 0)):
        raise QuantizationError("scale overflows or underflows fp16", tensor=name, field="scales",
                                expected="|scale| in the fp16 range", found=f"max |s| {exact_str(np.max(np.abs(s32)))}",
                                hint="requantize with fp16 scales")
    try:
        return exact_cast(s32, np.float16, tensor=name, field="scales", message="scale not representable in fp16",
                          expected="fp16-representable scales",
                          hint="requantize with --scale-dtype f16 to round scales to fp16",
                          nan_exact=False), "scales cast to fp16 (exact)"
    except NotRepresentableError:
        if not allow_rounding:
            raise
    return s16, "scales rounded to fp16 (not exact)"


def _encode(t: QuantizedTensor, *, v1: bool, allow_rounding: bool, notes: list[str]) -> dict[str, np.ndarray]:
    prefix = module_prefix(t.name)
    if t.scheme.signed:
        t = as_unsigned(t)
        notes.append("signed codes shifted to unsigned (+2^(b-1)), exact")
    if t.scheme.zero_point is ZeroPoint.FLOAT:  # MLX / GGUF _1 biases: exact only when -bias/scale is integral
        t = as_integer_zero(t)
        note = "float bias re-expressed as integer zero points z = -bias/scale (checked exact)"
        if note not in notes:
            notes.append(note)
    s, gm = t.scheme, t.group_map
    O, I = t.shape
    b = s.bits
    scales = t.scales
    if gm.granularity is Granularity.TENSOR:  # broadcast to per output channel (exact)
        scales = np.broadcast_to(scales, (O, 1))
    if s.zero_point is ZeroPoint.NONE:
        zeros = np.full(scales.shape, s.center, dtype=np.uint8)
    else:
        zeros = np.broadcast_to(t.zero_points, scales.shape).astype(np.uint8)
    if v1 and zeros.size and int(zeros.min()) == 0:
        o, g = (int(x) for x in np.unravel_index(int(np.argmin(zeros)), zeros.shape))
        raise NotRepresentableError("GPTQ v1 stores z-1 and cannot hold a zero point of 0", tensor=t.name,
                                    field="zero_points", expected="zero points >= 1 for checkpoint_format 'gptq'",
                                    found=f"zero point 0 at out {o}, group {g} ({int((zeros == 0).sum())} in total)",
                                    hint="write GPTQ v2, which stores zero points as is (qckpt --gptq-format v2; "
                                         "library: checkpoint_format='gptq_v2')")
    s16, note = _scales_fp16(np.asarray(scales), t.name, allow_rounding)
    if note and note not in notes:
        notes.append(note)
    if gm.granularity is Granularity.GROUP:
        g_idx = gm.g_idx if gm.g_idx is not None else (np.arange(I, dtype=np.int32) // gm.group_size)
    else:
        g_idx = np.zeros(I, dtype=np.int32)
    raw = t.packed if t.packed is not None else t.codes
    return {f"{prefix}.qweight": codes_map(b).store_codes(raw, (OUT, IN)),
            f"{prefix}.qzeros": encode_qzeros(zeros, b, v1=v1),
            f"{prefix}.scales": SCALES_MAP.to_stored(np.ascontiguousarray(s16), (OUT, IN)),
            f"{prefix}.g_idx": np.ascontiguousarray(g_idx, dtype=np.int32)}


def gptq_plan(spec: TensorSpec, *, v1: bool, allow_rounding: bool = False) -> TensorPlan:
    """Plan for one quantized spec: output names, dtypes and shapes from the spec alone."""
    O, I, nG, _ = _gptq_params(spec)
    b = spec.scheme.bits
    prefix = module_prefix(spec.name)
    outs = [(f"{prefix}.qweight", "I32", (packed_rows(I, b), O)),
            (f"{prefix}.qzeros", "I32", (nG, packed_rows(O, b))),
            (f"{prefix}.scales", "F16", (nG, O)),
            (f"{prefix}.g_idx", "I32", (I,))]
    notes: list[str] = ["exact repack"]
    gm = spec.group_map
    if gm.granularity is Granularity.GROUP and I % gm.group_size:
        notes.append(f"partial final group ({I % gm.group_size} of {gm.group_size}); kernels without auto-padding "
                     f"need I padded to {nG * gm.group_size} with zero weights (CASES.md B14)")
    if I % 32:
        notes.append("in_features not a multiple of 32: AutoGPTQ 0.7.1 (I//32*b rows) cannot load this layer")
    if gm.granularity is Granularity.TENSOR:
        notes.append("per-tensor scale broadcast to per-output-channel (exact)")
    if spec.scheme.scale_dtype != "F16":
        notes.append(f"{spec.scheme.scale_dtype} scales cast to fp16 (checked exact at write time)")
    return TensorPlan(spec.name, outs, lambda t: _encode(t, v1=v1, allow_rounding=allow_rounding, notes=notes), notes)


def default_checkpoint_format(ckpt: Checkpoint) -> str:
    """The GPTQ ``checkpoint_format`` a write keeps: a GPTQ source's own (v1 stays v1, requantized or not: a
    requantization that makes a zero point of 0 is then refused naming ``--gptq-format v2``), else ``gptq_v2``.

    GPTQModel writes v2 by default and converts v1 on load, but AutoGPTQ-era kernels and vLLM expect the
    v1 layout of a v1 model: a repack should not change it unasked.
    """
    source = ckpt.metadata.get("source_format", ckpt.format)  # a requantized view names the format it came from
    if source == "gptq" and ckpt.metadata.get("checkpoint_format") in (V1, V2):
        return ckpt.metadata["checkpoint_format"]
    return V2


def write_gptq(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, checkpoint_format: str | None = None,
               allow_scale_rounding: bool = False, max_shard_bytes: int | None = None,
               detect_symmetric: bool = True, **_: Any) -> dict:
    """Write ``ckpt`` as a GPTQ model directory (``model.safetensors``, ``config.json``, ``quantize_config.json``).

    Parameters
    ----------
    checkpoint_format : {"gptq_v2", "gptq"}, optional
        ``"gptq"`` (v1) stores ``z - 1`` and refuses a zero point of 0 (CASES.md B03). Default: the
        source's own when it is GPTQ, else ``gptq_v2`` (:func:`default_checkpoint_format`).
    allow_scale_rounding : bool
        Round F32 (or other non-fp16) scales to fp16 when the cast is not exact.
    detect_symmetric : bool
        When every integer zero point (or float bias ``-2^(b-1) * s``) equals the centre
        ``2^(b-1)``, write ``sym: true`` (the stored ``qzeros`` are the same either way; symmetric-only
        kernels such as vLLM's GPTQ-Marlin need the flag). Reads each such tensor once more.

    Raises
    ------
    NotRepresentableError
        A tensor's scheme does not fit GPTQ (reason from :func:`check_target`), mixed bits /
        group sizes across layers, or a v1 zero point of 0.
    """
    ckpt.refuse_opaque("gptq")
    checkpoint_format = ({"v1": V1, "v2": V2}.get(checkpoint_format, checkpoint_format)
                         or default_checkpoint_format(ckpt))
    if checkpoint_format not in (V1, V2):
        raise FormatError("unknown GPTQ checkpoint format", field="checkpoint_format", expected=[V1, V2],
                          found=checkpoint_format)
    v1 = checkpoint_format == V1
    plans, layouts, sym, act, lm_head = [], set(), True, False, False
    for spec in ckpt.specs():
        if spec.kind == "dense":
            plans.append(dense_plan(spec))
            continue
        reason = check_target(spec)
        if reason and not (allow_scale_rounding and spec.scheme.scale_dtype == "F32"
                           and check_target(_with_scale(spec, "F16")) is None):
            raise NotRepresentableError(reason, tensor=spec.name, field="scheme", hint="requantize to a GPTQ scheme")
        layouts.add((spec.scheme.bits, _gptq_params(spec)[3]))
        sym &= spec.scheme.zero_point is ZeroPoint.NONE
        act |= bool(spec.act_order)
        lm_head |= spec.name.startswith("lm_head")
        plans.append(gptq_plan(spec, v1=v1, allow_rounding=allow_scale_rounding))
    if not sym and detect_symmetric:
        sym = _all_zero_points_centred(ckpt)
    if len(layouts) > 1:
        raise NotRepresentableError("GPTQ config holds one bits/group_size for all layers", field="quantization_config",
                                    expected="uniform (bits, group_size)", found=sorted(layouts),
                                    hint="requantize to one scheme (per-module 'dynamic' overrides are not written)")
    bits, group = next(iter(layouts)) if layouts else (4, 128)
    base = {}
    src_q = (ckpt.config or {}).get("quantization_config")
    src_q = src_q if ckpt.format == "gptq" and isinstance(src_q, dict) else None
    if src_q is not None:
        base = {k: v for k, v in src_q.items() if k != "dynamic"}
    base.update(_not_converted(ckpt, src_q))
    meta = dict(base.get("meta") or {})
    meta["quantizer"] = [QCKPT_QUANTIZER]
    meta.setdefault("static_groups", False)
    qc = {**base, "quant_method": "gptq", "method": "gptq", "bits": bits, "group_size": group, "desc_act": act,
          "sym": sym, "checkpoint_format": checkpoint_format, "format": checkpoint_format, "pack_dtype": "int32",
          "lm_head": lm_head, "meta": meta}
    # drop any other format's quantization keys (an MLX source's "quantization" would make the
    # output claim to be MLX as well)
    config = {**{k: v for k, v in (ckpt.config or {}).items() if k not in ("quantization", "quantization_config")},
              "quantization_config": qc}
    result = write_directory(ckpt, dst, plans, config=config, extra_json={"quantize_config.json": qc},
                             max_shard_bytes=max_shard_bytes, overwrite=overwrite,
                             notes=lambda: {p.source: list(p.notes) for p in plans})
    result["quantization_config"] = qc
    return result


_BLOCK_RE = re.compile(r"^(?P<block>.+?\.(?:layers|h|blocks|block|layer)\.\d+)\.(?P<rel>.+)$")


def _not_converted(ckpt: Checkpoint, src_q: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config keys that name the Linear modules written dense, so no loader converts them.

    - ``dynamic``: a GPTQModel negative rule ``"-:^<module>$": {}`` per dense Linear-like module
      (:func:`converter.formats.modules.dense_linear_modules`), plus the source's own ``-:`` rules;
    - ``modules_in_block_to_quantize`` (transformers / optimum ``GPTQQuantizer.convert_model``, which
      converts every Linear of the decoder blocks unless this list is given; matched with
      ``name.endswith``): the quantized modules' names within a block, when a block holds a dense one.

    Raises
    ------
    NotRepresentableError
        A module name quantized in one block and dense in another (optimum's list is per block).
    """
    dense = dense_linear_modules(ckpt.specs())
    rules = {k: v for k, v in ((src_q or {}).get("dynamic") or {}).items() if str(k).startswith("-:")}
    for m in dense:
        rules[f"-:^{re.escape(m)}$"] = {}
    out: dict[str, Any] = {"dynamic": rules} if rules else {}
    in_block = [m for m in dense if _BLOCK_RE.match(m)]
    if in_block:
        quantized = sorted({mt.group("rel") for n in ckpt.quantized_names()
                            if (mt := _BLOCK_RE.match(module_prefix(n)))})
        clash = next(((m, q) for m in in_block for q in quantized if m.endswith(q)), None)
        if clash:
            raise NotRepresentableError("a module is dense in one decoder block and quantized in another: "
                                        "transformers' GPTQ loader converts the same modules in every block",
                                        tensor=clash[0] + ".weight", field="modules_in_block_to_quantize",
                                        expected="the same modules quantized in every block", found=clash[1],
                                        hint="requantize every block alike, or keep that module dense everywhere")
        out["modules_in_block_to_quantize"] = [quantized]
    return out


def _all_zero_points_centred(ckpt: Checkpoint) -> bool:
    """True when every quantized tensor is symmetric or has all zero points at the unsigned centre."""
    for spec in ckpt.specs():
        if spec.kind != "quantized" or spec.scheme.zero_point is ZeroPoint.NONE:
            continue
        try:
            t = as_integer_zero(as_unsigned(ckpt[spec.name]))
        except NotRepresentableError:
            return False
        if t.zero_points is None or not np.all(t.zero_points == t.scheme.center):
            return False
    return True


def _with_scale(spec: TensorSpec, dtype: str) -> TensorSpec:
    from dataclasses import replace
    return replace(spec, scheme=spec.scheme.replace(scale_dtype=dtype))
