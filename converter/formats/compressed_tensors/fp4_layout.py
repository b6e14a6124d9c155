"""compressed-tensors ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized`` (FP4 E2M1) modules: layout checks and decode.

Per quantized Linear ``<p>`` (compressed-tensors 0.20.1 ``compressors/nvfp4/base.py``
``NVFP4PackedCompressor``, ``compressors/mxfp4/base.py`` ``MXFP4PackedCompressor``,
``compressors/nvfp4/helpers.py`` ``pack_fp4_to_uint8`` / ``unpack_fp4_from_uint8``):

- ``<p>.weight_packed`` U8 ``[out, in/2]``: E2M1 codes (bit 3 sign, code 0x8 = -0.0), element
  ``2j`` of a row in the **low** nibble of byte ``j``, element ``2j+1`` in the high nibble.
  No ``weight_shape`` is stored (``in`` = 2 x the packed width).
- ``<p>.weight_scale`` ``[out, in/G]``: NVFP4 (``G`` = 16, strategy ``tensor_group``) F8_E4M3;
  MXFP4 (``G`` = 32, strategy ``group``) U8 E8M0 exponents, read as F8_E8M0 holding the true
  multiplier (the version rule of :mod:`.e8m0_rule` applied at the reader boundary).
- ``<p>.weight_global_scale`` F32 ``[1]`` (NVFP4 only): a **divisor**, ``w = e2m1 * (s / g)``
  (``forward_helpers._dequantize``: ``scale = scale / global_scale``); kept as stored, a 0-d
  float32 (:attr:`QuantizedTensor.global_scale`, scheme ``global_scale="divisor"``).
- ``<p>.input_global_scale`` (static / ``local`` FP4 activations): a dense tensor in role
  ``activation_scale``, runtime metadata, never applied to the weight.

Partial final groups: compressed-tensors 0.20.1 ``_process_group`` raises ``ValueError("tensor
column shape must be divisible by the given group_size")`` for ``in % G != 0`` on compress and
decompress alike, so such a module is refused here too. 3-D weights: the FP4 compressors are 2-D
only (``decompress``: ``m, n = packed.shape``), refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from converter.codebooks import E2M1_VALUES
from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError, UnsupportedError
from converter.groups import GroupMap
from converter.layout import IN, OUT, AxisMap, PackedCodes
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor, StoredArray, TensorSpec
from converter.formats.source import Source
from converter.formats.compressed_tensors.config import (FP4_FORMATS, FP4_GROUP, MXFP4_FORMAT, NVFP4_FORMAT,
                                                         ConfigGroup)
from converter.formats.compressed_tensors.e8m0_rule import LEGACY, RuleDecision

AXES = (OUT, IN)
#: ``weight_packed``: ``[out, in/2]`` uint8, two E2M1 fields per byte, LSB (low nibble) first along ``in``.
CODES_MAP = AxisMap(AXES, packed_axis=IN, bits=4, container="U8", packing="stream")
PARAM_MAP = AxisMap(AXES)
#: Stored ``weight_scale`` dtype by format, and the logical scale dtype.
STORED_SCALE = {NVFP4_FORMAT: ("F8_E4M3",), MXFP4_FORMAT: ("U8", "F8_E8M0")}
LOGICAL_SCALE = {NVFP4_FORMAT: "F8_E4M3", MXFP4_FORMAT: "F8_E8M0"}
#: Activation scales an FP4 module may store beside its weight (``compression_param_names``).
ACTIVATION_SUFFIXES = ("input_global_scale", "input_scale")
ACTIVATION_NOTE = "FP4 activation global scale of {p}: runtime metadata, never applied to the weight"


@dataclass(frozen=True)
class FP4Layout:
    """One FP4 module known from headers: format, sizes, stored arrays; ``rule`` (MXFP4) the E8M0 encoding."""

    prefix: str
    group: ConfigGroup
    fmt: str
    out_features: int
    in_features: int
    stored: tuple[StoredArray, ...]
    rule: RuleDecision | None = None

    @property
    def name(self) -> str:
        return self.prefix + ".weight"

    @property
    def group_size(self) -> int:
        return FP4_GROUP[self.fmt]

    @property
    def group_map(self) -> GroupMap:
        return GroupMap.per_group(self.group_size, axis=IN)

    @property
    def scheme(self) -> QuantScheme:
        return QuantScheme(4, False, scale_dtype=LOGICAL_SCALE[self.fmt], codebook=E2M1_VALUES,
                           global_scale="divisor" if self.fmt == NVFP4_FORMAT else None)

    def spec(self) -> TensorSpec:
        notes = [f"compressed-tensors {self.fmt} (config group {self.group.name!r}): E2M1 codes, low nibble first"]
        if self.fmt == NVFP4_FORMAT:
            notes.append("weight_global_scale is a divisor: effective scale = e4m3(weight_scale) / weight_global_scale")
        if self.rule is not None:
            notes.append(self.rule.note())
        acts = self.group.input_activations
        if acts is not None:
            notes.append(f"input activations: {acts.describe()} (metadata, not applied to the weight)")
        return TensorSpec(self.name, "quantized", (self.out_features, self.in_features), self.stored, axes=AXES,
                          scheme=self.scheme, group_map=self.group_map, notes=tuple(notes))


def _fail(src: Source, tensor: str, msg: str, field: str, expected, found, kind=None, hint=None,
          cls=FormatError) -> Exception:
    return cls(msg, file=src.file_of(tensor) if src.has(tensor) else src.path, tensor=tensor, field=field,
               expected=expected, found=found, kind=kind, hint=hint)


def is_fp4_group(group: ConfigGroup | None) -> bool:
    """Whether a config group holds FP4 weights (its format, or 4-bit float weights)."""
    return group is not None and group.weights is not None and (
        group.format in FP4_FORMATS or group.weights.fp4_format is not None)


def fp4_layout(src: Source, group: ConfigGroup, prefix: str) -> FP4Layout:
    """Check FP4 module ``prefix`` against its config ``group`` (headers only).

    Raises
    ------
    FormatError
        Config contradicting the tensors (format vs weights args, dtypes, shapes), a global scale on
        MXFP4 or a malformed one on NVFP4.
    MissingTensorError
        ``weight_scale`` or (NVFP4) ``weight_global_scale`` absent.
    UnsupportedError
        3-D weights, a partial final group (``in % G``), MXFP4 exponents stored as float8_e4m3fn,
        a group size the FP4 compressors do not pair with the format.
    """
    args = group.weights
    gfield = f"quantization_config.config_groups.{group.name}"
    fmt = group.format if group.format in FP4_FORMATS else args.fp4_format
    name = prefix + ".weight_packed"
    if args.type != "float" or args.bits != 4:
        raise _fail(src, name, f"config format {fmt!r} needs 4-bit float weights", gfield + ".weights",
                    "type float, num_bits 4", f"type {args.type}, num_bits {args.bits}", ErrorKind.CONFIG_MISMATCH)
    if group.format is not None and group.format not in FP4_FORMATS:
        raise _fail(src, name, f"config format {group.format!r} contradicts 4-bit float weights", gfield + ".format",
                    list(FP4_FORMATS), group.format, ErrorKind.CONFIG_MISMATCH)
    if args.group_size != FP4_GROUP[fmt]:
        raise _fail(src, name, f"{fmt} is written with group_size {FP4_GROUP[fmt]} (can_compress)",
                    gfield + ".weights.group_size", FP4_GROUP[fmt], args.group_size, cls=UnsupportedError)
    info = src.info(name)
    if info.dtype != "U8":
        raise _fail(src, name, "FP4 weight_packed must be uint8 (two E2M1 codes per byte)", "dtype", "U8", info.dtype)
    if len(info.shape) != 2:
        raise _fail(src, name, "FP4 weights are 2-D [out, in/2] (NVFP4PackedCompressor.decompress unpacks 2-D only)",
                    "shape", "[out, in/2]", list(info.shape), ErrorKind.SHAPE,
                    cls=UnsupportedError if len(info.shape) == 3 else FormatError)
    o, i = int(info.shape[0]), 2 * int(info.shape[1])
    stored = [src.stored_array(name, "codes")]
    shape_name = prefix + ".weight_shape"
    if src.has(shape_name):  # not written by the FP4 compressors; tolerated when it agrees
        got = [int(v) for v in np.asarray(src.read(shape_name)).ravel()]
        if got != [o, i]:
            raise _fail(src, shape_name, "weight_shape contradicts weight_packed", "values", [o, i], got,
                        ErrorKind.SHAPE)
        stored.append(src.stored_array(shape_name, "other"))
    g = FP4_GROUP[fmt]
    sname = prefix + ".weight_scale"
    if not src.has(sname):
        raise MissingTensorError("partner tensor missing: every FP4 module stores weight_scale", file=src.path,
                                 tensor=sname, expected="present", found="absent", hint=f"module {prefix!r}")
    sinfo = src.info(sname)
    if i % g:
        raise _fail(src, sname, f"in_features {i} is not a multiple of group_size {g}: compressed-tensors 0.20.1 "
                    "refuses a partial final FP4 group (_process_group: 'tensor column shape must be divisible by "
                    "the given group_size')", "shape", f"[{o}, in/{g}] with in % {g} == 0", list(sinfo.shape),
                    ErrorKind.SHAPE, cls=UnsupportedError)
    if tuple(sinfo.shape) != (o, i // g):
        raise _fail(src, sname, f"weight_scale shape does not fit {fmt} (one scale per {g} inputs)", "shape",
                    [o, i // g], list(sinfo.shape), ErrorKind.SHAPE)
    if fmt == MXFP4_FORMAT and sinfo.dtype == "F8_E4M3":
        raise _fail(src, sname, "MXFP4 exponents stored as float8_e4m3fn (compressed-tensors 0.13 casts the integer "
                    "exponent to scale_dtype, rounding it): the exponents are not recoverable", "dtype", "U8",
                    sinfo.dtype, cls=UnsupportedError, hint="re-export with scale_dtype torch.uint8")
    if sinfo.dtype not in STORED_SCALE[fmt]:
        raise _fail(src, sname, f"{fmt} weight_scale dtype", "dtype", list(STORED_SCALE[fmt]), sinfo.dtype)
    stored.append(src.stored_array(sname, "scales"))
    gname = prefix + ".weight_global_scale"
    if fmt == NVFP4_FORMAT:
        if not src.has(gname):
            raise MissingTensorError("partner tensor missing: NVFP4 (tensor_group) stores weight_global_scale",
                                     file=src.path, tensor=gname, expected="F32 [1]", found="absent",
                                     hint=f"module {prefix!r}")
        ginfo = src.info(gname)
        if ginfo.dtype != "F32" or int(np.prod(ginfo.shape, dtype=np.int64)) != 1:
            raise _fail(src, gname, "weight_global_scale must be one float32", "dtype/shape", "F32 [1]",
                        f"{ginfo.dtype} {list(ginfo.shape)}")
        stored.append(src.stored_array(gname, "global_scale"))
    elif src.has(gname):
        raise _fail(src, gname, "MXFP4 (group strategy) has no weight_global_scale (compressed-tensors PR #809)",
                    "name", "absent", "present", ErrorKind.CONFIG_MISMATCH, cls=UnsupportedError)
    zname = prefix + ".weight_zero_point"
    if src.has(zname):
        stored.append(src.stored_array(zname, "zero_points"))
    return FP4Layout(prefix, group, fmt, o, i, tuple(stored))


def activation_spec(src: Source, name: str) -> TensorSpec:
    """``<p>.input_global_scale`` of an FP4 module as a dense spec in role ``activation_scale``."""
    info = src.info(name)
    return TensorSpec(name, "dense", tuple(info.shape), (src.stored_array(name, "activation_scale"),),
                      dtype=info.dtype, notes=(ACTIVATION_NOTE.format(p=name.rsplit(".", 1)[0]),))


def e8m0_bytes(raw: np.ndarray, rule: RuleDecision | None, *, src: Source, tensor: str) -> np.ndarray:
    """Stored MXFP4 exponent bytes -> true E8M0 bytes (``2^(byte - 127)``; 0xFF NaN kept as is).

    Raises
    ------
    FormatError
        A legacy byte >= 253, which has no E8M0 value once moved up by 2.
    """
    b = np.asarray(raw).view(np.uint8)
    if rule is None or rule.rule != LEGACY:
        return np.array(b)
    nan = b == 255
    high = (b >= 253) & ~nan
    if high.any():
        raise _fail(src, tensor, "legacy MXFP4 exponent too large for E8M0 (byte + 2 > 254)", "values", "<= 252",
                    int(b[high].max()))
    return np.where(nan, np.uint8(255), (b + rule.offset).astype(np.uint8)).astype(np.uint8)


def load_fp4(src: Source, m: FP4Layout) -> QuantizedTensor:
    """Materialise one FP4 module: codes still packed (uint8 words), scales E4M3 / true E8M0, global scale 0-d."""
    try:
        words = src.read(m.prefix + ".weight_packed")
        codes = PackedCodes(words, CODES_MAP, AXES, {OUT: m.out_features, IN: m.in_features}, signed=False)
        sname = m.prefix + ".weight_scale"
        raw = np.asarray(src.read(sname))
        if m.fmt == MXFP4_FORMAT:
            scales = e8m0_bytes(raw, m.rule, src=src, tensor=sname).view(ml_dtypes.float8_e8m0fnu)
        else:
            scales = np.array(raw.view(ml_dtypes.float8_e4m3fn))
        gs = None
        if m.fmt == NVFP4_FORMAT:
            gname = m.prefix + ".weight_global_scale"
            gs = np.array(np.asarray(src.read(gname)).reshape(()), dtype=np.float32)
            if not np.isfinite(gs) or gs <= 0:
                raise _fail(src, gname, "weight_global_scale must be a positive finite divisor", "values", "> 0",
                            float(gs))
        zname = m.prefix + ".weight_zero_point"
        if src.has(zname):  # symmetric: tolerate only zeros
            z = np.asarray(src.read(zname)).astype(np.float32)
            if z.size and np.any(z != 0):
                raise _fail(src, zname, "symmetric FP4 weights with a non-zero weight_zero_point", "values", "all 0",
                            f"{int(np.count_nonzero(z))} non-zero", ErrorKind.CONFIG_MISMATCH)
        return QuantizedTensor(name=m.name, axes=AXES, codes=codes, scales=scales, scheme=m.scheme,
                               group_map=m.group_map, stored={"codes": CODES_MAP, "scales": PARAM_MAP},
                               global_scale=gs)
    except LayoutError as exc:
        exc.with_context(file=src.file_of(m.prefix + ".weight_packed"), tensor=m.name)
        raise
