"""GGUF ``MXFP4`` / ``NVFP4`` tensors <-> the logical FP4 model (E2M1 codes, E8M0 / E4M3 group scales).

- ``MXFP4``: E2M1 codes, one E8M0 scale per 32 elements along ``in`` (scheme ``e2m1``, scale dtype
  ``F8_E8M0``, no global scale). The stored byte ``e`` *is* the OCP E8M0 byte (``2^(e - 127)``): ggml's
  doubled E2M1 table and halved E8M0 decode cancel (:mod:`.block_fp4`).
- ``NVFP4``: E2M1 codes, one E4M3 scale (stored UE4M3, bytes 0..0x7E) per 16 elements along ``in``, 64-element
  blocks. llama.cpp's second-level per-tensor scale (ModelOpt ``weight_scale_2``) is **not** in the blocks: its
  converter (``conversion/base.py`` ``_repack_nvfp4`` / ``_write_scale_tensor``, ggml-org/llama.cpp 2bbcf7fc)
  writes it as a separate F32 tensor ``<name>.scale`` (``new_name.replace(".weight", ".scale")``, shape [1],
  left out when it is 1.0) and the graph multiplies the matmul output by it (``ggml_mul``). So it is a
  **multiplier**: the scheme's ``global_scale="multiplier"``, effective scale ``e4m3(d) * scale``. One file
  tensor per weight; a per-expert ``.scale`` vector (stacked experts) is listed, not decoded.

Writing a global scale of another direction (compressed-tensors' divisor ``weight_global_scale``) needs an
exactly equal float32 multiplier (:func:`converter.global_scales.equivalent_global_scale`, proven on all 256
E4M3 scales); none exists unless the divisor is a power of two, and the write is refused.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from converter.codebooks import E2M1_VALUES
from converter.errors import ConverterError, NotRepresentableError, UnsupportedError
from converter.global_scales import equivalent_global_scale
from converter.groups import Granularity, GroupMap
from converter.layout import EXPERT, IN, OUT
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor, TensorSpec
from converter.formats.global_scale_routes import exact_targets_text
from converter.formats.gguf.block_fields import BlockFields
from converter.formats.gguf.block_fp4 import FP4_CODECS, NIBBLE_ORDER, check_scale_bytes

__all__ = ["FP4_TYPES", "DIRECTION", "fp4_scheme", "fp4_tensor", "fp4_match", "fp4_fields", "gguf_multiplier",
           "quantize_fp4", "scale_tensor_name"]

FP4_TYPES: tuple[str, ...] = tuple(FP4_CODECS)
"""The FP4 ggml types read and written: ``MXFP4``, ``NVFP4``."""
DIRECTION = "multiplier"
"""NVFP4 ``<name>.scale``: multiplies (``ggml_mul`` on the matmul output)."""
SCALE_SUFFIX = ".scale"


def scale_tensor_name(gguf_name: str) -> str | None:
    """``blk.0.attn_q.weight`` -> ``blk.0.attn_q.scale`` (llama.cpp's ``.replace(".weight", ".scale")``); None
    for a name without ``.weight``."""
    return gguf_name[: -len(".weight")] + SCALE_SUFFIX if gguf_name.endswith(".weight") else None


def fp4_scheme(type_name: str, global_scale: bool = False) -> QuantScheme:
    """The logical scheme: 4-bit E2M1 codebook, ``F8_E8M0`` (MXFP4) / ``F8_E4M3`` (NVFP4) scales, NVFP4 with
    a ``.scale`` tensor: ``global_scale="multiplier"``. Rounding ``half_away`` is llama.cpp's (labels only: an
    E2M1 codebook quantizer picks the nearest value, first index on a tie)."""
    codec = FP4_CODECS[type_name]
    return QuantScheme(4, False, scale_dtype=codec.scale_dtype, rounding="half_away", codebook=E2M1_VALUES,
                       global_scale=DIRECTION if global_scale else None)


def fp4_note(type_name: str) -> str:
    codec = FP4_CODECS[type_name]
    return (f"{type_name}: E2M1 codes in {NIBBLE_ORDER} nibble order per {codec.group_size}-group (byte j: element "
            f"j low, j + {codec.group_size // 2} high), {codec.scale_dtype} scale per {codec.group_size}")


def fp4_tensor(name: str, fields: BlockFields, shape: Sequence[int], global_scale=None) -> QuantizedTensor:
    """Logical tensor of decoded FP4 block fields: codes ``shape`` uint8 E2M1, scales ``(..., out, in/G)``
    E8M0 / E4M3, ``global_scale`` (NVFP4 ``.scale``) a float32 0-d multiplier or None."""
    shape = tuple(int(s) for s in shape)
    axes = {2: (OUT, IN), 3: (EXPERT, OUT, IN)}.get(len(shape))
    if axes is None:
        raise UnsupportedError("quantized GGUF tensors must be 2-D or 3-D", tensor=name, field="ne",
                               expected="2 or 3 dims", found=len(shape))
    t = fields.type_name
    gs = None if global_scale is None else np.array(np.asarray(global_scale, dtype=np.float32).reshape(()))
    return QuantizedTensor(name=name, axes=axes, codes=fields.codes.reshape(shape),
                           scales=np.ascontiguousarray(fields.scales).reshape(*shape[:-1], -1),
                           scheme=fp4_scheme(t, gs is not None),
                           group_map=GroupMap.per_group(FP4_CODECS[t].group_size, IN), global_scale=gs)


def fp4_match(spec: TensorSpec) -> tuple[str | None, str | None]:
    """``(type, None)`` when ``spec`` is GGUF MXFP4 / NVFP4 as it is (E2M1 codes, E8M0 scales per 32 or E4M3
    per 16 along ``in``, ``in`` whole blocks), ``(None, reason)`` for another E2M1 tensor, ``(None, None)``
    when it is not E2M1 at all. A global scale's value is checked at write time (:func:`gguf_multiplier`)."""
    s, gm = spec.scheme, spec.group_map
    if s is None or gm is None or s.codebook != E2M1_VALUES:
        return None, None
    t = {"F8_E8M0": "MXFP4", "F8_E4M3": "NVFP4"}.get(s.scale_dtype)
    if t is None:
        return None, f"E2M1 with {s.scale_dtype} scales: GGUF MXFP4 has E8M0, NVFP4 E4M3 scales"
    codec = FP4_CODECS[t]
    if t == "MXFP4" and s.global_scale is not None:
        return None, "MXFP4 with a global scale: GGUF MXFP4 has none"
    if (gm.granularity is not Granularity.GROUP or gm.axis != IN or gm.group_size != codec.group_size
            or gm.g_idx is not None):
        return None, (f"GGUF {t} has one scale per {codec.group_size} elements along 'in'; the tensor has "
                      f"{gm.describe()}")
    if spec.axes is None or tuple(spec.axes) not in ((OUT, IN), (EXPERT, OUT, IN)):
        return None, f"GGUF quantized tensors are (out, in) or (expert, out, in); found axes {list(spec.axes or ())}"
    if spec.shape[-1] % codec.block_size:
        return None, (f"'in' = {spec.shape[-1]} is not a multiple of the {codec.block_size}-element {t} block "
                      "(ggml has no partial block)")
    return t, None


