"""fp8 reader: detection, the config rules per module (``layers``) and the decode (storage -> logical).

Every FP8 weight becomes a codebook tensor: codes = the stored element bytes (``view(uint8)`` of the
memory map, no copy), ``QuantScheme(8, False, scale_dtype=<stored scale dtype>, codebook=<E4M3 or
E5M2 values>)``, ``GroupMap.per_block(block_out, block_in)`` (``[ceil(O/bo), ceil(I/bi)]`` scales,
partial edge blocks counted) or ``GroupMap.per_tensor()``; activation scales are dense tensors with
stored role ``activation_scale`` (kept as stored, never applied to the weight).
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import numpy as np

from converter.codebooks import ELEMENTS, FloatElement, element_for_storage
from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError
from converter.groups import GroupMap, Granularity
from converter.layout import EXPERT, IN, OUT, AxisMap
from converter.scheme import QuantScheme
from converter.tensor import DenseTensor, QuantizedTensor, StoredArray, TensorSpec
from converter.formats.registry import Detection
from converter.formats.source import Source, module_prefix

from converter.formats.fp8.config import DEFAULT_BLOCK, FORMAT, Fp8Config, raw_config, read_config
from converter.formats.fp8.names import (COMFY_MARKER, activation_candidates, is_scale_name, scale_candidates,
                                         weight_of_scale)

#: scale dtypes read as stored (``F8_E8M0``: power-of-two DeepSeek-V3.1 / MXFP8 ``ue8m0`` scales).
SCALE_DTYPES = ("F32", "BF16", "F16", "F8_E8M0")
#: FP8 storage dtypes a bare file may hold (plain casts or ComfyUI ``scaled_fp8``).
BARE_DTYPES = ("F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ")
_INTEGER = ("I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "BOOL")
#: transformers 5.24's CPU dequantize (``Fp8Dequantize``) refuses shapes the scale grid does not divide.
TRANSFORMERS_PARTIAL_NOTE = ("warning: partial edge blocks; transformers 5.24's CPU dequantize (Fp8Dequantize) "
                             "refuses a weight shape not divisible by its scale grid, while DeepSeek / vLLM "
                             "kernels read ceil grids")


class Layer(NamedTuple):
    """What the decoder needs for one FP8 weight: its scale's stored name (None: a plain cast, scale 1)."""

    scale: str | None
    element: FloatElement


def _axes(ndim: int) -> tuple[str, ...]:
    return (OUT, IN) if ndim == 2 else (EXPERT, OUT, IN)


