"""formats/base.py: a format made of its four functions (detect, layers, decode, encode) reads and writes."""

from pathlib import Path

import numpy as np
import pytest

from converter.errors import NotRepresentableError
from converter.formats import registry
from converter.formats.base import define_format
from converter.formats.registry import Detection
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, TensorSpec, spec_of
from converter.write.plan import TensorPlan

SCHEME = QuantScheme(8, True, ZeroPoint.NONE, "F16")


def _toy(monkeypatch):
    """A toy format: int8 ``<m>.q`` [out, in] codes and fp16 ``<m>.s`` [out, 1] per-channel scales."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry.formats()))

    def detect(src: Source):
        return Detection("toy", 10, "toy .q/.s pairs") if any(n.endswith(".q") for n in src.tensor_names()) else None

    def layers(src: Source):
        out = {}
        for n in src.tensor_names():
            if n.endswith(".q"):
                m = n[:-2]
                shape = tuple(src.info(n).shape)
                stored = (src.stored_array(n, "codes"), src.stored_array(m + ".s", "scales"))
                out[m + ".weight"] = (TensorSpec(m + ".weight", "quantized", shape, stored, axes=(OUT, IN),
                                                 scheme=SCHEME, group_map=GroupMap.per_channel(OUT)), m)
        return out

    def decode(src: Source, spec: TensorSpec, m: str) -> QuantizedTensor:
        return QuantizedTensor(spec.name, (OUT, IN), np.array(src.read(m + ".q")), np.array(src.read(m + ".s")),
                               SCHEME, GroupMap.per_channel(OUT))

    def encode(spec: TensorSpec) -> TensorPlan:
        m = spec.name[:-len(".weight")]
        outs = [(m + ".q", "I8", tuple(spec.shape)), (m + ".s", "F16", (spec.shape[0], 1))]
        return TensorPlan(spec.name, outs, lambda t: {m + ".q": t.codes, m + ".s": t.scales})

    def check(spec, options):
        toy = spec.scheme == SCHEME and spec.group_map.describe() == GroupMap.per_channel(OUT).describe()
        return None if toy else "not toy"

    return define_format("toy", "toy format", detect=detect, layers=layers, decode=decode, encode=encode,
                         check_target=check)


def test_four_functions_make_a_readable_writable_format(monkeypatch, tmp_path: Path):
    handler = _toy(monkeypatch)
    codes = (np.arange(13 * 7) % 255 - 127).astype(np.int8).reshape(13, 7)
    t = QuantizedTensor("m.weight", (OUT, IN), codes, np.linspace(0.5, 2, 13, dtype=np.float16)[:, None],
                        SCHEME, GroupMap.per_channel(OUT))
    bias = DenseTensor("m.bias", np.arange(13, dtype=np.float32))
    handler.write(Checkpoint.from_tensors([t, bias], config={"model_type": "toy"}), tmp_path / "out")
    back = registry.load(tmp_path / "out")
    assert back.format == "toy" and sorted(back.names()) == ["m.bias", "m.weight"]
    assert np.array_equal(back["m.weight"].codes, codes)
    assert np.array_equal(back["m.weight"].dequantize(), t.dequantize())
    assert np.array_equal(back["m.bias"].data, bias.data)
    assert back.config == {"model_type": "toy"}


def test_check_target_refuses_before_writing(monkeypatch, tmp_path: Path):
    handler = _toy(monkeypatch)
    t = QuantizedTensor("m.weight", (OUT, IN), np.zeros((3, 8), np.uint8), np.ones((3, 1), np.float16),
                        QuantScheme(4, False, ZeroPoint.NONE, "F16"), GroupMap.per_channel(OUT))
    assert handler.target_reason(spec_of(t)) == "not toy"
    with pytest.raises(NotRepresentableError, match="not toy"):
        handler.write(Checkpoint.from_tensors([t]), tmp_path / "out")
    assert not (tmp_path / "out").exists()
