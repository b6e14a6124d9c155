"""compressed-tensors ``float-quantized`` (FP8) modules: layout checks and decode.

Per quantized Linear ``<p>`` (``compressors/naive_quantized/base.py`` ``FloatQuantizationCompressor``
= ``NaiveQuantizationCompressor.compress`` / ``decompress``, ``quantization/lifecycle/forward.py``
``dequantize`` -> ``forward_helpers._process_block`` / ``_dequantize``, compressed-tensors 0.20.1):

- ``<p>.weight`` ``[O, I]`` F8_E4M3 (``QuantizationArgs.pytorch_dtype`` for ``type: float,
  num_bits: 8``); F8_E5M2 is read too (``decompress`` casts whatever element is stored). The
  element comes from the stored dtype and is checked against the group's ``weights`` arguments.
- ``<p>.weight_scale`` (F32 / BF16 / F16, kept): ``[1]`` (strategy ``tensor``), ``[O, 1]``
  (``channel``: the FP8_DYNAMIC preset), ``[ceil(O/bo), ceil(I/bi)]`` (``block`` with
  ``block_structure: [bo, bi]``, FP8_BLOCK). A multiplier: ``w = fp8 * weight_scale``, computed
  by compressed-tensors in the scale dtype (``x_q.to(scale.dtype) * scale``); the product of an
  8-bit float and a 16-bit scale is exact in float32, so qckpt's float32 decode rounded once to
  the scale dtype is the tool's decode bit for bit. Partial edge blocks: ``_process_block`` pads
  the weight to whole blocks, applies each block's scale and crops, i.e. element ``(r, c)`` uses
  scale ``[r // bo, c // bi]`` (the ``GroupMap.per_block`` convention).
- ``<p>.input_scale`` (static ``input_activations``): kept as a dense tensor in role
  ``activation_scale`` (runtime metadata, never applied to the weight). Dynamic activations
  store nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter import codebooks
from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError
from converter.groups import GroupMap
from converter.layout import IN, OUT, AxisMap
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor, StoredArray, TensorSpec
from converter.formats.source import Source
from converter.formats.compressed_tensors.config import FLOAT_FORMAT, ConfigGroup

AXES = (OUT, IN)
SCALE_DTYPES = ("F16", "BF16", "F32")
#: Stored element types of a float-quantized weight, by safetensors dtype.
ELEMENT_DTYPES = ("F8_E4M3", "F8_E5M2")
PARAM_MAP = AxisMap(AXES)
ACTIVATION_NOTE = "static activation (input) scale of {p}: runtime metadata, never applied to the weight"


@dataclass(frozen=True)
class FloatLayout:
    """One float-quantized module, known from headers: element, strategy, scale dtype, stored arrays."""

    prefix: str
    group: ConfigGroup
    element: str
    out_features: int
    in_features: int
    scale_dtype: str
    stored: tuple[StoredArray, ...]

    @property
    def name(self) -> str:
        return self.prefix + ".weight"

    @property
    def group_map(self) -> GroupMap:
        a = self.group.weights
        if a.strategy == "block":
            return GroupMap.per_block(a.block[0], a.block[1])
        return GroupMap.per_channel(OUT) if a.strategy == "channel" else GroupMap.per_tensor()

    @property
    def scheme(self) -> QuantScheme:
        return QuantScheme(8, False, scale_dtype=self.scale_dtype, codebook=codebooks.ELEMENTS[self.element].values)

    def spec(self) -> TensorSpec:
        notes = [f"compressed-tensors {FLOAT_FORMAT} (config group {self.group.name!r})"]
        partial = self.group_map.partial_blocks((self.out_features, self.in_features), AXES) \
            if self.group.weights.strategy == "block" else 0
        if partial:
            notes.append(f"{partial} partial edge block(s): O={self.out_features}, I={self.in_features}, "
                         f"block {list(self.group.weights.block)}")
        acts = self.group.input_activations
        if acts is not None:
            notes.append(f"input activations: {acts.describe()} (metadata, not applied to the weight)")
        return TensorSpec(self.name, "quantized", (self.out_features, self.in_features), self.stored, axes=AXES,
                          scheme=self.scheme, group_map=self.group_map, notes=tuple(notes))


def _fail(src: Source, tensor: str, msg: str, field: str, expected, found, kind=None, hint=None) -> FormatError:
    return FormatError(msg, file=src.file_of(tensor) if src.has(tensor) else src.path, tensor=tensor, field=field,
                       expected=expected, found=found, kind=kind, hint=hint)


def float_layout(src: Source, group: ConfigGroup, prefix: str) -> FloatLayout:
    """Check float-quantized module ``prefix`` against its config ``group``.

    Raises
    ------
    FormatError
        The stored element contradicts the config (``type`` / ``num_bits`` / ``format``; names the
        field, expected vs found), a weight that is not 2-D, a scale of the wrong shape or dtype.
    MissingTensorError
        ``weight_scale`` absent, or ``input_scale`` absent under static ``input_activations``.
    """
    args = group.weights
    name = prefix + ".weight"
    info = src.info(name)
    gfield = f"quantization_config.config_groups.{group.name}"
    el = codebooks.element_for_storage(info.dtype)
    if args.type != "float":
        raise _fail(src, name, f"weight is stored as {info.dtype} (a float element) but its config group quantizes "
                    f"{args.type} weights", gfield + ".weights.type", "float", args.type, ErrorKind.CONFIG_MISMATCH)
    if el is None or info.dtype not in ELEMENT_DTYPES:
        raise _fail(src, name, "float-quantized weight must be stored as an 8-bit float element", "dtype",
                    list(ELEMENT_DTYPES), info.dtype, ErrorKind.CONFIG_MISMATCH,
                    hint=f"config group {group.name!r} declares type float, num_bits {args.bits}")
    if group.format not in (None, FLOAT_FORMAT):
        raise _fail(src, name, f"config format {group.format!r} contradicts the tensors: module stores "
                    f"{info.dtype} 'weight' (float-quantized layout)", gfield + ".format", FLOAT_FORMAT, group.format,
                    ErrorKind.CONFIG_MISMATCH)
    if len(info.shape) != 2:
        raise _fail(src, name, "float-quantized weight must be 2-D [O, I]", "shape", "[O, I]", list(info.shape),
                    ErrorKind.SHAPE)
    o, i = (int(v) for v in info.shape)
    sname = prefix + ".weight_scale"
    if not src.has(sname):
        raise MissingTensorError("partner tensor missing: every quantized module stores weight_scale",
                                 file=src.path, tensor=sname, expected="present", found="absent",
                                 hint=f"module {prefix!r}")
    sinfo = src.info(sname)
    probe = FloatLayout(prefix, group, el.name, o, i, "F32", ())
    pshape = probe.group_map.param_shape((o, i), AXES)
    want = [(1,), (1, 1), ()] if args.strategy == "tensor" else [pshape]
    if tuple(sinfo.shape) not in want:
        raise _fail(src, sname, f"weight_scale shape does not fit strategy {args.strategy!r}", "shape",
                    list(want[0]), list(sinfo.shape), ErrorKind.SHAPE,
                    hint="block scales are [ceil(O/bo), ceil(I/bi)]" if args.strategy == "block" else None)
    if sinfo.dtype not in SCALE_DTYPES:
        raise _fail(src, sname, "weight_scale dtype is not a float scale dtype", "dtype", list(SCALE_DTYPES),
                    sinfo.dtype)
    stored = [src.stored_array(name, "codes"), src.stored_array(sname, "scales")]
    zname = prefix + ".weight_zero_point"
    if src.has(zname):
        stored.append(src.stored_array(zname, "zero_points"))
    acts = group.input_activations
    if acts is not None and not acts.dynamic and not src.has(prefix + ".input_scale"):
        raise MissingTensorError("partner tensor missing: static input_activations store input_scale",
                                 file=src.path, tensor=prefix + ".input_scale", expected="present", found="absent",
                                 hint=f"config group {group.name!r}: input_activations.dynamic is false")
    return FloatLayout(prefix, group, el.name, o, i, sinfo.dtype, tuple(stored))


def activation_spec(src: Source, name: str) -> TensorSpec:
    """A stored static activation scale (``<p>.input_scale``) as a dense spec in role ``activation_scale``."""
    info = src.info(name)
    return TensorSpec(name, "dense", tuple(info.shape), (src.stored_array(name, "activation_scale"),),
                      dtype=info.dtype, notes=(ACTIVATION_NOTE.format(p=name.rsplit(".", 1)[0]),))


def load_float(src: Source, m: FloatLayout) -> QuantizedTensor:
    """Materialise one float-quantized module: codes are the stored element bytes (uint8 view, no copy)."""
    try:
        codes = np.asarray(src.read(m.name)).view(np.uint8)
        pshape = m.group_map.param_shape((m.out_features, m.in_features), AXES)
        scales = np.asarray(src.read(m.prefix + ".weight_scale")).reshape(pshape)
        zname = m.prefix + ".weight_zero_point"
        if src.has(zname):  # symmetric float: compressed-tensors drops it; tolerate only zeros
            z = np.asarray(src.read(zname))
            if z.size and np.any(z.astype(np.float32) != 0):
                raise FormatError("symmetric float weights with a non-zero weight_zero_point",
                                  file=src.file_of(zname), tensor=zname, field="values", expected="all 0",
                                  found=f"{int(np.count_nonzero(z.astype(np.float32)))} non-zero",
                                  kind=ErrorKind.CONFIG_MISMATCH)
        return QuantizedTensor(name=m.name, axes=AXES, codes=codes, scales=scales, scheme=m.scheme,
                               group_map=m.group_map, stored={"codes": PARAM_MAP, "scales": PARAM_MAP})
    except LayoutError as exc:
        exc.with_context(file=src.file_of(m.name), tensor=m.name)
        raise
