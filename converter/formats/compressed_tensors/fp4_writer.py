"""compressed-tensors FP4 writing: which E2M1 specs ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized`` hold,
the global scale re-expressed as a divisor (or refused), and the arrays of one module.

Arrays as compressed-tensors 0.20.1 ``NVFP4PackedCompressor.compress`` / ``MXFP4PackedCompressor``
store them (sample_checkpoints/ct_nvfp4_smollm2, ct_mxfp4_smollm2): ``weight_packed`` U8 ``[out, in/2]``
(low nibble = even element), ``weight_scale`` ``[out, in/G]`` (F8_E4M3 for NVFP4; for MXFP4 the U8
E8M0 exponent ``127 + log2 s``, ``compressors/mx_utils.py`` ``compress_mx_scale``; ``ct_version``
0.13.0 stores ``127 + log2 s - 2``, :mod:`.e8m0_rule`) and, NVFP4 only, ``weight_global_scale`` F32
``[1]`` (a divisor). The model-directory writer is
:func:`converter.formats.compressed_tensors.writer.write_ct`.
"""

from __future__ import annotations

import numpy as np

from converter.codebooks import E2M1_VALUES, element_of
from converter.errors import NotRepresentableError
from converter.global_scales import equivalent_global_scale
from converter.groups import Granularity
from converter.layout import IN
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec
from converter.write.plan import TensorPlan, rows_plan
from converter.formats.compressed_tensors.config import (FP4_GROUP, FP4_SCALE_DTYPE, FP4_STRATEGY, MXFP4_FORMAT,
                                                         NVFP4_FORMAT, WeightArgs)
from converter.formats.compressed_tensors.e8m0_rule import LEGACY, LEGACY_OFFSET, rule_for_version
from converter.formats.compressed_tensors.fp4_layout import AXES, CODES_MAP
from converter.formats.global_scale_routes import exact_targets_text, global_scales_of

#: First release with ``mxfp4-pack-quantized`` (PR #502 / #509).
MXFP4_SINCE = (0, 13)
#: llm-compressor's preset names for weight-only FP4 (the config group name it writes).
PRESET_NAME = {NVFP4_FORMAT: "NVFP4A16", MXFP4_FORMAT: "MXFP4A16"}
#: ``input_activations`` of the NVFP4 (W4A4) preset (compressed-tensors 0.20.1 ``quant_scheme.NVFP4``).
NVFP4_ACTIVATIONS = {"actorder": None, "block_structure": None, "dynamic": "local", "group_size": 16, "num_bits": 4,
                     "observer": "static_minmax", "observer_kwargs": {}, "scale_dtype": "torch.float8_e4m3fn",
                     "strategy": "tensor_group", "symmetric": True, "type": "float", "zp_dtype": None}


def is_fp4(spec: TensorSpec) -> bool:
    """An E2M1 (FP4) quantized spec."""
    return spec.kind == "quantized" and spec.scheme.codebook is not None and spec.scheme.codebook == E2M1_VALUES


def fp4_format(spec: TensorSpec) -> str | None:
    """``nvfp4-pack-quantized`` (E4M3 scales, group 16) or ``mxfp4-pack-quantized`` (E8M0, group 32), else None."""
    s, gm = spec.scheme, spec.group_map
    if gm.granularity is not Granularity.GROUP:
        return None
    if s.scale_dtype == "F8_E4M3" and gm.group_size == FP4_GROUP[NVFP4_FORMAT]:
        return NVFP4_FORMAT
    if s.scale_dtype == "F8_E8M0" and gm.group_size == FP4_GROUP[MXFP4_FORMAT] and s.global_scale is None:
        return MXFP4_FORMAT
    return None


def fp4_target(spec: TensorSpec, version: tuple[int, ...]) -> str | None:
    """``None`` when E2M1 ``spec`` can be written exactly as compressed-tensors FP4 under ``version``, else why.
    (A non-divisor global scale is checked per value at write time: :func:`divisor_global_scales`.)"""
    s, gm = spec.scheme, spec.group_map
    if element_of(s.codebook) is None or element_of(s.codebook).name != "e2m1":
        return "only E2M1 4-bit float codes are compressed-tensors FP4"
    if tuple(spec.axes) != AXES:
        return (f"axes {list(spec.axes)}: compressed-tensors FP4 compressors are 2-D [out, in] "
                "(NVFP4PackedCompressor.decompress unpacks packed.shape = (m, n))")
    if gm.granularity is not Granularity.GROUP or gm.axis != IN or gm.g_idx is not None:
        return f"{gm.describe()} FP4 scales: compressed-tensors FP4 groups run along in (16 NVFP4, 32 MXFP4)"
    fmt = fp4_format(spec)
    if fmt is None:
        return (f"E2M1 with {s.scale_dtype} scales per {gm.group_size} (global scale {s.global_scale}): "
                "compressed-tensors holds E4M3 per 16 (+ global scale, nvfp4) or E8M0 per 32 (mxfp4)")
    if spec.shape[1] % gm.group_size:
        return (f"in_features {spec.shape[1]} is not a multiple of {gm.group_size}: compressed-tensors 0.20.1 "
                "cannot compress or decompress a partial final FP4 group (_process_group raises ValueError)")
    if fmt == MXFP4_FORMAT and (version[:2] < MXFP4_SINCE or rule_for_version(version) is None):
        return (f"ct_version {'.'.join(map(str, version))}: mxfp4-pack-quantized exists from 0.13.0 and its E8M0 "
                "encoding is defined for 0.13.0 (legacy) and >= 0.14.0 (standard) only")
    return None


