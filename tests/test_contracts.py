"""The design contracts (DEVELOPERS.md), each with its exact values computed by hand."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

import converter
from converter import GroupMap, QuantScheme, ZeroPoint, quantize_codes
from converter.cli import main
from converter.ops.audit import theoretical_bytes
from converter.errors import LayoutError
from converter.kernels.metrics import error_stats
from converter.quant.quantize import quantize


# Contract 1: a per-axis scale follows the declared axis.
def test_per_column_contract():
    assert quantize_codes([[2, 6], [4, 8]], [2, 4], axis="in").tolist() == [[1, 2], [2, 2]]
    assert quantize_codes([[4, 12], [8, 16]], [4, 2], axis="in").tolist() == [[1, 6], [2, 8]]


def test_per_row_twin():
    # the transposed inputs with one scale per row give the transposed codes
    assert quantize_codes([[2, 4], [6, 8]], [2, 4], axis="out").tolist() == [[1, 2], [2, 2]]
    assert quantize_codes([[4, 8], [12, 16]], [4, 2], axis="out").tolist() == [[1, 2], [6, 8]]


def test_empty_input_gives_empty():
    out = quantize_codes(np.zeros((0, 0)), [], axis="in")
    assert out.shape == (0, 0) and out.size == 0


def test_rounding_is_half_to_even():
    # 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0, -1.5 -> -2 (half-to-even), not half-away
    assert quantize_codes([[0.5, 1.5, 2.5, -0.5, -1.5]], [1, 1, 1, 1, 1], axis="in").tolist() == [[0, 2, 2, 0, -2]]
    assert quantize_codes([[0.5, 1.5, 2.5, -0.5, -1.5]], [1] * 5, axis="in", rounding="half_away").tolist() == \
        [[1, 2, 3, -1, -2]]


def test_wrong_scale_length_names_axis():
    with pytest.raises(LayoutError, match="one scale per 'in' index"):
        quantize_codes([[1, 2, 3]], [1, 1], axis="in")
    with pytest.raises(LayoutError, match="unknown axis"):
        quantize_codes([[1, 2]], [1, 1], axis=1)


def test_zero_points_and_clamp():
    # 3/1 + 8 = 11; -20/1 + 8 = -12 -> clamp 0; unsigned 4-bit range with zero points
    assert quantize_codes([[3, -20]], [1, 1], axis="in", zero_points=[8, 8], bits=4).tolist() == [[11, 0]]
    # signed 4-bit clamp without zero points: 9 -> 7, -9 -> -8
    assert quantize_codes([[9, -9]], [1, 1], axis="in", bits=4).tolist() == [[7, -8]]


# Contract 2: symmetric quantization and the zero-range safeguard.
def test_symmetric_formula():
    x = np.array([[14.0, -7.0, 5.0, 9.8]], np.float32)
    t = quantize(x, QuantScheme(4, signed=True, scale_dtype="F32"), GroupMap.per_tensor())
    scale = np.float32(2.0)  # max|x| / (2^(4-1) - 1) = 14 / 7
    assert t.scales.item() == scale
    assert t.codes.tolist() == [[7, -4, 2, 5]]  # rint(x / 2): 7, -3.5->-4, 2.5->2 (half-even), 4.9->5
    np.testing.assert_array_equal(t.dequantize(), np.array([[7, -4, 2, 5]], np.float32) * scale)


def test_all_zero_tensor_scale_one_exact(tmp_path):
    x = np.zeros((1, 4), np.float32)
    t = quantize(x, QuantScheme(4, signed=True, scale_dtype="F32"), GroupMap.per_tensor())
    assert t.scales.item() == 1.0
    e = error_stats(x, t.dequantize())
    assert e.mse == 0.0 and e.max_abs == 0.0 and e.exact
    assert not np.isnan(t.dequantize()).any()
    # what `qckpt quantize` reports for `0,0,0,0` at 4 bits: MSE 0, max error 0, scale 1, and an
    # ideal compression vs FP32 of 8 (32-bit floats -> 4-bit codes); with metadata 16 bytes of FP32
    # over 2 bytes of codes + one 4-byte F32 scale = 16 / 6.
    src, dst = tmp_path / "zeros.safetensors", tmp_path / "q.safetensors"
    save_file({"layer.weight": x}, str(src))
    r = CliRunner().invoke(main, ["quantize", str(src), str(dst), "--bits", "4", "--per-tensor", "--scale-dtype", "f32",
                                  "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    (row,) = doc["tensors"]
    assert row["name"] == "layer.weight" and row["exact"] is True
    assert row["mse"] == 0.0 and row["max_abs_error"] == 0.0
    assert row["scale_min"] == row["scale_max"] == 1.0
    assert row["ideal_compression_vs_fp32"] == 8.0 and doc["overall"]["ideal_compression_vs_fp32"] == 8.0
    assert row["compression_vs_fp32_with_metadata"] == pytest.approx(16 / 6)
    assert doc["overall"]["mse"] == 0.0 and doc["overall"]["max_abs_error"] == 0.0


def test_all_zero_group_among_others_never_nan():
    x = np.array([[0, 0, 0, 0, 1, -2, 3, 4]], np.float32)
    schemes = (QuantScheme(4, True), QuantScheme(4, False, ZeroPoint.INTEGER), QuantScheme(4, False, ZeroPoint.FLOAT))
    for scheme in schemes:
        t = quantize(x, scheme, GroupMap.per_group(4))
        assert float(t.scales[0, 0].astype(np.float32)) == 1.0
        d = t.dequantize()
        assert np.isfinite(d).all() and (d[0, :4] == 0).all()


# Contract 3: storage = payload + metadata; partial final groups count.
def test_storage_accounting_partial_group():
    # 5 x 12, 4-bit, group 8 along in: ceil(12/8) = 2 groups per row -> 10 groups x 2 bytes (f16)
    t = theoretical_bytes((5, 12), ("out", "in"), 4, GroupMap.per_group(8), 2, 0)
    assert t["payload_bytes"] == 30 and t["groups"] == 10 and t["metadata_bytes"] == 20 and t["total_bytes"] == 50
    # with a 4-bit integer zero point per group: + 10 x 0.5 bytes
    t = theoretical_bytes((5, 12), ("out", "in"), 4, GroupMap.per_group(8), 2, 0.5)
    assert t["total_bytes"] == 55
    # 7 x 20 group 8 -> 3 groups per row (last partial, 4 wide): 21 groups
    assert GroupMap.per_group(8).n_groups((7, 20), ("out", "in")) == 3
    assert GroupMap.per_group(8).partial_tail((7, 20), ("out", "in")) == 4


# Contract 4: per-tensor vs per-row on rows of very different magnitude.
def test_per_tensor_vs_per_row_small_row():
    x = np.array([[0.1, -0.1], [10, -10]], np.float32)
    s = QuantScheme(8, signed=True, scale_dtype="F32")
    assert quantize(x, s, GroupMap.per_tensor()).codes.tolist() == [[1, -1], [127, -127]]
    assert quantize(x, s, GroupMap.per_channel("out")).codes.tolist() == [[127, -127], [127, -127]]


def test_public_api_exports():
    assert converter.quantize_codes is quantize_codes
    assert callable(converter.load) and callable(converter.save)


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf"), -float("inf")])
def test_zero_or_non_finite_scale_is_a_quantization_error(bad):
    from converter.errors import QuantizationError
    with pytest.raises(QuantizationError, match="finite and non-zero") as e:
        quantize_codes([[1.0, 2.0]], [1.0, bad], axis="in")
    assert e.value.field == "scales" and not isinstance(e.value, LayoutError)


def test_error_stats_shape_mismatch_is_a_converter_error():
    from converter.errors import ConverterError
    with pytest.raises(LayoutError, match="shapes differ") as e:
        error_stats(np.zeros((2, 3)), np.zeros((3, 2)))
    assert isinstance(e.value, ConverterError) and (e.value.expected, e.value.found) == ([2, 3], [3, 2])


# -- B18: an all-zero group quantizes to zeros, never NaN -------------------------------------------
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("zp", [ZeroPoint.NONE, ZeroPoint.INTEGER])
def test_b18_all_zero_group_quantizes_to_zero(bits, zp):
    scheme = QuantScheme(bits, zp is ZeroPoint.NONE, zp, "F16")
    t = converter.quantize(np.zeros((1, 4), np.float32), scheme, GroupMap.per_tensor(), name="w")
    s = t.scales.astype(np.float32)
    assert np.isfinite(s).all() and (s != 0).all()
    assert t.dequantize().tolist() == [[0.0, 0.0, 0.0, 0.0]]