def _ceil_grid(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    o, i = shape[-2:]
    return tuple(shape[:-2]) + (-(-o // block[0]), -(-i // block[1]))


def _scale_dtype(src: Source, sname: str, raw: Mapping[str, Any]) -> str:
    info = src.info(sname)
    if info.dtype == "U8" and raw.get("scale_fmt") == "ue8m0":  # MXFP8-style E8M0 exponents stored as bytes
        return "F8_E8M0"
    if info.dtype not in SCALE_DTYPES:
        raise FormatError("weight scale dtype is not a float scale type", file=src.file_of(sname), tensor=sname,
                          field="dtype", expected=list(SCALE_DTYPES), found=info.dtype)
    return info.dtype


def infer_block(src: Source, wname: str, sname: str, cfg_file) -> tuple[int, int] | None:
    """The block of a weight whose config has no ``weight_block_size``, from its scale's shape.

    transformers' ``FineGrainedFP8Config`` defaults an absent ``weight_block_size`` to ``(128, 128)``;
    vLLM's ``Fp8Config`` reads it as per-tensor. The stored scale decides: one value per tensor (per
    expert; ``[]``, ``[1]``, ``[1, 1]``, ``[E]``, ``[E, 1, 1]``, a fused gate_up's ``[E, 2, 1]``) ->
    None; a 2-D grid -> ``(128, 128)``, its extents checked against ``ceil(shape / 128)``.

    Raises
    ------
    FormatError
        A grid other than ``ceil(shape / 128)`` (``kind=SHAPE``), naming both sources' readings.
    """
    shape = tuple(int(d) for d in src.info(wname).shape)
    sshape = tuple(int(d) for d in src.info(sname).shape)
    if sshape in _per_tensor_shapes(wname, shape):
        return None
    want = _ceil_grid(shape, DEFAULT_BLOCK)
    if sshape != want:
        raise FormatError("weight scale is neither one value per tensor nor a ceil(shape / 128) block grid, and the "
                          "config gives no weight_block_size", file=src.file_of(sname), tensor=sname, field="shape",
                          expected=[list(want)] + [list(p) for p in sorted(_per_tensor_shapes(wname, shape))],
                          found=list(sshape), hint=f"weight {list(shape)}; transformers defaults an absent "
                          f"weight_block_size to [128, 128], vLLM reads it as per-tensor ({cfg_file.name})",
                          kind=ErrorKind.SHAPE)
    return DEFAULT_BLOCK


def _per_tensor_shapes(wname: str, shape: tuple[int, ...]) -> set[tuple[int, ...]]:
    lead = shape[:-2]
    if not lead:
        return {(), (1,), (1, 1)}
    out = {lead, lead + (1, 1)}
    if wname.endswith(".experts.gate_up_proj"):
        out.add(lead + (2, 1))  # transformers _alloc_expert_proj(min_sf_out=2): one row per half
    return out


def _group_map(src: Source, wname: str, sname: str | None, block: tuple[int, int] | None, cfg_file) -> GroupMap:
    """The group map of ``wname`` from its scale's shape, checked against the config's block size.

    A fused ``gate_up_proj`` expert stack's per-tensor scale ``[E, 2, 1]`` (transformers
    ``_alloc_expert_proj(min_sf_out=2)``: one scale for the gate half, one for the up half) reads as
    blocks of ``out / 2`` rows spanning ``in``: the two values may differ.
    """
    shape = tuple(int(d) for d in src.info(wname).shape)
    if sname is None:
        return GroupMap.per_tensor()
    sshape = tuple(int(d) for d in src.info(sname).shape)
    lead = shape[:-2]
    if block is not None:
        want = _ceil_grid(shape, block)
        one_block = not lead and want == (1, 1) and sshape in ((), (1,))  # a matrix within one block: a scalar
        if sshape != want and not one_block:
            raise FormatError("weight scale extents do not match ceil(shape / weight_block_size)",
                              file=src.file_of(sname), tensor=sname, field="shape", expected=list(want),
                              found=list(sshape), hint=f"weight {list(shape)}, weight_block_size {list(block)} "
                              f"({cfg_file.name})", kind=ErrorKind.SHAPE)
        return GroupMap.per_block(*block)
    per_tensor = _per_tensor_shapes(wname, shape)
    if sshape not in per_tensor:
        raise FormatError("weight scale is not one value per tensor, and the config gives no weight_block_size",
                          file=src.file_of(sname), tensor=sname, field="shape",
                          expected=[list(s) for s in sorted(per_tensor)], found=list(sshape),
                          hint="a block-scaled checkpoint names its block in quantization_config.weight_block_size",
                          kind=ErrorKind.CONFIG_MISMATCH)
    if lead and sshape == lead + (2, 1):
        if shape[-2] % 2:
            raise FormatError("a fused gate_up_proj scale [expert, 2, 1] needs an even out extent", tensor=sname,
                              file=src.file_of(sname), field="shape", expected="out divisible by 2",
                              found=list(shape), kind=ErrorKind.SHAPE)
        return GroupMap.per_block(shape[-2] // 2, None)
    return GroupMap.per_tensor()


def _spec(src: Source, wname: str, sname: str | None, element: FloatElement, gm: GroupMap, sdt: str,
          notes: list[str]) -> TensorSpec:
    shape = tuple(int(d) for d in src.info(wname).shape)
    axes = _axes(len(shape))
    scheme = QuantScheme(8, False, scale_dtype=sdt, codebook=element.values)
    stored = [src.stored_array(wname, "codes")] + ([src.stored_array(sname, "scales")] if sname else [])
    if gm.partial_blocks(shape, axes):
        notes.append(TRANSFORMERS_PARTIAL_NOTE)
    return TensorSpec(wname, "quantized", shape, tuple(stored), axes=axes, scheme=scheme, group_map=gm,
                      notes=tuple(notes))


def _activation_specs(src: Source, wname: str) -> dict[str, tuple[TensorSpec, None]]:
    """The activation scales stored beside ``wname``'s module, as dense specs with role ``activation_scale``."""
    out = {}
    for a in activation_candidates(wname):
        if src.has(a):
            info = src.info(a)
            st = StoredArray(a, "activation_scale", info.dtype, tuple(info.shape), info.nbytes, src.file_of(a).name)
            out[a] = (TensorSpec(a, "dense", tuple(info.shape), (st,), dtype=info.dtype,
                                 notes=("activation scale: metadata for the runtime, not applied to the weight",)),
                      None)
    return out


def _check_weight(src: Source, wname: str, sname: str, cfg: Fp8Config) -> None:
    info = src.info(wname)
    file = src.file_of(wname)
    if info.dtype in _INTEGER or element_for_storage(info.dtype) is None:
        raise FormatError("quant_method fp8 names an FP8 weight, but the stored weight is not an FP8 type",
                          file=file, tensor=wname, field="dtype", expected=cfg.element.storage_dtype,
                          found=info.dtype, hint=f"it has a weight scale {sname}; an integer weight is another "
                          "format (int8 / FP4-packed experts are not fp8)", kind=ErrorKind.CONFIG_MISMATCH)
    if info.dtype != cfg.element.storage_dtype:
        raise FormatError("FP8 weight dtype differs from the config's fmt", file=file, tensor=wname,
                          field="quantization_config.fmt", expected=cfg.element.storage_dtype, found=info.dtype,
                          hint=f"{cfg.file.name} says fmt {cfg.element.name!r}", kind=ErrorKind.CONFIG_MISMATCH)
    if len(info.shape) not in (2, 3):
        raise FormatError("an FP8 weight must be [out, in] or [expert, out, in]", file=file, tensor=wname,
                          field="shape", expected="rank 2 or 3", found=list(info.shape), kind=ErrorKind.SHAPE)
    if module_prefix(wname) in cfg.modules_to_not_convert:
        raise FormatError("module listed in modules_to_not_convert has an FP8 weight and a scale", file=cfg.file,
                          tensor=wname, field="quantization_config.modules_to_not_convert",
                          expected="a dense weight", found=f"{info.dtype} with {sname}", kind=ErrorKind.CONFIG_MISMATCH)


def config_layers(src: Source, cfg: Fp8Config) -> dict[str, tuple[TensorSpec, Any]]:
    """``layers`` of a checkpoint with an fp8 config: every weight that has a scale."""
    found: dict[str, tuple[TensorSpec, Any]] = {}
    names = src.tensor_names()
    for n in names:
        if not is_scale_name(n):
            continue
        owners = [w for w in weight_of_scale(n) if src.has(w)]
        if not owners:
            raise MissingTensorError("weight scale without its FP8 weight", file=src.file_of(n), tensor=n,
                                     expected=" or ".join(dict.fromkeys(weight_of_scale(n))), found="absent")
        w = owners[0]
        if w in found:
            continue
        sname = next(s for s in scale_candidates(w) if src.has(s))
        _check_weight(src, w, sname, cfg)
        block = cfg.block if cfg.block_given else infer_block(src, w, sname, cfg.file)
        gm = _group_map(src, w, sname, block, cfg.file)
        found[w] = (_spec(src, w, sname, cfg.element, gm, _scale_dtype(src, sname, cfg.raw), []),
                    Layer(sname, cfg.element))
        found.update(_activation_specs(src, w))
    for n in names:
        info = src.info(n)
        if n not in found and element_for_storage(info.dtype) is not None and len(info.shape) >= 2 \
                and module_prefix(n) not in cfg.modules_to_not_convert:
            raise MissingTensorError("FP8 weight without a weight scale", file=src.file_of(n),
                                     tensor=scale_candidates(n)[0], expected="present (a multiplier per block or "
                                     "per tensor)", found="absent",
                                     hint=f"also looked for {', '.join(scale_candidates(n)[1:]) or 'nothing else'}")
    return found


def bare_layers(src: Source) -> dict[str, tuple[TensorSpec, Any]]:
    """``layers`` of a bare FP8 file (no config): every rank-2/3 FP8 tensor, a plain cast (scale 1) unless a
    per-tensor ``scale_weight`` (ComfyUI ``scaled_fp8``) or ``weight_scale`` is stored beside it."""
    found: dict[str, tuple[TensorSpec, Any]] = {}
    for n in src.tensor_names():
        info = src.info(n)
        el = element_for_storage(info.dtype)
        if el is None or len(info.shape) not in (2, 3) or n == COMFY_MARKER:
            continue
        sname = next((s for s in scale_candidates(n, bare=True) if src.has(s)), None)
        gm = _group_map(src, n, sname, None, src.path)
        sdt = _scale_dtype(src, sname, {}) if sname else "F32"
        note = (f"bare FP8 ({el.name}) with per-tensor {sname.rsplit('.', 1)[-1]}" if sname
                else f"bare FP8 ({el.name}) cast, scale 1")
        found[n] = (_spec(src, n, sname, el, gm, sdt, [note]), Layer(sname, el))
        found.update(_activation_specs(src, n))
    return found


def layers(src: Source) -> dict[str, tuple[TensorSpec, Any]]:
    """Every FP8 weight's spec (the stored arrays it owns) and its :class:`Layer`; activation scales as
    dense specs (state None).

    Raises
    ------
    FormatError
        A config field malformed; a weight dtype the config does not declare (``fmt``) or not FP8
        at all; scale extents other than ``ceil(shape / weight_block_size)`` (or one per tensor
        without a block size); a scale dtype that is not F32 / BF16 / F16 / F8_E8M0.
    MissingTensorError
        A scale without its weight, an FP8 weight without a scale.
    """
    cfg = read_config(src)
    return bare_layers(src) if cfg is None else config_layers(src, cfg)


def metadata(src: Source, found: Mapping[str, tuple[TensorSpec, Any]]) -> dict:
    """``activations``: ``{module: "static" | "dynamic" | "dynamic:group:<n>"}`` for every FP8 weight of a
    checkpoint with an fp8 config (the key the compressed-tensors and ModelOpt readers fill, which the
    writers use to declare activations), and ``scale_fmt`` when the config has one.

    ``activation_scheme: "static"``: the modules with a stored activation scale are ``static``.
    ``"dynamic"`` (DeepSeek-V3 and every released block-FP8 model): activations are quantized at run
    time per token group of ``block_in`` columns when the weight has blocks (DeepSeek-V3
    ``inference/kernel.py`` ``act_quant(x, block_size=128)``; transformers 5.24 ``finegrained_fp8_linear``
    ``block_size[1]``), per token otherwise (``fp8_linear``: "leave None for dynamic (per-token) quant").
    A bare file (no config) says nothing about its activations.
    """
    cfg = read_config(src)
    if cfg is None:
        return {}
    acts = {}
    for name, (spec, _) in found.items():
        if spec.kind != "quantized":
            continue
        mod = module_prefix(name) if name.endswith(".weight") else name
        if cfg.activation_scheme == "static":
            if any(src.has(a) for a in activation_candidates(name)):
                acts[mod] = "static"
        else:
            gm = spec.group_map
            bi = gm.extent(IN) if gm.granularity is Granularity.BLOCK else None
            acts[mod] = f"dynamic:group:{bi}" if bi else "dynamic"
    out: dict = {"activations": acts} if acts else {}
    if "scale_fmt" in cfg.raw:
        out["scale_fmt"] = cfg.raw["scale_fmt"]
    return out


def decode(src: Source, spec: TensorSpec, state: Layer | None) -> QuantizedTensor | DenseTensor:
    """Storage -> logical for one FP8 weight (an activation scale loads as stored)."""
    if spec.kind == "dense":
        return src.dense(spec.name)
    pshape = spec.group_map.param_shape(spec.shape, spec.axes)
    try:
        codes = src.read(spec.name).view(np.uint8)  # the element bytes are the codes (no copy)
        if state.scale is None:
            scales = np.ones(pshape, dtype=np.float32)
        else:
            raw = np.asarray(src.read(state.scale))
            scales = np.array(raw.view(spec.scheme.scale_np_dtype) if raw.dtype == np.uint8 else raw).reshape(pshape)
        amap = AxisMap(spec.axes)
        return QuantizedTensor(spec.name, spec.axes, codes, scales, spec.scheme, spec.group_map,
                               stored={"codes": amap, "scales": amap})
    except LayoutError as exc:
        exc.with_context(file=src.file_of(spec.name), tensor=spec.name)
        raise


def _bare_candidate(src: Source) -> bool:
    if src.kind == "gguf" or src.quantization_config or src.st_metadata.get("qckpt.format"):
        return False
    if src.kind == "directory" and (src.directory / "hf_quant_config.json").exists():  # ModelOpt's side config
        return False
    return any(src.info(n).dtype in BARE_DTYPES and len(src.info(n).shape) in (2, 3) for n in src.tensor_names())


def detect(src: Source) -> Detection | None:
    """``quant_method: "fp8"`` in ``config.json`` (or ``quantization_config.json``) -> 90; a file with FP8
    weights and no quantization config at all (bare casts, ComfyUI ``scaled_fp8``) -> 30."""
    if src.kind == "gguf":
        return None
    raw, file = raw_config(src)
    if raw is not None:
        return Detection(FORMAT, 90, f"quantization_config quant_method fp8 ({file.name})")
    if _bare_candidate(src):
        return Detection(FORMAT, 30, "FP8 weights and no quantization config (bare FP8 safetensors)")
    return None


__all__ = ["ELEMENTS", "Layer", "layers", "decode", "detect", "metadata", "infer_block", "TRANSFORMERS_PARTIAL_NOTE"]
