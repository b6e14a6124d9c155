"""MLX quantized checkpoints (``mlx.core.quantize`` / mlx-lm): reader and affine writer.

Storage (FORMATS.md section 4; ``mlx/ops.cpp`` ``affine_quantize`` / ``fp_quantize``,
``python/mlx/nn/layers/quantized.py`` ``QuantizedLinear``, ``mlx_lm/utils.py`` ``load_model`` /
``save_model``), for a module ``<p>`` with logical weight ``<p>.weight`` of shape ``(out, in)``
(``(expert, out, in)`` for ``SwitchLinear``):

- ``<p>.weight``  uint32 ``[..., out, in*b/32]``: codes packed along ``in``, LSB-first, one
  continuous bit stream (3/5/6-bit codes straddle words).
- ``<p>.scales``  ``[..., out, in/G]``: model dtype (F16/BF16/F32) in ``affine`` mode, may be
  **negative**; uint8 in ``mxfp4`` / ``mxfp8`` (E8M0) and ``nvfp4`` (FP8 E4M3 bits).
- ``<p>.biases``  ``[..., out, in/G]``: affine only, an additive offset: ``w = s*q + b``.
- ``<p>.bias``    the ordinary Linear bias (a dense tensor; coexists with ``.biases``).

``config.json["quantization"]`` (mirrored as ``quantization_config``) holds the defaults
``group_size``, ``bits``, ``mode`` (absent -> ``"affine"``) and per-module entries keyed by module
path: a params dict or ``false``. Layers without ``.scales`` are dense (mlx-lm leaves layers with
``in % G != 0`` in float, CASES.md B15).

Logical model: affine -> unsigned codes, ``ZeroPoint.FLOAT`` (biases in the scale dtype);
``mxfp4`` / ``nvfp4`` -> codebook E2M1 with E8M0 / E4M3 scales; ``mxfp8`` -> a 256-entry codebook
of the FP8 E4M3 values with E8M0 scales. The mode therefore lives in the scheme itself (codebook
and scale dtype), so fp codes can never be read as affine integers (CASES.md B31).
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping

import ml_dtypes
import numpy as np

from converter.errors import FormatError, LayoutError, MissingTensorError, NotRepresentableError, UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.layout import EXPERT, IN, OUT, AxisMap
from converter.quant.recode import as_float_bias, as_groups, as_unsigned
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, opaque_reason
from converter.formats.model_dir import write_model_dir
from converter.write.plan import TensorPlan, dense_plan, rows_plan
from converter.formats.registry import Detection, FormatHandler, register
from converter.formats.source import Source, module_prefix

FORMAT = "mlx"

#: FP4 E2M1 values by 4-bit code (``mlx/ops.cpp`` ``fp_quantize``; OCP MX spec).
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: FP8 E4M3 (fn) values by 8-bit code; codes 0x7F / 0xFF are NaN.
E4M3 = tuple(float(v) for v in np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32))

#: mode -> (default group size, default bits, scale dtype or None for the model dtype, codebook).
MODES: dict[str, tuple[int, int, str | None, tuple[float, ...] | None]] = {
    "affine": (64, 4, None, None),
    "mxfp4": (32, 4, "F8_E8M0", E2M1),
    "nvfp4": (16, 4, "F8_E4M3", E2M1),
    "mxfp8": (32, 8, "F8_E8M0", E4M3),
}
AFFINE_BITS = (2, 3, 4, 5, 6, 8)
AFFINE_GROUPS = (32, 64, 128)
FLOAT_SCALE_DTYPES = ("F16", "BF16", "F32")

#: config.json keys whose integer values are model widths (independent ``in_features`` candidates, B27).
_SIZE_KEYS = ("hidden_size", "intermediate_size", "d_model", "n_embd", "ffn_dim", "d_ff", "n_inner",
              "embed_dim", "moe_intermediate_size", "shared_expert_intermediate_size", "vocab_size",
              "kv_lora_rank", "q_lora_rank", "projection_dim")


# -- config -------------------------------------------------------------------------------------
def quant_config(src: Source) -> dict | None:
    """``config.json["quantization"]`` (mlx-lm), else its ``quantization_config`` mirror, else None."""
    cfg = src.config or {}
    for key in ("quantization", "quantization_config"):
        q = cfg.get(key)
        if isinstance(q, dict) and ("bits" in q or "group_size" in q or "mode" in q) and "quant_method" not in q:
            return q
    return None


def layer_params(qcfg: Mapping[str, Any], module: str, *, file: Any = None) -> dict | None:
    """Effective ``{"group_size", "bits", "mode"}`` of ``module``, or None when the config says ``false``.

    Per-module entries override the top-level defaults key by key (``mlx_lm/utils.py``
    ``load_model``: ``quantization.get(path, defaults)``); a missing ``mode`` means ``affine``.

    Raises
    ------
    FormatError
        Unknown mode, or non-integer bits / group size.
    """
    entry = qcfg.get(module, None)
    if entry is False:
        return None
    base = {"mode": qcfg.get("mode") or "affine"}
    if isinstance(entry, dict):
        base["mode"] = entry.get("mode") or base["mode"]
    mode = base["mode"]
    if not isinstance(mode, str) or mode not in MODES:
        raise FormatError("unknown MLX quantization mode", file=file, tensor=module, field="quantization.mode",
                          expected=sorted(MODES), found=mode)
    g0, b0, _, _ = MODES[mode]
    params = {"group_size": qcfg.get("group_size", g0), "bits": qcfg.get("bits", b0), "mode": mode}
    if isinstance(entry, dict):
        params.update({k: entry[k] for k in ("group_size", "bits") if k in entry})
    for k in ("group_size", "bits"):
        if not isinstance(params[k], int) or isinstance(params[k], bool) or params[k] <= 0:
            raise FormatError("quantization parameter must be a positive integer", file=file, tensor=module,
                              field=f"quantization.{k}", found=params[k])
    return params


def _known_widths(src: Source, quantized: Iterable[str]) -> set[int]:
    """Widths that an ``in_features`` can be checked against (B27), from config and headers only.

    Config sizes (``hidden_size`` ...; nested ``*_config`` too), every dimension of every dense
    tensor (biases, norms: out widths of other layers) and the ``out`` of every quantized weight.
    """
    known: set[int] = set()

    def walk(cfg: Mapping[str, Any]) -> None:
        for k, v in cfg.items():
            if isinstance(v, dict) and k.endswith("_config") and k not in ("quantization_config",):
                walk(v)
            elif k in _SIZE_KEYS and isinstance(v, int) and not isinstance(v, bool):
                known.add(v)
        heads, hd = cfg.get("num_attention_heads"), cfg.get("head_dim")
        if isinstance(heads, int) and isinstance(hd, int):
            known.add(heads * hd)
    walk(src.config or {})
    owned = set()
    for p in quantized:
        owned.update({f"{p}.weight", f"{p}.scales", f"{p}.biases"})
        known.add(int(src.info(f"{p}.weight").shape[-2]) if len(src.info(f"{p}.weight").shape) >= 2 else 0)
    for n in src.tensor_names():
        if n not in owned:
            known.update(int(d) for d in src.info(n).shape)
    known.discard(0)
    return known


def _cross_check(src: Source, p: str, bits: int, group: int, in_features: int, wcols: int, scols: int,
                 known: set[int]) -> str | None:
    """B27: the packed shapes pin only ``bits*group``; check the config's ``in_features`` independently.

    Returns a note when nothing independent confirms it; raises FormatError when another
    ``(bits, group_size)`` fits the shapes and gives a width the model has while the config's does not.
    """
    if not known or in_features in known:
        return None
    alts = []
    for b in (1, 2, 3, 4, 5, 6, 8):
        if (wcols * 32) % b:
            continue
        i2 = wcols * 32 // b
        for g in (16, 32, 64, 128):
            if i2 % g == 0 and i2 // g == scols and i2 in known and (b, g) != (bits, group):
                alts.append((b, g, i2))
    if alts:
        b, g, i2 = alts[0]
        raise FormatError(
            "config bits/group_size contradict the model's widths: the packed shapes fit both readings",
            file=src.file_of(f"{p}.weight"), tensor=f"{p}.weight", field="quantization",
            expected=f"bits={b}, group_size={g} (in_features {i2}, a width of this model)",
            found=f"config bits={bits}, group_size={group} (in_features {in_features}, not a width of this model)",
            hint="fix config.json 'quantization' for this module (CASES.md B27)")
    return f"in_features {in_features} not confirmed by an independent width"


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
    if src.has(f"{p}.global_scale"):
        raise UnsupportedError("per-tensor global_scale (nvfp4) is not supported: no sample to verify MLX's "
                               "order of multiplication", file=file, tensor=f"{p}.global_scale")
    w, s = src.info(wname), src.info(sname)
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
                          hint=f"config says bits={bits}, group_size={group}")
    note = _cross_check(src, p, bits, group, in_features, wcols, scols, known)
    axes = _axes(len(w.shape))
    shape = tuple(int(d) for d in w.shape[:-1]) + (in_features,)
    codebook = MODES[mode][3]
    scheme = QuantScheme(bits, False, ZeroPoint.FLOAT if codebook is None else ZeroPoint.NONE,
                         scale_dtype=scale_dtype, codebook=codebook)
    stored = [src.stored_array(wname, "codes"), src.stored_array(sname, "scales")]
    if mode == "affine":
        stored.append(src.stored_array(bname, "zero_points"))
    notes = [f"mlx mode {mode}"] + ([note] if note else [])
    spec = TensorSpec(wname, "quantized", shape, tuple(stored), axes=axes, scheme=scheme,
                      group_map=GroupMap.per_group(group, IN), notes=tuple(notes))
    return spec, params


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
        zp = None
        if mode == "affine":
            zp = np.array(src.read(f"{p}.biases"))
        else:
            scales = scales.view(spec.scheme.scale_np_dtype)
        return QuantizedTensor(spec.name, spec.axes, codes, scales, spec.scheme, spec.group_map, zero_points=zp,
                               stored={"codes": cmap, "scales": AxisMap(spec.axes), "zero_points": AxisMap(spec.axes)}
                               if mode == "affine" else {"codes": cmap, "scales": AxisMap(spec.axes)})
    except LayoutError as exc:
        raise exc.with_context(file=src.file_of(spec.name), tensor=spec.name)


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
        nvfp4 ``global_scale``.
    """
    names = src.tensor_names()
    quantized = [n[: -len(".scales")] for n in names if n.endswith(".scales")]
    qset = set(quantized)
    qcfg = quant_config(src)
    if quantized and qcfg is None:
        raise FormatError("quantized layers but no 'quantization' in config.json", file=src.path,
                          field="config.json:quantization", expected="{group_size, bits, mode}", found="absent",
                          hint="bits and group_size cannot be inferred from packed shapes alone (CASES.md B27)")
    known = _known_widths(src, quantized)
    specs: dict[str, TensorSpec] = {}
    modes: dict[str, str] = {}
    for p in quantized:
        spec, params = _layer_spec(src, qcfg, p, known)
        specs[spec.name] = spec
        modes[spec.name] = params["mode"]
    for n in names:
        if n in specs or (n.endswith((".scales", ".biases")) and n.rsplit(".", 1)[0] in qset):
            continue
        if n.endswith(".biases"):
            raise MissingTensorError("biases without scales", file=src.file_of(n), tensor=n.rsplit(".", 1)[0] + ".scales",
                                     expected="present", found="absent")
        info = src.info(n)
        if n.endswith(".weight") and info.dtype == "U32":
            raise MissingTensorError("packed uint32 weight without scales", file=src.file_of(n),
                                     tensor=module_prefix(n) + ".scales", expected="present", found="absent")
        specs[n] = src.dense_spec(n)
    specs = dict(sorted(specs.items()))

    def load(name: str):
        spec = specs[name]
        if spec.kind == "quantized":
            return _load(src, spec, modes[name])
        return src.dense(name)

    return Checkpoint(specs, load, format=FORMAT, path=str(src.path), config=src.config,
                      metadata={"quantization": qcfg, "modes": modes}, files=[str(f) for f in src.files],
                      extra_files=[str(p) for p in src.extra_files()])


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


