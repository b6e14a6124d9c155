"""Checks against a float reference (validate/reference.py): unmasked v1 zero packing (CASES.md B03)."""

import json

import numpy as np
from safetensors.numpy import save_file

from converter.formats.gptq import format as gptq
from converter.layout import IN, OUT
from converter.validate import validate
from tests.validate.helpers import assert_finding




def test_b03_unmasked_v1_zero_packing_is_caught_against_the_reference(tmp_path):
    z = np.array([3, 4, 5, 6, 7, 0, 2, 9])
    q = np.tile(np.array([0, 5, 15], np.uint8), (8, 1))  # (out=8, in=3)
    s = np.float16(0.1)
    d = tmp_path / "b03"
    d.mkdir()
    qweight = gptq.codes_map(4).to_stored(q, (OUT, IN))
    save_file({"m.fc.qweight": qweight, "m.fc.qzeros": np.array([[0xFFF65432]], np.uint32).view(np.int32),
               "m.fc.scales": np.full((1, 8), s, np.float16), "m.fc.g_idx": np.zeros(3, np.int32)},
              str(d / "model.safetensors"), metadata={"format": "pt"})
    qc = {"quant_method": "gptq", "bits": 4, "group_size": -1, "sym": False, "desc_act": False,
          "checkpoint_format": "gptq"}
    (d / "config.json").write_text(json.dumps({"quantization_config": qc}))
    right = (q.astype(np.float32) - z[:, None]) * np.float32(s)
    assert np.allclose(right[5], [0, 0.5, 1.5], atol=1e-3)
    save_file({"m.fc.weight": right}, str(tmp_path / "ref.safetensors"))
    rep = validate(d, reference=tmp_path / "ref.safetensors")
    f = assert_finding(rep, "reference-mismatch", "m.fc.weight")
    assert f.evidence["rms_steps"] > 1
