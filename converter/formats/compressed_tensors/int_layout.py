"""The integer layouts of compressed-tensors: ``pack-quantized`` / ``int-quantized`` / ``naive-quantized`` modules.

Per quantized Linear ``<p>`` (FORMATS.md section 3.2; ``compressors/pack_quantized``
``PackedQuantizationCompressor.compress`` / ``decompress``, ``compressors/pack_quantized/helpers.py``
``pack_to_int32`` / ``unpack_from_int32``, compressed-tensors 0.20.1):

- ``<p>.weight_packed`` int32 ``[O, ceil(I*b/32)]`` (>= 0.18, stream) or ``[O, ceil(I/(32//b))]``
  (<= 0.17, padded; decided by ``quantization_config.version``), fields ``q + 2^(b-1)`` LSB-first
  along ``in``; ``<p>.weight_shape`` int64 ``[O, I]`` (always used: packing loses ``I``).
- ``<p>.weight_scale`` ``[O, nG]`` (group), ``[O, 1]`` (channel), ``[1]`` (tensor); fp16/bf16/fp32.
- ``<p>.weight_zero_point`` (asymmetric only): group/channel int32 ``[ceil(O*b/32), nG]`` packed
  along ``out`` (``PACK_ZP_STRATS``), fields ``zp + 2^(b-1)``; tensor strategy unpacked ``[1]``.
  All-zero zero points of a symmetric scheme (very old checkpoints) are tolerated and dropped.
- ``<p>.weight_g_idx`` int32 ``[I]`` (<= 0.12, ``actorder: "group"``); any ``-1`` means column order.
- int-/naive-quantized: ``<p>.weight`` int8 ``[O, I]`` signed codes, ``weight_scale``, optional
  ``weight_zero_point`` int8 (unpacked).

Codes are modelled as signed (``q in [-2^(b-1), 2^(b-1)-1]``, ``calculate_qparams``) and
dequantize as ``s * (q - zp)``. A group strategy with ``I % G != 0`` is read with ``ceil(I/G)``
groups, the last one partial, as ``initialize_qparams`` / ``strategy_cdiv`` size it (CASES.md B13).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError, UnsupportedError
from converter.groups import GroupMap
from converter.layout import IN, OUT, AxisMap, PackedCodes
from converter.kernels.packing import packed_length
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor, StoredArray
from converter.formats.source import Source
from converter.formats.compressed_tensors.config import ACTORDER_MSG, CTConfig, WeightArgs, packing_for

AXES = (OUT, IN)
SCALE_DTYPES = ("F16", "BF16", "F32")


def codes_map(bits: int, packing: str) -> AxisMap:
    """``weight_packed``: ``[out, in]`` int32, packed along ``in``."""
    return AxisMap(AXES, packed_axis=IN, bits=bits, container="I32", packing=packing)


def zero_map(bits: int, packing: str) -> AxisMap:
    """Packed ``weight_zero_point``: ``[out, group]`` int32, packed along ``out``."""
    return AxisMap(AXES, packed_axis=OUT, bits=bits, container="I32", packing=packing)


PARAM_MAP = AxisMap(AXES)


@dataclass(frozen=True)
class ModuleLayout:
    """Everything known about one quantized module from headers (and its 2-value ``weight_shape``)."""

    prefix: str
    fmt: str
    args: WeightArgs
    out_features: int
    in_features: int
    packing: str | None
    scale_dtype: str
    zero_packed: bool
    has_zero: bool
    has_g_idx: bool
    stored: tuple[StoredArray, ...]

    @property
    def name(self) -> str:
        return self.prefix + ".weight"

    @property
    def group_map(self) -> GroupMap:
        a = self.args
        if a.strategy == "group":
            return GroupMap.per_group(a.group_size, axis=IN)
        return GroupMap.per_channel(OUT) if a.strategy == "channel" else GroupMap.per_tensor()

    @property
    def scheme(self) -> QuantScheme:
        zp = ZeroPoint.NONE if self.args.symmetric else ZeroPoint.INTEGER
        return QuantScheme(bits=self.args.bits, signed=True, zero_point=zp, scale_dtype=self.scale_dtype)

    @property
    def param_shape(self) -> tuple[int, int]:
        return self.group_map.param_shape((self.out_features, self.in_features), AXES)

    def stored_names(self) -> list[str]:
        return [s.name for s in self.stored]


def _need(src: Source, name: str, module: str, why: str) -> None:
    if not src.has(name):
        raise MissingTensorError(f"partner tensor missing: {why}", file=src.path, tensor=name,
                                 expected="present", found="absent", hint=f"module {module!r}")


def _expect(cond: bool, msg: str, src: Source, tensor: str, field: str, expected: Any, found: Any,
            hint: str | None = None, kind: ErrorKind | None = None) -> None:
    if not cond:
        raise FormatError(msg, file=src.file_of(tensor) if src.has(tensor) else src.path, tensor=tensor,
                          field=field, expected=expected, found=found, hint=hint, kind=kind)


def _choose_packing(src: Source, cfg: CTConfig, prefix: str, bits: int, in_features: int, width: int) -> str:
    """Stream or padded for ``weight_packed`` (FORMATS.md pitfall 8; CASES.md B29)."""
    name = prefix + ".weight_packed"
    dense = packed_length(in_features, bits, layout="stream")
    padded = packed_length(in_features, bits, layout="padded")
    packing = packing_for(cfg.version_tuple, bits)
    if packing is None:  # version missing/unparsable and bits in 3, 5, 6, 7
        if width == padded and width != dense:
            return "padded"
        raise FormatError("cannot tell dense from padded packing without quantization_config.version",
                          file=src.file_of(name), tensor=name, field="quantization_config.version",
                          expected=f"a version (>= 0.18: {dense} words dense; <= 0.17: {padded} words padded)",
                          found=f"version {cfg.version!r}, {width} words for I={in_features}, {bits} bits",
                          hint="set quantization_config.version to the compressed-tensors version that wrote it")
    expected = dense if packing == "stream" else padded
    if width != expected:
        other = padded if packing == "stream" else dense
        hint = None
        if width == other:
            hint = (f"{width} words is the {'padded (<= 0.17)' if packing == 'stream' else 'dense (>= 0.18)'} "
                    f"layout: quantization_config.version {cfg.version!r} contradicts the tensor")
        raise FormatError("weight_packed width does not match weight_shape", file=src.file_of(name), tensor=name,
                          field="shape[1]", expected=f"{expected} ({packing}, version {cfg.version}, I={in_features}, "
                          f"{bits} bits)", found=width, hint=hint,
                          kind=ErrorKind.CONFIG_MISMATCH if hint else None)
    return packing


def _read_shape(src: Source, prefix: str) -> tuple[int, int]:
    name = prefix + ".weight_shape"
    _need(src, name, prefix, "pack-quantized stores the logical [O, I] in weight_shape")
    info = src.info(name)
    if info.dtype not in ("I64", "I32") or tuple(info.shape) != (2,):
        if info.dtype in ("I64", "I32") and len(info.shape) == 1 and info.shape[0] == 3:
            raise UnsupportedError("3-D (stacked expert) compressed-tensors weights are not supported yet",
                                   file=src.file_of(name), tensor=name, field="shape", expected=[2],
                                   found=list(info.shape))
        raise FormatError("weight_shape must be int64 [2] = [O, I]", file=src.file_of(name), tensor=name,
                          field="dtype/shape", expected="I64 [2]", found=f"{info.dtype} {list(info.shape)}")
    o, i = (int(v) for v in np.asarray(src.read(name)))
    if o < 1 or i < 1:
        raise FormatError("weight_shape values must be positive", file=src.file_of(name), tensor=name,
                          field="values", expected="[O >= 1, I >= 1]", found=[o, i], kind=ErrorKind.SHAPE)
    return o, i


def module_layout(src: Source, cfg: CTConfig, prefix: str) -> ModuleLayout:
    """Describe quantized module ``prefix`` and check every stored array against the config.

    Raises
    ------
    FormatError
        Config contradicting tensors (format, shapes, dtypes, version vs width, B12 actorder).
    MissingTensorError
        A required partner (``weight_shape``, ``weight_scale``, asym ``weight_zero_point``).
    """
    group = cfg.group_for(prefix)
    packed = src.has(prefix + ".weight_packed")
    if group is not None and group.weights is not None and group.weights.type != "int":
        name = prefix + (".weight_packed" if packed else ".weight")
        raise FormatError(f"config group quantizes {group.weights.type} weights but the module stores "
                          f"{src.info(name).dtype} {name.rsplit('.', 1)[1]!r} (an integer layout)",
                          file=src.file_of(name), tensor=name,
                          field=f"quantization_config.config_groups.{group.name}.weights.type", expected="int",
                          found=group.weights.type, kind=ErrorKind.CONFIG_MISMATCH)
    if group is None or group.weights is None:
        raise FormatError("module holds quantized tensors but no config group quantizes its weights",
                          file=src.path, tensor=prefix + (".weight_packed" if packed else ".weight"),
                          field="quantization_config.config_groups/ignore", expected="a group targeting it",
                          found="ignored" if group is None and any(True for _ in cfg.ignore) else "no matching target")
    args = group.weights
    fmt = group.format or ("pack-quantized" if packed else "int-quantized")
    tensor_fmt = "pack-quantized" if packed else "int-quantized"
    stored_kind = "int32 'weight_packed'" if packed else "int8 'weight'"
    if fmt == "dense" or (fmt == "pack-quantized") != packed:
        raise FormatError(f"config format {fmt!r} contradicts the tensors: module stores {stored_kind} "
                          f"({tensor_fmt} layout)", file=src.path,
                          tensor=prefix + (".weight_packed" if packed else ".weight"),
                          field=f"quantization_config.config_groups.{group.name}.format", expected=tensor_fmt,
                          found=fmt)
    stored: list[StoredArray] = []
    if packed:
        out_f, in_f = _read_shape(src, prefix)
        name = prefix + ".weight_packed"
        info = src.info(name)
        _expect(info.dtype == "I32" and len(info.shape) == 2, "weight_packed must be int32 [O, words]", src, name,
                "dtype/shape", "I32 2-D", f"{info.dtype} {list(info.shape)}")
        _expect(info.shape[0] == out_f, "weight_packed rows differ from weight_shape[0]", src, name, "shape[0]",
                out_f, info.shape[0])
        packing = _choose_packing(src, cfg, prefix, args.bits, in_f, int(info.shape[1]))
        stored += [src.stored_array(name, "codes"), src.stored_array(prefix + ".weight_shape", "other")]
    else:
        name = prefix + ".weight"
        info = src.info(name)
        _expect(info.dtype == "I8" and len(info.shape) == 2, f"{fmt} weight must be int8 [O, I]", src, name,
                "dtype/shape", "I8 2-D", f"{info.dtype} {list(info.shape)}")
        out_f, in_f = (int(v) for v in info.shape)
        packing = None
        stored.append(src.stored_array(name, "codes"))
    # scales
    sname = prefix + ".weight_scale"
    _need(src, sname, prefix, "every quantized module stores weight_scale")
    sinfo = src.info(sname)
    probe = ModuleLayout(prefix, fmt, args, out_f, in_f, packing, "F16", False, False, False, ())
    pshape = probe.param_shape
    want = [(1,), (1, 1)] if args.strategy == "tensor" else [pshape]
    _expect(tuple(sinfo.shape) in want, f"weight_scale shape does not fit strategy {args.strategy!r}", src, sname,
            "shape", [list(w) for w in want][0], list(sinfo.shape),
            hint="scales are [out, group] in compressed-tensors (not transposed as in GPTQ)")
    _expect(sinfo.dtype in SCALE_DTYPES, "weight_scale dtype is not a float scale dtype", src, sname, "dtype",
            list(SCALE_DTYPES), sinfo.dtype)
    stored.append(src.stored_array(sname, "scales"))
    # zero points
    zname = prefix + ".weight_zero_point"
    has_zero = src.has(zname)
    zero_packed = False
    if not args.symmetric:
        _need(src, zname, prefix, "asymmetric schemes store weight_zero_point")
    if has_zero:
        zinfo = src.info(zname)
        if not args.symmetric and packed and args.strategy in ("group", "channel"):
            zero_packed = True
            zshape = (packed_length(out_f, args.bits, layout=packing_for(cfg.version_tuple, args.bits) or packing),
                      pshape[1])
            _expect(zinfo.dtype == "I32" and tuple(zinfo.shape) == zshape,
                    "packed weight_zero_point must be int32 [ceil(O*b/32), nG] (packed along out)", src, zname,
                    "dtype/shape", f"I32 {list(zshape)}", f"{zinfo.dtype} {list(zinfo.shape)}")
        elif not args.symmetric:
            _expect(zinfo.dtype in ("I8", "I16", "I32") and tuple(zinfo.shape) in want,
                    "weight_zero_point must be an integer array shaped like weight_scale", src, zname, "dtype/shape",
                    f"I8 {list(want[0])}", f"{zinfo.dtype} {list(zinfo.shape)}")
        else:
            _expect(zinfo.dtype in ("I8", "I16", "I32", "U8"), "weight_zero_point must be integer", src, zname,
                    "dtype", "I8", zinfo.dtype)
        stored.append(src.stored_array(zname, "zero_points"))
    # legacy g_idx
    gname = prefix + ".weight_g_idx"
    has_g = src.has(gname)
    if has_g:
        ginfo = src.info(gname)
        _expect(args.strategy == "group", ACTORDER_MSG, src, gname, "strategy", "group", args.strategy,
                kind=ErrorKind.CONFIG_MISMATCH)
        _expect(ginfo.dtype in ("I32", "I64") and tuple(ginfo.shape) == (in_f,), ACTORDER_MSG, src, gname,
                "dtype/shape", f"I32 [{in_f}]", f"{ginfo.dtype} {list(ginfo.shape)}", kind=ErrorKind.CONFIG_MISMATCH)
        stored.append(src.stored_array(gname, "g_idx"))
    return ModuleLayout(prefix, fmt, args, out_f, in_f, packing, sinfo.dtype, zero_packed,
                        has_zero and not args.symmetric, has_g, tuple(stored))


def _unsigned_to_signed(u: np.ndarray, bits: int) -> np.ndarray:
    """Stored field ``q + 2^(b-1)`` -> signed code ``q`` (int8)."""
    return (u.astype(np.int16) - (1 << (bits - 1))).astype(np.int8)


def load_module(src: Source, m: ModuleLayout) -> QuantizedTensor:
    """Materialise one quantized module as a signed-code :class:`QuantizedTensor`."""
    sizes = {OUT: m.out_features, IN: m.in_features}
    bits = m.args.bits
    pshape = m.param_shape
    stored_maps: dict[str, AxisMap] = {"scales": PARAM_MAP}
    try:
        if m.fmt == "pack-quantized":
            cmap = codes_map(bits, m.packing)
            # stored fields are q + 2^(b-1): signed codes one top-bit flip away, kept packed until read
            codes = PackedCodes(src.read(m.prefix + ".weight_packed"), cmap, AXES, sizes, signed=True, flip=True)
        else:
            cmap = PARAM_MAP
            codes = np.array(src.read(m.prefix + ".weight"), dtype=np.int8)
        stored_maps["codes"] = cmap
        scales = np.array(src.read(m.prefix + ".weight_scale")).reshape(pshape)
        zeros = None
        zname = m.prefix + ".weight_zero_point"
        if m.has_zero:
            raw = src.read(zname)
            if m.zero_packed:
                zmap = zero_map(bits, m.packing)
                zeros = _unsigned_to_signed(zmap.to_logical(raw, AXES, {OUT: m.out_features, IN: pshape[1]}), bits)
                stored_maps["zero_points"] = zmap
            else:  # I8/I16/I32: range-check in the stored dtype before narrowing (no silent wrap)
                z = np.asarray(raw).reshape(pshape)
                s = m.scheme
                if z.size and (int(z.min()) < s.qmin or int(z.max()) > s.qmax):
                    raise FormatError(f"weight_zero_point outside the {bits}-bit signed code range",
                                      file=src.file_of(zname), tensor=zname, field="weight_zero_point",
                                      expected=f"[{s.qmin}, {s.qmax}]", found=f"[{int(z.min())}, {int(z.max())}]",
                                      kind=ErrorKind.ZERO_POINT_RANGE)
                zeros = z.astype(np.int8)
                stored_maps["zero_points"] = PARAM_MAP
        elif src.has(zname):  # symmetric: tolerate all-zero zero points, refuse anything else
            raw = np.asarray(src.read(zname))
            if raw.size and raw.any():
                raise FormatError("config says symmetric but weight_zero_point is not all zero",
                                  file=src.file_of(zname), tensor=zname, field="values", expected="all 0",
                                  found=f"{int(np.count_nonzero(raw))} non-zero", hint="set symmetric: false",
                                  kind=ErrorKind.CONFIG_MISMATCH)
        gm = m.group_map
        if m.has_g_idx:
            g = np.array(src.read(m.prefix + ".weight_g_idx")).astype(np.int32)
            if not (g < 0).any():  # -1 anywhere: "not initialised", column order (0.12 forward)
                n_groups = pshape[1]
                if g.size and int(g.max()) >= n_groups:
                    raise FormatError("weight_g_idx names a group beyond weight_scale", file=src.file_of(
                        m.prefix + ".weight_g_idx"), tensor=m.prefix + ".weight_g_idx", field="values",
                        expected=f"< {n_groups}", found=int(g.max()))
                gm = GroupMap.per_group(m.args.group_size, axis=IN, g_idx=g)
        return QuantizedTensor(name=m.name, axes=AXES, codes=codes, scales=scales, scheme=m.scheme, group_map=gm,
                               zero_points=zeros, stored=stored_maps)
    except LayoutError as exc:
        exc.with_context(file=src.file_of(m.stored[0].name), tensor=m.name)
        raise
