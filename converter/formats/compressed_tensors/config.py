"""compressed-tensors ``quantization_config``: parse it into typed weight arguments (emitting it:
:mod:`converter.formats.compressed_tensors.config_emit`).

The reader trusts nothing in the config until it is parsed here; everything downstream gets
:class:`WeightArgs` (bits, symmetric, strategy, group size, act-order) and :class:`ConfigGroup`
(targets, format). FORMATS.md section 3.1; sources:
``compressed_tensors/quantization/quant_config.py`` ``QuantizationConfig``,
``quantization/quant_args.py`` ``QuantizationArgs`` (``validate_model_after`` strategy inference),
``config/base.py`` ``CompressionFormat``, ``utils/match.py`` (``re:`` targets, module names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from converter.errors import ErrorKind, FormatError, UnsupportedError

QUANT_METHOD = "compressed-tensors"
#: Integer formats this module reads and writes.
READ_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")
#: The float format (FP8 ``weight`` + ``weight_scale``; ``FloatQuantizationCompressor``), read and written.
FLOAT_FORMAT = "float-quantized"
#: The FP4 (E2M1) formats: ``NVFP4PackedCompressor`` / ``MXFP4PackedCompressor`` (compressors/nvfp4, mxfp4).
NVFP4_FORMAT = "nvfp4-pack-quantized"
MXFP4_FORMAT = "mxfp4-pack-quantized"
FP4_FORMATS = (NVFP4_FORMAT, MXFP4_FORMAT)
#: Formats that are valid compressed-tensors but not read here (honest refusal).
REFUSED_FORMATS = ("mxfp6-pack-quantized", "mxfp8-quantized", "marlin-24", "sparse-bitmask", "sparse-24-bitmask")
KNOWN_FORMATS = READ_FORMATS + (FLOAT_FORMAT,) + FP4_FORMATS + REFUSED_FORMATS + ("dense", "mixed-precision")
#: FP4 strategies and group sizes (``can_compress``: NVFP4 group 16 ``tensor_group``, MXFP4 group 32 ``group``).
FP4_STRATEGY = {NVFP4_FORMAT: "tensor_group", MXFP4_FORMAT: "group"}
FP4_GROUP = {NVFP4_FORMAT: 16, MXFP4_FORMAT: 32}
#: ``scale_dtype`` as the presets write it (``NVFP4A16``: E4M3; ``MXFP4A16``: uint8 E8M0 exponents).
FP4_SCALE_DTYPE = {NVFP4_FORMAT: "torch.float8_e4m3fn", MXFP4_FORMAT: "torch.uint8"}
STRATEGIES = ("tensor", "channel", "group")
#: Strategies of ``type: "float"`` weights read here (``block`` with ``block_structure: [bo, bi]``).
FLOAT_STRATEGIES = ("tensor", "channel", "block")
#: Version written by default (the one that made sample_checkpoints/ct_*).
DEFAULT_VERSION = "0.20.1"
#: First version with dense (stream) packing of 3/5/6/7-bit codes (PR #732; FORMATS.md section 3.4).
DENSE_SINCE = (0, 18)
#: Last version family that stored ``weight_g_idx`` for ``actorder: "group"`` (FORMATS.md section 3.2).
G_IDX_UNTIL = (0, 12)
ACTORDER_MSG = "actorder requires strategy=group and a g_idx of length I"


def parse_version(text: Any) -> tuple[int, ...] | None:
    """``"0.20.1"`` -> ``(0, 20, 1)``; ``"0.9.4.dev3"`` -> ``(0, 9, 4)``; None when absent/unparsable."""
    if not isinstance(text, str):
        return None
    m = re.match(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def packing_for(version: tuple[int, ...] | None, bits: int) -> str | None:
    """Packing layout of ``pack_to_int32`` for ``bits`` under a package version.

    ``"stream"`` (dense, >= 0.18) or ``"padded"`` (``32 // bits`` per word, <= 0.17). Widths that
    divide 32 pack identically either way (``"stream"``). ``None`` when the version is unknown and
    the layouts differ (the caller decides from the shape, FORMATS.md pitfall 8).
    """
    if 32 % bits == 0:
        return "stream"
    if version is None:
        return None
    return "stream" if version[:2] >= DENSE_SINCE else "padded"


@dataclass(frozen=True)
class WeightArgs:
    """The ``weights`` arguments of one config group (integer weights only).

    Attributes
    ----------
    bits : int (1..8); symmetric : bool
    strategy : ``"tensor" | "channel" | "group"``
    group_size : int or None (group strategy only)
    actorder : str or None (``"group"``, ``"weight"``, ``"static"``, ``"dynamic"``; ``True`` -> ``"group"``)
    """

    bits: int
    symmetric: bool
    strategy: str
    group_size: int | None
    actorder: str | None = None
    type: str = "int"
    block: tuple[int, int] | None = None
    scale_dtype: str | None = None

    @property
    def fp4_format(self) -> str | None:
        """``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized`` for 4-bit float weights, else None."""
        if self.type != "float" or self.bits != 4:
            return None
        return MXFP4_FORMAT if self.strategy == "group" and self.group_size == 32 else NVFP4_FORMAT


@dataclass(frozen=True)
class ActivationArgs:
    """The ``input_activations`` of one config group: ``type`` (``"float"`` / ``"int"``), ``bits``,
    ``strategy`` (``"tensor"``, ``"token"``, ``"group"`` ...), ``dynamic`` (True: scales computed at run
    time, nothing stored; False: a static ``<module>.input_scale``) and ``group_size`` (``group``
    strategy: ``FP8_BLOCK``'s 128). Runtime metadata, never applied to weights."""

    type: str
    bits: int
    strategy: str | None
    dynamic: bool
    group_size: int | None = None

    def describe(self) -> str:
        how = "dynamic" if self.dynamic else "static"
        size = f" {self.group_size}" if self.strategy == "group" and self.group_size else ""
        return f"{self.type} {self.bits}-bit {how} per-{self.strategy or 'tensor'}{size}"

    def metadata_value(self) -> str:
        """The ``ckpt.metadata["activations"]`` value: ``static``, ``dynamic`` or ``dynamic:group:<n>``."""
        if not self.dynamic:
            return "static"
        return f"dynamic:group:{self.group_size}" if self.strategy == "group" and self.group_size else "dynamic"


@dataclass(frozen=True)
class ConfigGroup:
    """One entry of ``config_groups``: targets and the weight arguments (None: weights unquantized).

    ``unreadable`` is the :class:`~converter.errors.UnsupportedError` for a group this reader cannot
    decode (a refused format, an unsupported strategy): in a mixed config only that group's modules
    are unreadable (opaque), the rest read normally.
    """

    name: str
    targets: tuple[str, ...]
    weights: WeightArgs | None
    format: str | None
    input_activations: ActivationArgs | None = None
    unreadable: UnsupportedError | None = None


@dataclass(frozen=True)
class CTConfig:
    """A parsed ``quantization_config``."""

    format: str | None
    version: str | None
    groups: tuple[ConfigGroup, ...]
    ignore: tuple[str, ...]
    raw: Mapping[str, Any]

    @property
    def version_tuple(self) -> tuple[int, ...] | None:
        return parse_version(self.version)

    def group_for(self, module: str) -> ConfigGroup | None:
        """The first config group whose targets match ``module`` (None when ignored / unmatched).

        A target is ``"Linear"`` (class name: any module holding a 2-D weight qualifies, as class
        names are not in the file), ``"re:<regex>"`` (``re.match`` on the module name) or a module
        name (exact, or as a dotted suffix).
        """
        if any(_matches(p, module) for p in self.ignore):
            return None
        for g in self.groups:
            if any(_matches(t, module, class_ok=True) for t in g.targets):
                return g
        return None


def _check_str_list(value: Any, *, file, field: str) -> None:
    """``targets`` / ``ignore`` must be a list of strings (checked where config.json enters)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise FormatError("must be a string or a list of strings", file=file, field=field,
                          expected="list of str", found=repr(value)[:80])


def _matches(pattern: str, module: str, *, class_ok: bool = False) -> bool:
    if pattern.startswith("re:"):
        try:
            return re.match(pattern[3:], module) is not None
        except re.error:
            return False
    if class_ok and pattern == "Linear":
        return True
    return module == pattern or module.endswith("." + pattern)


def _weight_args(obj: Any, *, file: Any, field: str) -> WeightArgs:
    if not isinstance(obj, Mapping):
        raise FormatError("weights arguments must be an object", file=file, field=field, found=type(obj).__name__)
    qtype = obj.get("type", "int")
    bits = obj.get("num_bits", 8)
    if qtype == "float":
        return _float_weight_args(obj, bits, file=file, field=field)
    if qtype != "int":
        raise UnsupportedError(f"{qtype} weight quantization is not read by the compressed-tensors reader",
                               file=file, field=field + ".type", expected=["int", "float"], found=qtype)
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise FormatError("num_bits must be an integer in 1..8", file=file, field=field + ".num_bits",
                          expected="1..8", found=bits)
    gs = obj.get("group_size")
    strategy = obj.get("strategy")
    if strategy is None:  # QuantizationArgs.validate_model_after
        strategy = "tensor" if gs is None else ("channel" if gs == -1 else "group")
    if strategy in ("block", "tensor_group", "token", "attn_head"):
        raise UnsupportedError(f"strategy {strategy!r} is not supported for weights", file=file,
                               field=field + ".strategy", expected=list(STRATEGIES), found=strategy)
    if strategy not in STRATEGIES:
        raise FormatError("unknown strategy", file=file, field=field + ".strategy", expected=list(STRATEGIES),
                          found=strategy)
    if strategy == "group":
        if isinstance(gs, bool) or not isinstance(gs, int) or gs < 1:
            raise FormatError("group strategy needs a positive group_size", file=file,
                              field=field + ".group_size", expected=">= 1", found=gs)
    else:
        gs = None
    actorder = obj.get("actorder")
    if actorder is True:
        actorder = "group"
    if actorder is False:
        actorder = None
    if actorder is not None and strategy != "group":  # CASES.md B12
        raise FormatError(ACTORDER_MSG, file=file, field=field + ".actorder", expected="null for strategy "
                          f"{strategy!r}", found=actorder, hint="remove actorder (act-order has no meaning "
                          "without groups; llm-compressor PR #1815)")
    symmetric = obj.get("symmetric", True)
    if not isinstance(symmetric, bool):
        raise FormatError("symmetric must be a boolean", file=file, field=field + ".symmetric", found=symmetric)
    return WeightArgs(bits=bits, symmetric=symmetric, strategy=strategy, group_size=gs, actorder=actorder)



def _float_weight_args(obj: Mapping, bits: Any, *, file: Any, field: str) -> WeightArgs:
    """``type: "float"`` weights: 8 bits, symmetric, strategy tensor / channel / block
    (``QuantizationArgs`` 0.20.1: ``pytorch_dtype`` is ``float8_e4m3fn`` for 8-bit floats), or 4 bits
    (E2M1, :func:`_fp4_weight_args`)."""
    if bits == 4 and not isinstance(bits, bool):
        return _fp4_weight_args(obj, file=file, field=field)
    if bits != 8 or isinstance(bits, bool):
        raise UnsupportedError(f"{bits}-bit float weights are not read by the compressed-tensors reader "
                               "(float-quantized is 8-bit, nvfp4/mxfp4-pack-quantized 4-bit)", file=file,
                               field=field + ".num_bits", expected=[4, 8], found=bits)
    gs = obj.get("group_size")
    strategy = obj.get("strategy")
    if strategy is None:  # QuantizationArgs.validate_model_after
        strategy = ("block" if obj.get("block_structure") else
                    "tensor" if gs is None else ("channel" if gs == -1 else "group"))
    if strategy not in FLOAT_STRATEGIES:
        raise UnsupportedError(f"strategy {strategy!r} is not supported for float weights", file=file,
                               field=field + ".strategy", expected=list(FLOAT_STRATEGIES), found=strategy)
    symmetric = obj.get("symmetric", True)
    if symmetric is not True:
        raise UnsupportedError("asymmetric float weights are not supported", file=file, field=field + ".symmetric",
                               expected=True, found=symmetric)
    if obj.get("actorder") not in (None, False):
        raise FormatError(ACTORDER_MSG, file=file, field=field + ".actorder", expected=None, found=obj["actorder"])
    block = None
    if strategy == "block":
        bs = obj.get("block_structure")
        if (not isinstance(bs, (list, tuple)) or len(bs) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bs)):
            raise FormatError("block strategy needs block_structure [block_out, block_in] of positive integers",
                              file=file, field=field + ".block_structure", expected="[bo, bi]", found=bs)
        block = (int(bs[0]), int(bs[1]))
    return WeightArgs(bits=8, symmetric=True, strategy=strategy, group_size=None, type="float", block=block)


def _fp4_weight_args(obj: Mapping, *, file: Any, field: str) -> WeightArgs:
    """4-bit float (E2M1) weights: symmetric, strategy ``tensor_group`` (NVFP4: group 16, E4M3 scales and a
    ``weight_global_scale``) or ``group`` (MXFP4: group 32, E8M0 exponents); ``QuantizationArgs``
    ``validate_model_after`` infers ``group`` from a group size (0.20.1)."""
    gs = obj.get("group_size")
    strategy = obj.get("strategy") or ("group" if isinstance(gs, int) and gs > 0 else None)
    if strategy not in ("tensor_group", "group"):
        raise UnsupportedError(f"strategy {strategy!r} is not supported for 4-bit float weights", file=file,
                               field=field + ".strategy", expected=["tensor_group", "group"], found=strategy)
    if isinstance(gs, bool) or not isinstance(gs, int) or gs < 1:
        raise FormatError("4-bit float weights need a positive group_size", file=file, field=field + ".group_size",
                          expected="16 (NVFP4) or 32 (MXFP4)", found=gs)
    if obj.get("symmetric", True) is not True:
        raise UnsupportedError("asymmetric FP4 weights are not supported (NVFP4PackedCompressor: symmetric only)",
                               file=file, field=field + ".symmetric", expected=True, found=obj.get("symmetric"))
    if obj.get("actorder") not in (None, False):
        raise FormatError(ACTORDER_MSG, file=file, field=field + ".actorder", expected=None, found=obj["actorder"])
    sd = obj.get("scale_dtype")
    if sd is not None and not isinstance(sd, str):
        raise FormatError("scale_dtype must be a torch dtype name", file=file, field=field + ".scale_dtype",
                          expected="e.g. torch.uint8", found=repr(sd)[:40])
    return WeightArgs(bits=4, symmetric=True, strategy=strategy, group_size=gs, type="float", scale_dtype=sd)


def _activation_args(obj: Any, *, file: Any, field: str) -> ActivationArgs | None:
    if obj is None:
        return None
    if not isinstance(obj, Mapping):
        raise FormatError("input_activations must be an object or null", file=file, field=field,
                          found=type(obj).__name__)
    dynamic = obj.get("dynamic", False)
    if dynamic not in (True, False, "local"):
        raise FormatError("input_activations.dynamic must be a boolean", file=file, field=field + ".dynamic",
                          expected="true / false", found=dynamic)
    bits = obj.get("num_bits", 8)
    gs = obj.get("group_size")
    return ActivationArgs(type=str(obj.get("type", "int")), bits=bits if isinstance(bits, int) else 8,
                          strategy=obj.get("strategy"), dynamic=dynamic is not False,
                          group_size=gs if isinstance(gs, int) and not isinstance(gs, bool) and gs > 0 else None)


def _check_format(fmt: Any, *, file: Any, field: str) -> None:
    """Raise FormatError for an unknown format, UnsupportedError for a refused one."""
    if fmt is None:
        return
    if fmt not in KNOWN_FORMATS:
        raise FormatError("unknown compressed-tensors format", file=file, field=field,
                          expected=list(KNOWN_FORMATS), found=fmt)
    if fmt in REFUSED_FORMATS:
        raise UnsupportedError(f"compressed-tensors format {fmt!r} is not supported", file=file, field=field,
                               expected=list(READ_FORMATS + (FLOAT_FORMAT,)), found=fmt)


def parse_config(qc: Any, *, file: Any = None) -> CTConfig:
    """Parse and validate a compressed-tensors ``quantization_config``.

    Raises
    ------
    FormatError
        Not compressed-tensors, malformed groups, actorder on a non-group strategy (B12).
    UnsupportedError
        A format or strategy this reader does not decode (named in the message).
    """
    if not isinstance(qc, Mapping) or qc.get("quant_method") != QUANT_METHOD:
        raise FormatError("not a compressed-tensors quantization_config", file=file,
                          field="quantization_config.quant_method", expected=QUANT_METHOD,
                          found=qc.get("quant_method") if isinstance(qc, Mapping) else qc)
    fmt = qc.get("format")
    _check_format(fmt if fmt not in REFUSED_FORMATS else None, file=file, field="quantization_config.format")
    status = qc.get("quantization_status")
    if status not in (None, "compressed"):
        raise UnsupportedError("only compressed checkpoints are read", file=file,
                               field="quantization_config.quantization_status", expected="compressed", found=status)
    if qc.get("sparsity_config") and not isinstance(qc["sparsity_config"], Mapping):
        raise FormatError("sparsity_config must be an object", file=file, field="quantization_config.sparsity_config",
                          expected="object", found=type(qc["sparsity_config"]).__name__)
    if qc.get("sparsity_config") and qc["sparsity_config"].get("format") not in (None, "dense"):
        raise UnsupportedError("sparse compressed-tensors checkpoints are not supported", file=file,
                               field="quantization_config.sparsity_config.format",
                               found=qc["sparsity_config"]["format"])
    groups_obj = qc.get("config_groups") or {}
    if not isinstance(groups_obj, Mapping):
        raise FormatError("config_groups must be an object", file=file, field="quantization_config.config_groups")
    groups = []
    for gname, g in groups_obj.items():
        field = f"quantization_config.config_groups.{gname}"
        if not isinstance(g, Mapping):
            raise FormatError("config group must be an object", file=file, field=field, kind=ErrorKind.CONFIG_MISMATCH)
        targets = g.get("targets") or []
        if isinstance(targets, str):
            targets = [targets]
        _check_str_list(targets, file=file, field=field + ".targets")
        gfmt = g.get("format")
        acts = _activation_args(g.get("input_activations"), file=file, field=field + ".input_activations")
        w = g.get("weights")
        try:  # a group this reader cannot decode is recorded, not raised (mixed configs; see ConfigGroup)
            if gfmt is not None:
                _check_format(gfmt, file=file, field=field + ".format")
            elif w:
                _check_format(fmt, file=file, field="quantization_config.format")
            args = _weight_args(w, file=file, field=field + ".weights") if w else None
        except UnsupportedError as exc:
            groups.append(ConfigGroup(gname, tuple(targets), None, gfmt if gfmt is not None else fmt, acts, exc))
            continue
        groups.append(ConfigGroup(gname, tuple(targets), args, gfmt if gfmt is not None else fmt, acts))
    readable = [g for g in groups if g.unreadable is None and g.weights is not None]
    refused = [g for g in groups if g.unreadable is not None]
    if refused and not readable:  # nothing this reader could decode: refuse the checkpoint, as before
        raise refused[0].unreadable
    if not groups:
        _check_format(fmt, file=file, field="quantization_config.format")
    ignore = qc.get("ignore") or []
    if isinstance(ignore, str):
        ignore = [ignore]
    _check_str_list(ignore, file=file, field="quantization_config.ignore")
    return CTConfig(format=fmt, version=qc.get("version"), groups=tuple(groups), ignore=tuple(ignore), raw=qc)
