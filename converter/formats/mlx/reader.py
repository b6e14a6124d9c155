"""MLX reader: ``weight`` / ``scales`` / ``biases`` -> logical tensors, detection, and the decode as
``mx.dequantize`` computes it (:func:`dequantize_like_mlx`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError, UnsupportedError
from converter.groups import GroupMap
from converter.layout import EXPERT, IN, OUT, AxisMap
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec
from converter.formats.registry import Detection
from converter.formats.base import source_checkpoint
from converter.formats.source import Source, module_prefix

from converter.formats.mlx.config import (AFFINE_BITS, FLOAT_SCALE_DTYPES, FORMAT, MODES, cross_check, known_widths,
                                          layer_params, quant_config)

# -- reader -------------------------------------------------------------------------------------
def _axes(ndim: int) -> tuple[str, ...]:
    return (OUT, IN) if ndim == 2 else (EXPERT, OUT, IN)


def _layer_spec(src: Source, qcfg: Mapping[str, Any], p: str, known: set[int]) -> tuple[TensorSpec, dict]:
    """Spec of quantized module ``p`` from headers and config only; also returns its params."""
    wname, sname, bname = f"{p}.weight", f"{p}.scales", f"{p}.biases"
    file = src.file_of(sname)
    if not src.has(wname):
        raise MissingTensorError("scales without a packed weight", file=file, tensor=wname,
                                 expected=f"{wname} (U32)", found="absent")
    params = layer_params(qcfg, p, file=file)
    if params is None:
        raise FormatError("config marks the module unquantized (false) but it has scales", file=file, tensor=p,
                          field=f"quantization.{p}", expected="a params dict", found=False)
    mode, bits, group = params["mode"], params["bits"], params["group_size"]
    w, s = src.info(wname), src.info(sname)
    has_global = _check_global_scale(src, p, mode, w.shape)
    if w.dtype != "U32" or len(w.shape) not in (2, 3):
        raise FormatError("packed weight must be uint32 of rank 2 or 3", file=src.file_of(wname), tensor=wname,
                          field="dtype", expected="U32 [..., out, in*bits/32]", found=f"{w.dtype} {list(w.shape)}")
    scale_dtype = MODES[mode][2]
    if mode == "affine":
        if s.dtype not in FLOAT_SCALE_DTYPES:
            raise FormatError("affine scales must be a float dtype (uint8 scales mean an mx/nv mode)", file=file,
                              tensor=sname, field="dtype", expected=list(FLOAT_SCALE_DTYPES), found=s.dtype,
                              hint="set quantization.mode to mxfp4/nvfp4/mxfp8 if that is what was written")
        if not src.has(bname):
            raise MissingTensorError("affine mode needs biases", file=file, tensor=bname,
                                     expected=f"{s.dtype} {list(s.shape)}", found="absent")
        b = src.info(bname)
        if b.dtype != s.dtype or b.shape != s.shape:
            raise FormatError("biases must match scales in dtype and shape", file=src.file_of(bname), tensor=bname,
                              field="shape", expected=f"{s.dtype} {list(s.shape)}", found=f"{b.dtype} {list(b.shape)}")
        scale_dtype = s.dtype
        if bits not in (1,) + AFFINE_BITS:
            raise FormatError("affine bits must be 1-6 or 8", file=file, tensor=p, field="quantization.bits",
                              expected=list(AFFINE_BITS), found=bits)
    else:
        if s.dtype != "U8":
            raise FormatError(f"{mode} scales must be uint8", file=file, tensor=sname, field="dtype",
                              expected="U8", found=s.dtype)
        if src.has(bname):
            raise FormatError(f"biases must be absent in mode {mode}", file=src.file_of(bname), tensor=bname,
                              expected="no biases", found=list(src.info(bname).shape))
        g0, b0, _, _ = MODES[mode]
        if (bits, group) != (b0, g0):
            raise FormatError(f"mode {mode} fixes bits and group_size", file=file, tensor=p, field="quantization",
                              expected=f"bits={b0}, group_size={g0}", found=f"bits={bits}, group_size={group}")
    wcols, scols = int(w.shape[-1]), int(s.shape[-1])
    if (wcols * 32) % bits:
        raise FormatError("packed width is not a whole number of codes", file=src.file_of(wname), tensor=wname,
                          field="shape", expected=f"last dim * 32 divisible by bits={bits}", found=list(w.shape))
    in_features = wcols * 32 // bits
    if in_features % group or tuple(s.shape) != tuple(w.shape[:-1]) + (in_features // group,):
        raise FormatError("scales shape contradicts config bits/group_size", file=file, tensor=sname, field="shape",
                          expected=list(w.shape[:-1]) + [f"{in_features}/{group}"], found=list(s.shape),
                          hint=f"config says bits={bits}, group_size={group}", kind=ErrorKind.CONFIG_MISMATCH)
    note = cross_check(src, p, bits, group, in_features, wcols, scols, known)
    axes = _axes(len(w.shape))
    shape = tuple(int(d) for d in w.shape[:-1]) + (in_features,)
    codebook = MODES[mode][3]
    scheme = QuantScheme(bits, False, ZeroPoint.FLOAT if codebook is None else ZeroPoint.NONE,
                         scale_dtype=scale_dtype, codebook=codebook, global_scale="amax" if has_global else None)
    stored = [src.stored_array(wname, "codes"), src.stored_array(sname, "scales")]
    if mode == "affine":
        stored.append(src.stored_array(bname, "zero_points"))
    if has_global:
        stored.append(src.stored_array(f"{p}.global_scale", "global_scale"))
    notes = [f"mlx mode {mode}"] + (["global_scale: tensor amax, effective scale s * fp32(g / 2688)"]
                                    if has_global else []) + ([note] if note else [])
    spec = TensorSpec(wname, "quantized", shape, tuple(stored), axes=axes, scheme=scheme,
                      group_map=GroupMap.per_group(group, IN), notes=tuple(notes))
    return spec, params


def _check_global_scale(src: Source, p: str, mode: str, wshape) -> bool:
    """Whether module ``p`` has an nvfp4 ``global_scale`` (F32, 0-dim, beside a 2-D weight).

    mlx-lm 0.32.2 loads one when the tensor is present (``utils.load_model``: ``f"{p}.global_scale" in
    weights``) and records ``"global_scale": true`` in the module's config entry (``quantize_model``).
    """
    gname = f"{p}.global_scale"
    entry = (quant_config(src) or {}).get(p)
    declared = isinstance(entry, dict) and entry.get("global_scale") is True
    if not src.has(gname):
        if declared:
            raise MissingTensorError("config declares a global scale for the module but the tensor is absent",
                                     file=src.file_of(f"{p}.scales"), tensor=gname, expected="F32 []", found="absent")
        return False
    file = src.file_of(gname)
    if mode != "nvfp4":
        raise FormatError("a global_scale belongs to nvfp4 only (mx.quantize)", file=file, tensor=gname,
                          field="quantization.mode", expected="nvfp4", found=mode)
    g = src.info(gname)
    if len(wshape) != 2:
        raise UnsupportedError("per-expert nvfp4 global scales (one per expert of a switch layer) are not in the "
                               "logical model, which holds one float32 global scale per tensor", file=file,
                               tensor=gname, field="shape", expected="F32 [] beside a 2-D weight",
                               found=f"{g.dtype} {list(g.shape)} beside weight {list(wshape)}")
    if g.dtype != "F32" or tuple(g.shape) != ():
        raise FormatError("an nvfp4 global_scale is one float32 value (0-dim)", file=file, tensor=gname,
                          field="shape", expected="F32 []", found=f"{g.dtype} {list(g.shape)}", kind=ErrorKind.SHAPE)
    return True


def codes_map(axes: tuple[str, ...], bits: int) -> AxisMap:
    """MLX code storage: logical order, packed along ``in`` into uint32, LSB-first stream."""
    return AxisMap(stored_axes=axes, packed_axis=IN, bits=bits, container="U32", packing="stream")


def _load(src: Source, spec: TensorSpec, mode: str) -> QuantizedTensor:
    p = module_prefix(spec.name)
    sizes = dict(zip(spec.axes, spec.shape))
    cmap = codes_map(spec.axes, spec.scheme.bits)
    try:
        codes = cmap.to_logical(src.read(spec.name), spec.axes, sizes)
        scales = np.array(src.read(f"{p}.scales"))
        zp, g = None, None
        if mode == "affine":
            zp = np.array(src.read(f"{p}.biases"))
        else:
            scales = scales.view(spec.scheme.scale_np_dtype)
        if spec.scheme.global_scale is not None:
            g = np.array(src.read(f"{p}.global_scale"), dtype=np.float32).reshape(())
        return QuantizedTensor(spec.name, spec.axes, codes, scales, spec.scheme, spec.group_map, zero_points=zp,
                               global_scale=g,
                               stored={"codes": cmap, "scales": AxisMap(spec.axes), "zero_points": AxisMap(spec.axes)}
                               if mode == "affine" else {"codes": cmap, "scales": AxisMap(spec.axes)})
    except LayoutError as exc:
        exc.with_context(file=src.file_of(spec.name), tensor=spec.name)
        raise


def read_mlx(src: Source) -> Checkpoint:
    """Read an MLX model directory (or file plus config) into a lazily loaded :class:`Checkpoint`.

    Raises
    ------
    FormatError
        No ``quantization`` config while quantized layers exist, config contradicting the
        tensors (dtype, shapes, mode, B27 width mismatch), biases in an fp mode.
    MissingTensorError
        ``.weight`` / ``.biases`` partner missing, or a uint32 ``.weight`` without ``.scales``.
    UnsupportedError
        per-expert nvfp4 ``global_scale`` vectors (switch layers).
    """
    names = src.tensor_names()
    quantized = [n[: -len(".scales")] for n in names if n.endswith(".scales")]
    qset = set(quantized)
    qcfg = quant_config(src)
    if quantized and qcfg is None:
        raise FormatError("quantized layers but no 'quantization' in config.json", file=src.path,
                          field="config.json:quantization", expected="{group_size, bits, mode}", found="absent",
                          hint="bits and group_size cannot be inferred from packed shapes alone (CASES.md B27)")
    known = known_widths(src, quantized)
    specs: dict[str, TensorSpec] = {}
    modes: dict[str, str] = {}
    for p in quantized:
        spec, params = _layer_spec(src, qcfg, p, known)
        specs[spec.name] = spec
        modes[spec.name] = params["mode"]
    for n in names:
        if n in specs or (n.endswith((".scales", ".biases", ".global_scale")) and n.rsplit(".", 1)[0] in qset):
            continue
        if n.endswith(".biases"):
            raise MissingTensorError("biases without scales", file=src.file_of(n),
                                     tensor=n.rsplit(".", 1)[0] + ".scales",
                                     expected="present", found="absent")
        info = src.info(n)
        if n.endswith(".weight") and info.dtype == "U32":
            raise MissingTensorError("packed uint32 weight without scales", file=src.file_of(n),
                                     tensor=module_prefix(n) + ".scales", expected="present", found="absent")
        specs[n] = src.dense_spec(n)
    quantized_names = {n for n, s in specs.items() if s.kind == "quantized"}
    return source_checkpoint(src, FORMAT, specs, lambda name: _load(src, specs[name], modes[name]), quantized_names,
                             {"quantization": qcfg, "modes": modes})


def detect_mlx(src: Source) -> Detection | None:
    """Config ``quantization`` (mlx-lm) -> 90; ``__metadata__`` format mlx with scales -> 60."""
    if src.kind == "gguf":
        return None
    cfg = src.config or {}
    if isinstance(cfg.get("quantization"), dict) and quant_config(src) is not None:
        return Detection(FORMAT, 90, "config.json has an mlx-lm 'quantization' dict")
    names = src.tensor_names()
    if src.st_metadata.get("format") == "mlx" or any(
            n.endswith(".scales") and src.has(n[:-7] + ".weight") and src.info(n[:-7] + ".weight").dtype == "U32"
            for n in names):
        return Detection(FORMAT, 60, "uint32 <p>.weight with <p>.scales (MLX tensor names)")
    return None


def dequantize_like_mlx(t: QuantizedTensor) -> np.ndarray:
    """Affine decode in MLX's own arithmetic: ``fp16(fp16(s*q) + b)`` in the scale dtype.

    ``mx.dequantize`` computes in the scales' dtype: the product ``s*q`` is rounded to the dtype,
    then the bias is added and rounded again (verified bit-exact on the sample checkpoints).
    Our :meth:`QuantizedTensor.dequantize` is float32 (one rounding), so its fp16 cast can differ
    from MLX by that extra rounding: at most half an fp16 ulp of ``s*q`` plus half of the result.

    Returns
    -------
    ndarray, shape ``t.shape``, dtype of the scales.
    """
    dt = t.scales.dtype
    s = t.group_map.expand(t.scales, t.shape, t.axes)
    b = t.group_map.expand(t.zero_points, t.shape, t.axes)
    return (t.codes.astype(dt) * s).astype(dt) + b
