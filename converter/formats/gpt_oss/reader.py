"""gpt-oss MXFP4 reading: detection from config and headers, the expert projections as logical specs.

Every ``<p>.gate_up_proj_blocks`` / ``<p>.down_proj_blocks`` pair (with its ``_scales``) becomes the logical
tensor ``<p>.gate_up_proj`` / ``<p>.down_proj`` (:mod:`.layout`); every other stored tensor (attention, router,
norms, embeddings, head, the expert biases) is dense BF16 as stored. ``gate_up_proj`` carries its interleave
record (:mod:`.interleave`) in its notes and in ``Checkpoint.metadata["fused"]``.
"""

from __future__ import annotations

from typing import Any, Mapping

from converter.errors import ErrorKind, FormatError
from converter.layout import EXPERT, IN, OUT
from converter.formats.registry import Detection
from converter.formats.source import Source
from converter.formats.gpt_oss.config import is_mxfp4, kept_dense, not_converted
from converter.formats.gpt_oss.interleave import GATE_UP
from converter.formats.gpt_oss.layout import BLOCKS, PROJECTIONS, SCALES, ExpertLayout, expert_layout, expert_spec

FORMAT = "gpt-oss"


def _projections(src: Source) -> list[tuple[str, str]]:
    """``(prefix, proj)`` of every stored ``<prefix>.<proj>_blocks`` / ``_scales`` name."""
    found = set()
    for n in src.tensor_names():
        for proj in PROJECTIONS:
            for suffix in (BLOCKS, SCALES):
                tail = f".{proj}{suffix}"
                if n.endswith(tail):
                    found.add((n[:-len(tail)], proj))
    return sorted(found)


def detect(src: Source) -> Detection | None:
    """``quantization_config.quant_method == "mxfp4"`` and at least one ``*_proj_blocks`` tensor."""
    if src.kind != "directory" or not is_mxfp4(src.quantization_config):
        return None
    if not _projections(src):
        return None
    return Detection(FORMAT, 90, 'quant_method "mxfp4" with gpt-oss expert *_proj_blocks / *_scales tensors')


def layers(src: Source) -> dict[str, tuple[Any, ExpertLayout]]:
    """The quantized expert projections as ``{logical name: (spec, layout)}``.

    Raises
    ------
    FormatError
        A quantized projection whose module ``modules_to_not_convert`` names (transformers would expect it
        dense and find only ``_blocks``), or any check of :func:`.layout.expert_layout`.
    """
    patterns = not_converted(src.quantization_config, file=src.directory / "config.json")
    out = {}
    for prefix, proj in _projections(src):
        if kept_dense(prefix, patterns):
            raise FormatError("modules_to_not_convert names an expert module stored quantized: transformers would "
                              "keep it BF16 and not read its _blocks", file=src.directory / "config.json",
                              tensor=f"{prefix}.{proj}{BLOCKS}", field="quantization_config.modules_to_not_convert",
                              expected=f"no pattern matching {prefix!r}", found=list(patterns or ()),
                              kind=ErrorKind.CONFIG_MISMATCH)
        m = expert_layout(src, prefix, proj)
        notes = ("gpt-oss MXFP4: E2M1 low nibble first, E8M0 2^(b-127) per 32 inputs, [expert, out, in]",)
        if proj == "gate_up_proj":
            notes += (GATE_UP.note(),)
        out[m.name] = (expert_spec(m, notes), m)
    return out


def metadata(src: Source, found: Mapping[str, tuple[Any, ExpertLayout]]) -> dict[str, Any]:
    """``modules_to_not_convert`` as written, the interleave record of every fused ``gate_up_proj`` and
    ``dense_axes``: the BF16 ``GptOssExperts`` parameters are ``[expert, in, out]`` (``gate_up_proj``
    ``[E, hidden, 2 * intermediate]``, modeling_gpt_oss.py line 75; the dequantize transposes, mxfp4.py line 285),
    so a float export writes them in that order."""
    patterns = not_converted(src.quantization_config, file=src.directory / "config.json")
    return {"modules_to_not_convert": None if patterns is None else list(patterns),
            "fused": {n: GATE_UP.to_json() for n, (_, m) in found.items() if m.proj == "gate_up_proj"},
            "dense_axes": {n: [EXPERT, IN, OUT] for n in found}}
