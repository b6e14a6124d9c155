"""Regressions from the FP8 review: the read-back proof compares block extents, a reshaped one-value
tensor is stated, and block-tiled matrices are row-split only by plans that write values."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from converter import codebooks
from converter.groups import GroupMap
from converter.ops.compare import compare_tensors
from converter.scheme import QuantScheme
from converter.tensor import DenseTensor, QuantizedTensor, spec_of
from converter.write.plan import TensorPlan, block_rows, rows_plan

E4M3 = QuantScheme(8, False, scale_dtype="F32", codebook=codebooks.E4M3)


def _block(extent_out: int) -> QuantizedTensor:
    codes = np.full((200, 64), 0x38, dtype=np.uint8)  # every code 1.0
    return QuantizedTensor("w", ("out", "in"), codes, np.array([[1.0], [2.0]], dtype=np.float32), E4M3,
                           GroupMap.per_block(extent_out, 64))


def test_readback_proof_compares_block_extents():
    a, b = _block(128), _block(150)  # both 2 x 1 scale grids over 200 rows, different rows per block
    assert a.scales.shape == b.scales.shape
    # rows 128..149 are 2.0 in a, 1.0 in b
    assert a.dequantize()[140, 0] == 2.0 and b.dequantize()[140, 0] == 1.0
    row = compare_tensors(a, b)
    assert row["mode"] == "changed" and row["bit_exact"] is False and row["max_abs_diff"] == 1.0
    assert compare_tensors(a, _block(128))["mode"] == "exact"


def test_nan_codes_on_both_sides_are_exact():
    t = _block(128)
    codes = t.codes.copy()
    codes[0, 0] = 0x7F  # NaN in E4M3
    a = t.replace(codes=codes)
    b = QuantizedTensor("w", a.axes, codes.copy(), a.scales.copy(), QuantScheme.from_json(E4M3.to_json()),
                        a.group_map)
    row = compare_tensors(a, b)
    assert row["mode"] == "exact" and row["bit_exact"] is True


def test_one_value_reshape_is_stated():
    a = DenseTensor("m.input_scale", np.array(0.5, dtype=np.float32))
    b = DenseTensor("m.input_scale", np.array([0.5], dtype=np.float32))
    row = compare_tensors(a, b)
    assert row["mode"] == "passthrough" and row["bit_exact"] and row["reshaped"] == [[], [1]]
    assert "reshaped" not in compare_tensors(a, a)
    other = DenseTensor("m.input_scale", np.array([0.25], dtype=np.float32))
    assert compare_tensors(a, other)["mode"] == "changed"
    assert compare_tensors(a, DenseTensor("x", np.array([0.5], dtype=ml_dtypes.bfloat16)))["mode"] == "changed"


def test_block_tiled_matrices_split_only_for_values_plans():
    spec = spec_of(_block(128))
    outs = [("w", "F8_E4M3", (200, 64))]
    quantized = rows_plan(TensorPlan("w", outs, lambda t: {}, []))
    values = rows_plan(TensorPlan("w", outs, lambda t: {}, []), values=True)
    assert block_rows(quantized, spec, budget=1000) is None
    step = block_rows(values, spec, budget=1000)
    assert step is not None and 1 <= step < 200


def test_quantize_refuses_an_already_quantized_source(tmp_path):
    """A quantized source used to crash with a KeyError traceback (exit 1); now one typed line, exit 3."""
    from click.testing import CliRunner

    from converter.cli import main
    from tests.conftest import SAMPLES
    for sample, args in (("deepseek_fp8_block_smollm2tiny", ["--fp8", "e4m3", "--per-tensor"]),
                         ("gptq_w4_g128_sym", ["--bits", "4", "--per-channel"])):
        dst = tmp_path / sample
        r = CliRunner().invoke(main, ["quantize", str(SAMPLES / sample), str(dst), *args])
        assert r.exit_code == 3, r.output
        assert "already quantized (7 quantized tensors" in r.output and "qckpt convert" in r.output
        assert "Traceback" not in r.output and not dst.exists()


def test_nan_scale_copied_exactly_is_exact_and_the_report_is_json():
    """A NaN scale copied bit for bit: scales identical, exact, and the JSON report has no NaN."""
    t = _block(128)
    scales = t.scales.copy()
    scales[1, 0] = np.nan
    a = t.replace(scales=scales)
    row = compare_tensors(a, a.replace(scales=scales.copy()))
    assert row["scales_identical"] and row["mode"] == "exact" and row["max_abs_diff"] == 0.0
    import json
    json.dumps(row, allow_nan=False)