# -- writer -------------------------------------------------------------------------------------
def target_group_size(spec: TensorSpec) -> int | None:
    """The MLX ``group_size`` a quantized ``spec`` is written with, or None if there is none.

    Groups along ``in`` keep their size. Per-tensor and per-output-channel parameters are written
    as the largest MLX group size dividing ``in`` (128, 64, then 32), each group repeating its
    row's scale and bias (:func:`converter.quant.recode.as_groups`): an exact re-expression.
    """
    gm = spec.group_map
    if gm.granularity is Granularity.GROUP:
        return gm.group_size
    n_in = int(spec.shape[-1])
    if gm.granularity is Granularity.TENSOR or (gm.granularity is Granularity.CHANNEL and gm.axis == OUT):
        return next((g for g in sorted(AFFINE_GROUPS, reverse=True) if n_in % g == 0), None)
    return None


def check_target(spec: TensorSpec) -> str | None:
    """None if ``spec`` can be written as MLX affine exactly (up to bias rounding), else the reason."""
    if spec.kind != "quantized":
        return opaque_reason(spec)  # None for dense tensors
    if not spec.name.endswith(".weight"):
        return "MLX stores a quantized weight as '<module>.weight'"
    if tuple(spec.axes) not in ((OUT, IN), (EXPERT, OUT, IN)):
        return f"MLX needs axes (out, in) or (expert, out, in), found {spec.axes}"
    gm, s = spec.group_map, spec.scheme
    if s.codebook is not None:
        return "codebook schemes (nf4/fp4/mx/nv) cannot be written as MLX affine"
    if gm.granularity is Granularity.GROUP and gm.axis != IN:
        return f"MLX groups run along 'in'; found {gm.describe()}"
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


