"""gpt-oss MXFP4 expert storage: the stored arrays of one fused expert projection, checked from headers, and its decode.

Per MoE layer ``<p>`` = ``model.layers.<L>.mlp.experts`` (``GptOssExperts``, transformers 5.24
``models/gpt_oss/modeling_gpt_oss.py`` lines 69-80) and projection ``<j>`` in ``gate_up_proj`` / ``down_proj``:

- ``<p>.<j>_blocks`` U8 ``[E, O, G, 16]``: 32 E2M1 codes of one group in 16 bytes, element ``2k`` of the group
  in the **low** nibble of byte ``k`` and ``2k + 1`` in the high nibble (``integrations/mxfp4.py``
  ``_convert_moe_packed_tensors`` lines 270-276: ``sub[:, 0::2] = lut[blk & 0x0F]``, ``sub[:, 1::2] =
  lut[blk >> 4]``; openai/gpt-oss ``gpt_oss/torch/weights.py`` ``_get_mxfp4_tensor`` the same). The codebook is
  ``FP4_VALUES`` (lines 29-46): 0, .5, 1, 1.5, 2, 3, 4, 6 and their negatives at ``code | 8`` (E2M1).
- ``<p>.<j>_scales`` U8 ``[E, O, G]``: one E8M0 exponent per group, ``2^(byte - 127)`` (line 243:
  ``scales.to(torch.int32) - 127``, then ``torch.ldexp``). Byte 255 is read as OCP E8M0 NaN here; transformers'
  ``ldexp`` would give ``2^128`` (inf), so no real checkpoint stores it.
- Orientation: ``[E, out, in]`` with ``in = 32 G`` (line 283: the groups flattened into the last axis, then
  ``transpose(1, 2)`` into the ``[E, in, out]`` of the BF16 parameter, ``GptOssExperts.gate_up_proj``
  ``[E, hidden, 2 * intermediate]``, ``down_proj`` ``[E, intermediate, hidden]``). So ``gate_up_proj`` is
  ``[E, 2 * intermediate, hidden/32, 16]`` and ``down_proj`` ``[E, hidden, intermediate/32, 16]``.
- ``gate_up_proj`` rows interleave gate and up (``GptOssExperts._apply_gate``, line 83: ``gate_up[..., ::2]``
  is the gate, ``[..., 1::2]`` the up projection; openai/gpt-oss ``torch/model.py`` ``swiglu``):
  :mod:`converter.formats.gpt_oss.interleave`.
- ``<p>.<j>_bias`` BF16 ``[E, O]``: dense (``param_needs_quantization`` excludes ``*_bias``,
  ``quantizers/quantizer_mxfp4.py`` lines 144-152).

The logical tensor is ``<p>.<j>`` (the BF16 parameter's name), axes ``(expert, out, in)``, codes E2M1, scales
``F8_E8M0`` per 32 along ``in``. A partial final group cannot be stored: ``G`` groups always decode to ``32 G``
inputs, so a config whose ``hidden_size`` / ``intermediate_size`` is not ``32 G`` cannot load in transformers;
such a checkpoint is refused (:class:`~converter.errors.UnsupportedError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from converter.codebooks import E2M1_VALUES
from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError, UnsupportedError
from converter.groups import GroupMap
from converter.layout import EXPERT, IN, OUT, AxisMap, PackedCodes
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor, StoredArray, TensorSpec
from converter.formats.source import Source

#: The two quantized projections of ``GptOssExperts`` (``Mxfp4HfQuantizer.serialized_names``).
PROJECTIONS = ("gate_up_proj", "down_proj")
BLOCKS, SCALES, BIAS = "_blocks", "_scales", "_bias"
#: Elements per group and bytes per stored block.
GROUP = 32
BLOCK_BYTES = GROUP // 2
AXES = (EXPERT, OUT, IN)
#: ``<j>_blocks`` viewed as ``[E, O, G * 16]``: two E2M1 fields per byte, low nibble first along ``in``.
CODES_MAP = AxisMap(AXES, packed_axis=IN, bits=4, container="U8", packing="stream")
SCALES_MAP = AxisMap(AXES)
SCHEME = QuantScheme(4, False, scale_dtype="F8_E8M0", codebook=E2M1_VALUES)
GROUP_MAP = GroupMap.per_group(GROUP, IN)


def _fail(src: Source, tensor: str, message: str, field: str, expected: Any, found: Any,
          kind: ErrorKind | None = None, cls: type = FormatError) -> Exception:
    file = src.file_of(tensor) if src.has(tensor) else src.path
    return cls(message, file=file, tensor=tensor, field=field, expected=expected, found=found, kind=kind)


@dataclass(frozen=True)
class ExpertLayout:
    """One fused expert projection known from headers: ``<prefix>.<proj>``, sizes and stored arrays."""

    prefix: str
    proj: str
    experts: int
    out_features: int
    in_features: int
    stored: tuple[StoredArray, ...]

    @property
    def name(self) -> str:
        return f"{self.prefix}.{self.proj}"

    @property
    def groups(self) -> int:
        return self.in_features // GROUP

    def sizes(self) -> dict[str, int]:
        return {EXPERT: self.experts, OUT: self.out_features, IN: self.in_features}


def _config_int(cfg: Mapping[str, Any], key: str) -> int | None:
    v = cfg.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _check_config(src: Source, m: ExpertLayout, cfg: Mapping[str, Any]) -> None:
    """``num_local_experts``, ``hidden_size``, ``intermediate_size`` against the stored shape (when present)."""
    hidden, inter, experts = (_config_int(cfg, k) for k in ("hidden_size", "intermediate_size", "num_local_experts"))
    bname = m.name + BLOCKS
    if experts is not None and experts != m.experts:
        raise _fail(src, bname, "expert count differs from config.json num_local_experts", "shape[0]", experts,
                    m.experts, ErrorKind.CONFIG_MISMATCH)
    want = {"gate_up_proj": ((None if inter is None else 2 * inter, "2 * intermediate_size"), (hidden, "hidden_size")),
            "down_proj": ((hidden, "hidden_size"), (inter, "intermediate_size"))}[m.proj]
    for (n, what), got, axis in zip(want, (m.out_features, m.in_features), ("out (shape[1])", "in (32 * shape[2])")):
        if n is None or n == got:
            continue
        if axis.startswith("in") and n % GROUP:
            raise _fail(src, bname, f"config {what} = {n} is not a multiple of {GROUP}: gpt-oss MXFP4 blocks always "
                        f"decode to 32 * G inputs (_convert_moe_packed_tensors), a partial final group cannot be "
                        "stored", "shape", f"[E, O, {n}/32, 16] with {n} % 32 == 0", list(src.info(bname).shape),
                        ErrorKind.SHAPE, UnsupportedError)
        raise _fail(src, bname, f"{axis} differs from config.json {what}", "shape", n, got, ErrorKind.CONFIG_MISMATCH)


def expert_layout(src: Source, prefix: str, proj: str) -> ExpertLayout:
    """Check the stored arrays of ``<prefix>.<proj>`` (blocks, scales, optional bias) against each other and
    ``config.json``.

    Raises
    ------
    FormatError
        Wrong dtype, rank or block width; scales not ``blocks.shape[:-1]``; sizes contradicting the config.
    MissingTensorError
        ``_blocks`` without ``_scales`` (or the reverse).
    UnsupportedError
        A config size that is not a multiple of 32 (a partial final group).
    """
    name = f"{prefix}.{proj}"
    bname, sname = name + BLOCKS, name + SCALES
    for have, need in ((bname, sname), (sname, bname)):
        if src.has(have) and not src.has(need):
            raise MissingTensorError("partner tensor missing: every gpt-oss MXFP4 projection stores _blocks and "
                                     "_scales", file=src.file_of(have), tensor=need, expected="present",
                                     found="absent", hint=f"projection {name!r}")
    b, s = src.info(bname), src.info(sname)
    if b.dtype != "U8" or len(b.shape) != 4 or int(b.shape[-1]) != BLOCK_BYTES:
        raise _fail(src, bname, "gpt-oss MXFP4 blocks are uint8 [experts, out, groups, 16]", "dtype/shape",
                    "U8 [E, O, G, 16]", f"{b.dtype} {list(b.shape)}", ErrorKind.SHAPE)
    if s.dtype != "U8":
        raise _fail(src, sname, "gpt-oss MXFP4 scales are uint8 E8M0 exponents (bias 127)", "dtype", "U8", s.dtype)
    if tuple(s.shape) != tuple(b.shape[:-1]):
        raise _fail(src, sname, "scales must be blocks.shape[:-1] (one exponent per 32-element block)", "shape",
                    list(b.shape[:-1]), list(s.shape), ErrorKind.SHAPE)
    e, o, g = (int(v) for v in b.shape[:-1])
    if proj == "gate_up_proj" and o % 2:
        raise _fail(src, bname, "gate_up_proj interleaves gate and up rows: out must be even", "shape[1]",
                    "even", o, ErrorKind.SHAPE)
    stored = [src.stored_array(bname, "codes"), src.stored_array(sname, "scales")]
    m = ExpertLayout(prefix, proj, e, o, GROUP * g, tuple(stored))
    _check_config(src, m, src.config or {})
    return m


def expert_spec(m: ExpertLayout, notes: tuple[str, ...] = ()) -> TensorSpec:
    """The logical spec: ``(expert, out, in)`` E2M1 codes, E8M0 scales per 32 along ``in``."""
    return TensorSpec(m.name, "quantized", (m.experts, m.out_features, m.in_features), m.stored, axes=AXES,
                      scheme=SCHEME, group_map=GROUP_MAP, notes=notes)


def load_expert(src: Source, m: ExpertLayout) -> QuantizedTensor:
    """Materialise one projection: codes still packed (the blocks viewed ``[E, O, G * 16]``), E8M0 scales."""
    bname = m.name + BLOCKS
    try:
        blocks = np.asarray(src.read(bname))
        words = blocks.reshape(m.experts, m.out_features, m.groups * BLOCK_BYTES)
        codes = PackedCodes(words, CODES_MAP, AXES, m.sizes(), signed=False)
        raw = np.asarray(src.read(m.name + SCALES))
        scales = np.array(raw.view(np.uint8)).view(ml_dtypes.float8_e8m0fnu)
        return QuantizedTensor(m.name, AXES, codes, scales, SCHEME, GROUP_MAP,
                               stored={"codes": CODES_MAP, "scales": SCALES_MAP})
    except LayoutError as exc:
        exc.with_context(file=src.file_of(bname), tensor=m.name)
        raise
