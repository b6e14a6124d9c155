"""Native format: read -> write -> read is bit-exact; the descriptor validates against the schema."""

import json

import ml_dtypes
import numpy as np
import pytest

import converter
from converter import DenseTensor, GroupMap, QuantScheme, ZeroPoint
from converter.errors import ConverterError, FormatError
from converter.formats.safetensors_io import read_header
from converter.quant.quantize import quantize
from converter.schemas import validate_document
from converter.tensor import Checkpoint

RNG = np.random.default_rng(7)


def _ckpt():
    tensors = [
        quantize(RNG.standard_normal((7, 20)).astype(np.float32), QuantScheme(3, False, ZeroPoint.INTEGER, "BF16"),
                 GroupMap.per_group(8), name="a.weight"),
        quantize(RNG.standard_normal((5, 12)).astype(np.float32), QuantScheme(4, True), GroupMap.per_group(
            4, g_idx=np.array([2, 0, 1] * 4)), name="b.weight"),
        quantize(RNG.standard_normal((3, 33)).astype(np.float32), QuantScheme(5, False, ZeroPoint.FLOAT, "F32"),
                 GroupMap.per_channel("out"), name="c.weight"),
        quantize(RNG.standard_normal((2, 3, 16)).astype(np.float32), QuantScheme(8, True, scale_dtype="F32"),
                 GroupMap.per_tensor(), name="experts.weight", axes=("expert", "out", "in")),
        DenseTensor("a.bias", RNG.standard_normal(7).astype(ml_dtypes.bfloat16)),
    ]
    return Checkpoint.from_tensors(tensors)


def test_round_trip_bit_exact(tmp_path):
    ck = _ckpt()
    p = tmp_path / "m.safetensors"
    converter.save(ck, p, format="native")
    back = converter.load(p)
    assert back.format == "native" and sorted(back.names()) == sorted(ck.names())
    for name in ck.names():
        a, b = ck[name], back[name]
        if isinstance(a, DenseTensor):
            assert a.data.dtype == b.data.dtype and np.array_equal(a.data.view(np.uint16), b.data.view(np.uint16))
            continue
        np.testing.assert_array_equal(a.codes, b.codes)
        assert a.scales.dtype == b.scales.dtype
        np.testing.assert_array_equal(a.scales.astype(np.float32), b.scales.astype(np.float32))
        assert a.scheme == b.scheme and a.axes == b.axes
        np.testing.assert_array_equal(a.dequantize(), b.dequantize())
    # the same input written twice gives byte-identical files (deterministic header)
    p2, p3 = tmp_path / "m2.safetensors", tmp_path / "m3.safetensors"
    converter.save(back, p2, format="native")
    converter.save(converter.load(p), p3, format="native")
    assert p2.read_bytes() == p3.read_bytes()


def test_descriptors_validate_against_schema(tmp_path):
    p = tmp_path / "m.safetensors"
    converter.save(_ckpt(), p, format="native")
    meta = read_header(p).metadata
    keys = [k for k in meta if k.startswith("qckpt.layout.")]
    assert len(keys) == 4
    for k in keys:
        validate_document(json.loads(meta[k]), "layout")
    d = json.loads(meta["qckpt.layout.b.weight"])
    assert d["group_map"] == {"granularity": "group", "axis": "in", "group_size": 4, "g_idx": True,
                              "n_groups": 3, "partial_tail": 0}
    assert d["codes"]["packed_axis"] == "in" and d["codes"]["container"] == "U32"


def test_bad_descriptor_is_a_typed_error(tmp_path):
    from converter.write.safetensors import write_safetensors
    p = tmp_path / "bad.safetensors"
    write_safetensors(p, {"w.qcodes": np.zeros((2, 1), np.uint32), "w.scales": np.ones((2, 1), np.float16)},
                      {"qckpt.format": "native", "qckpt.version": "1", "qckpt.layout.w": json.dumps({"schema": "x"})})
    with pytest.raises(FormatError, match="layout.schema.json") as e:
        converter.load(p)
    assert "'w'" in str(e.value)


def test_existing_destination_untouched(tmp_path):
    p = tmp_path / "m.safetensors"
    p.write_bytes(b"keep me")
    with pytest.raises(ConverterError, match="exists"):
        converter.save(_ckpt(), p, format="native")
    assert p.read_bytes() == b"keep me"


def test_float_codes_are_refused_not_reinterpreted(tmp_path):
    # the qcodes array rewritten as float32 with the same bytes: the old reader viewed it as uint32
    # words and decoded it silently; now a FormatError names the stored tensor and its dtype
    from safetensors import safe_open
    from safetensors.numpy import save_file
    ck = _ckpt()
    p = tmp_path / "m.safetensors"
    converter.save(ck, p, format="native")
    with safe_open(str(p), "np") as f:
        arrays, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    assert arrays["a.weight.qcodes"].dtype == np.uint32
    arrays["a.weight.qcodes"] = arrays["a.weight.qcodes"].view(np.float32)
    bad = tmp_path / "bad.safetensors"
    save_file(arrays, str(bad), metadata=meta)
    with pytest.raises(FormatError) as e:
        converter.load(bad)
    assert (e.value.tensor, e.value.field, e.value.expected, e.value.found) == \
        ("a.weight.qcodes", "dtype", "U32", "F32")
    # an int32 view of the same words is the container's signed twin, also refused by the native reader
    arrays["a.weight.qcodes"] = arrays["a.weight.qcodes"].view(np.int32)
    save_file(arrays, str(bad), metadata=meta)
    with pytest.raises(FormatError, match="container"):
        converter.load(bad)


def test_double_quant_kind_survives_in_the_spec(tmp_path):
    """Regression: the native reader kept ``double_quant`` on the tensor but dropped it from the spec."""
    from converter.formats.registry import load as load_any
    from converter.formats.native import write_native
    from tests.conftest import SAMPLES
    src = load_any(SAMPLES / "gguf" / "minilm_llamacpp_Q4_K_M.gguf")
    name = next(n for n in src.quantized_names() if src.spec(n).double_quant is not None)
    kind = src.spec(name).double_quant
    assert kind == src[name].double_quant.kind and kind.endswith("_K")
    dst = tmp_path / "k.safetensors"
    write_native(src, dst)
    back = load_any(dst)
    assert back.spec(name).double_quant == kind
    assert back[name].double_quant.kind == kind


# -- conformance (tests/formats/conformance.py) ------------------------------------------------------
from tests.formats.conformance import QuantizedFormatConformance  # noqa: E402


class TestNativeConformance(QuantizedFormatConformance):
    FORMAT = "native"


def test_save_without_a_format_writes_native(tmp_path):
    p = tmp_path / "default.safetensors"
    converter.save(_ckpt(), p)
    assert converter.load(p).format == "native"
    assert read_header(p).metadata["qckpt.format"] == "native"