def _plan(spec: TensorSpec) -> TensorPlan:
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
    return rows_plan(plan) if tuple(spec.axes) == ("out", "in") and spec.group_map.granularity.value == "group" else plan


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
    pairs = Counter((target_group_size(s), s.scheme.bits) for s in q)
    g, b = pairs.most_common(1)[0][0] if pairs else (64, 4)
    quant: dict[str, Any] = {"group_size": g, "bits": b, "mode": "affine"}
    for s in q:
        if (target_group_size(s), s.scheme.bits) != (g, b):
            quant[module_prefix(s.name)] = {"group_size": target_group_size(s), "bits": s.scheme.bits}
    cfg = {k: copy.deepcopy(v) for k, v in (ckpt.config or {}).items() if k not in ("quantization", "quantization_config")}
    _flatten_rope(cfg)
    cfg["quantization"] = quant
    cfg["quantization_config"] = copy.deepcopy(quant)
    return cfg


def write_mlx(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, max_shard_bytes: int | None = None,
              **_: Any) -> dict:
    """Write ``ckpt`` as an MLX affine model directory (``model.safetensors`` + ``config.json``).

    Raises
    ------
    NotRepresentableError
        A quantized tensor :func:`check_target` refuses (nothing is written).
    """
    ckpt.refuse_opaque("mlx")
    plans = []
    for spec in ckpt.specs():
        if spec.kind == "dense":
            plans.append(dense_plan(spec))
            continue
        reason = check_target(spec)
        if reason:
            raise NotRepresentableError(reason, tensor=spec.name, field="scheme", expected="MLX affine",
                                        found=f"{spec.scheme.describe()} {spec.group_map.describe()}",
                                        hint="requantize to an MLX affine scheme")
        plans.append(_plan(spec))
    summary = write_model_dir(Path(dst), plans, ckpt, metadata={"format": "mlx"}, config=mlx_config(ckpt),
                              extra_files=ckpt.extra_files, max_shard_bytes=max_shard_bytes, overwrite=overwrite)
    summary["notes"] = {p.source: p.notes for p in plans if p.notes}
    return summary


HANDLER = register(FormatHandler(FORMAT, "MLX / mlx-lm quantized (affine; mxfp4, nvfp4, mxfp8 read-only)",
                                 detect_mlx, read_mlx, write_mlx, check_target=check_target))


from converter.validate.hooks import register_hooks  # noqa: E402

#: MLX affine scales may be negative (FORMATS.md section 11, pitfall 9).
register_hooks(FORMAT, negative_scales=True)
