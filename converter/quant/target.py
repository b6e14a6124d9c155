"""A requantization target (:class:`Target`) and its concrete scheme and groups (:func:`resolve`)."""

from __future__ import annotations

from dataclasses import dataclass

from converter.errors import UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.quant.format_quant import FormatQuantizer
from converter.scheme import QuantScheme, ZeroPoint
from converter.codebooks import ELEMENTS
from converter.vocabulary import (FP8_ELEMENTS, FP8_GRANULARITY_OPTIONS, GRANULARITIES, SCALE_DTYPE_CHOICES,
                                  float_dtype_name, group_map_for)

# Scale dtype widenings that are exact for every finite value of the source dtype.
_WIDER = {
    "F16": {"F16", "F32"},
    "BF16": {"BF16", "F32"},
    "F32": {"F32"},
    "F8_E4M3": {"F8_E4M3", "F16", "BF16", "F32"},
    "F8_E8M0": {"F8_E8M0", "BF16", "F32"},
}

#: Granularities a target can ask for (the command line's, :data:`converter.vocabulary.GRANULARITIES`).
_TARGET_GRANULARITIES = tuple(Granularity(g) for g in GRANULARITIES)
#: Granularities of an FP8 (``element``) target.
_FP8_GRANULARITIES = tuple(Granularity(g) for _, g in FP8_GRANULARITY_OPTIONS)


