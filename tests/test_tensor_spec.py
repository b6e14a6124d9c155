"""TensorSpec invariants: a quantized spec has scheme, axes and group map; opaque specs name their type."""

import pytest

from converter import GroupMap, QuantScheme
from converter.errors import LayoutError, UnsupportedError
from converter.tensor import Checkpoint, StoredArray, TensorSpec, opaque_reason

ST = (StoredArray("w", "other", "IQ4_NL", (2, 64), 72),)


@pytest.mark.parametrize("missing", ["axes", "scheme", "group_map"])
def test_quantized_spec_needs_scheme_axes_and_group_map(missing):
    full = {"axes": ("out", "in"), "scheme": QuantScheme(4, True), "group_map": GroupMap.per_group(32)}
    full[missing] = None
    with pytest.raises(LayoutError, match="needs axes, scheme and group map") as e:
        TensorSpec("w", "quantized", (2, 64), ST, **full)
    assert e.value.tensor == "w" and e.value.field == missing and "opaque" in e.value.hint


def test_unknown_kind_and_opaque_without_type_refused():
    with pytest.raises(LayoutError, match="unknown tensor kind"):
        TensorSpec("w", "blob", (2, 64), ST)
    with pytest.raises(LayoutError, match="storage type"):
        TensorSpec("w", "opaque", (2, 64), ST)


def test_opaque_spec_reason_and_load_refused():
    spec = TensorSpec("w", "opaque", (2, 64), ST, dtype="IQ4_NL")
    assert "IQ4_NL" in opaque_reason(spec)
    assert opaque_reason(TensorSpec("b", "dense", (2,), ST, dtype="F32")) is None
    ck = Checkpoint({"w": spec}, lambda n: pytest.fail("the loader must not run for an opaque spec"),
                    format="gguf", path="m.gguf")
    with pytest.raises(UnsupportedError, match="cannot load or dequantize") as e:
        ck["w"]
    assert (e.value.file, e.value.tensor, e.value.found) == ("m.gguf", "w", "IQ4_NL")
    with pytest.raises(UnsupportedError):
        ck.refuse_opaque("native")
