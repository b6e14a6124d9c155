"""What a tensor is, known from headers alone: :class:`TensorSpec` and its :class:`StoredArray` list."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter.double_quant import ScaleCoding
from converter.errors import LayoutError, UnsupportedError
from converter.groups import GroupMap
from converter.scheme import QuantScheme

#: Roles of stored arrays. ``activation_scale``: a static activation (input) scale stored beside a
#: weight (``input_scale``, ``qscale_act``): metadata for the runtime, never applied to the weight.
#: ``global_scale``: the per-tensor second-level weight scale of NVFP4 (``weight_scale_2``,
#: ``weight_global_scale``), applied to every group scale in the scheme's direction.
ROLES = ("codes", "scales", "zero_points", "g_idx", "dense", "other", "activation_scale", "global_scale",
         "codes+scales")
"""``codes+scales``: a block whose code and scale bits are packed together (GGUF IQ2_XXS / IQ3_XXS / IQ1_S / IQ1_M)."""


@dataclass(frozen=True)
class StoredArray:
    """One array as stored on disk, and its role (for audits: bytes by role).

    ``part``: the format's own name for the array when its role does not say it (bitsandbytes ``quant_map``,
    ``quant_state``, ``nested_absmax`` ...); inspect and audit show it.
    """

    name: str
    role: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: str | None = None
    part: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise LayoutError("unknown role", field="role", expected=list(ROLES), found=self.role)


#: Tensor kinds of a :class:`TensorSpec`.
KINDS = ("quantized", "dense", "opaque")


@dataclass(frozen=True, eq=False)
class TensorSpec:
    """What a tensor is, known from headers alone (no data read).

    ``kind`` is ``"quantized"``, ``"dense"`` or ``"opaque"``; quantized specs carry ``axes``,
    ``scheme`` and ``group_map`` (checked at construction; ``act_order`` says a non-trivial
    ``g_idx`` is stored); ``stored`` lists the arrays that hold it, with roles and byte sizes;
    ``scale_coding`` prices scales that are stored quantized (double quant), for the theoretical size.
    An ``opaque`` spec is a tensor the source lists in a storage type qckpt cannot decode (GGUF
    IQ*/TQ* ...): ``dtype`` names that type, inspect and audit show its stored arrays, every
    writer refuses it (:func:`opaque_reason`) and loading it raises UnsupportedError. ``scheme`` is the scheme the
    tensor loads with; ``declared_scheme`` is set only when the format's config declares another one (GPTQ
    ``sym: true`` with stored zero points off the centre), for validators to report. ``decoded_by`` names the
    decoder of an ``opaque`` tensor whose values can be read (GGUF IQ* / TQ* by gguf-py): it loads as a float32
    :class:`DenseTensor` of its values (dequantize, validate, requantize) and writers still refuse it exactly.
    """

    name: str
    kind: str
    shape: tuple[int, ...]
    stored: tuple[StoredArray, ...]
    dtype: str | None = None
    axes: tuple[str, ...] | None = None
    scheme: QuantScheme | None = None
    group_map: GroupMap | None = None
    act_order: bool = False
    double_quant: str | None = None
    scale_coding: ScaleCoding | None = None
    notes: tuple[str, ...] = ()
    declared_scheme: QuantScheme | None = None
    decoded_by: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise LayoutError("unknown tensor kind", tensor=self.name, field="kind", expected=list(KINDS),
                              found=self.kind)
        if self.kind == "quantized":
            missing = [f for f in ("axes", "scheme", "group_map") if getattr(self, f) is None]
            if missing:
                raise LayoutError("a quantized spec needs axes, scheme and group map", tensor=self.name,
                                  field=missing[0], expected="set", found="None",
                                  hint='use kind "opaque" for a tensor whose storage type cannot be decoded')
        elif self.kind == "opaque" and not self.dtype:
            raise LayoutError("an opaque spec names its storage type in dtype", tensor=self.name, field="dtype",
                              expected="a type name", found=self.dtype)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


def opaque_reason(spec: TensorSpec) -> str | None:
    """Why an ``opaque`` spec cannot be loaded or written (names its storage type); ``None`` otherwise.

    Every writer's ``check_target`` and planning use it, so the refusal reads the same everywhere.
    """
    if spec.kind != "opaque":
        return None
    if spec.decoded_by:
        return (f"stored as {spec.dtype}: its values are decoded ({spec.decoded_by}) but it has no codes or scales "
                "qckpt can write exactly (requantize it, or dequantize)")
    return f"stored as {spec.dtype}, a type qckpt lists but cannot decode (inspect and audit only)"


def refuse_opaque(spec: TensorSpec, target: str) -> None:
    """Raise UnsupportedError if ``spec`` is opaque (writers call it while planning, before data moves)."""
    reason = opaque_reason(spec)
    if reason:
        raise UnsupportedError(f"cannot write to {target}: {reason}", tensor=spec.name, field="dtype",
                               expected="a type qckpt decodes", found=spec.dtype)
