"""What a compressed-tensors checkpoint holds besides decodable weights: which modules are quantized, the
modules of a config group this reader cannot decode (opaque specs), and what the config says about
activations (checkpoint metadata).

Split from :mod:`converter.formats.compressed_tensors.reader` (the decode); same sources
(compressed-tensors 0.20.1 ``ModelCompressor``, ``QuantizationArgs``).
"""

from __future__ import annotations

import numpy as np

from converter.tensor import TensorSpec
from converter.formats.source import Source
from converter.formats.compressed_tensors.config import ConfigGroup, CTConfig
from converter.formats.compressed_tensors.float_layout import FloatLayout


def quantized_prefixes(src: Source) -> list[str]:
    """Modules with ``<p>.weight_packed``, or an int8 / 8-bit float ``<p>.weight`` next to ``<p>.weight_scale``."""
    out = []
    for n in src.tensor_names():
        if n.endswith(".weight_packed"):
            out.append(n[: -len(".weight_packed")])
        elif n.endswith(".weight_scale"):
            p = n[: -len(".weight_scale")]
            if not src.has(p + ".weight_packed") and src.has(p + ".weight") and (
                    src.info(p + ".weight").dtype == "I8" or src.info(p + ".weight").dtype.startswith("F8_")):
                out.append(p)
    return out


def _module_tensors(src: Source, prefix: str) -> list[str]:
    """Every stored quantization tensor of module ``prefix`` (``weight*``, ``input_*``): an opaque module's arrays."""
    head = prefix + "."
    return [n for n in src.tensor_names() if n.startswith(head) and "." not in n[len(head):]
            and (n[len(head):].startswith("weight") or n[len(head):].startswith("input_"))]


def opaque_spec(src: Source, group: ConfigGroup, prefix: str) -> TensorSpec:
    """Module ``prefix`` of a config group this reader cannot decode: listed (inspect, audit), never decoded."""
    names = _module_tensors(src, prefix)
    shape_name = prefix + ".weight_shape"
    if src.has(shape_name) and src.info(shape_name).dtype in ("I64", "I32") and len(src.info(shape_name).shape) == 1:
        shape = tuple(int(v) for v in np.asarray(src.read(shape_name)))
    else:
        main = prefix + ".weight" if src.has(prefix + ".weight") else prefix + ".weight_packed"
        shape = tuple(src.info(main).shape)
    roles = {"weight": "codes", "weight_packed": "codes", "weight_scale": "scales", "weight_zero_point": "zero_points",
             "weight_g_idx": "g_idx", "input_scale": "activation_scale", "weight_global_scale": "global_scale",
             "input_global_scale": "activation_scale"}
    stored = tuple(src.stored_array(n, roles.get(n.rsplit(".", 1)[-1], "other")) for n in names)
    return TensorSpec(prefix + ".weight", "opaque", shape, stored,
                      dtype=f"compressed-tensors {group.format or 'unknown format'} (config group {group.name!r})",
                      notes=(str(group.unreadable.render() if hasattr(group.unreadable, "render")
                                 else group.unreadable),))


def activation_metadata(cfg: CTConfig, layouts, opaque: dict[str, TensorSpec]) -> dict:
    """Checkpoint metadata on activations and unreadable groups (inspect shows the scalar entries).

    ``activations``: ``{module: "static" | "dynamic" | "dynamic:group:<n>"}`` (per tensor, per token, per
    token group of ``n``) for every quantized module whose group quantizes
    its input activations (the key both FP8 readers fill; writers use it to declare activations);
    ``input_activations``: one line per group; ``unreadable_groups``: the groups read as opaque.
    """
    out: dict = {}
    acts = {m.prefix: m.group.input_activations.metadata_value() for m in layouts
            if isinstance(m, FloatLayout) and m.group.input_activations is not None}
    if acts:
        out["activations"] = acts
    lines = [f"{g.name}: {g.input_activations.describe()}" for g in cfg.groups if g.input_activations is not None]
    if lines:
        out["input_activations"] = "; ".join(lines)
    if opaque:
        by_group: dict[str, int] = {}
        for spec in opaque.values():
            by_group[spec.dtype] = by_group.get(spec.dtype, 0) + 1
        out["unreadable_groups"] = "; ".join(f"{k}: {n} module(s) opaque" for k, n in by_group.items())
    return out
