"""The one registry of formats: each format registers one :class:`FormatHandler` carrying every
capability (detect, read, optionally write, target checks with typed options, validation hooks,
output kind).

Detection reads headers and config files only, never tensor data. A lookup miss lists what is
known; an ambiguous detection lists the candidates (DESIGN.md section 7, habit 5). Code outside
``converter/formats/`` asks the handler (``handler.validation``, ``handler.output``,
:meth:`FormatHandler.target_reason`) and never tests a format's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Optional


from converter.errors import UnknownFormatError, UnsupportedError
from converter.formats import foreign
from converter.formats.guard import guarded, guarded_row_blocks
from converter.formats.source import Source
from converter.tensor import TensorSpec, opaque_reason


@dataclass(frozen=True)
class Detection:
    """A format's claim on an input: ``confidence`` 0-100 and the evidence."""

    format: str
    confidence: int
    reason: str


@dataclass(frozen=True)
class TargetOptions:
    """The write options a target's ``check_target`` understands; this base class holds none.

    A format whose exact-repack check depends on a write option subclasses it with one frozen
    field per option (compressed-tensors: ``ct_version``, ``ct_format``) and names the subclass in
    :attr:`FormatHandler.target_options`. The writer's other options are ignored.
    """

    @classmethod
    def from_write_options(cls, options: Mapping[str, Any] | None) -> "TargetOptions":
        """The options of ``options`` (a writer's keyword options) this class has a field for."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in (options or {}).items() if k in names})


#: The options of a target without any.
NO_OPTIONS = TargetOptions()


def opaque_target(spec: TensorSpec, options: TargetOptions = NO_OPTIONS) -> str | None:
    """``check_target`` of a format that stores every decodable scheme as it is (native, plain):
    only a tensor qckpt cannot decode (:func:`~converter.tensor.opaque_reason`) is refused."""
    return opaque_reason(spec)


@dataclass(frozen=True)
class ValidationHooks:
    """The few format quirks the validator needs (``qckpt validate`` stays format-agnostic).

    Attributes
    ----------
    zero_convention : callable(Source, TensorSpec) -> dict or None, optional
        Evidence about the zero-point convention read from the stored arrays: ``{"claimed": str,
        "inferred": str or None, ...}``. A finding ``zero-convention`` is raised when ``inferred``
        is set and differs from ``claimed`` (GPTQ v1 ``z - 1`` vs v2 ``z``, CASES.md B01).
    always_stored : tuple of str
        Roles (``"g_idx"`` ...) the format's writers always store for a quantized tensor; an
        absent one is reported (``missing-tensor``; an error when the tensor declares act-order).
    negative_scales : bool
        The format's scales may be negative (MLX affine, GGUF ``d``); otherwise a negative scale
        is a ``scale-negative`` finding.
    e8m0_rule : callable(Source) -> dict or None, optional
        Which E8M0 exponent encoding the format's MXFP4 scales follow and what decided it:
        ``{"rule", "by", "version_rule", "data_rule", "evidence", "factor", "tensors"}``; an
        ``e8m0-bias`` finding when the declared rule and the data disagree
        (:func:`converter.validate.fp4_checks.check_e8m0_rule`).
    block_scales : callable(Source, TensorSpec) -> ndarray or None, optional
        The block scales (float32, block order) of a tensor loaded through another decoder (``decoded_by``:
        GGUF IQ* / TQ* by gguf-py), read from its stored bytes; None when the type has no readable scale.
    config_loaders : str
        The loaders that recognise the format only by its quantization config (``config.json``
        ``quantization_config`` or ``quantize_config.json``), e.g. ``"transformers, vLLM and GPTQModel"``: without one,
        a checkpoint the reader still decodes (bits and group size inferred from the shapes) is a ``config-missing``
        warning. Empty: the format needs none.
    words_along_in : bool
        The format stores integer codes as 32-bit words packed along ``in``, LSB-first in field order (GPTQ
        ``qweight``, compressed-tensors ``weight_packed``; not AWQ GEMM, packed along ``out`` and interleaved):
        the validator's one-pass word scan reads such tensors with a small working set, so more of them are
        checked side by side under ``--max-memory`` (:func:`converter.validate.word_scan.likely_covered`).
    """

    zero_convention: Optional[Callable[[Source, TensorSpec], Optional[dict]]] = None
    block_scales: Optional[Callable[[Source, TensorSpec], Any]] = None
    always_stored: tuple[str, ...] = ()
    negative_scales: bool = False
    e8m0_rule: Optional[Callable[[Source], Optional[dict]]] = None
    words_along_in: bool = False
    config_loaders: str = ""


@dataclass(frozen=True)
class OutputKind:
    """What a format's writer makes.

    Attributes
    ----------
    suffix : str, optional
        The destination suffix of a writer that makes one file (``".safetensors"``, ``".gguf"``);
        None when it makes a model directory.
    quantized : bool
        The writer stores quantized tensors; False when it writes dense floats only (plain).
    dense_source : bool
        A checkpoint without quantized tensors may be written (a float source converts to this
        format); False: such a conversion is refused, there is nothing to repack.
    """

    suffix: Optional[str] = None
    quantized: bool = True
    dense_source: bool = False


@dataclass(frozen=True)
class FormatHandler:
    """One registered format.

    Attributes
    ----------
    name : str
        Registry key, used by ``--to`` (``"gptq"``, ``"awq"``, ``"compressed-tensors"`` ...).
    description : str
    detect : callable(Source) -> Detection or None
    read : callable(Source) -> Checkpoint
    write : callable(Checkpoint, Path, **options) -> dict, optional
        Writes atomically; returns a summary dict (files written, per-tensor notes).
    check_target : callable(TensorSpec, TargetOptions) -> str or None, optional
        Before any data moves: ``None`` if the spec's scheme is representable exactly in this
        format, else a reason (used to refuse a silent requantize). Called through
        :meth:`target_reason`; the options argument defaults to ``target_options()``.
    check_model : callable(list of TensorSpec) -> str or None, optional
        Before any data moves: the model-wide rules of the format's config over all the specs to write
        (GPTQ: one bits / group_size; AWQ: one group_size): ``None``, or the reason. Planners check it
        beside ``check_target`` so that a refusal and its hint see every blocking property at once.
    target_options : type of TargetOptions
        The frozen dataclass of the write options ``check_target`` understands
        (:class:`TargetOptions`: none).
    keep_dense : callable(TensorSpec) -> str or None, optional
        The target's module policy (:mod:`converter.formats.modules`): ``None`` when the format's
        loaders read the tensor quantized, else the reason it must be written dense (a quantized
        source tensor is then dequantized exactly). ``None`` (no policy): everything may stay quantized.
    partial_groups : bool
        Whether the format's common loaders read a partial final group (``in`` not a multiple of
        the group size). When False, a conversion that would write one is refused before any data
        moves, naming the group sizes that divide every layer.
    float_bias : ``"keep" | "integer" | "symmetric"``
        What a requantization into the format that leaves ``--sym`` / ``--asym`` out makes of a
        float-bias source tensor (``Target.float_bias``): ``keep`` (the format stores float biases:
        MLX affine, GGUF Q4_1), ``integer`` zero points (GPTQ, AWQ), or ``symmetric``
        (compressed-tensors: transformers 5.24 cannot load its asymmetric pack-quantized layout).
    scale_dtype : str, optional
        The one scale dtype the format stores (GPTQ, AWQ: ``"F16"``); a requantization into it that
        leaves ``--scale-dtype`` out uses it instead of the source's (a K-quant's F32 scales).
    quantizer : FormatQuantizer, optional
        The format's own quantizer for the types it defines by their reference quantizer
        (:mod:`converter.quant.format_quant`; GGUF's legacy types: llama.cpp's). None: a
        requantization into the format uses qckpt's generic round-to-nearest.
    requant_targets : callable(Checkpoint, Target) -> dict, optional
        When requantizing into this format: ``{tensor name: (Target, reason)}`` for the modules the
        format's own quantizer gives another target than the one asked for (GGUF: llama.cpp keeps the
        output head, or the token embedding tied to it, at Q6_K / Q8_0).
    word_orders : mapping of str to tuple of int
        The in-word element orders the format's packing uses besides sequential, by name
        (AWQ GEMM: ``{"AWQ interleave": (0, 2, 4, 6, 1, 3, 5, 7)}``): the validator tries each
        (and its inverse) as an alternative reading of packed codes.
    validation : ValidationHooks
        The format's quirks the validator needs (zero convention, roles always stored, signed scales).
    output : OutputKind
        What the writer makes: one file (its suffix) or a model directory, quantized or dense only,
        and whether a float-only checkpoint may be written.
    probe_companions : callable(QuantizedTensor | TensorSpec) -> list of Tensor, optional
        The tensors the format requires beside a quantized probe tensor (or a planned tensor's spec:
        only its name, scheme and group map are read) to write it (ModelOpt FP8:
        the static ``<module>.input_scale`` of a per-tensor W8A8 layer); used by ``--self-test``
        probes (:func:`converter.validate.probes.probe_tensors`). None: the tensor alone.
    arrange : callable(Checkpoint) -> Checkpoint, optional
        The source's tensors in the arrangement this format's loaders want, before anything is planned
        (gpt-oss fused experts split into stacked gate / up for GGUF and MLX, into per-expert Linear
        weights for compressed-tensors, and fused back for gpt-oss); exact (whole rows move), returning the
        checkpoint unchanged when it has nothing to rearrange. None: tensors are written as the source names them.
    tool_decode : callable(Checkpoint, TensorSpec, str or None) -> ToolDecode, optional
        How the format's producing tool dequantizes a quantized tensor (its arithmetic and output dtype;
        the third argument is ``--tool-dtype`` or None): ``qckpt dequantize --match-tool``
        (:mod:`converter.formats.tool_decode`). None: no tool decode is declared (refused).
    prove_written : callable(Checkpoint, Path, Checkpoint) -> dict, optional
        ``(source, written path, written checkpoint as read back)``: a check of the written file against the
        source's logical tensors that does not go through the format's reader for the tensors' values:
        ``{source tensor name: why it failed}`` (GGUF: the stored LLaMA q/k rows against llama.cpp's permute
        of the source, :mod:`converter.formats.gguf.qk_proof`). None: the read-back alone.
    quantize_exclude : callable(TensorSpec, group size or None) -> bool, optional
        ``qckpt quantize``'s default selection when writing this format (no ``--exclude``): True for a 2-D weight
        the format's own quantizing tool leaves dense (mlx-lm quantizes every module with ``to_quantized``, token
        embedding and head included, but not one whose ``in`` is not a multiple of the group size). None: qckpt's
        default ``--exclude`` (embeddings, norms, head).
    """

    name: str
    description: str
    detect: Callable[[Source], Optional[Detection]]
    read: Callable[[Source], Any]
    write: Optional[Callable[..., dict]] = None
    check_target: Optional[Callable[..., Optional[str]]] = None
    check_model: Optional[Callable[[Any], Optional[str]]] = None
    target_options: type = TargetOptions
    keep_dense: Optional[Callable[[Any], Optional[str]]] = None
    partial_groups: bool = True
    float_bias: str = "keep"
    scale_dtype: Optional[str] = None
    quantizer: Any = None
    requant_targets: Optional[Callable[[Any, Any], dict]] = None
    word_orders: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    validation: ValidationHooks = field(default_factory=ValidationHooks)
    output: OutputKind = field(default_factory=OutputKind)
    probe_companions: Optional[Callable[[Any], list]] = None
    arrange: Optional[Callable[[Any], Any]] = None
    tool_decode: Optional[Callable[[Any, Any, Optional[str]], Any]] = None
    prove_written: Optional[Callable[[Any, Path, Any], dict]] = None
    quantize_exclude: Optional[Callable[[Any, Optional[int]], bool]] = None

    def target_reason(self, spec: TensorSpec, options: Mapping[str, Any] | None = None) -> str | None:
        """``check_target(spec, options)`` with the write ``options`` it understands
        (:attr:`target_options`); None when the format has no ``check_target``."""
        if self.check_target is None:
            return None
        return self.check_target(spec, self.target_options.from_write_options(options))


    def model_reason(self, specs) -> str | None:
        """``check_model(specs)``: None when the format has no model-wide rule or ``specs`` satisfy it."""
        return self.check_model(list(specs)) if self.check_model is not None else None


_REGISTRY: dict[str, FormatHandler] = {}


def register(handler: FormatHandler) -> FormatHandler:
    """Add a handler; the name must be new."""
    if handler.name in _REGISTRY:
        raise ValueError(f"format {handler.name!r} registered twice")
    _REGISTRY[handler.name] = handler
    return handler


def _ensure_loaded() -> None:
    # lazy: each format module imports this one (register); importing them here at module level would be a cycle
    from converter.formats import _builtin  # noqa: F401  (registers the built-in formats)


def formats() -> dict[str, FormatHandler]:
    """All registered handlers by name."""
    _ensure_loaded()
    return dict(_REGISTRY)


def get(name: str) -> FormatHandler:
    """The handler called ``name``; raises UnknownFormatError listing the known names."""
    _ensure_loaded()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownFormatError("unknown format", field="format", expected=sorted(_REGISTRY), found=name) from None


def validation_hooks(name: str | None) -> ValidationHooks:
    """The validation hooks of format ``name`` (none for an unregistered name such as ``memory``)."""
    _ensure_loaded()
    handler = _REGISTRY.get(name or "")
    return handler.validation if handler is not None else ValidationHooks()


def word_orders(n: int) -> dict[str, tuple[int, ...]]:
    """The named in-word orders of ``n`` elements some registered format packs with
    (:attr:`FormatHandler.word_orders`), in registration order."""
    return {label: tuple(order) for h in formats().values() for label, order in h.word_orders.items()
            if len(order) == n}


def writable() -> list[str]:
    """Names of formats with a writer."""
    return sorted(n for n, h in formats().items() if h.write is not None)


#: Destination suffixes that name one file: a directory writer refuses them (``--to awq out.safetensors``
#: would make a directory called ``out.safetensors``).
FILE_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".json", ".npz")


def check_writable(name: str, dst: "str | Path | None" = None) -> FormatHandler:
    """The handler called ``name`` if it has a writer (and, given ``dst``, one that can write there).

    Raises
    ------
    UnknownFormatError
        No such format (the known names are listed).
    UnsupportedError
        The format is read-only (the writable names are listed); or its writer makes a model directory
        and ``dst`` ends in a file suffix (``.safetensors``, ``.gguf`` ...), the directory name suggested.
    """
    handler = get(name)
    if handler.write is None:
        raise UnsupportedError("format has no writer", field="--to", expected=writable(), found=name)
    if dst is not None and handler.output.suffix is None and Path(dst).suffix.lower() in FILE_SUFFIXES:
        raise UnsupportedError(f"{name} writes a model directory (config.json and safetensors shards), not one file",
                               file=dst, field="DST", expected="a directory name", found=Path(dst).name,
                               hint=f"e.g. {Path(dst).with_suffix('')}")
    return handler


def detect(source: Source) -> Detection:
    """The single best detection for ``source``.

    Only :class:`~converter.errors.ConverterError` escapes: a detector's unexpected exception on
    foreign data becomes :class:`~converter.errors.MalformedInputError` naming the file.

    Raises
    ------
    UnknownFormatError
        When no format claims the input, or when the top claims tie (candidates listed).
    """
    return guarded(_detect, source.path, "format detection")(source)


def _detect(source: Source) -> Detection:
    _ensure_loaded()
    if source.kind != "gguf":  # a foreign format's signature wins over any claim (refused by name)
        foreign.refuse_config({"quantization_config": source.quantization_config}, source.path)
        foreign.refuse_tensors(source.tensor_names(), source.path)
    claims = [d for h in _REGISTRY.values() if (d := h.detect(source)) is not None]
    if not claims:
        raise UnknownFormatError("no registered format recognises this input", file=source.path,
                                 expected=sorted(_REGISTRY), found=source.describe())
    claims.sort(key=lambda d: -d.confidence)
    top = [d for d in claims if d.confidence == claims[0].confidence]
    if len(top) > 1:
        raise UnknownFormatError("ambiguous format", file=source.path,
                                 expected="one format", found="; ".join(f"{d.format} ({d.reason})" for d in top),
                                 hint="pass the format explicitly")
    return top[0]


def read(source: Source, fmt: "str | FormatHandler | None" = None):
    """Read ``source`` with format ``fmt`` (auto-detected when ``None``) into a lazy Checkpoint.

    ``fmt`` may also be a :class:`FormatHandler` (a probe testing an unregistered variant).

    The one entry point to a format's reader: only :class:`~converter.errors.ConverterError`
    escapes, from detection, from reading and from loading each tensor later (``ckpt[name]``,
    ``ckpt.items()``): a reader's unexpected exception on foreign data becomes
    :class:`~converter.errors.MalformedInputError` naming the file (and tensor).

    Raises
    ------
    UnknownFormatError
        ``fmt`` is not registered, or detection fails.
    ConverterError
        Whatever the reader raises (with the file filled in).
    """
    handler = fmt if isinstance(fmt, FormatHandler) else get(fmt or detect(source).format)
    ckpt = guarded(handler.read, source.path, handler.name)(source)
    ckpt._loader = guarded(ckpt._loader, source.path, handler.name)
    if ckpt._row_blocks is not None:  # (the same net around the row blocks a reader makes, block by block)
        ckpt._row_blocks = guarded_row_blocks(ckpt._row_blocks, source.path, handler.name)
    return ckpt



def load(path: str | Path, *, format: str | None = None):
    """Read a checkpoint from ``path``, auto-detecting its format unless ``format`` is given.

    ``read(Source(path, prefer=format), format)``: only :class:`~converter.errors.ConverterError` escapes
    (``format`` also picks the model of a folder holding a GGUF and a safetensors model).
    """
    return read(Source(path, prefer=format), format)
