"""gpt-oss MXFP4 writing: which specs the layout holds, the arrays of one projection, the config.

transformers' Mxfp4 integration quantizes only the two projections of ``GptOssExperts`` (``integrations/mxfp4.py``
``replace_with_mxfp4_linear`` replaces ``GptOssMLP.experts``; ``Mxfp4HfQuantizer.serialized_names``: ``gate_up_proj``
and ``down_proj``); every other module loads BF16. So the target holds exactly E2M1 + E8M0-per-32 tensors named
``<...>.mlp.experts.gate_up_proj`` / ``down_proj`` with axes ``(expert, out, in)``, written as
``<name>_blocks`` U8 ``[E, O, in/32, 16]`` and ``<name>_scales`` U8 ``[E, O, in/32]`` (:mod:`.layout`): the packed
E2M1 bytes and E8M0 bytes move unchanged (an exact repack from compressed-tensors / MLX MXFP4).
"""

from __future__ import annotations

import re

import numpy as np

from converter.codebooks import element_of
from converter.errors import NotRepresentableError
from converter.groups import Granularity
from converter.layout import IN
from converter.tensor import Checkpoint, TensorSpec, opaque_reason
from converter.write.plan import TensorPlan, dense_plan
from converter.formats.registry import NO_OPTIONS, TargetOptions
from converter.formats.gpt_oss.config import emit
from converter.formats.gpt_oss.layout import AXES, BLOCK_BYTES, BLOCKS, CODES_MAP, GROUP, SCALES

#: The BF16 parameter names of ``GptOssExperts`` that the MXFP4 layout stores quantized.
EXPERT_RE = re.compile(r"(^|\.)experts\.(gate_up_proj|down_proj)$")


NOT_AN_EXPERT = ("gpt-oss MXFP4 quantizes only the GptOssExperts gate_up_proj / down_proj parameters "
                 "(replace_with_mxfp4_linear); this module loads BF16")


def _expert(spec: TensorSpec) -> bool:
    return bool(EXPERT_RE.search(spec.name)) and len(spec.shape) == 3


def check_target(spec: TensorSpec, options: TargetOptions = NO_OPTIONS) -> str | None:
    """``None`` when quantized ``spec`` is an MXFP4 gpt-oss expert projection (or a dense tensor), else why not."""
    if spec.kind == "opaque":
        return opaque_reason(spec)
    if spec.kind != "quantized":
        return None
    if not EXPERT_RE.search(spec.name):
        return NOT_AN_EXPERT
    s, gm = spec.scheme, spec.group_map
    el = element_of(s.codebook)
    if el is None or el.name != "e2m1" or s.scale_dtype != "F8_E8M0" or s.global_scale is not None:
        return f"{s.describe()} with {s.scale_dtype} scales: gpt-oss MXFP4 stores E2M1 codes with E8M0 scales only"
    if tuple(spec.axes) != AXES:
        return f"axes {list(spec.axes)}: gpt-oss experts are (expert, out, in)"
    if gm.granularity is not Granularity.GROUP or gm.axis != IN or gm.group_size != GROUP or gm.g_idx is not None:
        return f"{gm.describe()}: gpt-oss MXFP4 groups are 32 consecutive inputs"
    if spec.shape[2] % GROUP:
        return (f"in {spec.shape[2]} is not a multiple of {GROUP}: gpt-oss blocks [E, O, G, 16] cannot hold a partial "
                "final group (transformers' dequantize makes 32 G inputs)")
    if spec.name.endswith("gate_up_proj") and spec.shape[1] % 2:
        return f"gate_up_proj out {spec.shape[1]} is odd: gate and up rows interleave in pairs"
    return None


def keep_dense(spec: TensorSpec) -> str | None:
    """The module policy: everything but the expert projections loads BF16 in transformers."""
    if _expert(spec):
        return None
    return NOT_AN_EXPERT


def encode(spec: TensorSpec) -> TensorPlan:
    """The plan of one projection: ``_blocks`` and ``_scales`` from packed codes and E8M0 bytes."""
    e, o, i = spec.shape
    g = i // GROUP
    bname, sname = spec.name + BLOCKS, spec.name + SCALES

    def arrays(t) -> dict:
        words = CODES_MAP.store_codes(t.packed if t.packed is not None else t.codes, AXES)
        return {bname: np.ascontiguousarray(words).reshape(e, o, g, BLOCK_BYTES),
                sname: np.array(np.ascontiguousarray(t.scales).view(np.uint8), dtype=np.uint8)}
    return TensorPlan(spec.name, [(bname, "U8", (e, o, g, BLOCK_BYTES)), (sname, "U8", (e, o, g))], arrays,
                      ["exact repack: E2M1 bytes and E8M0 exponents copied into [E, O, G, 16] blocks"])


def dense(ckpt: Checkpoint, spec: TensorSpec) -> TensorPlan:
    """A dense tensor passes through, except a dense expert projection, which the MXFP4 loader cannot read.

    Raises
    ------
    NotRepresentableError
        A dense ``experts.gate_up_proj`` / ``down_proj`` (a BF16 export, ``[E, in, out]``): quantize it first.
    """
    if EXPERT_RE.search(spec.name):
        raise NotRepresentableError("a dense expert projection cannot be written as gpt-oss MXFP4 without quantizing "
                                    "it (the loader expects _blocks / _scales)", tensor=spec.name, field="kind",
                                    expected="quantized E2M1 / E8M0", found=f"dense {spec.dtype}",
                                    hint="quantize the experts to MXFP4 first (requantize options)")
    return dense_plan(spec)


def config(ckpt: Checkpoint) -> dict:
    """The source ``config.json`` with gpt-oss's ``quantization_config`` (the source's
    ``modules_to_not_convert`` when it is gpt-oss, else transformers' default list)."""
    cfg = dict(ckpt.config or {})
    patterns = (ckpt.metadata or {}).get("modules_to_not_convert") if ckpt.format == "gpt-oss" else None
    cfg["quantization_config"] = emit(tuple(patterns) if patterns is not None else None)
    return cfg
