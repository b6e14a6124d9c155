"""The command line's quantization vocabulary, defined once: dtype aliases and granularities.

The ``qckpt`` options (``--dtype``, ``--scale-dtype``, ``--per-tensor`` / ``--per-channel`` /
``--group-size``), the requantization :class:`~converter.quant.requant.Target` and the
``quantize`` options all read their words from here, so an alias or a granularity is added in
one place.
"""

from __future__ import annotations

from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT

#: Lower-case float dtype names of the command line -> safetensors dtype names.
FLOAT_DTYPE_ALIASES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}

#: ``--scale-dtype`` choices, in the order ``--help`` lists them.
SCALE_DTYPE_CHOICES = ("f16", "bf16", "f32")

#: ``dequantize --dtype`` choices, in the order ``--help`` lists them.
DENSE_DTYPE_CHOICES = ("f32", "f16", "bf16")

#: The option naming a quantization type the target format defines by name (GGUF: ``Q4_K_M``, ``Q6_K``, ``Q8_0``
#: ...): the target format's quantizer resolves it per tensor (:attr:`converter.quant.requant.Target.quant_type`).
QUANT_TYPE_OPTION = "--quant-type"

#: Granularities a user can ask for (``flat_block`` is a storage fact of some formats, not a target).
GRANULARITIES = (Granularity.TENSOR.value, Granularity.CHANNEL.value, Granularity.GROUP.value)

#: The option naming each granularity, in the order usage messages list them.
GRANULARITY_OPTIONS = (("--per-tensor", Granularity.TENSOR.value), ("--per-channel", Granularity.CHANNEL.value),
                       ("--group-size", Granularity.GROUP.value))


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
    granularity = Granularity(granularity)
    if granularity is Granularity.TENSOR:
        return GroupMap.per_tensor()
    if granularity is Granularity.CHANNEL:
        return GroupMap.per_channel(OUT)
    return GroupMap.per_group(int(group_size), IN)
