"""The per-tensor plan of a GGUF write: the GGUF name, ggml type, shape and byte size of each tensor, checked
before anything is written (:class:`TensorPlan`), and the bytes GGUFWriter writes for a tensor under its plan
(:func:`encode`): legacy blocks from the tensor's codes and fp16 scales, K-quant super-blocks from its
:class:`~converter.double_quant.DoubleQuant` record, MXFP4 / NVFP4 blocks and the NVFP4 ``<name>.scale``
multiplier, dense F32 / F16 / BF16 (1-D F16 / BF16 widened to F32 as ``convert_hf_to_gguf.py`` writes them), with
LLaMA's q/k rows permuted and Gemma's norm weights stored as ``1 + w`` as llama.cpp's converter does. Used by
:func:`converter.formats.gguf.format.write_gguf`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from converter.errors import FormatError, NotRepresentableError
from converter.quant.recode import as_groups, exact_cast
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, TensorSpec
from converter.formats.gguf.blocks import BlockFields, codec_for
from converter.formats.gguf.fp4 import FP4_TYPES, fp4_fields, gguf_multiplier
from converter.formats.gguf.hf_source import WIDENED_1D
from converter.formats.gguf.names import hf_to_gguf, norm_offset, permute_heads_key
from converter.formats.gguf.reader import permute_rows, qk_permutation
from converter.formats.gguf.schemes import DENSE_TYPES, K_TYPES, MAX_DIMS, MAX_NAME_BYTES, gguf_module
from converter.formats.gguf.targets import check_target, exact_type

__all__ = ["TensorPlan", "plan_tensor", "encode", "encode_rows", "rows_encodable"]


def _exact_f16(a: np.ndarray, *, tensor: str, field: str) -> np.ndarray:
    """``a`` as float16 if every value survives the cast exactly (GGUF block scales are ``ggml_half``)."""
    return exact_cast(a, np.float16, tensor=tensor, field=field,
                      message=f"{field} are not exactly representable in fp16 (GGUF block {field} are ggml_half)",
                      hint="requantize with --scale-dtype f16 (and --group-size 32) to write GGUF")


def _legacy_fields(t: QuantizedTensor, type_name: str) -> BlockFields:
    """Codes and fp16 scales of ``t`` as ``type_name`` block fields (no requantization)."""
    s = t.scheme
    rows = int(np.prod(t.shape[:-1], dtype=np.int64))
    codec = codec_for(type_name)
    if type_name == "Q8_0":
        codes = t.codes if s.signed else (t.codes.astype(np.int16) - np.int16(128)).astype(np.int8)
    elif not codec.affine:
        if s.signed:
            codes = (t.codes.astype(np.int16) + np.int16(s.center or (1 << (s.bits - 1)))).astype(np.uint8)
        else:
            codes = t.codes
    else:
        codes = t.codes
    scales = _exact_f16(t.scales, tensor=t.name, field="scales").reshape(rows, -1)
    mins = _exact_f16(t.zero_points, tensor=t.name, field="zero_points").reshape(rows, -1) if codec.affine else None
    return BlockFields(type_name, np.ascontiguousarray(codes).reshape(rows, t.shape[-1]), scales=scales, mins=mins)


def _kquant_fields(t: QuantizedTensor, type_name: str) -> BlockFields:
    """``t``'s own K-quant super-block fields (its :class:`DoubleQuant` record) as block fields."""
    dq = t.double_quant
    if dq is None or dq.kind != type_name:
        raise NotRepresentableError(f"a {type_name} tensor is written from its super-block fields; this one has none "
                                    "(only its effective scales)", tensor=t.name, field="double_quant",
                                    expected=type_name, found=None if dq is None else dq.kind,
                                    hint="requantize with --quant-type to quantize it with llama.cpp's quantizer")
    rows = int(np.prod(t.shape[:-1], dtype=np.int64))
    codec = codec_for(type_name)

    def r(a):
        return None if a is None else np.ascontiguousarray(a).reshape(rows, -1)
    return BlockFields(type_name, np.ascontiguousarray(t.codes, dtype=np.uint8).reshape(rows, t.shape[-1]),
                       super_scales=r(dq.super_scales), super_mins=r(dq.super_mins), sub_scales=r(dq.sub_scales),
                       sub_mins=r(dq.sub_mins), sub_block_size=codec.sub_block_size)