@dataclass(frozen=True)
class Target:
    """A requantization target; ``None`` fields keep the source's value.

    Parameters
    ----------
    bits : int, optional
        Bits per code (2..8).
    granularity : Granularity (or its name ``"tensor" | "channel" | "group"``), optional
        ``channel`` = one scale per output channel; ``group`` = groups of ``group_size`` along ``in``
        (in column order, no ``g_idx``).
    group_size : int, optional
        Required with ``granularity="group"``.
    symmetric : bool, optional
        True: implicit centre, no zero point. False: integer zero points (a float-bias source
        stays float-bias only when ``symmetric`` is left out).
    scale_dtype : ``"F16" | "BF16" | "F32"``, optional
    scale_search : ``"none" | "mse"``
        ``mse``: per group, the clipping ratio minimising the squared error (lossy path only).
    float_bias : ``"keep" | "integer" | "symmetric"``
        With ``symmetric`` left out, what a float-bias source tensor (GGUF Q4_1, MLX affine) becomes:
        ``keep`` its float biases (targets that store them), ``integer`` zero points (GPTQ, AWQ:
        asymmetric with integer zero points), or ``symmetric`` (compressed-tensors, whose asymmetric
        layout transformers 5.24 cannot load). Set from the target format, not by the user.
    quant_type : str, optional
        A type the target format defines by name (``--quant-type``).
    types_from : str, optional
        Path of an existing checkpoint of the target format whose per-tensor types the target format's quantizer
        gives each tensor of the same name (``--gguf-types-from``; GGUF:
        :mod:`converter.formats.gguf.types_from`).
    element : ``"e4m3" | "e5m2"``, optional
        Requantize to this FP8 element (``--fp8``; :data:`converter.codebooks.ELEMENTS`) with absmax
        scales (:func:`converter.quant.float_quant.quantize_float`); the granularity is then
        ``tensor``, ``channel`` or ``block`` (default ``channel``), never ``group``.
    block : ``(out, in)`` extents, optional
        With ``granularity="block"``: one scale per ``out x in`` block (None: the axis whole).
    """

    bits: int | None = None
    granularity: Granularity | None = None
    group_size: int | None = None
    symmetric: bool | None = None
    scale_dtype: str | None = None
    scale_search: str = "none"
    float_bias: str = "keep"
    quant_type: str | None = None
    types_from: str | None = None
    element: str | None = None
    block: tuple[int | None, int | None] | None = None

    def __post_init__(self) -> None:
        if self.element is not None:
            self._check_element()
            return
        if self.types_from is not None and (self.quant_type is not None or self.scale_search != "none" or any(
                v is not None for v in (self.bits, self.granularity, self.group_size, self.symmetric,
                                        self.scale_dtype, self.block))):
            raise UnsupportedError("the types come from the given file: no other target option", field="types_from",
                                   found=self.types_from, hint="drop --quant-type / --bits / --group-size ...")
        if self.block is not None:
            raise UnsupportedError("--block needs --fp8", field="--block", found=self.block,
                                   hint="integer targets: --per-tensor, --per-channel, --group-size")
        if self.granularity is None and self.group_size is not None:
            object.__setattr__(self, "granularity", Granularity.GROUP)
        if self.granularity is not None:
            if self.granularity not in _TARGET_GRANULARITIES:
                raise UnsupportedError("unknown granularity", field="granularity",
                                       expected=[g.value for g in _TARGET_GRANULARITIES], found=self.granularity)
            object.__setattr__(self, "granularity", Granularity(self.granularity))
        if self.granularity is Granularity.GROUP and not self.group_size:
            raise UnsupportedError("group granularity needs a group size", field="--group-size", expected=">= 1",
                                   found=self.group_size)
        if self.granularity in (Granularity.TENSOR, Granularity.CHANNEL) and self.group_size is not None:
            raise UnsupportedError(f"{self.granularity.value} granularity takes no group size", field="--group-size",
                                   found=self.group_size)
        if self.bits is not None and not 2 <= int(self.bits) <= 8:
            raise UnsupportedError("bits out of range", field="--bits", expected="2..8", found=self.bits)
        self._normalize_scale_dtype()
        if self.scale_search not in ("none", "mse"):
            raise UnsupportedError("unknown scale search", field="--scale-search", expected=["none", "mse"],
                                   found=self.scale_search)

    def _normalize_scale_dtype(self) -> None:
        """``scale_dtype`` as a storage dtype name (``f16`` -> ``F16``); UnsupportedError names the choices."""
        if self.scale_dtype is not None:
            sd = float_dtype_name(self.scale_dtype)
            if sd is None:
                raise UnsupportedError("unknown scale dtype", field="--scale-dtype", expected=list(SCALE_DTYPE_CHOICES),
                                       found=self.scale_dtype)
            object.__setattr__(self, "scale_dtype", sd)

    def _check_element(self) -> None:
        if self.element not in FP8_ELEMENTS:
            raise UnsupportedError("unknown FP8 element", field="--fp8", expected=list(FP8_ELEMENTS),
                                   found=self.element)
        if self.bits not in (None, 8) or self.symmetric is False or self.group_size is not None:
            found = ("--asym" if self.symmetric is False else f"--group-size {self.group_size}"
                     if self.group_size is not None else f"--bits {self.bits}")
            raise UnsupportedError("an FP8 target is 8-bit, symmetric, per tensor / channel / block", field="--fp8",
                                   expected="--per-tensor | --per-channel | --block OUTxIN", found=found)
        gran = Granularity(self.granularity) if self.granularity is not None else (
            Granularity.BLOCK if self.block is not None else Granularity.CHANNEL)
        if gran not in _FP8_GRANULARITIES or (gran is Granularity.BLOCK) != (self.block is not None):
            raise UnsupportedError("FP8 granularity", field="--fp8", expected=list(dict(FP8_GRANULARITY_OPTIONS)),
                                   found=gran.value)
        object.__setattr__(self, "granularity", gran)
        object.__setattr__(self, "bits", 8)
        object.__setattr__(self, "symmetric", True)
        self._normalize_scale_dtype()
        if self.scale_search != "none":
            raise UnsupportedError("--scale-search does not apply to --fp8 (absmax scales)", field="--scale-search",
                                   found=self.scale_search)

    def group_map(self) -> GroupMap | None:
        """The target group map of an ``(out, in)`` weight, None when the source's is kept."""
        if self.granularity is None:
            return None
        if self.granularity is Granularity.BLOCK:
            return GroupMap.per_block(*self.block)
        return group_map_for(self.granularity, self.group_size)

    @property
    def named_types(self) -> bool:
        """True when the target format's quantizer chooses each tensor's type by name (``quant_type`` or
        ``types_from``): no scheme fields to resolve or complete."""
        return self.quant_type is not None or self.types_from is not None

    def is_identity(self) -> bool:
        """True when no field asks for a change (only a repack)."""
        return (self.bits is None and self.granularity is None and self.symmetric is None
                and self.scale_dtype is None and self.scale_search == "none" and self.quant_type is None
                and self.element is None and self.types_from is None)

    def to_json(self) -> dict:
        gran = self.granularity.value if self.granularity is not None else None
        out = {"bits": self.bits, "granularity": gran, "group_size": self.group_size,
               "symmetric": self.symmetric, "scale_dtype": self.scale_dtype, "scale_search": self.scale_search}
        if self.quant_type is not None:
            out["quant_type"] = self.quant_type
        if self.types_from is not None:
            out["types_from"] = self.types_from
        if self.element is not None:
            out["element"] = self.element
            if self.block is not None:
                out["block"] = {"out": self.block[0], "in": self.block[1]}
        return out


