"""ModelOpt ``NVFP4`` (``NVFP4_DEFAULT_CFG``, W4A4): the storage of one quantized Linear, both ways.

Per module ``<p>`` with logical weight ``(out, in)`` (nvidia-modelopt 0.47.0:
``modelopt/torch/quantization/qtensor/nvfp4_tensor.py`` ``NVFP4QTensor.quantize`` / ``dequantize``,
``modelopt/torch/export/quant_utils.py`` ``to_quantized_weight`` / ``get_weight_scaling_factor`` /
``get_weight_scaling_factor_2``; checked on the real export sample_checkpoints/modelopt_nvfp4_smollm2tiny):

- ``<p>.weight`` U8 ``[O, I/2]``: two E2M1 codes per byte along ``in``, element ``2j`` in the **low**
  nibble of byte ``j`` (``NVFP4QTensor._cast_fp4``: ``(q[..., 1::2] << 4) | q[..., 0::2]``); code bit 3
  is the sign (:data:`converter.codebooks.E2M1_VALUES`);
- ``<p>.weight_scale`` F8_E4M3 ``[O, I/16]``: one scale per 16 consecutive elements along ``in``;
- ``<p>.weight_scale_2`` F32 0-dim: the per-tensor global scale, a **multiplier**
  (``amax / (6 * 448)``): ``w = e2m1(q) * (fp32(weight_scale) * weight_scale_2)``, the scheme's
  ``global_scale="multiplier"`` (:func:`converter.values.effective_scales`);
- ``<p>.input_scale`` F32 0-dim: the activations' global scale (W4A4; runtime metadata, never applied
  to the weight): a dense tensor in role ``activation_scale``, written back as stored.

ModelOpt's own E2M1 table decodes code 0x8 as +0.0 where the OCP table (ml_dtypes, compressed-tensors,
MLX, qckpt) has -0.0: the values are equal, only the sign bit of those zeros differs from its
reference decode (tests/formats/test_modelopt_nvfp4.py counts them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter import codebooks
from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError, NotRepresentableError
from converter.global_scales import equivalent_global_scale
from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT, AxisMap, PackedCodes
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor, StoredArray, TensorSpec
from converter.formats.source import Source
from converter.formats.global_scale_routes import exact_targets_text
from converter.formats.modelopt.config import NVFP4, NVFP4_GROUP, ModelOptConfig

AXES = (OUT, IN)
#: What a refused ModelOpt NVFP4 write can be requantized to instead (ModelOpt FP8 without an input_scale).
FP8_HINT = "requantize to ModelOpt FP8 instead: --fp8 e4m3 --per-channel (or --block 128x128)"
#: ``<p>.weight``: E2M1 codes packed two per byte along ``in``, low nibble first.
CODES_MAP = AxisMap(AXES, packed_axis=IN, bits=4, container="U8", packing="stream")
PARAM_MAP = AxisMap(AXES)
GROUP_MAP = GroupMap.per_group(NVFP4_GROUP, IN)
SCHEME = QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=codebooks.E2M1_VALUES, global_scale="multiplier")
#: ModelOpt's global-scale direction (``weight_scale_2`` multiplies).
DIRECTION = "multiplier"


@dataclass(frozen=True)
class NvFp4Module:
    """One NVFP4 module of a ModelOpt export: shape and the three stored weight arrays."""

    prefix: str
    out_features: int
    in_features: int
    stored: tuple[StoredArray, ...]
    algo: str = NVFP4

    @property
    def name(self) -> str:
        return self.prefix + ".weight"

    def spec(self) -> TensorSpec:
        notes = ("ModelOpt quant_algo NVFP4 (E2M1, 16-element E4M3 groups, weight_scale_2 multiplier)",)
        return TensorSpec(self.name, "quantized", (self.out_features, self.in_features), self.stored, axes=AXES,
                          scheme=SCHEME, group_map=GROUP_MAP, notes=notes)


def _err(src: Source, tensor: str, msg: str, field: str, expected, found, kind=None) -> FormatError:
    return FormatError(msg, file=src.file_of(tensor) if src.has(tensor) else src.path, tensor=tensor, field=field,
                       expected=expected, found=found, kind=kind)


def module(src: Source, cfg: ModelOptConfig, prefix: str) -> NvFp4Module:
    """Check NVFP4 module ``prefix`` from its headers.

    Raises
    ------
    FormatError
        ``weight`` not U8 2-D; ``weight_scale`` not F8_E4M3 ``[O, I/16]``; ``weight_scale_2`` not F32 0-dim.
    MissingTensorError
        ``weight_scale`` or ``weight_scale_2`` absent.
    """
    name, sname, gname = prefix + ".weight", prefix + ".weight_scale", prefix + ".weight_scale_2"
    info = src.info(name)
    if info.dtype != "U8" or len(info.shape) != 2:
        raise _err(src, name, "ModelOpt NVFP4 weights are packed E2M1, uint8 [O, I/2]", "dtype",
                   "U8 [O, I/2]", f"{info.dtype} {list(info.shape)}", ErrorKind.CONFIG_MISMATCH)
    o, i = int(info.shape[0]), 2 * int(info.shape[1])
    for n in (sname, gname):
        if not src.has(n):
            raise MissingTensorError("partner tensor missing: ModelOpt NVFP4 stores weight_scale and weight_scale_2 "
                                     "beside the packed weight", file=cfg.file, tensor=n, expected="present",
                                     found="absent")
    s = src.info(sname)
    if s.dtype != "F8_E4M3":
        raise _err(src, sname, "NVFP4 group scales are E4M3", "dtype", "F8_E4M3", s.dtype)
    if i % NVFP4_GROUP or tuple(s.shape) != (o, i // NVFP4_GROUP):
        raise _err(src, sname, "NVFP4 weight_scale must hold one scale per 16 elements of each row", "shape",
                   [o, f"{i}/16"], list(s.shape), ErrorKind.SHAPE)
    g = src.info(gname)
    if g.dtype != "F32" or tuple(g.shape) != ():
        raise _err(src, gname, "NVFP4 weight_scale_2 is one float32 value (0-dim)", "shape", "F32 []",
                   f"{g.dtype} {list(g.shape)}", ErrorKind.SHAPE)
    stored = (src.stored_array(name, "codes"), src.stored_array(sname, "scales"),
              src.stored_array(gname, "global_scale"))
    return NvFp4Module(prefix, o, i, stored)


def load(src: Source, m: NvFp4Module) -> QuantizedTensor:
    """Materialise one module: codes left packed (:class:`PackedCodes`), E4M3 scales, the 0-dim global scale."""
    try:
        codes = PackedCodes(src.read(m.name), CODES_MAP, AXES, {OUT: m.out_features, IN: m.in_features},
                            signed=False)
        scales = np.asarray(src.read(m.prefix + ".weight_scale")).view(SCHEME.scale_np_dtype)
        g = np.array(src.read(m.prefix + ".weight_scale_2"), dtype=np.float32).reshape(())
        return QuantizedTensor(name=m.name, axes=AXES, codes=codes, scales=scales, scheme=SCHEME, group_map=GROUP_MAP,
                               stored={"codes": CODES_MAP, "scales": PARAM_MAP}, global_scale=g)
    except LayoutError as exc:
        exc.with_context(file=src.file_of(m.name), tensor=m.name)
        raise


# -- writing ------------------------------------------------------------------------------------------------
def is_nvfp4(spec: TensorSpec) -> bool:
    """Whether ``spec`` is a 4-bit E2M1 codebook tensor (the NVFP4 / MXFP4 element)."""
    s = spec.scheme
    return s is not None and s.codebook is not None and codebooks.element_of(s.codebook) is codebooks.ELEMENTS["e2m1"]


def check_target(spec: TensorSpec) -> str | None:
    """``None`` when E2M1 ``spec`` is held by ModelOpt NVFP4 (value-independent part), else the reason."""
    s, gm = spec.scheme, spec.group_map
    if s.scale_dtype != "F8_E4M3":
        return (f"E2M1 with {s.scale_dtype} scales (MXFP4 uses E8M0): ModelOpt NVFP4 stores E4M3 group scales "
                "(NVFP4QTensor)")
    if tuple(spec.axes) != AXES:
        return f"axes {list(spec.axes)}: only 2-D [out, in] NVFP4 weights are written"
    if gm.granularity is not Granularity.GROUP or gm.axis != IN or gm.group_size != NVFP4_GROUP:
        return f"{gm.describe()}: ModelOpt NVFP4 uses groups of 16 along in"
    if spec.shape[1] % NVFP4_GROUP:
        return f"in = {spec.shape[1]} is not a multiple of 16 (NVFP4 has no partial group)"
    return None


def multiplier(t: QuantizedTensor) -> np.ndarray | None:
    """``t``'s global scale as ModelOpt's ``weight_scale_2`` (float32 0-dim), or None when no float32
    multiplier gives the same effective scales (:func:`converter.global_scales.equivalent_global_scale`,
    proven on every E4M3 scale). No global scale: 1.0 (``s * 1 == s`` exactly)."""
    if t.global_scale is None:
        return np.array(1.0, dtype=np.float32)
    return equivalent_global_scale(t.global_scale, t.scheme.global_scale, DIRECTION, t.scheme.scale_dtype)


def refuse_global_scale(name: str, g, direction: str) -> NotRepresentableError:
    """The typed refusal of a global scale with no exact ModelOpt multiplier (names tensor and value)."""
    return NotRepresentableError(
        f"the {direction} global scale {float(np.float32(g))!r} has no float32 multiplier giving the same effective "
        "scales: ModelOpt weight_scale_2 multiplies", tensor=name, field="global_scale",
        expected="a global scale exactly re-expressible as a multiplier (a power-of-two divisor, any amax)",
        found=float(np.float32(g)),
        hint=FP8_HINT + "".join(f"; weight-only NVFP4: {x}" for x in [exact_targets_text(direction, "F8_E4M3")] if x))


def encode(t: QuantizedTensor, prefix: str) -> dict:
    """``<p>.weight`` (packed U8), ``<p>.weight_scale`` (F8_E4M3) and ``<p>.weight_scale_2`` (F32 0-dim)."""
    g = multiplier(t)
    if g is None:
        raise refuse_global_scale(t.name, t.global_scale, t.scheme.global_scale)
    return {prefix + ".weight": CODES_MAP.store_codes(t.packed if t.packed is not None else t.codes, AXES),
            prefix + ".weight_scale": np.ascontiguousarray(t.scales).astype(SCHEME.scale_np_dtype),
            prefix + ".weight_scale_2": np.array(g, dtype=np.float32).reshape(())}


def outputs(spec: TensorSpec, prefix: str) -> list[tuple[str, str, tuple[int, ...]]]:
    o, i = spec.shape
    return [(prefix + ".weight", "U8", (o, i // 2)), (prefix + ".weight_scale", "F8_E4M3", (o, i // NVFP4_GROUP)),
            (prefix + ".weight_scale_2", "F32", ())]


#: ``convert_hf_config._quant_algo_to_group_config`` for NVFP4 (as in the real 0.47.0 export's config.json).
GROUP_CONFIG = {"input_activations": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": NVFP4_GROUP},
                "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": NVFP4_GROUP}}

#: transformers 5.24 on a ModelOpt NVFP4 folder (measured on CPU, sample_checkpoints/modelopt_nvfp4_smollm2tiny):
#: "Unknown quantization type, got modelopt ... we will skip the quantization", then the packed [O, I/2]
#: weights fail the [O, I] parameter shapes (RuntimeError: "You set `ignore_mismatched_sizes` to `False`");
#: its ``nvfp4`` quantizer quantizes on the fly only ("Loading pre-quantized NVFP4 checkpoints is not supported yet").
TRANSFORMERS_NOTE = ("warning: transformers 5.24 does not load ModelOpt NVFP4 (quant_method modelopt is skipped and "
                     "the packed [O, I/2] weights fail the [O, I] shapes); load it with vLLM or TensorRT-LLM")