@dataclass
class TensorPlan:
    """One tensor of a GGUF write: its source name, GGUF name, ggml type, shape (logical order) and bytes."""
    name: str
    gguf_name: str
    type_name: str
    shape: tuple[int, ...]  # numpy (logical) order
    nbytes: int
    perm: np.ndarray | None
    widened_from: str | None = None  # a 1-D F16 / BF16 tensor written F32 (WIDENED_1D)
    global_of: bool = False  # the F32 [1] ``<name>.scale`` of NVFP4 tensor ``name`` (its multiplier)
    scaled: bool = False  # an NVFP4 tensor whose ``<name>.scale`` is planned
    offset: float | None = None  # added to the values (Gemma's norm weights, ``names.norm_offset``)


def plan_tensor(ckpt: Checkpoint, spec: TensorSpec, arch: str, gguf_type: str | None, names: Mapping[str, str],
          kv: Mapping[str, Any]) -> TensorPlan:
    gname = names.get(spec.name) or hf_to_gguf(spec.name, arch)
    if len(gname.encode("utf-8")) > MAX_NAME_BYTES:
        raise FormatError("tensor name too long for GGUF", tensor=spec.name, field="name",
                          expected=f"<= {MAX_NAME_BYTES} bytes (GGML_MAX_NAME)", found=gname)
    shape = tuple(int(s) for s in spec.shape)
    if not shape and spec.kind == "dense":  # a 0-d scale (ModelOpt input_scale): F32 [1], as _write_scale_tensor
        shape = (1,)
    if not 1 <= len(shape) <= MAX_DIMS:
        raise NotRepresentableError("GGUF tensors have 1 to 4 dims", tensor=spec.name, field="shape",
                                    expected=f"1..{MAX_DIMS} dims", found=list(shape))
    reason = check_target(spec)
    if reason:
        raise NotRepresentableError(f"cannot write to GGUF exactly: {reason}", tensor=spec.name, field="scheme",
                                    hint="requantize with quantize_to_gguf (e.g. Q8_0, Q4_0) to write GGUF")
    if spec.kind == "dense":
        type_name = "F32" if len(shape) == 1 and spec.dtype in WIDENED_1D else spec.dtype
    else:
        type_name = exact_type(spec)
        if gguf_type is not None and type_name != gguf_type:
            raise NotRepresentableError(f"tensor's scheme is {type_name}, not the requested {gguf_type}",
                                        tensor=spec.name, field="gguf_type", expected=gguf_type, found=type_name,
                                        hint="requantize with quantize_to_gguf to change the block type")
    gguf = gguf_module()
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    perm = None
    if len(shape) <= 2 and permute_heads_key(gname, arch):
        perm = qk_permutation(gname, shape[0], arch, kv, ckpt.config, file=None, tensor=spec.name)
    widened = spec.dtype if spec.kind == "dense" and type_name != spec.dtype else None
    offset = norm_offset(spec.name, arch)
    if offset is not None and spec.kind != "dense":
        raise NotRepresentableError(f"{arch} stores norm weights as 1 + w: a quantized norm weight cannot carry the "
                                    "offset exactly", tensor=spec.name, field="kind", expected="dense",
                                    found=spec.kind, hint="dequantize the model first, then convert it to GGUF")
    return TensorPlan(spec.name, gname, type_name, shape, n // block * size, perm, widened, offset=offset)


def encode(t, p: TensorPlan) -> np.ndarray:
    """The bytes (numpy array) GGUFWriter writes for tensor ``t`` under plan ``p``."""
    if p.perm is not None:
        t = permute_rows(t, p.perm)
    if isinstance(t, DenseTensor):
        data = np.ascontiguousarray(t.data)
        if p.offset is not None:  # in the source's dtype, as convert_hf_to_gguf.py's ``data_torch + 1``
            data = data + data.dtype.type(p.offset)
        if p.widened_from is not None and data.dtype == DENSE_TYPES[p.widened_from]:
            data = data.astype(np.float32)  # exact: every F16 / BF16 value is an F32 value
        if data.ndim == 0 and p.shape == (1,):
            data = data.reshape(1)
        if tuple(data.shape) != p.shape or data.dtype != DENSE_TYPES[p.type_name]:
            raise FormatError("tensor differs from its spec", tensor=p.name, field="data",
                              expected=f"{p.type_name} {list(p.shape)}", found=f"{data.dtype} {list(data.shape)}")
        return data.view(np.uint8) if p.type_name == "BF16" else data
    if isinstance(t, QuantizedTensor) and (p.global_of or p.type_name in FP4_TYPES):
        g = gguf_multiplier(t)  # refused before any byte is packed when not an exact multiplier
        if (g is not None) != (p.scaled or p.global_of):  # never drop (or invent) a global scale silently
            raise FormatError("tensor's global scale differs from its spec", tensor=p.name, field="global_scale",
                              expected="present" if p.scaled or p.global_of else "none",
                              found="none" if g is None else float(g))
        if p.global_of:
            return np.asarray(g, dtype=np.float32).reshape(1)
        return codec_for(p.type_name).pack(fp4_fields(t, p.type_name)).reshape(*p.shape[:-1], -1)
    if isinstance(t, QuantizedTensor) and p.type_name in K_TYPES:
        return codec_for(p.type_name).pack(_kquant_fields(t, p.type_name)).reshape(*p.shape[:-1], -1)
    if isinstance(t, QuantizedTensor):
        codec = codec_for(p.type_name)
        raw = codec.pack(_legacy_fields(as_groups(t, 32), p.type_name))
        return raw.reshape(*p.shape[:-1], -1)
    raise FormatError("unknown tensor kind", tensor=p.name, found=type(t).__name__)


def encode_rows(blocks, p: TensorPlan):
    """The bytes of :func:`encode` for a tensor given as consecutive row blocks ``(r0, QuantizedTensor of rows
    r0:)`` (:meth:`converter.tensor.Checkpoint.row_blocks`): ``(byte offset in the tensor, bytes)`` per block,
    each block encoded alone (a block type's rows are encoded independently, so the bytes are the whole
    tensor's). For plans without a q/k permutation, stored offset or global scale (:func:`rows_encodable`).

    Raises
    ------
    FormatError
        The blocks do not cover the tensor's rows in order, or their bytes differ from the plan's size.
    """
    row_bytes = p.nbytes // p.shape[0]
    done = 0
    for r0, block in blocks:
        if r0 * row_bytes != done:
            raise FormatError("row blocks out of order", tensor=p.name, field="rows", expected=done // row_bytes,
                              found=r0)
        data = encode(block, dataclasses.replace(p, shape=tuple(int(s) for s in block.shape))).reshape(-1)
        yield done, data
        done += data.nbytes
    if done != p.nbytes:
        raise FormatError("encoded size differs from the plan", tensor=p.name, field="nbytes", expected=p.nbytes,
                          found=done)


def rows_encodable(p: TensorPlan) -> bool:
    """True when :func:`encode_rows` can write ``p``'s tensor block by block: a 2-D block type (legacy or
    K-quant) without a q/k row permutation, a stored offset or a global scale."""
    return (len(p.shape) == 2 and p.perm is None and p.offset is None and not p.global_of and not p.scaled
            and p.type_name not in FP4_TYPES and p.type_name not in DENSE_TYPES and p.widened_from is None)