def _scale_dtype_only(scheme: QuantScheme, target: Target) -> bool:
    """``target`` asks a codebook ``scheme`` for another float scale dtype and nothing else. A ``--bits``
    given (even the codebook's own width: ``--bits 4`` on MXFP4) asks for an integer grid."""
    return (target.scale_dtype is not None and target.granularity is None and target.symmetric is None
            and target.bits is None and target.scale_search == "none")


def resolve(scheme: QuantScheme, group_map: GroupMap, target: Target,
            fmt: FormatQuantizer | None = None) -> tuple[QuantScheme, GroupMap]:
    """The concrete target scheme and group map for a source ``scheme`` / ``group_map``.

    Left-out options keep the source's value. A codebook source (NF4/FP4, the FP8 elements) has no
    affine grid: its target is a signed symmetric integer scheme unless ``--asym`` is given; asked
    only for another scale dtype (``--scale-dtype``), it keeps its codebook.
    The lossy route rounds half to even, so the target's ``rounding`` is ``half_even``
    when anything but the layout changes, unless a format quantizer produces the target.
    ``fmt`` (a :class:`converter.quant.format_quant.FormatQuantizer` of the target format) then
    adapts the result to the format's own form, or refuses it (NotRepresentableError naming the
    option).
    """
    bits = int(target.bits) if target.bits is not None else scheme.bits
    sd = target.scale_dtype or scheme.scale_dtype
    if target.element is not None:  # an FP8 element with absmax scales (F8 source scale dtypes go to F32)
        sd = sd if sd in ("F16", "BF16", "F32") else "F32"
        new = QuantScheme(8, False, scale_dtype=sd, codebook=ELEMENTS[target.element].values)
        gm = target.group_map()
        if fmt is not None:
            new, gm = fmt.adapt(new, gm, target)
        return new, gm
    if scheme.codebook is not None:
        if target.is_identity():
            return scheme, group_map
        if _scale_dtype_only(scheme, target):  # the same codebook (E4M3 ...), its scales re-stored
            return scheme.replace(scale_dtype=sd), group_map
        sym = True if target.symmetric is None else target.symmetric
        zp, signed = (ZeroPoint.NONE, True) if sym else (ZeroPoint.INTEGER, False)
    else:
        sym = scheme.symmetric if target.symmetric is None else target.symmetric
        if target.symmetric is None and scheme.zero_point is ZeroPoint.FLOAT and target.float_bias == "symmetric":
            sym = True
        if sym:
            zp, signed = ZeroPoint.NONE, scheme.signed if scheme.symmetric else True
        elif target.symmetric is None and not (target.float_bias == "integer" and scheme.zero_point is ZeroPoint.FLOAT):
            zp, signed = scheme.zero_point, scheme.signed  # asymmetric source kept as is (integer zero or float bias)
        elif scheme.zero_point is ZeroPoint.INTEGER:
            zp, signed = ZeroPoint.INTEGER, scheme.signed
        else:  # --asym: integer zero points (a float-bias source is re-expressed or requantized)
            zp, signed = ZeroPoint.INTEGER, False
    if sd not in ("F16", "BF16", "F32") and (sd != scheme.scale_dtype or bits != scheme.bits
                                             or scheme.codebook is not None):
        # an F8 source scale dtype is kept only by an exact carry; requantized scales go to F32 (an
        # FP4 source's E4M3 / E8M0 scales never scale an integer grid, even at the same bit width)
        sd = "F32"
    new = QuantScheme(bits, signed=signed, zero_point=zp, scale_dtype=sd, rounding=scheme.rounding)
    gm = group_map if target.granularity is None else group_map_for(target.granularity, target.group_size)
    if fmt is not None:
        new, gm = fmt.adapt(new, gm, target)
    return new, gm
