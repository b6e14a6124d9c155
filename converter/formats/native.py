"""qckpt's native format: a safetensors file that carries its own layout.

For each quantized tensor ``W`` the file holds ``W.qcodes`` (codes packed LSB-first along ``in``
into uint32 words, stream layout), ``W.scales`` (logical parameter orientation), optional
``W.zero_points`` and ``W.g_idx``, and for two-level scales ``W.dq.*``. ``__metadata__`` holds
``qckpt.format = "native"``, ``qckpt.version`` and one key ``qckpt.layout.W`` per quantized tensor
whose value is a JSON layout descriptor (``schemas/layout.schema.json``): axes, shape, scheme,
group map and the axis map of each stored array. Dense tensors are stored under their own names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from converter.dtypes import dtype_name
from converter.errors import FormatError, LayoutError
from converter.groups import GroupMap
from converter.layout import IN, OUT, AxisMap
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, DoubleQuant, QuantizedTensor, TensorSpec
from converter.write.plan import TensorPlan, dense_plan, rows_plan
from converter.write.files import write_single_file
from converter.formats.registry import Detection, FormatHandler, OutputKind, opaque_target, register
from converter.formats.source import Source
from converter.formats.ties import resolve_tied_head

FORMAT = "native"
FORMAT_KEY = "qckpt.format"
VERSION = "1"
LAYOUT_PREFIX = "qckpt.layout."
DESCRIPTOR_SCHEMA = "qckpt.layout/1"


def codes_axis_map(axes: tuple[str, ...], bits: int) -> AxisMap:
    """Native code storage: logical order, packed along ``in`` into U32 words (stream)."""
    return AxisMap(stored_axes=axes, packed_axis=IN, bits=bits, container="U32", packing="stream")


def descriptor(t: QuantizedTensor | TensorSpec) -> dict[str, Any]:
    """The layout descriptor of a quantized tensor (JSON object)."""
    axes = tuple(t.axes)
    scheme: QuantScheme = t.scheme
    gm: GroupMap = t.group_map
    has_g_idx = (t.group_map.g_idx is not None) if isinstance(t, QuantizedTensor) else t.act_order
    zero = None
    if scheme.zero_point.value != "none":
        zero = {"tensor": f"{t.name}.zero_points", **AxisMap(axes).to_json()}
    obj = {
        "schema": DESCRIPTOR_SCHEMA,
        "axes": list(axes),
        "shape": [int(s) for s in t.shape],
        "scheme": scheme.to_json(),
        "group_map": {**gm.to_json(t.shape, axes), "g_idx": bool(has_g_idx)},
        "codes": {"tensor": f"{t.name}.qcodes", **codes_axis_map(axes, scheme.bits).to_json()},
        "scales": {"tensor": f"{t.name}.scales", **AxisMap(axes).to_json()},
        "zero_points": zero,
        "g_idx": {"tensor": f"{t.name}.g_idx"} if has_g_idx else None,
        "double_quant": None,
    }
    if scheme.global_scale is not None:
        obj["global_scale"] = {"tensor": f"{t.name}.global_scale"}
    if isinstance(t, QuantizedTensor) and t.double_quant is not None:
        dq = t.double_quant
        obj["double_quant"] = {"kind": dq.kind, "super_block": dq.super_block,
                               "has_mins": dq.super_mins is not None}
    return obj


def _outputs(t: QuantizedTensor) -> dict[str, np.ndarray]:
    d = descriptor(t)
    out = {d["codes"]["tensor"]: codes_axis_map(t.axes, t.scheme.bits).to_stored(t.codes, t.axes),
        d["scales"]["tensor"]: np.ascontiguousarray(t.scales)}
    if t.zero_points is not None:
        zp = t.zero_points
        if t.scheme.zero_point.value == "integer":
            zp = zp.astype(t.scheme.code_dtype)
        out[d["zero_points"]["tensor"]] = np.ascontiguousarray(zp)
    if t.group_map.g_idx is not None:
        out[d["g_idx"]["tensor"]] = np.ascontiguousarray(t.group_map.g_idx.astype(np.int32))
    if t.global_scale is not None:
        out[d["global_scale"]["tensor"]] = np.array(t.global_scale, dtype=np.float32)  # stays 0-d
    if t.double_quant is not None:
        dq = t.double_quant
        for k in ("super_scales", "sub_scales", "super_mins", "sub_mins"):
            a = getattr(dq, k)
            if a is not None:
                out[f"{t.name}.dq.{k}"] = np.ascontiguousarray(a)
    return out


def _plan(ckpt: Checkpoint, name: str) -> tuple[TensorPlan, dict | None]:
    spec = ckpt.spec(name)
    if spec.kind == "dense":
        return dense_plan(spec), None
    if spec.double_quant is not None:
        # Two-level scale arrays have format-specific shapes: materialise once to plan them exactly
        # (only GGUF K-quants carry them).
        t = ckpt[name]
        arrays = _outputs(t)
        outs = [(k, dtype_name(v.dtype), tuple(v.shape)) for k, v in arrays.items()]
        return TensorPlan(name, outs, _outputs), descriptor(t)
    d = descriptor(spec)
    axes, s = tuple(spec.axes), spec.scheme
    pshape = spec.group_map.param_shape(spec.shape, axes)
    outs = [(d["codes"]["tensor"], "U32", codes_axis_map(axes, s.bits).stored_shape(dict(zip(axes, spec.shape)))),
            (d["scales"]["tensor"], s.scale_dtype, pshape)]
    if d.get("global_scale"):
        outs.append((d["global_scale"]["tensor"], "F32", ()))
    if d["zero_points"]:
        zdt = s.scale_dtype if s.zero_point.value == "float" else ("I8" if s.signed else "U8")
        outs.append((d["zero_points"]["tensor"], zdt, pshape))
    if d["g_idx"]:
        outs.append((d["g_idx"]["tensor"], "I32", (spec.shape[axes.index(spec.group_map.axis)],)))
    plan = TensorPlan(name, outs, _outputs)
    if axes == (OUT, IN):  # codes [out, in/w], parameters [out, ...] (per tensor and g_idx: row-independent)
        once = [o[0] for o in outs if o[0].endswith((".g_idx", ".global_scale"))]
        if spec.group_map.granularity.value == "tensor":
            once += [o[0] for o in outs[1:] if not o[0].endswith((".g_idx", ".global_scale"))]
        elif spec.group_map.granularity.value == "group" and spec.group_map.axis != IN:
            return plan, d
        elif spec.group_map.granularity.value == "block":
            # a row block of a 2-D block tensor carries per-row scales (converter.groups.as_row_groups),
            # not the stored [ceil(out/b), ceil(in/b)] grid: encoded whole (one byte per code, scales tiny)
            return plan, d
        rows_plan(plan, once=once)
    return plan, d


def plan_native(ckpt: Checkpoint) -> tuple[list[TensorPlan], dict[str, str], dict | None]:
    """Plans, ``__metadata__`` and the tied-head summary for writing ``ckpt`` natively.

    The tied-embedding rule of every writer applies (:func:`converter.formats.ties.resolve_tied_head`).
    """
    drop, config, tie = resolve_tied_head(ckpt, ckpt.config or None, ckpt.names())
    plans, meta = [], {"format": "pt", FORMAT_KEY: "native", "qckpt.version": VERSION,
                       "qckpt.source_format": ckpt.format}
    if config:
        meta["qckpt.config"] = json.dumps(config, sort_keys=True)
    for name in ckpt.names():
        if name in drop:
            continue
        p, d = _plan(ckpt, name)
        plans.append(p)
        if d is not None:
            meta[LAYOUT_PREFIX + name] = json.dumps(d, sort_keys=True, separators=(",", ":"))
    return plans, meta, tie


def write_native(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, **_: Any) -> dict:
    """Write ``ckpt`` as one native safetensors file at ``dst`` (atomically)."""
    ckpt.refuse_opaque("native")
    plans, meta, tie = plan_native(ckpt)
    result = write_single_file(Path(dst), plans, ckpt, metadata=meta, overwrite=overwrite)
    if tie is not None:
        result["tied_head"] = tie
    return result


# -- reader -------------------------------------------------------------------------------------
def _parse_descriptor(src: Source, name: str, text: str) -> dict[str, Any]:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FormatError(f"layout descriptor is not JSON: {exc}", file=src.path, tensor=name,
                          field=LAYOUT_PREFIX + name) from None
    from converter.schemas import validate_document  # lazy: jsonschema loads only when a native file is read
    validate_document(d, "layout", file=src.path, tensor=name)
    return d


def _check_codes_dtype(src: Source, name: str, d: dict[str, Any]) -> None:
    """The stored codes dtype must be the descriptor's container (or U8/I8 when not packed).

    Raises
    ------
    FormatError
        Naming the stored codes tensor and its ``dtype`` (expected vs found); float words are never
        reinterpreted as integers.
    """
    try:
        cmap, scheme = AxisMap.from_json(d["codes"]), QuantScheme.from_json(d["scheme"])
    except LayoutError as exc:
        exc.with_context(file=src.path, tensor=name)
        raise
    stored = d["codes"]["tensor"]
    if not src.has(stored):
        return  # reported as a missing tensor when loaded
    want = cmap.container if cmap.packed_axis is not None else ("I8" if scheme.signed else "U8")
    found = src.info(stored).dtype
    if found != want:
        raise FormatError("stored codes dtype differs from the layout descriptor's container",
                          file=src.file_of(stored), tensor=stored, field="dtype", expected=want, found=found,
                          hint=f"see {LAYOUT_PREFIX}{name} codes.container")


def _spec(src: Source, name: str, d: dict[str, Any]) -> TensorSpec:
    _check_codes_dtype(src, name, d)
    stored = [src.stored_array(d["codes"]["tensor"], "codes"), src.stored_array(d["scales"]["tensor"], "scales")]
    if d["zero_points"]:
        stored.append(src.stored_array(d["zero_points"]["tensor"], "zero_points"))
    if d["g_idx"]:
        stored.append(src.stored_array(d["g_idx"]["tensor"], "g_idx"))
    if d.get("global_scale"):
        stored.append(src.stored_array(d["global_scale"]["tensor"], "global_scale"))
    for k in ("super_scales", "sub_scales", "super_mins", "sub_mins"):
        if src.has(f"{name}.dq.{k}"):
            stored.append(src.stored_array(f"{name}.dq.{k}", "scales"))
    gm = GroupMap.from_json(d["group_map"])
    return TensorSpec(name, "quantized", tuple(d["shape"]), tuple(stored), axes=tuple(d["axes"]),
                      scheme=QuantScheme.from_json(d["scheme"]), group_map=gm, act_order=bool(d["group_map"]["g_idx"]),
                      double_quant=(d.get("double_quant") or {}).get("kind"))


def _load_quantized(src: Source, name: str, d: dict[str, Any]) -> QuantizedTensor:
    axes = tuple(d["axes"])
    sizes = dict(zip(axes, d["shape"]))
    scheme = QuantScheme.from_json(d["scheme"])
    try:
        cmap = AxisMap.from_json(d["codes"])
        codes = cmap.to_logical(src.read(d["codes"]["tensor"]), axes, sizes, signed=scheme.signed)
        g_idx = np.array(src.read(d["g_idx"]["tensor"])) if d["g_idx"] else None
        zp = np.array(src.read(d["zero_points"]["tensor"])) if d["zero_points"] else None
        dq = None
        if d.get("double_quant"):
            arr = {k: (np.array(src.read(f"{name}.dq.{k}")) if src.has(f"{name}.dq.{k}") else None)
                   for k in ("super_scales", "sub_scales", "super_mins", "sub_mins")}
            dq = DoubleQuant(d["double_quant"]["kind"], d["double_quant"]["super_block"], **arr)
        gs = np.array(src.read(d["global_scale"]["tensor"])) if d.get("global_scale") else None
        return QuantizedTensor(name=name, axes=axes, codes=codes, scales=np.array(src.read(d["scales"]["tensor"])),
                               scheme=scheme, group_map=GroupMap.from_json(d["group_map"], g_idx=g_idx),
                               zero_points=zp, double_quant=dq, global_scale=gs)
    except LayoutError as exc:
        exc.with_context(file=src.file_of(d["codes"]["tensor"]), tensor=name)
        raise


def read_native(src: Source) -> Checkpoint:
    """Read a native file into a lazily loaded :class:`Checkpoint`."""
    meta = src.st_metadata
    if meta.get(FORMAT_KEY) != "native":
        raise FormatError("not a qckpt native file", file=src.path, field="__metadata__." + FORMAT_KEY,
                          expected="native", found=meta.get(FORMAT_KEY))
    if meta.get("qckpt.version") != VERSION:
        raise FormatError("unsupported native format version", file=src.path, field="qckpt.version",
                          expected=VERSION, found=meta.get("qckpt.version"))
    descs = {k[len(LAYOUT_PREFIX):]: _parse_descriptor(src, k[len(LAYOUT_PREFIX):], v)
             for k, v in meta.items() if k.startswith(LAYOUT_PREFIX)}
    owned: set[str] = set()
    for name, d in descs.items():
        for role in ("codes", "scales", "zero_points", "g_idx", "global_scale"):
            if d.get(role):
                owned.add(d[role]["tensor"])
        owned.update(f"{name}.dq.{k}" for k in ("super_scales", "sub_scales", "super_mins", "sub_mins"))
    specs: dict[str, TensorSpec] = {}
    order = []
    for stored_name in src.tensor_names():
        if stored_name in owned:
            continue
        specs[stored_name] = src.dense_spec(stored_name)
        order.append(stored_name)
    for name, d in descs.items():
        specs[name] = _spec(src, name, d)
    specs = dict(sorted(specs.items()))

    def load(name: str):
        if name in descs:
            return _load_quantized(src, name, descs[name])
        return src.dense(name)

    config = json.loads(meta["qckpt.config"]) if "qckpt.config" in meta else None
    return Checkpoint(specs, load, format="native", path=str(src.path), config=config,
                      metadata={"source_format": meta.get("qckpt.source_format")}, files=[str(f) for f in src.files])


def detect_native(src: Source) -> Detection | None:
    if src.kind != "safetensors":
        return None
    if src.st_metadata.get(FORMAT_KEY) == "native":
        return Detection("native", 100, "__metadata__ qckpt.format = native")
    return None


HANDLER = register(FormatHandler(FORMAT, "qckpt native safetensors (self-describing layout)",
                                 detect_native, read_native, write_native, check_target=opaque_target,
                                 output=OutputKind(suffix=".safetensors", dense_source=True)))