def gguf_multiplier(t: QuantizedTensor) -> np.ndarray | None:
    """``t``'s global scale as the NVFP4 ``.scale`` multiplier (float32 0-d), None without a global scale.

    Raises
    ------
    NotRepresentableError
        No float32 multiplier gives the same effective scales (e.g. compressed-tensors' divisor 936.0).
    """
    if t.global_scale is None:
        return None
    g = equivalent_global_scale(t.global_scale, t.scheme.global_scale, DIRECTION, t.scheme.scale_dtype)
    if g is None:
        found = float(np.float32(t.global_scale))
        raise NotRepresentableError(
            f"the {t.scheme.global_scale} global scale {found!r} has no float32 multiplier giving the same "
            "effective scales: GGUF NVFP4's <name>.scale multiplies (llama.cpp ggml_mul)", tensor=t.name,
            field="global_scale", expected="a global scale exactly re-expressible as a multiplier (a power-of-two "
            "divisor, any multiplier or amax)", found=found,
            hint="requantize with --quant-type NVFP4 (llama.cpp's quantizer, no global scale)" + "".join(
                f"; {x}" for x in [exact_targets_text(t.scheme.global_scale, t.scheme.scale_dtype, exclude="gguf")]
                if x))
    return g


def fp4_fields(t: QuantizedTensor, type_name: str) -> BlockFields:
    """``t``'s codes and scale bytes as ``type_name`` block fields (no requantization).

    Raises
    ------
    NotRepresentableError
        A scale byte GGUF cannot hold as that value: E8M0 0xFF (NaN), an E4M3 scale that is negative, -0.0
        or NaN (UE4M3 holds 0x00..0x7E).
    """
    codec = FP4_CODECS[type_name]
    rows = int(np.prod(t.shape[:-1], dtype=np.int64))
    scale_bytes = np.ascontiguousarray(np.asarray(t.scales).astype(codec.scale_np_dtype)).view(np.uint8)
    try:
        check_scale_bytes(type_name, scale_bytes)
    except ConverterError as exc:
        raise NotRepresentableError(f"scale not representable in GGUF {type_name}: {exc.message}", tensor=t.name,
                                    field="scales", expected=exc.expected, found=exc.found) from None
    codes = np.ascontiguousarray(t.codes, dtype=np.uint8).reshape(rows, t.shape[-1])
    return BlockFields(type_name, codes, scales=scale_bytes.reshape(rows, -1).view(codec.scale_np_dtype))


def quantize_fp4(values: np.ndarray, type_name: str, *, name: str = "tensor") -> QuantizedTensor:
    """Float ``(out, in)`` / ``(expert, out, in)`` -> ``type_name`` with llama.cpp's reference quantizer
    (``quantize_row_mxfp4_ref`` / ``quantize_row_nvfp4_ref``; no global scale), as the decode of those bytes.

    Raises
    ------
    QuantizationError
        ``in`` not whole blocks (32 / 64), non-finite values, an MXFP4 block absmax below 2^-125.
    """
    values = np.asarray(values, dtype=np.float32)
    codec = FP4_CODECS[type_name]
    try:
        raw = codec.encode(values.reshape(-1, values.shape[-1]))
        return fp4_tensor(name, codec.decode(raw), values.shape)
    except ConverterError as exc:
        exc.with_context(tensor=name)
        raise
