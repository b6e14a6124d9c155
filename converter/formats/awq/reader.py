"""AWQ reader: GEMM and GEMV ``qweight`` / ``qzeros`` / ``scales`` -> logical ``(out, in)`` tensors."""

from __future__ import annotations

import copy

import numpy as np

from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError, UnsupportedError
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec
from converter.formats.registry import Detection
from converter.formats.base import source_checkpoint
from converter.formats.source import Source
from converter.formats.awq.layout import (AXES, BITS, FAST_VERSIONS, FORMAT, GEMM_QWEIGHT, GEMM_QZEROS,
    GEMM_SCALES, GEMM_VERSIONS, GEMV_QWEIGHT, GEMV_QZEROS, GEMV_SCALES, GEMV_VERSIONS, PACK, ROLE_SUFFIXES,
    SCALE_DTYPES, WEIGHT_SUFFIX, layout_version, gemv_zeros_width)



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
                          tensor=tensor, field=field, expected=list(expected), found=list(found), hint=hint,
                          kind=ErrorKind.CONFIG_MISMATCH)


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
        exc.with_context(file=src.file_of(qw), tensor=qw)
        raise
    if zero_point:
        zp = zeros.astype(np.int16)
    else:
        if zeros is not None and zeros.size and not (zeros == 8).all():
            bad = np.unravel_index(int(np.argmax(zeros != 8)), zeros.shape)
            raise FormatError("config says zero_point false (symmetric) but qzeros are not all 8",
                              file=src.file_of(qz), tensor=qz, field="quantization_config.zero_point",
                              expected="every zero = 8",
                              found=f"{int(zeros[bad])} at (out, group) {list(map(int, bad))}",
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
    version = layout_version(qc)
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
    meta = {"version": version, "config_version": layout_version(src.quantization_config or {}),
            "group_size": group_size, "zero_point": zero_point,
            "quantization_config": copy.deepcopy(src.quantization_config or {})}
    return source_checkpoint(src, FORMAT, specs, lambda name: _load(src, layers[name], zero_point), layers, meta)


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
        return Detection(FORMAT, 90, f"quantization_config.quant_method = awq (version {layout_version(qc)})")
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
