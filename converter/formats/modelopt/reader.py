"""Read NVIDIA ModelOpt FP8 and NVFP4 exports (``export_hf_checkpoint``) into the logical model.

NVFP4 modules: :mod:`converter.formats.modelopt.nvfp4`. FP8:

Per quantized Linear ``<p>`` (``modelopt/torch/export/unified_export_hf.py``
``_export_quantized_weight``, ``quant_utils.py`` ``to_quantized_weight`` / ``get_weight_scaling_factor``,
``quantization/qtensor/fp8_tensor.py`` ``FP8QTensor``; nvidia-modelopt 0.47.0):

- ``<p>.weight`` F8_E4M3 ``[O, I]`` (``(weight / scale).to(torch.float8_e4m3fn)``);
- ``<p>.weight_scale``: FP8 ``[]`` (per tensor; ``[O, 1]`` when the amax was per channel),
  FP8_PER_CHANNEL_PER_TOKEN ``[O]``, FP8_PB_WO ``[ceil(O/128), 1, ceil(I/128), 1]`` (a plain
  ``[ceil(O/128), ceil(I/128)]`` is accepted, as ModelOpt's export state and vLLM accept it); F32 as
  ModelOpt writes it (BF16 / F16 read too: qckpt keeps a source's scale dtype). A multiplier:
  ``FP8QTensor.dequantize`` = ``fp8.to(dtype) * scale.to(dtype)``, exact in float32;
- ``<p>.input_scale`` F32 0-dim (FP8, static activations): a dense tensor in role ``activation_scale``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter import codebooks
from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError
from converter.groups import GroupMap
from converter.layout import IN, OUT, AxisMap
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, QuantizedTensor, StoredArray, TensorSpec
from converter.formats.base import source_checkpoint
from converter.formats.registry import Detection
from converter.formats.source import Source
from converter.formats.modelopt import nvfp4
from converter.formats.modelopt.config import (FP8, FP8_PB_WO, FP8_PC_PT, HF_QUANT_CONFIG, MIXED, NVFP4, PB_WO_BLOCK,
                                               ModelOptConfig, is_modelopt, parse, refuse_algo)

FORMAT = "modelopt"
AXES = (OUT, IN)
SCALE_DTYPES = ("F32", "BF16", "F16")
PARAM_MAP = AxisMap(AXES)
ACTIVATION_NOTE = "static activation (input) scale of {p}: runtime metadata, never applied to the weight"


@dataclass(frozen=True)
class Module:
    """One quantized module: algorithm, granularity of its stored scale, arrays."""

    prefix: str
    algo: str
    out_features: int
    in_features: int
    group_map: GroupMap
    scale_dtype: str
    stored: tuple[StoredArray, ...]

    @property
    def name(self) -> str:
        return self.prefix + ".weight"

    @property
    def scheme(self) -> QuantScheme:
        return QuantScheme(8, False, scale_dtype=self.scale_dtype, codebook=codebooks.E4M3)

    def spec(self) -> TensorSpec:
        notes = [f"ModelOpt quant_algo {self.algo}"]
        partial = self.group_map.partial_blocks((self.out_features, self.in_features), AXES) \
            if self.algo == FP8_PB_WO else 0
        if partial:
            notes.append(f"{partial} partial edge block(s) of 128 x 128: O={self.out_features}, I={self.in_features}")
        return TensorSpec(self.name, "quantized", (self.out_features, self.in_features), self.stored, axes=AXES,
                          scheme=self.scheme, group_map=self.group_map, notes=tuple(notes))


def _err(src: Source, tensor: str, msg: str, field: str, expected, found, kind=None, hint=None) -> FormatError:
    return FormatError(msg, file=src.file_of(tensor) if src.has(tensor) else src.path, tensor=tensor, field=field,
                       expected=expected, found=found, kind=kind, hint=hint)


def _scale_map(src: Source, algo: str, prefix: str, o: int, i: int) -> GroupMap:
    """The group map the stored ``weight_scale`` shape gives under ``algo`` (FormatError if it fits none)."""
    name = prefix + ".weight_scale"
    shape = tuple(src.info(name).shape)
    ob, ib = -(-o // PB_WO_BLOCK), -(-i // PB_WO_BLOCK)
    fits = {FP8: {(): GroupMap.per_tensor(), (1,): GroupMap.per_tensor(), (o, 1): GroupMap.per_channel(OUT)},
            FP8_PC_PT: {(o,): GroupMap.per_channel(OUT), (o, 1): GroupMap.per_channel(OUT)},
            FP8_PB_WO: {(ob, 1, ib, 1): GroupMap.per_block(PB_WO_BLOCK, PB_WO_BLOCK),
                        (ob, ib): GroupMap.per_block(PB_WO_BLOCK, PB_WO_BLOCK)}}[algo]
    if shape not in fits:
        raise _err(src, name, f"weight_scale shape does not fit quant_algo {algo}", "shape",
                   [list(s) for s in fits][0], list(shape), ErrorKind.SHAPE,
                   hint="FP8_PB_WO scales are [ceil(O/128), 1, ceil(I/128), 1]" if algo == FP8_PB_WO else None)
    return fits[shape]


def module(src: Source, cfg: ModelOptConfig, prefix: str, algo: str) -> Module:
    """Check FP8 module ``prefix`` (``algo`` one of FP8 / FP8_PER_CHANNEL_PER_TOKEN / FP8_PB_WO).

    Raises
    ------
    FormatError
        Weight not F8_E4M3 2-D, scale of the wrong shape / dtype.
    MissingTensorError
        ``weight_scale`` absent.
    """
    name = prefix + ".weight"
    info = src.info(name)
    if info.dtype != "F8_E4M3":
        raise _err(src, name, f"ModelOpt {algo} weights are F8_E4M3 (FP8QTensor: E4M3 only)", "dtype", "F8_E4M3",
                   info.dtype, ErrorKind.CONFIG_MISMATCH,
                   hint="very old ModelOpt exports stored FP8 bytes as int8; re-export with a current ModelOpt"
                   if info.dtype in ("I8", "U8") else None)
    if len(info.shape) != 2:
        raise _err(src, name, "only 2-D [O, I] FP8 weights are read", "shape", "[O, I]", list(info.shape),
                   ErrorKind.SHAPE)
    o, i = (int(v) for v in info.shape)
    sname = prefix + ".weight_scale"
    if not src.has(sname):
        raise MissingTensorError(f"partner tensor missing: ModelOpt {algo} stores weight_scale beside the weight",
                                 file=cfg.file, tensor=sname, expected="present", found="absent")
    sdt = src.info(sname).dtype
    if sdt not in SCALE_DTYPES:
        raise _err(src, sname, "weight_scale dtype is not a float scale dtype", "dtype", list(SCALE_DTYPES), sdt)
    gm = _scale_map(src, algo, prefix, o, i)
    return Module(prefix, algo, o, i, gm, sdt, (src.stored_array(name, "codes"), src.stored_array(sname, "scales")))


def load(src: Source, m: "Module | nvfp4.NvFp4Module") -> QuantizedTensor:
    """Materialise one module: codes are the stored E4M3 bytes (uint8 view, no copy); NVFP4: :func:`nvfp4.load`."""
    if isinstance(m, nvfp4.NvFp4Module):
        return nvfp4.load(src, m)
    try:
        codes = np.asarray(src.read(m.name)).view(np.uint8)
        pshape = m.group_map.param_shape((m.out_features, m.in_features), AXES)
        scales = np.asarray(src.read(m.prefix + ".weight_scale")).reshape(pshape)
        return QuantizedTensor(name=m.name, axes=AXES, codes=codes, scales=scales, scheme=m.scheme,
                               group_map=m.group_map, stored={"codes": PARAM_MAP, "scales": PARAM_MAP})
    except LayoutError as exc:
        exc.with_context(file=src.file_of(m.name), tensor=m.name)
        raise


def _candidates(src: Source) -> list[str]:
    """Modules holding ``<p>.weight`` next to ``<p>.weight_scale`` (every ModelOpt quantized layout)."""
    return [n[: -len(".weight_scale")] for n in src.tensor_names()
            if n.endswith(".weight_scale") and src.has(n[: -len("_scale")])]


def _opaque(src: Source, prefix: str, algo: str, file) -> TensorSpec:
    head = prefix + "."
    names = [n for n in src.tensor_names() if n.startswith(head) and "." not in n[len(head):]
             and (n[len(head):].startswith("weight") or n[len(head):].startswith("input_"))]
    roles = {"weight": "codes", "weight_scale": "scales", "weight_scale_2": "global_scale",
             "input_scale": "activation_scale"}
    stored = tuple(src.stored_array(n, roles.get(n.rsplit(".", 1)[-1], "other")) for n in names)
    reason = refuse_algo(algo, file=file, field=f"quantized_layers.{prefix}.quant_algo")
    return TensorSpec(prefix + ".weight", "opaque", tuple(src.info(prefix + ".weight").shape), stored,
                      dtype=f"ModelOpt {algo}", notes=(reason.render(),))


def read_modelopt(src: Source) -> Checkpoint:
    """Read a ModelOpt FP8 export into a lazily loaded :class:`Checkpoint`.

    Raises
    ------
    FormatError, MissingTensorError, UnsupportedError
        See :func:`module` and :func:`converter.formats.modelopt.config.parse`.
    """
    cfg = parse(src)
    mods: dict[str, Module | nvfp4.NvFp4Module] = {}
    opaque: dict[str, TensorSpec] = {}
    for p in _candidates(src):
        algo = cfg.algo_for(p)
        if algo is None:
            w = p + ".weight"
            if src.info(w).dtype.startswith("F8_") or cfg.quant_algo == MIXED or src.has(p + ".weight_scale_2"):
                raise _err(src, w, "module stores a quantized weight but the config does not quantize it", "config",
                           f"a quant_algo for {p!r}", "excluded" if cfg.excluded(p) else "not listed",
                           ErrorKind.CONFIG_MISMATCH, hint=f"{cfg.file.name}: exclude_modules / quantized_layers")
            continue  # a dense weight with an unrelated *_scale tensor: left dense
        if algo in (FP8, FP8_PC_PT, FP8_PB_WO):
            m = module(src, cfg, p, algo)
            mods[m.name] = m
        elif algo == NVFP4:
            m = nvfp4.module(src, cfg, p)
            mods[m.name] = m
        else:
            opaque[p + ".weight"] = _opaque(src, p, algo, cfg.file)
    owned = {a.name for m in mods.values() for a in m.stored} | {a.name for s in opaque.values() for a in s.stored}
    specs: dict[str, TensorSpec] = {}
    for n in src.tensor_names():
        if n in owned:
            continue
        if n.endswith(".input_scale") and n[: -len(".input_scale")] + ".weight" in mods:
            info = src.info(n)
            specs[n] = TensorSpec(n, "dense", tuple(info.shape), (src.stored_array(n, "activation_scale"),),
                                  dtype=info.dtype, notes=(ACTIVATION_NOTE.format(p=n[: -len(".input_scale")]),))
        else:
            specs[n] = src.dense_spec(n)
    specs.update({n: m.spec() for n, m in mods.items()})
    specs.update(opaque)
    meta = metadata(cfg, mods, opaque, src)
    ckpt = source_checkpoint(src, FORMAT, specs, lambda n: load(src, mods[n]), mods, meta)
    # the side file describes this export only: a writer of another format must not copy it
    ckpt.extra_files = tuple(f for f in ckpt.extra_files if not f.endswith("/" + HF_QUANT_CONFIG)
                             and f != HF_QUANT_CONFIG)
    return ckpt


#: inspect's ``input_activations`` wording per kind of module.
ACT_KINDS = {"static": "float 8-bit static per-tensor (input_scale)", "dynamic": "float 8-bit dynamic per-token",
             "nvfp4": "float 4-bit NVFP4 (static global input_scale, dynamic E4M3 scales per 16)"}


def metadata(cfg: ModelOptConfig, mods: dict, opaque: dict, src: Source) -> dict:
    """``quant_algo``, ``kv_cache_quant_algo``, producer version, ``activations`` ({module: "static" /
    "dynamic" / "nvfp4"}: FP8 with a stored input_scale is static, FP8_PER_CHANNEL_PER_TOKEN dynamic per
    token, FP8_PB_WO weight-only, NVFP4 with an input_scale W4A4), an ``input_activations`` line for inspect
    and the unreadable layers."""
    acts = {}
    for m in mods.values():
        if m.algo == FP8_PC_PT:
            acts[m.prefix] = "dynamic"
        elif m.algo == FP8 and src.has(m.prefix + ".input_scale"):
            acts[m.prefix] = "static"
        elif m.algo == NVFP4 and src.has(m.prefix + ".input_scale"):
            acts[m.prefix] = "nvfp4"
    out: dict = {"modelopt_quant_algo": cfg.quant_algo, "kv_cache_quant_algo": cfg.kv_cache_quant_algo,
                 "modelopt_version": cfg.producer_version}
    if acts:
        out["activations"] = acts
        kinds = sorted({ACT_KINDS[v] for v in acts.values()})
        out["input_activations"] = "; ".join(kinds)
    if opaque:
        algos = sorted({s.dtype for s in opaque.values()})
        out["unreadable_groups"] = "; ".join(f"{a}: {sum(s.dtype == a for s in opaque.values())} module(s) opaque"
                                             for a in algos)
    return out


def detect_modelopt(src: Source) -> Detection | None:
    """Claim ModelOpt exports: ``hf_quant_config.json`` from producer modelopt, or ``quant_method: modelopt``."""
    why = is_modelopt(src)
    return Detection(FORMAT, 95, why) if why else None
