"""Nibble order (validate/nibble_order.py): linear nibbles under an AWQ config, with and without a
reference (CASES.md B09)."""

import numpy as np

import converter
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor
from converter.validate import validate
from converter.validate.interpretations import alternatives
from tests.conftest import SAMPLES
from tests.validate.helpers import FP16, OUTPUT, assert_finding, copy_sample, edit_tensors, with_inf_scales

U4Z = QuantScheme(4, False, ZeroPoint.INTEGER, "F16")


def test_b09_linear_nibbles_under_an_awq_config(tmp_path):
    from converter.formats.awq import GEMM_QWEIGHT
    # 8 codes packed linearly -> 0x87654321; the AWQ unpacker reads [1,5,2,6,3,7,4,8]
    words = GEMM_QWEIGHT.__class__(GEMM_QWEIGHT.stored_axes, GEMM_QWEIGHT.packed_axis, 4, "I32").to_stored(
        np.arange(1, 9, dtype=np.uint8).reshape(8, 1), (OUT, IN))
    assert int(words.view(np.uint32)[0, 0]) == 0x87654321
    read = GEMM_QWEIGHT.to_logical(words, (OUT, IN), {OUT: 8, IN: 1})
    assert read[:, 0].tolist() == [1, 5, 2, 6, 3, 7, 4, 8]
    t = QuantizedTensor("m.fc.weight", (OUT, IN), read, np.full((8, 1), 0.5, np.float16), U4Z,
                        GroupMap.per_channel(OUT), zero_points=np.full((8, 1), 8, np.int16),
                        stored={"codes": GEMM_QWEIGHT})
    assert t.dequantize()[:, 0].tolist() == [-3.5, -1.5, -3.0, -1.0, -2.5, -0.5, -2.0, 0.0]
    assert alternatives(t)["nibble order sequential"][:, 0].tolist() == [-3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0]
    # on the real AWQ sample: output.dense repacked linearly, config unchanged
    from dataclasses import replace
    d = copy_sample("awq_gemm_w4_g128_zp", tmp_path)
    real = converter.load(SAMPLES / "awq_gemm_w4_g128_zp")[OUTPUT]
    linear = replace(GEMM_QWEIGHT, order=None)
    edit_tensors(d, lambda s: s.__setitem__("encoder.layer.0.output.dense.qweight",
                                            linear.to_stored(real.codes, (OUT, IN))))
    f = assert_finding(validate(d, reference=FP16), "layout-mismatch", OUTPUT)
    assert f.evidence["best_alternative"] == "nibble order sequential"
    # without the reference: AWQ packs across rows, so the codes land beside other rows' zero points
    f = assert_finding(validate(d), "nibble-order", OUTPUT)
    assert f.evidence["best_alternative"] == "nibble order sequential"
    assert f.evidence["alternative_spread"] < 0.3 < 1.0 < f.evidence["declared_spread"]


def test_every_sibling_with_a_nonfinite_scale_is_reported_not_a_crash(tmp_path):
    """One infinite scale in every GPTQ tensor: each column profile is non-finite, so no sibling has a within-word
    detail (word_detail: None). The sibling check stacked an empty list of details and raised ValueError out of
    validate (a traceback from ``qckpt validate``); now the nonfinite scales are the report, every tensor checked."""
    d = with_inf_scales(copy_sample("gptq_w4_g128_sym", tmp_path), (0, 0))
    report = validate(d)
    quantized = [s.name for s in converter.load(d).specs() if s.kind == "quantized"]
    assert sorted(f.tensor for f in report.findings if f.code == "scale-nonfinite") == sorted(quantized)
    assert not any(f.code == "nibble-order" for f in report.findings) and not report.unchecked
