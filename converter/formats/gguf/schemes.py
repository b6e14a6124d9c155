"""GGUF types -> logical schemes: the scheme, group map and axes of each ggml type, block fields <-> a
:class:`~converter.tensor.QuantizedTensor`, and llama.cpp's reference quantization of a legacy type
(:func:`quantize_to_gguf`). See :mod:`converter.formats.gguf.format` for the type table.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from converter.double_quant import ScaleCoding
from converter.dtypes import DTYPES
from converter.errors import ConverterError, UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.layout import EXPERT, IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import DoubleQuant, QuantizedTensor
from converter.formats.gguf.blocks import QK_K, SUPPORTED_WRITE, BlockFields, FP4Codec, LegacyCodec, codec_for
from converter.formats.gguf.fp4 import FP4_TYPES, fp4_scheme, fp4_tensor, quantize_fp4


LEGACY_TYPES: tuple[str, ...] = SUPPORTED_WRITE
"""Quantized ggml types this module writes (bit-exact repack or reference quantization): the
legacy block codecs of :mod:`gguf_blocks` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)."""

K_TYPES: tuple[str, ...] = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
"""K-quant types written by llama.cpp's reference quantizers (:mod:`converter.formats.gguf.kquant_encode`)
or repacked from a K-quant source's own super-block fields."""

WRITE_TYPES: tuple[str, ...] = LEGACY_TYPES + K_TYPES + FP4_TYPES
"""Every quantized ggml type qckpt writes (MXFP4 / NVFP4: :mod:`converter.formats.gguf.fp4`)."""

