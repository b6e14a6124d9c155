"""Read a compressed-tensors checkpoint: each quantized module's layout by its config group, stray
partner tensors refused, the rest dense. The layouts: integer ``pack-quantized`` / ``int-quantized`` /
``naive-quantized`` (:mod:`~converter.formats.compressed_tensors.int_layout`), ``float-quantized`` FP8
(:mod:`~converter.formats.compressed_tensors.float_layout`), ``nvfp4-`` / ``mxfp4-pack-quantized``
(:mod:`~converter.formats.compressed_tensors.fp4_layout`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from converter.errors import FormatError
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec
from converter.formats.base import source_checkpoint
from converter.formats.registry import Detection
from converter.formats.source import Source
from converter.formats.compressed_tensors.config import parse_config
from converter.formats.compressed_tensors.float_layout import FloatLayout, activation_spec, float_layout, load_float
from converter.formats.compressed_tensors.int_layout import AXES, ModuleLayout, load_module, module_layout
from converter.formats.compressed_tensors.inventory import activation_metadata, opaque_spec, quantized_prefixes
from converter.formats.compressed_tensors import e8m0_rule
from converter.formats.compressed_tensors.fp4_layout import (ACTIVATION_SUFFIXES, FP4Layout, fp4_layout, is_fp4_group,
                                                             load_fp4)
from converter.formats.compressed_tensors.fp4_layout import activation_spec as fp4_activation_spec

FORMAT = "compressed-tensors"
SUFFIXES = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "weight_g_idx", "weight_global_scale")
__all__ = ["AXES", "FORMAT", "SUFFIXES", "detect_ct", "e8m0_rule_evidence", "read_ct"]


def _layouts(src: Source):
    """(config, module layouts, opaque specs, owned stored names, MXFP4 prefixes, E8M0 rule decision)."""
    cfg_file = Path(src.directory) / "config.json"
    cfg = parse_config(src.quantization_config, file=cfg_file)
    layouts: dict[str, ModuleLayout | FloatLayout | FP4Layout] = {}
    opaque: dict[str, TensorSpec] = {}
    for p in quantized_prefixes(src):
        group = cfg.group_for(p)
        if group is not None and group.unreadable is not None:
            opaque[p + ".weight"] = opaque_spec(src, group, p)
        elif is_fp4_group(group) and src.has(p + ".weight_packed"):
            m = fp4_layout(src, group, p)
            layouts[m.name] = m
        elif group is not None and group.weights is not None and src.has(p + ".weight") \
                and src.info(p + ".weight").dtype.startswith("F8_"):
            m = float_layout(src, group, p)
            layouts[m.name] = m
        else:
            m = module_layout(src, cfg, p)
            layouts[m.name] = m
    owned = {s for m in layouts.values() for s in (a.name for a in m.stored)}
    owned |= {a.name for spec in opaque.values() for a in spec.stored}
    mx = [m.prefix for m in layouts.values() if isinstance(m, FP4Layout) and m.fmt == "mxfp4-pack-quantized"]
    rule = e8m0_rule.decide(src, cfg.version, cfg.version_tuple, mx, owned) if mx else None
    if rule is not None:
        layouts.update({n: replace(m, rule=rule) for n, m in layouts.items()
                        if isinstance(m, FP4Layout) and m.prefix in mx})
    return cfg, layouts, opaque, owned, mx, rule


def e8m0_rule_evidence(src: Source) -> dict | None:
    """Validation hook: which E8M0 encoding the MXFP4 modules use and what decided it
    (:func:`e8m0_rule.decide`); None without MXFP4 modules. Keys: ``rule``, ``by``, ``version_rule``,
    ``data_rule``, ``evidence``, ``factor`` (the two encodings' decode ratio, 4), ``tensors``."""
    _, layouts, _, _, mx, rule = _layouts(src)
    if rule is None:
        return None
    names = sorted(n for n, m in layouts.items() if isinstance(m, FP4Layout) and m.prefix in mx)
    return {"rule": rule.rule, "by": rule.by, "version_rule": rule.version_rule, "data_rule": rule.data_rule,
            "evidence": rule.evidence, "factor": 2 ** e8m0_rule.LEGACY_OFFSET, "tensors": names}


def read_ct(src: Source) -> Checkpoint:
    """Read a compressed-tensors checkpoint into a lazily loaded :class:`Checkpoint`.

    Raises
    ------
    FormatError, MissingTensorError, UnsupportedError
        See :func:`module_layout` and :func:`converter.formats.compressed_tensors.config.parse_config`.
    """
    cfg, layouts, opaque, owned, mx, rule = _layouts(src)
    # Stray partner tensors of modules that are not quantized would be silently dense otherwise.
    for n in src.tensor_names():
        if n not in owned and n.rsplit(".", 1)[-1] in SUFFIXES:
            raise FormatError("quantization partner tensor without its quantized module", file=src.file_of(n),
                              tensor=n, field="name", expected="weight_packed or int8 weight beside it", found="absent")
    activations = {m.prefix + ".input_scale" for m in layouts.values() if isinstance(m, FloatLayout)}
    fp4_acts = {f"{m.prefix}.{s}" for m in layouts.values() if isinstance(m, FP4Layout) for s in ACTIVATION_SUFFIXES}
    specs: dict[str, TensorSpec] = {}
    for n in src.tensor_names():
        if n in owned:
            continue
        specs[n] = (activation_spec(src, n) if n in activations else
                    fp4_activation_spec(src, n) if n in fp4_acts else src.dense_spec(n))
    specs.update(opaque)
    for name, m in layouts.items():
        if isinstance(m, (FloatLayout, FP4Layout)):
            specs[name] = m.spec()
            continue
        notes = []
        if m.args.strategy == "group" and m.in_features % m.args.group_size:
            notes.append(f"partial final group: I={m.in_features} is not a multiple of {m.args.group_size}")
        if m.packing == "padded":
            notes.append("padded pack_to_int32 layout (compressed-tensors <= 0.17)")
        specs[name] = TensorSpec(name, "quantized", (m.out_features, m.in_features), m.stored, axes=AXES,
                                 scheme=m.scheme, group_map=m.group_map, act_order=m.has_g_idx, notes=tuple(notes))

    def load(name: str) -> QuantizedTensor:
        m = layouts[name]
        if isinstance(m, FP4Layout):
            return load_fp4(src, m)
        return load_float(src, m) if isinstance(m, FloatLayout) else load_module(src, m)
    extra = {"mx_e8m0_rule": f"{rule.rule} ({rule.by})", "mx_e8m0_evidence": rule.evidence} if rule else {}
    return source_checkpoint(src, FORMAT, specs, load, layouts,
                             {"ct_format": cfg.format, "ct_version": cfg.version,
                              **activation_metadata(cfg, layouts.values(), opaque), **extra})


def detect_ct(src: Source) -> Detection | None:
    """Claim inputs whose config says compressed-tensors (90), or with ``weight_packed`` + ``weight_shape`` (60)."""
    if src.kind == "gguf":
        return None
    qc = src.quantization_config
    if isinstance(qc, dict) and qc.get("quant_method") == "compressed-tensors":
        return Detection("compressed-tensors", 90, "quantization_config.quant_method = compressed-tensors")
    names = src.tensor_names()
    if any(n.endswith(".weight_packed") and src.has(n[:-len("packed")] + "shape") for n in names):
        return Detection("compressed-tensors", 60, "tensors named *.weight_packed with *.weight_shape")
    return None
