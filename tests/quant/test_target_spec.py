"""Planning from shapes alone: the spec :func:`converter.quant.requant.target_spec` derives for a
requantized tensor (no array allocated) is the spec of the tensor ``requantize`` actually returns,
and a requantizing view's planned specs are those of the tensors it loads (qckpt issue 19: the
planner used to allocate a full-size zero code array per tensor to learn these)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from converter.formats import registry
from converter.groups import GroupMap
from converter.ops.requantize_model import requantize_checkpoint
from converter.quant.quantize import quantize
from converter.quant.requant import Target, requantize, target_spec
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import spec_of

def _key(spec):
    """A spec as comparable values (a GroupMap compares by identity): its group map's fields apart."""
    gm = spec.group_map
    fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "group_map"}
    return fields, (gm.granularity, gm.axis, gm.group_size, gm.block)


RNG = np.random.default_rng(19)
X = RNG.standard_normal((24, 96)).astype(np.float32)

SOURCES = {
    "s4 g32 f16": quantize(X, QuantScheme(4, True, scale_dtype="F16"), GroupMap.per_group(32)),
    "u4 asym g32": quantize(X, QuantScheme(4, False, zero_point=ZeroPoint.INTEGER, scale_dtype="F16"),
                            GroupMap.per_group(32)),
    "s8 channel f32": quantize(X, QuantScheme(8, True, scale_dtype="F32"), GroupMap.per_channel()),
    "u4 float bias g32": quantize(X, QuantScheme(4, False, zero_point=ZeroPoint.FLOAT, scale_dtype="F16"),
                                  GroupMap.per_group(32)),
    "s4 act-order g16": quantize(X, QuantScheme(4, True, scale_dtype="F16"),
                                 GroupMap.per_group(16, "in", g_idx=(RNG.permutation(96) // 16).astype(np.int32))),
}

TARGETS = [
    Target(bits=8, granularity="channel"),
    Target(bits=3),
    Target(group_size=16),
    Target(granularity="tensor", bits=8),
    Target(symmetric=False, bits=8, group_size=32),
    Target(scale_dtype="F32"),
    Target(scale_dtype="BF16", bits=2),
    Target(element="e4m3", granularity="channel"),
]


@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: repr(t.to_json()))
def test_target_spec_is_the_spec_of_the_requantized_tensor(source, target):
    t = SOURCES[source]
    try:
        got = requantize(t, target).tensor
    except Exception as exc:  # noqa: BLE001 - a target this source cannot take: target_spec refuses it too
        with pytest.raises(type(exc)):
            target_spec(spec_of(t), target)
        return
    assert _key(target_spec(spec_of(t), target)) == _key(spec_of(got))


def test_requantizing_view_plans_the_specs_it_loads(gptq_dir):
    src = registry.load(gptq_dir)
    for target in (Target(bits=8, granularity="channel"), Target(bits=3, group_size=32)):
        view, plans = requantize_checkpoint(src, target)
        for name in plans:
            assert _key(view.spec(name)) == _key(spec_of(view[name])), name


@pytest.mark.parametrize("quant_type", ["Q8_0", "Q4_1"])
def test_float_weights_the_target_quantizes_are_planned_as_loaded(quant_type):
    """A float weight quantized by the target format's own quantizer (the GGUF output head of an FP8
    checkpoint) is planned from its shape (``_float_spec``) as the tensor the view loads.

    (Not K-quants: a planned spec says ``double_quant`` None where the loaded Q4_K tensor says
    ``Q4_K``, as the full-size probes it replaced did: left as it was, noted for a later round.)"""
    from pathlib import Path

    from converter.ops.module_policy import apply_module_policy
    from converter.ops.target_plan import effective
    src = registry.load(Path(__file__).resolve().parents[2] / "sample_checkpoints" / "deepseek_fp8_block_smollm2tiny")
    handler = registry.check_writable("gguf")
    ckpt, _ = apply_module_policy(handler.arrange(src) if handler.arrange else src, handler)
    target = effective(Target(quant_type=quant_type), handler)
    chosen = handler.requant_targets(ckpt, target)
    view, plans = requantize_checkpoint(ckpt, target, fmt=handler.quantizer,
                                        overrides={n: t for n, (t, _) in chosen.items()})
    floats = [n for n in plans if ckpt.spec(n).kind != "quantized"]
    assert floats
    for name in plans:
        assert _key(view.spec(name)) == _key(spec_of(view[name])), name
