"""The command line's quantization vocabulary, defined once: dtype aliases, granularities, float
elements and block extents.

The ``qckpt`` options (``--dtype``, ``--scale-dtype``, ``--per-tensor`` / ``--per-channel`` /
``--group-size``), the requantization :class:`~converter.quant.requant.Target` and the
``quantize`` options all read their words from here, so an alias or a granularity is added in
one place.
"""

from __future__ import annotations

from typing import Any, Mapping, TYPE_CHECKING

if TYPE_CHECKING:
    from converter.groups import Granularity, GroupMap

# No module-level import of numpy / the model modules: `qckpt --help` reads the words below at start-up
# (issue 18); the granularity words are :class:`converter.groups.Granularity` values (tests/test_vocabulary.py).

#: Lower-case float dtype names of the command line -> safetensors dtype names.
FLOAT_DTYPE_ALIASES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}

#: ``--scale-dtype`` choices, in the order ``--help`` lists them.
SCALE_DTYPE_CHOICES = ("f16", "bf16", "f32")

#: The built-in formats by name, readable / writable, for ``--help`` without importing the formats
#: layer (tests/test_vocabulary.py checks them against the registry).
FORMAT_NAMES = ("awq", "bitsandbytes", "compressed-tensors", "fp8", "gguf", "gpt-oss", "gptq", "mlx", "modelopt",
                "native", "plain")
WRITABLE_FORMATS = ("awq", "compressed-tensors", "fp8", "gguf", "gpt-oss", "gptq", "mlx", "modelopt", "native",
                    "plain")

#: ``dequantize --dtype`` choices, in the order ``--help`` lists them.
DENSE_DTYPE_CHOICES = ("f32", "f16", "bf16")

#: The option naming a quantization type the target format defines by name (GGUF: ``Q4_K_M``, ``Q6_K``, ``Q8_0``
#: ...): the target format's quantizer resolves it per tensor (:attr:`converter.quant.requant.Target.quant_type`).
QUANT_TYPE_OPTION = "--quant-type"

#: Granularities a user can ask for (``flat_block`` is a storage fact of some formats, not a target).
GRANULARITIES = ("tensor", "channel", "group")

#: The option naming each granularity, in the order usage messages list them.
GRANULARITY_OPTIONS = (("--per-tensor", "tensor"), ("--per-channel", "channel"), ("--group-size", "group"))


#: ``quantize --fp8`` choices: the 8-bit float elements a weight is quantized to
#: (:data:`converter.codebooks.ELEMENTS`; the OCP FP8 formats E4M3 (``float8_e4m3fn``) and E5M2).
FP8_ELEMENTS = ("e4m3", "e5m2")

#: Granularities of a float-element (FP8) quantize target, with their options.
FP8_GRANULARITY_OPTIONS = (("--per-tensor", "tensor"), ("--per-channel", "channel"), ("--block", "block"))


def parse_block(text: str) -> tuple[int | None, int | None]:
    """Block extents ``OUTxIN`` of ``--block`` (``128x128``; ``1x128`` ...; ``*`` for an axis
    covered whole, e.g. ``*x128``) as ``(out, in)``.

    Raises
    ------
    ValueError
        Not two positive integers (or ``*``) separated by ``x``; the message says what was found.
    """
    parts = text.lower().replace(" ", "").split("x")
    if len(parts) != 2:
        raise ValueError(f"expected OUTxIN such as 128x128, found {text!r}")
    out: list[int | None] = []
    for p in parts:
        if p == "*":
            out.append(None)
        elif p.isdigit() and int(p) > 0:
            out.append(int(p))
        else:
            raise ValueError(f"block extents must be positive integers (or *), found {text!r}")
    if out == [None, None]:
        raise ValueError("a block of *x* is one scale per tensor: use --per-tensor")
    return out[0], out[1]


def float_dtype_name(name: str) -> str | None:
    """The safetensors name of a float dtype given as an alias (``"bf16"``) or by name (``"BF16"``).

    Returns ``None`` for any other name (the caller names the field in its error).
    """
    if name in FLOAT_DTYPE_ALIASES:
        return FLOAT_DTYPE_ALIASES[name]
    return name if name in FLOAT_DTYPE_ALIASES.values() else None


def granularity_options(per_tensor: bool, per_channel: bool, group_size: int | None) -> list[str]:
    """The granularity options given on a command line (``["--per-channel"]`` ...), in table order."""
    on = {"--per-tensor": per_tensor, "--per-channel": per_channel, "--group-size": group_size is not None}
    return [option for option, _ in GRANULARITY_OPTIONS if on[option]]


def granularity_of(option: str) -> str:
    """The granularity (``"tensor"`` / ``"channel"`` / ``"group"``) an option asks for."""
    return dict(GRANULARITY_OPTIONS)[option]


def group_map_for(granularity: Granularity | str, group_size: int | None = None) -> GroupMap:
    """The target group map of a weight ``(out, in)`` for a granularity name.

    Parameters
    ----------
    granularity : Granularity, or its name ``"tensor" | "channel" | "group"``
        ``channel``: one scale per index of ``out``; ``group``: groups of ``group_size`` along
        ``in``, in column order (no ``g_idx``).
    group_size : int, optional
        Elements per group (``group`` only; callers check it is given).
    """
    from converter.groups import Granularity, GroupMap  # lazy: numpy (start-up, see the top)
    from converter.layout import IN, OUT
    granularity = Granularity(granularity)
    if granularity is Granularity.TENSOR:
        return GroupMap.per_tensor()
    if granularity is Granularity.CHANNEL:
        return GroupMap.per_channel(OUT)
    return GroupMap.per_group(int(group_size), IN)


def writer_option_words(options: Mapping[str, Any] | None) -> list[str]:
    """The command-line words of writer options (``checkpoint_format`` -> ``--gptq-format v1|v2``,
    ``gguf_metadata`` -> ``--gguf-metadata FILE``), so a suggested command line writes what the user asked for."""
    words: list[str] = []
    for key, value in (options or {}).items():
        if key == "checkpoint_format" and value is not None:
            words += ["--gptq-format", {"gptq": "v1", "gptq_v2": "v2"}.get(str(value), str(value))]
        elif key == "gguf_metadata" and value is not None:
            words += ["--gguf-metadata", str(value)]
    return words