DENSE_TYPES: dict[str, np.dtype] = {n: DTYPES[n].numpy
                                   for n in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")}
"""ggml types read as plain arrays (:class:`DenseTensor`), with their numpy dtypes."""

MAX_DIMS = 4
"""``GGML_MAX_DIMS``."""
MAX_NAME_BYTES = 63
"""``GGML_MAX_NAME`` (64) minus the terminating NUL."""
QUANTIZATION_VERSION = 2
"""``GGML_QNT_VERSION`` (gguf-py ``GGML_QUANT_VERSION``)."""
MANAGED_KEYS = ("general.architecture", "general.quantization_version", "general.file_type",
                 "general.alignment")
FILE_TYPES = {"F32": "ALL_F32", "F16": "MOSTLY_F16", "BF16": "MOSTLY_BF16", "Q4_0": "MOSTLY_Q4_0",
              "Q4_1": "MOSTLY_Q4_1", "Q5_0": "MOSTLY_Q5_0", "Q5_1": "MOSTLY_Q5_1", "Q8_0": "MOSTLY_Q8_0",
              # a file of one K-quant type (no mix): llama.cpp's "_S" file type of that type
              "Q2_K": "MOSTLY_Q2_K", "Q3_K": "MOSTLY_Q3_K_S", "Q4_K": "MOSTLY_Q4_K_S", "Q5_K": "MOSTLY_Q5_K_S",
              "Q6_K": "MOSTLY_Q6_K",
              # llama.cpp's llama_ftype for an all-FP4 file (gguf-py LlamaFileType)
              "MXFP4": "MOSTLY_MXFP4_MOE", "NVFP4": "MOSTLY_NVFP4"}


def gguf_module():
    import gguf  # imported lazily: only GGUF paths need it
    return gguf

def scheme_for(type_name: str) -> QuantScheme:
    """The logical scheme of a ggml block type (see the module table).

    Raises
    ------
    UnsupportedError
        For types without a codec (IQ*, TQ*, ...).
    """
    codec = codec_for(type_name)
    if isinstance(codec, FP4Codec):
        return fp4_scheme(type_name)
    if isinstance(codec, LegacyCodec):
        if codec.bits == 8:
            return QuantScheme(8, True, ZeroPoint.NONE, "F16", "half_away")
        zp = ZeroPoint.FLOAT if codec.affine else ZeroPoint.NONE
        return QuantScheme(codec.bits, False, zp, "F16", "half_away")
    zp = ZeroPoint.FLOAT if codec.has_mins else ZeroPoint.NONE
    scheme = QuantScheme(codec.bits, False, zp, "F32", "half_away")
    assert codec.code_offset == (scheme.center if zp is ZeroPoint.NONE else 0)
    return scheme


#: Bits of each sub-block scale code (and of each min, for the types with mins), ggml-common.h ``block_q2_K``
#: (``scales[QK_K/16]``: 4-bit scale | 4-bit min), ``block_q3_K`` (``scales[12]``: 16 6-bit scales),
#: ``block_q4_K`` / ``block_q5_K`` (``scales[12]``: 8 6-bit scales + 8 6-bit mins), ``block_q6_K``
#: (``scales[QK_K/16]`` int8).
KQUANT_SCALE_CODE_BITS = {"Q2_K": 4, "Q3_K": 6, "Q4_K": 6, "Q5_K": 6, "Q6_K": 8}


def scale_coding_of(type_name: str) -> ScaleCoding | None:
    """How a K-quant stores its sub-block scales (None for the other types): a code per sub-block (and one per
    min), an fp16 ``d`` (and ``dmin``) per 256-element super-block: Q4_K = 4 + (6 + 6) / 32 + 32 / 256 = 4.5 bits
    per weight, Q6_K = 6 + 8 / 16 + 16 / 256 = 6.5625."""
    codec = codec_for(type_name)
    if type_name not in KQUANT_SCALE_CODE_BITS:
        return None
    return ScaleCoding(code_bits=KQUANT_SCALE_CODE_BITS[type_name], super_groups=QK_K // codec.sub_block_size,
                       super_bytes=4 if codec.has_mins else 2, with_min=codec.has_mins)


def group_size_of(type_name: str) -> int:
    codec = codec_for(type_name)
    if isinstance(codec, FP4Codec):
        return codec.group_size
    return codec.block_size if isinstance(codec, LegacyCodec) else codec.sub_block_size


def kquant_type_for(scheme: QuantScheme, group_map: GroupMap) -> str | None:
    """The K-quant type whose logical form is exactly ``scheme`` over ``group_map`` (F32 effective
    scales over 16/32-element sub-blocks along ``in``: no legacy target has F32 scales), or None."""
    if group_map.granularity is not Granularity.GROUP or group_map.axis != IN or group_map.g_idx is not None:
        return None
    for t in K_TYPES:
        if scheme == scheme_for(t) and group_map.group_size == group_size_of(t):
            return t
    return None


def axes_for(ndim: int) -> tuple[str, ...] | None:
    return {2: (OUT, IN), 3: (EXPERT, OUT, IN)}.get(ndim)


def tensor_from_fields(name: str, fields: BlockFields, shape: Sequence[int], global_scale=None) -> QuantizedTensor:
    """Build the logical tensor from decoded block fields.

    Parameters
    ----------
    name : str
        Logical name.
    fields : BlockFields
        From ``codec.decode(raw)`` with ``raw`` of shape ``(rows, row_bytes)``, ``rows = prod(shape[:-1])``.
    shape : sequence of int
        Logical shape ``(out, in)`` or ``(expert, out, in)`` (``reversed(ne)``).
    global_scale : float32, optional
        NVFP4 only: the ``<name>.scale`` multiplier (:mod:`converter.formats.gguf.fp4`).

    Returns
    -------
    QuantizedTensor
        Codes ``shape``; scales ``(..., out, in/group)``. K-quant effective scales/biases are float32
        products computed exactly as ``KQuantCodec.dequantize`` does, so ``dequantize()`` is bit-exact.
    """
    if fields.type_name in FP4_TYPES:
        return fp4_tensor(name, fields, shape, global_scale)
    shape = tuple(int(s) for s in shape)
    axes = axes_for(len(shape))
    if axes is None:
        raise UnsupportedError("quantized GGUF tensors must be 2-D or 3-D", tensor=name, field="ne",
                               expected="2 or 3 dims", found=len(shape))
    lead = shape[:-1]
    t = fields.type_name
    codec = codec_for(t)
    scheme = scheme_for(t)
    codes = fields.codes.reshape(shape)
    if isinstance(codec, LegacyCodec):
        scales = fields.scales.reshape(*lead, -1)
        zp = fields.mins.reshape(*lead, -1) if codec.affine else None
        dq = None
    else:
        rows = fields.rows
        per = QK_K // codec.sub_block_size
        d = fields.super_scales.astype(np.float32)[..., None]
        scales = (d * fields.sub_scales.reshape(rows, -1, per).astype(np.float32)).reshape(*lead, -1)
        zp = None
        if codec.has_mins:
            dmin = fields.super_mins.astype(np.float32)[..., None]
            zp = -(dmin * fields.sub_mins.reshape(rows, -1, per).astype(np.float32)).reshape(*lead, -1)
        dq = DoubleQuant(
            kind=t, super_block=QK_K, super_scales=fields.super_scales.reshape(*lead, -1),
            sub_scales=fields.sub_scales.reshape(*lead, -1),
            super_mins=None if fields.super_mins is None else fields.super_mins.reshape(*lead, -1),
            sub_mins=None if fields.sub_mins is None else fields.sub_mins.reshape(*lead, -1))
    return QuantizedTensor(name=name, axes=axes, codes=codes, scales=scales, scheme=scheme,
                           group_map=GroupMap.per_group(group_size_of(t), IN), zero_points=zp, double_quant=dq)


def quantize_to_gguf(values: np.ndarray, type_name: str, *, name: str = "tensor") -> QuantizedTensor:
    """Requantize float values to a ggml type with llama.cpp's reference quantizer.

    Bytes are identical with ``gguf.quants.quantize`` (``quantize_row_q*_ref``, round half away
    from zero); the result is the decode of those bytes, so writing it packs them back unchanged.

    Parameters
    ----------
    values : ndarray of float, shape (out, in) or (expert, out, in)
        ``in`` a multiple of 32.
    type_name : str
        One of :data:`WRITE_TYPES`.

    Returns
    -------
    QuantizedTensor

    Raises
    ------
    UnsupportedError
        Types without an encoder (IQ*, TQ* ...).
    QuantizationError
        Bad row length, non-finite input, fp16 overflow of a block scale.

    K-quants (Q2_K..Q6_K): llama.cpp's ``quantize_row_q*_K_ref`` (no importance matrix), ``in`` a
    multiple of 256; the result carries the super-block fields (:class:`DoubleQuant`). MXFP4 / NVFP4:
    ``quantize_row_mxfp4_ref`` / ``quantize_row_nvfp4_ref`` (``in`` a multiple of 32 / 64, no global scale).
    """
    values = np.asarray(values, dtype=np.float32)
    if values.ndim not in (2, 3):
        raise UnsupportedError("only 2-D or 3-D tensors can be quantized to GGUF", tensor=name, field="shape",
                               expected="2 or 3 dims", found=list(values.shape))
    if type_name in FP4_TYPES:
        return quantize_fp4(values, type_name, name=name)
    codec = codec_for(type_name)
    try:
        raw = codec.encode(values.reshape(-1, values.shape[-1]))
        return tensor_from_fields(name, codec.decode(raw), values.shape)
    except ConverterError as exc:
        exc.with_context(tensor=name)
        raise


#: The requantize options that give each legacy type (named in refusals).
REQUANT_OPTIONS = ("--group-size 32 and --bits 4/5/8 --sym (Q4_0/Q5_0/Q8_0) or --bits 4/5 --asym (Q4_1/Q5_1)")
