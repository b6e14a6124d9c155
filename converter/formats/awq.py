"""AWQ (AutoAWQ) checkpoints: GEMM and GEMV read, GEMM write (FORMATS.md section 2).

Storage facts, translated once at this boundary through :class:`~converter.layout.AxisMap`
(symbols: ``O`` out_features, ``I`` in_features, ``G`` group size, ``nG = I / G``):

GEMM (``version: "gemm"``; AutoAWQ ``awq/modules/linear/gemm.py`` ``WQLinear_GEMM``)
    ``<p>.qweight`` int32 ``[I, O/8]``: stored axes ``(in, out)``, 4-bit codes packed along
    **out**, nibble ``k`` of word ``c`` holds column ``8c + ORDER[k]``,
    ``ORDER = (0, 2, 4, 6, 1, 3, 5, 7)`` (``awq/utils/packing_utils.py`` ``AWQ_ORDER``).
    ``<p>.qzeros`` int32 ``[nG, O/8]``: same packing and interleave, *raw* zero (no ``-1``
    offset, unlike GPTQ v1). ``<p>.scales`` float16 ``[nG, O]``: stored axes ``(group, out)``.
    ``<p>.bias`` float16 ``[O]`` is the Linear's own bias, a dense pass-through tensor.
    Dequant ``W[o, i] = s[i//G, o] * (q[i, o] - z[i//G, o])`` (``packing_utils.dequantize_gemm``).
GEMV (``version: "gemv"``; ``awq/modules/linear/gemv.py`` ``WQLinear_GEMV``)
    ``qweight`` int32 ``[O, I/8]`` packed along **in**, sequential LSB-first. ``qzeros`` int32
    ``[O, Zw]`` packed sequentially along the group axis; ``scales`` float16 ``[O, Zw*8]``.
    ``Zw = calculate_zeros_width(I, G)`` pads ``ceil(nG/8)`` up to a multiple of 1 (G >= 128),
    2 (G = 64) or 4 (G = 32); the padding is zero and is dropped (after checking it is zero).
GEMV_FAST / llm-awq
    int16 ``qweight`` with a kernel-specific reshuffle: refused with :class:`UnsupportedError`.

Zero points. ``zero_point: true`` gives :attr:`ZeroPoint.INTEGER` unsigned 4-bit codes.
``zero_point: false`` (written by GPTQModel; AutoAWQ's own packer asserts zeros exist) is read
as :attr:`ZeroPoint.NONE` with the implicit unsigned centre 8, provided ``qzeros`` is absent
or holds 8 everywhere; anything else contradicts the config and raises :class:`FormatError`.

Writing produces GEMM only, because it is the layout every AWQ loader (AutoAWQ, transformers,
vLLM, exllama/ipex repackers) accepts. Symmetric and signed schemes are re-expressed exactly
with explicit integer zeros (``qzeros = 8`` and ``zero_point: true``), since AutoAWQ cannot
load a GEMM layer without zeros.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import ConverterError, FormatError, LayoutError, MissingTensorError, NotRepresentableError, UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT, AxisMap
from converter.kernels.packing import AWQ_ORDER
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, opaque_reason
from converter.formats.modules import dense_linear_modules, hf_linear_policy
from converter.formats.model_dir import write_model_dir
from converter.write.plan import TensorPlan, dense_plan
from converter.formats.registry import Detection, FormatHandler, register
from converter.formats.source import Source

from converter.quant.recode import as_integer_zero, as_unsigned

FORMAT = "awq"
BITS = 4
PACK = 32 // BITS
AXES = (OUT, IN)
SCALE_DTYPES = ("F16", "BF16", "F32")
GEMM_VERSIONS = ("gemm", "exllama", "ipex")  # exllama/ipex load the GEMM layout and repack at load time
GEMV_VERSIONS = ("gemv",)
FAST_VERSIONS = ("gemv_fast", "llm-awq", "llm_awq")
WEIGHT_SUFFIX = ".weight"
ROLE_SUFFIXES = {"codes": ".qweight", "zero_points": ".qzeros", "scales": ".scales"}

#: GEMM ``qweight``: ``[I, O/8]`` int32, packed along out with the AWQ interleave.
GEMM_QWEIGHT = AxisMap(stored_axes=(IN, OUT), packed_axis=OUT, bits=BITS, container="I32", order=AWQ_ORDER)
#: GEMM ``qzeros``: ``[nG, O/8]`` int32 (the ``in`` axis counts groups), same interleave.
GEMM_QZEROS = AxisMap(stored_axes=(IN, OUT), packed_axis=OUT, bits=BITS, container="I32", order=AWQ_ORDER)
#: GEMM ``scales``: ``[nG, O]``, transposed relative to the logical ``(out, group)``.
GEMM_SCALES = AxisMap(stored_axes=(IN, OUT))
#: GEMV ``qweight``: ``[O, I/8]`` int32, packed along in, sequential.
GEMV_QWEIGHT = AxisMap(stored_axes=(OUT, IN), packed_axis=IN, bits=BITS, container="I32")
#: GEMV ``qzeros``: ``[O, Zw]`` int32, packed sequentially along the (padded) group axis.
GEMV_QZEROS = AxisMap(stored_axes=(OUT, IN), packed_axis=IN, bits=BITS, container="I32")
#: GEMV ``scales``: ``[O, Zw*8]`` (zero-padded beyond nG).
GEMV_SCALES = AxisMap(stored_axes=(OUT, IN))


# -- configuration ------------------------------------------------------------------------------
def _version(qc: dict) -> str:
    """The layout name: ``version`` (AutoAWQ) or ``format`` (transformers ``AwqConfig``), default gemm."""
    v = qc.get("version", qc.get("format")) or "gemm"
    return str(v).lower()


def gemv_zeros_width(in_features: int, group_size: int, *, file: Any = None) -> int:
    """``calculate_zeros_width`` of AutoAWQ ``gemv.py``: words of packed zeros per output row.

    ``ceil((I // G) / 8)`` rounded up to a multiple of 1 (G >= 128), 2 (G = 64) or 4 (G = 32).

    Raises
    ------
    UnsupportedError
        For other group sizes (AutoAWQ raises ``NotImplementedError``).
    """
    if group_size >= 128:
        mult = 1
    elif group_size == 64:
        mult = 2
    elif group_size == 32:
        mult = 4
    else:
        raise UnsupportedError("AWQ GEMV supports group sizes 32, 64 or >= 128", file=file,
                               field="quantization_config.group_size", expected="32, 64 or >= 128", found=group_size)
    base = -(-(in_features // group_size) // PACK)
    return -(-base // mult) * mult


class _Layer:
    """One quantized Linear: stored names, logical sizes and how it is stored (headers only)."""

    def __init__(self, prefix: str, out: int, inp: int, group_size: int | None, n_groups: int,
                 has_zeros: bool, version: str, scale_dtype: str, zw: int = 0) -> None:
        self.prefix, self.out, self.inp, self.group_size = prefix, out, inp, group_size
        self.n_groups, self.has_zeros, self.version, self.scale_dtype, self.zw = (
            n_groups, has_zeros, version, scale_dtype, zw)

    @property
    def name(self) -> str:
        return self.prefix + WEIGHT_SUFFIX

    def stored(self, role: str) -> str:
        return self.prefix + ROLE_SUFFIXES[role]


def _check_shape(src: Source, tensor: str, field: str, expected: tuple[int, ...], hint: str | None = None) -> None:
    found = src.info(tensor).shape
    if tuple(found) != tuple(expected):
        raise FormatError("stored shape contradicts the AWQ layout and config", file=src.file_of(tensor),
                          tensor=tensor, field=field, expected=list(expected), found=list(found), hint=hint)


def _check_dtype(src: Source, tensor: str, allowed: tuple[str, ...]) -> str:
    dt = src.info(tensor).dtype
    if dt not in allowed:
        raise FormatError("unexpected dtype for an AWQ tensor", file=src.file_of(tensor), tensor=tensor,
                          field="dtype", expected=" or ".join(allowed), found=dt)
    return dt


def _layer(src: Source, prefix: str, version: str, group_size: int, zero_point: bool) -> _Layer:
    """Derive and check one layer's sizes from headers; raises FormatError / MissingTensorError."""
    qw, qz, sc = prefix + ".qweight", prefix + ".qzeros", prefix + ".scales"
    if not src.has(sc):
        raise MissingTensorError("AWQ qweight without its scales", file=src.file_of(qw), tensor=sc,
                                 field="scales", expected=sc, found="absent")
    has_zeros = src.has(qz)
    if zero_point and not has_zeros:
        raise MissingTensorError("AWQ qweight without its qzeros although zero_point is true", file=src.file_of(qw),
                                 tensor=qz, field="qzeros", expected=qz, found="absent")
    _check_dtype(src, qw, ("I32", "U32"))
    if has_zeros:
        _check_dtype(src, qz, ("I32", "U32"))
    scale_dtype = _check_dtype(src, sc, SCALE_DTYPES)
    shape = src.info(qw).shape
    if len(shape) != 2:
        raise FormatError("qweight must be 2-D", file=src.file_of(qw), tensor=qw, field="shape",
                          expected="2 dims", found=list(shape))
    if version in GEMV_VERSIONS:
        out, inp = shape[0], shape[1] * PACK
    else:
        inp, out = shape[0], shape[1] * PACK
    g = inp if group_size == -1 else group_size
    if g <= 0 or inp % g:
        raise FormatError("in_features is not a multiple of group_size (AutoAWQ asserts "
                          "in_features % group_size == 0)", file=src.file_of(qw), tensor=qw,
                          field="quantization_config.group_size", expected=f"a divisor of in_features={inp}",
                          found=group_size)
    n_groups = inp // g
    if version in GEMV_VERSIONS:
        zw = gemv_zeros_width(inp, g, file=src.file_of(qw))
        _check_shape(src, sc, "shape", (out, zw * PACK), "GEMV scales are [O, Zw*8] (zero-padded)")
        if has_zeros:
            _check_shape(src, qz, "shape", (out, zw), "GEMV qzeros are [O, Zw]")
        return _Layer(prefix, out, inp, None if group_size == -1 else g, n_groups, has_zeros, "gemv", scale_dtype, zw)
    hint = "GEMM stores scales [I/G, O]; a [O, I/G] tensor suggests GEMV or a transposed writer"
    _check_shape(src, sc, "shape", (n_groups, out), hint)
    if has_zeros:
        _check_shape(src, qz, "shape", (n_groups, out // PACK), "GEMM qzeros are [I/G, O/8]")
    return _Layer(prefix, out, inp, None if group_size == -1 else g, n_groups, has_zeros, "gemm", scale_dtype)


def _scheme(layer: _Layer, zero_point: bool) -> QuantScheme:
    return QuantScheme(bits=BITS, signed=False, zero_point=ZeroPoint.INTEGER if zero_point else ZeroPoint.NONE,
                       scale_dtype=layer.scale_dtype)


def _group_map(layer: _Layer) -> GroupMap:
    """``group_size: -1`` is per output channel (AutoAWQ replaces it by in_features)."""
    return GroupMap.per_channel(OUT) if layer.group_size is None else GroupMap.per_group(layer.group_size, IN)


def _spec(src: Source, layer: _Layer, zero_point: bool) -> TensorSpec:
    stored = []
    for role in ("codes", "scales", "zero_points"):
        n = layer.stored(role)
        if src.has(n):
            stored.append(src.stored_array(n, role))
    notes = [f"AWQ {layer.version}"]
    if not zero_point:
        notes.append("zero_point false: symmetric, implicit centre 8")
    return TensorSpec(layer.name, "quantized", (layer.out, layer.inp), tuple(stored), axes=AXES,
                      scheme=_scheme(layer, zero_point), group_map=_group_map(layer), notes=tuple(notes))


def _load(src: Source, layer: _Layer, zero_point: bool) -> QuantizedTensor:
    """Read one layer's arrays and translate them to the logical model (vectorized)."""
    qw, qz, sc = layer.stored("codes"), layer.stored("zero_points"), layer.stored("scales")
    try:
        if layer.version == "gemm":
            maps = {"codes": GEMM_QWEIGHT, "scales": GEMM_SCALES, "zero_points": GEMM_QZEROS}
            codes = GEMM_QWEIGHT.to_logical(src.read(qw), AXES, {OUT: layer.out, IN: layer.inp})
            psizes = {OUT: layer.out, IN: layer.n_groups}
            scales = np.array(GEMM_SCALES.to_logical(src.read(sc), AXES, psizes))
            zeros = GEMM_QZEROS.to_logical(src.read(qz), AXES, psizes) if layer.has_zeros else None
        else:
            maps = {"codes": GEMV_QWEIGHT, "scales": GEMV_SCALES, "zero_points": GEMV_QZEROS}
            codes = GEMV_QWEIGHT.to_logical(src.read(qw), AXES, {OUT: layer.out, IN: layer.inp})
            padded = {OUT: layer.out, IN: layer.zw * PACK}
            scales_p = GEMV_SCALES.to_logical(src.read(sc), AXES, padded)
            _check_padding(src, sc, scales_p, layer.n_groups)
            scales = np.array(scales_p[:, :layer.n_groups])
            zeros = None
            if layer.has_zeros:
                zeros_p = GEMV_QZEROS.to_logical(src.read(qz), AXES, padded)
                _check_padding(src, qz, zeros_p, layer.n_groups)
                zeros = zeros_p[:, :layer.n_groups]
    except LayoutError as exc:
        raise exc.with_context(file=src.file_of(qw), tensor=qw)
    if zero_point:
        zp = zeros.astype(np.int16)
    else:
        if zeros is not None and zeros.size and not (zeros == 8).all():
            bad = np.unravel_index(int(np.argmax(zeros != 8)), zeros.shape)
            raise FormatError("config says zero_point false (symmetric) but qzeros are not all 8",
                              file=src.file_of(qz), tensor=qz, field="quantization_config.zero_point",
                              expected="every zero = 8", found=f"{int(zeros[bad])} at (out, group) {list(map(int, bad))}",
                              hint="the config contradicts the tensors; fix zero_point in config.json")
        zp = None
    stored = {role: m for role, m in maps.items() if role != "zero_points" or layer.has_zeros}
    return QuantizedTensor(layer.name, AXES, codes, scales, _scheme(layer, zero_point), _group_map(layer),
                           zero_points=zp, stored=stored)


def _check_padding(src: Source, tensor: str, padded: np.ndarray, n_groups: int) -> None:
    """GEMV pads scales / zeros beyond nG with zeros; anything else means a different layout."""
    tail = padded[:, n_groups:]
    if tail.size and np.any(tail != 0):
        raise FormatError("GEMV padding beyond the last group is not zero", file=src.file_of(tensor), tensor=tensor,
                          field="padding", expected=f"zeros in columns >= {n_groups}",
                          found=f"{int(np.count_nonzero(tail))} non-zero entries")


# -- reader ---------------------------------------------------------------------------------------
def _config_params(src: Source) -> tuple[str, int, int, bool]:
    """(version, bits, group_size, zero_point) from quantization_config, or inferred from shapes."""
    qc = src.quantization_config or {}
    cfg_file = src.directory / "config.json"
    if qc.get("quant_method") is not None and str(qc.get("quant_method")).lower() != "awq":
        raise FormatError("not an AWQ checkpoint", file=cfg_file, field="quantization_config.quant_method",
                          expected="awq", found=qc.get("quant_method"))
    if not qc:  # tensor-name evidence only: infer from the first layer (GEMM shapes, see detect_awq)
        prefixes = _prefixes(src)
        if not prefixes:
            raise FormatError("no AWQ qweight tensors", file=src.path, field="tensors", expected="<p>.qweight",
                              found="none")
        p = prefixes[0]
        inp = src.info(p + ".qweight").shape[0]
        n_groups = src.info(p + ".scales").shape[0] if src.has(p + ".scales") else 1
        return "gemm", BITS, (inp // n_groups if n_groups > 1 else -1), src.has(p + ".qzeros")
    version = _version(qc)
    if version in FAST_VERSIONS:
        raise UnsupportedError(f"AWQ version {version!r} (int16 reshuffled kernel layout) is not supported",
                               file=cfg_file, field="quantization_config.version", expected="gemm or gemv",
                               found=version, hint="re-export the model with version gemm")
    if version not in GEMM_VERSIONS + GEMV_VERSIONS:
        raise UnsupportedError(f"AWQ version {version!r} is not supported", file=cfg_file,
                               field="quantization_config.version", expected="gemm or gemv", found=version)
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != BITS:
        raise UnsupportedError("AWQ stores 4-bit codes only", file=cfg_file, field="quantization_config.bits",
                               expected=BITS, found=bits)
    gs = qc.get("group_size", qc.get("q_group_size"))
    if not isinstance(gs, int) or isinstance(gs, bool) or (gs <= 0 and gs != -1):
        raise FormatError("group_size must be a positive integer or -1", file=cfg_file,
                          field="quantization_config.group_size", expected="> 0 or -1", found=gs)
    zp = qc.get("zero_point", True)
    if not isinstance(zp, bool):
        raise FormatError("zero_point must be a boolean", file=cfg_file, field="quantization_config.zero_point",
                          expected="true or false", found=zp)
    return ("gemv" if version in GEMV_VERSIONS else "gemm"), BITS, gs, zp


def _prefixes(src: Source) -> list[str]:
    return [n[:-len(".qweight")] for n in src.tensor_names() if n.endswith(".qweight")]


def read_awq(src: Source) -> Checkpoint:
    """Read an AWQ (GEMM or GEMV) checkpoint into a lazily loaded :class:`Checkpoint`.

    Logical names are the Hugging Face weight names (``<p>.weight``); ``<p>.bias`` and every
    other tensor pass through as dense tensors.

    Raises
    ------
    UnsupportedError
        GEMV_FAST / llm-awq or other versions, bits other than 4, GEMV group sizes AutoAWQ refuses.
    MissingTensorError
        ``qweight`` without ``scales`` (or without ``qzeros`` when ``zero_point`` is true), or a
        ``qzeros`` / ``scales`` whose ``qweight`` is absent.
    FormatError
        Shapes contradicting the layout, bits or group size; ``in_features % group_size != 0``;
        bad dtypes; non-zero GEMV padding; ``zero_point: false`` with zeros other than 8.
    """
    version, _bits, group_size, zero_point = _config_params(src)
    prefixes = _prefixes(src)
    owned: set[str] = set()
    layers: dict[str, _Layer] = {}
    for p in prefixes:
        layer = _layer(src, p, version, group_size, zero_point)
        layers[layer.name] = layer
        owned.update({p + ".qweight", p + ".qzeros", p + ".scales"})
    specs: dict[str, TensorSpec] = {}
    for n in src.tensor_names():
        if n in owned:
            continue
        for suffix in (".qzeros", ".scales"):
            if n.endswith(suffix) and src.info(n).dtype in (("I32", "U32") if suffix == ".qzeros" else SCALE_DTYPES):
                qw = n[:-len(suffix)] + ".qweight"
                raise MissingTensorError(f"AWQ {suffix[1:]} without its qweight", file=src.file_of(n), tensor=qw,
                                         field="qweight", expected=qw, found="absent")
        if n in layers:
            raise FormatError("a dense tensor has the logical name of a quantized layer", file=src.file_of(n),
                              tensor=n, field="name", expected="only <p>.qweight/.qzeros/.scales", found=n)
        specs[n] = src.dense_spec(n)
    for name, layer in layers.items():
        specs[name] = _spec(src, layer, zero_point)
    specs = dict(sorted(specs.items()))

    def load(name: str):
        if name in layers:
            return _load(src, layers[name], zero_point)
        return src.dense(name)

    meta = {"version": version, "config_version": _version(src.quantization_config or {}), "group_size": group_size, "zero_point": zero_point,
            "quantization_config": copy.deepcopy(src.quantization_config or {})}
    return Checkpoint(specs, load, format=FORMAT, path=str(src.path), config=src.config, metadata=meta,
                      files=[str(f) for f in src.files], extra_files=[str(p) for p in src.extra_files()])


def detect_awq(src: Source) -> Detection | None:
    """``quant_method: "awq"`` in the config (90), or GEMM-shaped ``qweight``/``scales`` pairs (60).

    Shape evidence: AWQ GEMM ``scales.shape[1] == 8 * qweight.shape[1]`` (packed along out),
    whereas GPTQ has ``scales.shape[1] == qweight.shape[1]`` (packed along in); GPTQ ``g_idx``
    excludes AWQ. Reads headers and config only.
    """
    if src.kind == "gguf":
        return None
    qc = src.quantization_config or {}
    method = str(qc.get("quant_method", "")).lower()
    if method == "awq":
        return Detection(FORMAT, 90, f"quantization_config.quant_method = awq (version {_version(qc)})")
    if method or src.st_metadata.get("qckpt.format"):
        return None
    prefixes = _prefixes(src)
    if not prefixes or any(src.has(p + ".g_idx") for p in prefixes):
        return None
    for p in prefixes:
        if not src.has(p + ".scales"):
            return None
        qw, sc = src.info(p + ".qweight").shape, src.info(p + ".scales").shape
        if len(qw) != 2 or len(sc) != 2 or sc[1] != qw[1] * PACK or qw[0] % max(sc[0], 1):
            return None
    return Detection(FORMAT, 60, "qweight [I, O/8] with scales [I/G, O] (AWQ GEMM shapes), no config")


# -- writer ---------------------------------------------------------------------------------------
def check_target(spec: TensorSpec) -> str | None:
    """``None`` when ``spec`` can be written as AWQ GEMM exactly, else the reason.

    Accepted: 4-bit affine-grid codes (signed or unsigned; symmetric or integer zero; float
    bias is accepted here and checked exactly per group when encoding, see
    :func:`converter.quant.recode.as_integer_zero`), float16 scales, logical ``(out, in)``,
    groups along ``in`` with ``in % G == 0`` (or per output channel / per tensor, written as
    ``G = in``), ``out % 8 == 0`` (``WQLinear_GEMM.__init__`` asserts both), no act-order.
    """
    if spec.kind != "quantized":
        return opaque_reason(spec)  # None for dense tensors
    s, gm = spec.scheme, spec.group_map
    if tuple(spec.axes or ()) != AXES:
        return f"AWQ stores 2-D (out, in) Linear weights only, not axes {list(spec.axes or ())}"
    if s.codebook is not None:
        return "AWQ codes are an affine integer grid; a codebook (NF4/FP4) scheme is not representable"
    if s.bits != BITS:
        return f"AWQ stores 4-bit codes only, not {s.bits}-bit"
    if s.scale_dtype != "F16":
        return f"AWQ kernels take float16 scales; {s.scale_dtype} scales would be rounded (requantize)"
    if spec.act_order:
        return "AWQ has no g_idx: act-order (desc_act) group membership is not representable"
    out, inp = spec.shape
    if out % PACK:
        return f"AWQ GEMM packs 8 output channels per int32: out_features={out} is not a multiple of 8"
    g = gm.granularity
    if g is Granularity.GROUP:
        if gm.axis != IN:
            return f"AWQ groups run along in, not {gm.axis}"
        if inp % gm.group_size:
            return f"AWQ needs in_features % group_size == 0 (in={inp}, group_size={gm.group_size})"
    elif g is Granularity.CHANNEL:
        if gm.axis != OUT:
            return "per-input-channel scales are not representable in AWQ (scales are per out channel and group)"
    elif g is not Granularity.TENSOR:
        return f"{gm.describe()} blocks are not representable in AWQ (groups along in)"
    return None


def _group_size_for(ckpt: Checkpoint) -> int:
    """The single ``group_size`` of config.json for every quantized tensor (-1 = per channel)."""
    explicit = {s.group_map.group_size for s in ckpt.specs()
                if s.kind == "quantized" and s.group_map.granularity is Granularity.GROUP}
    if len(explicit) > 1:
        raise NotRepresentableError("AWQ config has one group_size for the model", file=ckpt.path,
                                    field="quantization_config.group_size", expected="one group size",
                                    found=sorted(explicit), hint="requantize to a single group size")
    if not explicit:
        return -1
    g = explicit.pop()
    for s in ckpt.specs():
        if s.kind == "quantized" and s.group_map.granularity is not Granularity.GROUP and s.shape[1] != g:
            raise NotRepresentableError("a per-channel tensor does not fit the model's group size", file=ckpt.path,
                                        tensor=s.name, field="quantization_config.group_size",
                                        expected=f"in_features = {g}", found=s.shape[1],
                                        hint="requantize to a single group size")
    return g


def _unsigned_integer(t: QuantizedTensor) -> QuantizedTensor:
    """Re-express ``t`` exactly as unsigned codes with integer zero points (AWQ's model)."""
    if t.scheme.signed:
        t = as_unsigned(t)
    if t.scheme.zero_point is not ZeroPoint.INTEGER:
        t = as_integer_zero(t)
    return t


def encode_gemm(t: QuantizedTensor, group_size: int) -> dict[str, np.ndarray]:
    """Logical tensor -> ``{<p>.qweight, <p>.qzeros, <p>.scales}`` GEMM arrays.

    Returns
    -------
    dict: ``qweight`` int32 ``[I, O/8]``, ``qzeros`` int32 ``[nG, O/8]``, ``scales`` float16 ``[nG, O]``.

    Raises
    ------
    NotRepresentableError
        When :func:`check_target` refuses the tensor's spec, or a float bias is not an exact
        integer zero.
    """
    from converter.tensor import spec_of
    gm = t.group_map
    if gm.g_idx is not None and gm.is_trivial_g_idx(t.shape[1]):  # sequential g_idx: plain groups
        t = t.replace(group_map=GroupMap(gm.granularity, gm.axis, gm.group_size))
    reason = check_target(spec_of(t))
    if reason:
        raise NotRepresentableError(reason, tensor=t.name, field="scheme", hint="requantize to AWQ's scheme")
    t = _unsigned_integer(t)
    out, inp = t.shape
    g = inp if group_size == -1 else group_size
    n_groups = inp // g
    gm = t.group_map
    if gm.granularity is Granularity.GROUP:
        scales, zeros = t.scales, t.zero_points
    else:  # per channel (out, 1) or per tensor (1, 1): the one group spans all of in; exact broadcast
        scales = np.broadcast_to(t.scales, (out, 1))
        zeros = np.broadcast_to(t.zero_points, (out, 1))
    if scales.shape != (out, n_groups):
        raise NotRepresentableError("scale count does not match the AWQ group size", tensor=t.name, field="scales",
                                    expected=[out, n_groups], found=list(scales.shape))
    prefix = t.name[:-len(WEIGHT_SUFFIX)]
    return {prefix + ".qweight": GEMM_QWEIGHT.to_stored(t.codes.astype(np.uint8, copy=False), AXES),
            prefix + ".qzeros": GEMM_QZEROS.to_stored(np.asarray(zeros).astype(np.uint8), AXES),
            prefix + ".scales": GEMM_SCALES.to_stored(np.asarray(scales, dtype=np.float16), AXES)}


def _plan(spec: TensorSpec, group_size: int) -> TensorPlan:
    if spec.kind == "dense":
        return dense_plan(spec)
    if not spec.name.endswith(WEIGHT_SUFFIX):
        raise NotRepresentableError("AWQ names quantized tensors <module>.weight", tensor=spec.name, field="name",
                                    expected="<module>.weight", found=spec.name)
    reason = check_target(spec)
    if reason:
        raise NotRepresentableError(reason, tensor=spec.name, field="scheme", hint="requantize to AWQ's scheme")
    out, inp = spec.shape
    n_groups = inp // (inp if group_size == -1 else group_size)
    prefix = spec.name[:-len(WEIGHT_SUFFIX)]
    outputs = [(prefix + ".qweight", "I32", GEMM_QWEIGHT.stored_shape({IN: inp, OUT: out})),
               (prefix + ".qzeros", "I32", GEMM_QZEROS.stored_shape({IN: n_groups, OUT: out})),
               (prefix + ".scales", "F16", GEMM_SCALES.stored_shape({IN: n_groups, OUT: out}))]
    notes = ["exact repack to AWQ GEMM"]
    if spec.scheme.zero_point is ZeroPoint.NONE:
        notes.append("symmetric scheme written as explicit qzeros = 8 (AutoAWQ cannot load GEMM without zeros)")
    if spec.scheme.signed:
        notes.append("signed codes shifted by +8 to AWQ's unsigned domain")
    return TensorPlan(spec.name, outputs, lambda t: encode_gemm(t, group_size), notes)


_UNSET = object()


def awq_config(ckpt: Checkpoint, group_size: int, modules_to_not_convert: Any = _UNSET) -> dict:
    """config.json for the output: the source config with an AWQ GEMM ``quantization_config``.

    Keys follow AutoAWQ ``AwqConfig.to_transformers_dict`` (``awq/models/_config.py``).
    ``zero_point`` is always true: zeros are written explicitly, symmetric ones as 8.
    ``modules_to_not_convert`` is the given value, else every dense Linear-like module of ``ckpt``
    (:func:`converter.formats.modules.dense_linear_modules`: an MoE router or a layer the source left
    dense; transformers' AWQ loader matches the full names, from the start at a module boundary)
    together with the source's list when the source was AWQ, else ``None`` (as AutoAWQ writes it).
    """
    if modules_to_not_convert is _UNSET:
        names = set(dense_linear_modules(ckpt.specs()))
        if ckpt.format == FORMAT:
            names |= set((ckpt.metadata.get("quantization_config") or {}).get("modules_to_not_convert") or ())
        modules_to_not_convert = sorted(names) or None
    cfg = {k: v for k, v in (ckpt.config or {}).items() if k not in ("quantization_config", "quantization")}
    cfg["quantization_config"] = {"quant_method": "awq", "bits": BITS, "group_size": group_size,
                                  "zero_point": True, "version": "gemm",
                                  "modules_to_not_convert": modules_to_not_convert}
    return cfg


def write_awq(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, version: str = "gemm",
              max_shard_bytes: int | None = None, modules_to_not_convert: Any = _UNSET, **_: Any) -> dict:
    """Write ``ckpt`` as an AWQ GEMM model directory (``model.safetensors`` + ``config.json``).

    Every plan is made (and every tensor checked with :func:`check_target`) before any data
    moves; dense tensors (biases, norms, embeddings) pass through bit-exact. Packing is ours
    (vectorized), so ``out % 8 == 0`` suffices; AutoAWQ's own ``from_linear`` would need
    ``out % 32 == 0`` (it sizes the buffer as ``O // 32 * 4``; FORMATS.md section 11.13).
    Pass ``modules_to_not_convert=[...]`` to name Linear modules left dense.

    Raises
    ------
    UnsupportedError
        ``version`` other than ``"gemm"``.
    NotRepresentableError
        A tensor AWQ cannot hold exactly, or tensors needing different group sizes.
    """
    ckpt.refuse_opaque("awq")
    if str(version).lower() != "gemm":
        raise UnsupportedError("the AWQ writer produces the GEMM layout only", field="version",
                               expected="gemm", found=version)
    group_size = _group_size_for(ckpt)
    plans = []
    for spec in ckpt.specs():
        try:
            plans.append(_plan(spec, group_size))
        except ConverterError as exc:
            raise exc.with_context(file=ckpt.path, tensor=spec.name)
    config = awq_config(ckpt, group_size, modules_to_not_convert)
    summary = write_model_dir(Path(dst), plans, ckpt, metadata={"format": "pt"}, config=config,
                              extra_files=ckpt.extra_files, max_shard_bytes=max_shard_bytes, overwrite=overwrite)
    summary["notes"] = {p.source: p.notes for p in plans if p.notes}
    return summary


HANDLER = register(FormatHandler(FORMAT, "AWQ (AutoAWQ) GEMM/GEMV; writes GEMM", detect_awq, read_awq, write_awq,
                                 check_target=check_target, keep_dense=hf_linear_policy("awq"), partial_groups=False,
                                 float_bias="integer", scale_dtype="F16"))