def args_of(spec: TensorSpec) -> WeightArgs:
    fmt = fp4_format(spec)
    return WeightArgs(bits=4, symmetric=True, strategy=FP4_STRATEGY[fmt], group_size=FP4_GROUP[fmt], type="float",
                      scale_dtype=FP4_SCALE_DTYPE[fmt])


def divisor_global_scale(ckpt: Checkpoint, spec: TensorSpec) -> np.ndarray | None:
    """The ``weight_global_scale`` to write for an NVFP4 spec: the stored one for a divisor source, 1.0 when
    the source has none (``s / 1 == s``), else :func:`converter.global_scales.equivalent_global_scale`
    into the divisor direction (the tensor is loaded for its value). None for MXFP4.

    Raises
    ------
    NotRepresentableError
        No divisor reproduces the source's effective scales bit for bit (named tensor and value).
    """
    s = spec.scheme
    if fp4_format(spec) != NVFP4_FORMAT:
        return None
    if s.global_scale is None:
        return np.array(1.0, dtype=np.float32)
    g = ckpt[spec.name].global_scale
    if s.global_scale == "divisor":
        return np.array(g, dtype=np.float32)
    eq = equivalent_global_scale(g, s.global_scale, "divisor", s.scale_dtype)
    if eq is None:
        raise NotRepresentableError(
            f"global scale {float(g)!r} ({s.global_scale}) has no float32 divisor giving the same effective scale "
            f"for every E4M3 group scale: compressed-tensors weight_global_scale divides", tensor=spec.name,
            field="global_scale", expected="a divisor g' with s / g' == effective scale for all 256 E4M3 scales",
            found=f"{float(g)!r} ({s.global_scale})",
            hint="".join(f"{x}; or " for x in [exact_targets_text(s.global_scale, s.scale_dtype, global_scales_of(ckpt),
                                                                  exclude="compressed-tensors")] if x)
            + "requantize to compressed-tensors FP8: --fp8 e4m3 --block 128x128 (or --per-channel)")
    return eq


def encode_fp4(t: QuantizedTensor, prefix: str, fmt: str, divisor: np.ndarray | None, legacy: bool) -> dict:
    """Stored arrays of one FP4 module (see the module docstring)."""
    out = {prefix + ".weight_packed": CODES_MAP.store_codes(t.packed if t.packed is not None else t.codes, AXES)}
    if fmt == NVFP4_FORMAT:
        out[prefix + ".weight_scale"] = np.ascontiguousarray(t.scales)
        out[prefix + ".weight_global_scale"] = np.asarray(divisor, dtype=np.float32).reshape(1)
        return out
    b = np.ascontiguousarray(t.scales).view(np.uint8)
    if legacy:  # compressed-tensors 0.13.0: the exponent stored 2 below its E8M0 value
        bad = (b < LEGACY_OFFSET) | (b == 255)
        if bad.any():
            raise NotRepresentableError("E8M0 scale below 2^-125 or NaN has no compressed-tensors 0.13.0 exponent",
                                        tensor=t.name, field="scales", expected="bytes 2..254",
                                        found=int(b[bad][0]), hint="write with the default ct_version")
        b = (b - LEGACY_OFFSET).astype(np.uint8)
    out[prefix + ".weight_scale"] = np.array(b, dtype=np.uint8)
    return out


def fp4_plan(spec: TensorSpec, prefix: str, divisor: np.ndarray | None, version: tuple[int, ...]) -> TensorPlan:
    """A row-splittable plan (every array is ``[out, ...]`` but the global scale, written once)."""
    fmt = fp4_format(spec)
    o, i = spec.shape
    legacy = fmt == MXFP4_FORMAT and rule_for_version(version) == LEGACY
    outs = [(prefix + ".weight_packed", "U8", (o, i // 2)),
            (prefix + ".weight_scale", "F8_E4M3" if fmt == NVFP4_FORMAT else "U8", (o, i // FP4_GROUP[fmt]))]
    if fmt == NVFP4_FORMAT:
        outs.append((prefix + ".weight_global_scale", "F32", (1,)))
    notes = []
    if fmt == NVFP4_FORMAT and spec.scheme.global_scale not in (None, "divisor"):
        notes.append(f"global scale ({spec.scheme.global_scale}) re-expressed as the divisor {float(divisor)!r}, "
                     "proven exact over every E4M3 scale")
    if fmt == NVFP4_FORMAT and spec.scheme.global_scale is None:
        notes.append("no source global scale: weight_global_scale 1.0 (divisor)")
    if legacy:
        notes.append("E8M0 exponents stored 2 below their value (compressed-tensors 0.13.0 encoding)")
    plan = TensorPlan(spec.name, outs, lambda t: encode_fp4(t, prefix, fmt, divisor, legacy), notes)
    return rows_plan(plan, once=[prefix + ".weight_global_scale"] if fmt == NVFP4_FORMAT else [])
