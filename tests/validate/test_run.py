"""The validator's run (validate/run.py): a format's zero-convention hook against the data (CASES.md B01)."""

import numpy as np

import converter
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor
from converter.validate import validate
from converter.validate.interpretations import alternatives
from tests.validate.helpers import assert_finding, edit_config, write_gptq

U4 = QuantScheme(4, False, ZeroPoint.NONE, "F16")




def test_b01_v2_zeros_read_as_v1(tmp_path):
    stored = np.array([[8, 12], [5, 8], [15, 0], [8, 9]], dtype=np.uint8)  # [I=4, O=2]
    t = QuantizedTensor("m.fc.weight", (OUT, IN), stored.T.copy(), np.array([[0.5], [0.25]], np.float16), U4,
                        GroupMap.per_channel(OUT))
    right = np.array([[0, -1.5, 3.5, 0], [1.0, 0, -2.0, 0.25]], np.float32)
    d = write_gptq(tmp_path, t, checkpoint_format="gptq_v2")
    assert np.array_equal(converter.load(d)["m.fc.weight"].dequantize(), right)
    assert validate(d).findings == []
    edit_config(d, lambda qc: qc.update(checkpoint_format="gptq", format="gptq"))  # the buggy reading
    wrong = converter.load(d)["m.fc.weight"]
    assert np.array_equal(wrong.dequantize(), [[-0.5, -2.0, 3.0, -0.5], [0.75, -0.25, -2.25, 0]])
    assert np.array_equal(alternatives(wrong)["zero -1"], right)
    f = assert_finding(validate(d), "zero-convention", "m.fc.weight")
    assert f.evidence["claimed"] == "gptq" and f.evidence["inferred"] == "gptq_v2"
    assert f.evidence["raw_field_counts"] == {"8": 2}
