"""QuantScheme: how integer codes map to real values.

Families (FORMATS.md section 0):

- ``zero_point="none"`` (symmetric): ``x = s * (q - c)`` with the implicit centre ``c`` = 0 for
  signed codes and ``2^(b-1)`` for unsigned codes (GPTQ sym, GGUF Q4_0/Q8_0, compressed-tensors
  sym, bitsandbytes int8).
- ``zero_point="integer"``: ``x = s * (q - z)`` with an integer zero point per group, in the code
  domain (GPTQ asym, AWQ, compressed-tensors asym). Format quirks such as GPTQ v1's stored
  ``z - 1`` end at the reader.
- ``zero_point="float"``: ``x = s * q + b`` with an additive float bias per group (MLX affine
  ``biases``, GGUF Q4_1/Q5_1 ``m``, K-quant mins).
- ``codebook``: ``x = s * codebook[q]`` (bitsandbytes NF4/FP4; the float elements of
  :mod:`converter.codebooks`: E2M1 for mxfp4/nvfp4, E4M3 / E5M2 for FP8, whose codes are the raw
  element bytes). A codebook is not an affine grid and is never treated as one.

Two-level scales (NVFP4): a codebook scheme may also carry one **global scale** per tensor, whose
direction is part of the scheme (``global_scale``): ``"multiplier"`` (ModelOpt ``weight_scale_2``,
``x = codebook[q] * (s * g)``) or ``"divisor"`` (compressed-tensors ``weight_global_scale``,
``x = codebook[q] * (s / g)``) or ``"amax"`` (MLX nvfp4 ``global_scale``, the tensor's absolute
maximum: ``x = codebook[q] * (s * (g / 2688))``). The stored value is kept as written; the effective group scale is
computed in float32 in one place (:func:`converter.values.effective_scales`), so a direction read
wrong can never hide in a reader (it would be a factor of ``g^2``).

Rounding is half-to-even by default (numpy ``rint``, ONNX QuantizeLinear); llama.cpp's reference
quantizers round half away from zero, so GGUF writers use ``"half_away"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

import numpy as np

from converter.codebooks import element, element_of
from converter.dtypes import float_dtype
from converter.errors import LayoutError

SCALE_DTYPES = ("F32", "F16", "BF16", "F8_E4M3", "F8_E8M0")
ROUNDING_MODES = ("half_even", "half_away")
#: Directions of a per-tensor global scale ``g``: the effective group scale is ``s * g`` or ``s / g``.
#: ``amax`` (MLX nvfp4 ``global_scale``): ``g`` is the tensor's absolute maximum and the effective
#: scale is ``s * (g / (6 * 448))`` (E2M1 max times E4M3 max), the quotient rounded to float32 first.
GLOBAL_SCALE_DIRECTIONS = ("multiplier", "divisor", "amax")
#: The ``amax`` direction's denominator: E2M1's largest value (6) times E4M3's (448).
AMAX_DENOMINATOR = 6.0 * 448.0


class ZeroPoint(str, Enum):
    """Zero-point convention of a scheme."""

    NONE = "none"
    INTEGER = "integer"
    FLOAT = "float"


@dataclass(frozen=True)
class QuantScheme:
    """How codes become values.

    Parameters
    ----------
    bits : int
        Bits per code, 1..8.
    signed : bool
        Code domain: ``[-2^(b-1), 2^(b-1) - 1]`` (int8 arrays) when True, ``[0, 2^b - 1]``
        (uint8 arrays) when False.
    zero_point : ZeroPoint
        ``none`` (symmetric, implicit centre), ``integer`` or ``float`` (additive bias).
    scale_dtype : str
        Storage dtype of scales: ``F32 | F16 | BF16`` (``F8_E4M3`` / ``F8_E8M0`` for nvfp4/mx).
    rounding : str
        ``half_even`` (default) or ``half_away`` (llama.cpp).
    codebook : tuple of float, optional
        ``2^bits`` values indexed by code (NF4, FP4, E2M1); implies ``zero_point="none"``.
    global_scale : str, optional
        ``"multiplier"``, ``"divisor"`` or ``"amax"``: the tensor also stores one float32 global
        scale ``g`` (:attr:`converter.tensor.QuantizedTensor.global_scale`) and the effective group
        scale is ``s * g``, ``s / g`` or ``s * (g / 2688)`` (NVFP4: ModelOpt ``weight_scale_2``
        multiplies, compressed-tensors ``weight_global_scale`` divides, MLX ``global_scale`` is the
        tensor's amax). ``None``: no global scale.

    Raises
    ------
    LayoutError
        On out-of-range or contradictory fields.
    """

    bits: int
    signed: bool
    zero_point: ZeroPoint = ZeroPoint.NONE
    scale_dtype: str = "F16"
    rounding: str = "half_even"
    codebook: tuple[float, ...] | None = None
    global_scale: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "zero_point", ZeroPoint(self.zero_point))
        if not isinstance(self.bits, (int, np.integer)) or not 1 <= self.bits <= 8:
            raise LayoutError("bits must be in 1..8", field="scheme.bits", expected="1..8", found=self.bits)
        if self.scale_dtype not in SCALE_DTYPES:
            raise LayoutError("unknown scale dtype", field="scheme.scale_dtype", expected=list(SCALE_DTYPES),
                              found=self.scale_dtype)
        if self.rounding not in ROUNDING_MODES:
            raise LayoutError("unknown rounding mode", field="scheme.rounding", expected=list(ROUNDING_MODES),
                              found=self.rounding)
        if self.global_scale is not None and self.global_scale not in GLOBAL_SCALE_DIRECTIONS:
            raise LayoutError("unknown global-scale direction", field="scheme.global_scale",
                              expected=list(GLOBAL_SCALE_DIRECTIONS), found=self.global_scale)
        if self.codebook is not None:
            el = element_of(self.codebook)
            # a float element's table is the one ``ELEMENTS[...].values`` object: equality (tuple
            # ``==`` compares NaN entries by identity) then holds for tables built from any array
            cb = el.values if el is not None else tuple(float(v) for v in self.codebook)
            object.__setattr__(self, "codebook", cb)
            if len(cb) != 2 ** self.bits:
                raise LayoutError("codebook size must be 2^bits", field="scheme.codebook",
                                  expected=2 ** self.bits, found=len(cb))
            if self.signed or self.zero_point is not ZeroPoint.NONE:
                raise LayoutError("a codebook scheme has unsigned indices and no zero point",
                                  field="scheme.codebook")

    # -- code range ---------------------------------------------------------------------------
    @property
    def qmin(self) -> int:
        """Smallest code of the domain."""
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        """Largest code of the domain."""
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def center(self) -> int:
        """Implicit zero of a symmetric scheme: 0 (signed) or ``2^(b-1)`` (unsigned)."""
        return 0 if self.signed else 1 << (self.bits - 1)

    @property
    def symmetric(self) -> bool:
        return self.zero_point is ZeroPoint.NONE

    @property
    def code_dtype(self) -> np.dtype:
        """numpy dtype of unpacked codes: int8 when signed, uint8 otherwise."""
        return np.dtype(np.int8 if self.signed else np.uint8)

    @property
    def scale_np_dtype(self) -> np.dtype:
        """numpy dtype for scales (``ml_dtypes`` for BF16/F8)."""
        return float_dtype(self.scale_dtype)

    def replace(self, **changes: Any) -> "QuantScheme":
        from dataclasses import replace
        return replace(self, **changes)

    def describe(self) -> str:
        """Short label: ``int4 sym``, ``uint4 asym(int zp)``, ``uint4 affine(float bias)``, ``e4m3 float``
        (a float element, :mod:`converter.codebooks`) or ``4-bit codebook`` (NF4 and other tables)."""
        kind = ("u" if not self.signed else "") + f"int{self.bits}"
        if self.global_scale is not None and self.global_scale not in GLOBAL_SCALE_DIRECTIONS:
            raise LayoutError("unknown global-scale direction", field="scheme.global_scale",
                              expected=list(GLOBAL_SCALE_DIRECTIONS), found=self.global_scale)
        if self.codebook is not None:
            el = element_of(self.codebook)
            label = f"{el.name} float" if el is not None else f"{self.bits}-bit codebook"
            return label + (f" (global scale: {self.global_scale})" if self.global_scale else "")
        zp = {ZeroPoint.NONE: "sym", ZeroPoint.INTEGER: "asym(int zp)", ZeroPoint.FLOAT: "affine(float bias)"}
        return f"{kind} {zp[self.zero_point]}"

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """JSON object (``scheme`` in ``schemas/layout.schema.json``): a float element's table is
        named (``"element": "e4m3"``; JSON has no NaN), any other codebook listed."""
        obj = {"bits": int(self.bits), "signed": bool(self.signed), "zero_point": self.zero_point.value,
               "scale_dtype": self.scale_dtype, "rounding": self.rounding,
               "codebook": list(self.codebook) if self.codebook is not None else None}
        el = element_of(self.codebook)
        if el is not None:
            obj["codebook"], obj["element"] = None, el.name
        if self.global_scale is not None:
            obj["global_scale"] = self.global_scale
        return obj

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "QuantScheme":
        try:
            codebook = tuple(obj["codebook"]) if obj.get("codebook") is not None else None
            if obj.get("element") is not None:
                codebook = element(obj["element"]).values
            return cls(bits=obj["bits"], signed=obj["signed"], zero_point=ZeroPoint(obj["zero_point"]),
                       scale_dtype=obj["scale_dtype"], rounding=obj.get("rounding", "half_even"),
                       codebook=codebook, global_scale=obj.get("global_scale"))
        except (KeyError, ValueError, TypeError) as exc:
            if isinstance(exc, LayoutError):
                raise
            raise LayoutError(f"malformed scheme: {exc}", field="scheme") from None
