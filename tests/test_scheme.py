"""QuantScheme: an implicit zero point is the centre 2^(bits-1) through every writer; zero points
are codes, never a float reinterpretation (CASES.md B05).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import converter
from converter.errors import FormatError, LayoutError
from converter.groups import GroupMap
from converter.kernels.packing import unpack_codes
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor
from converter.validate import validate

# -- B05: no zero-point input means the centre 2^(bits-1); packed nibble zeros are not fp16 -------
B05_RIGHT = [0.0, -4.0, 3.5]  # codes [8, 0, 15], s = 0.5, zero point 8
B05_BUGGY = [4.0, 0.0, 7.5]  # zero point 0


def _b05_tensor():
    q = np.full((8, 32), 8, np.uint8)
    q[0, :3] = [8, 0, 15]
    return QuantizedTensor("model.layers.0.mlp.down_proj.weight", (OUT, IN), q, np.full((8, 1), 0.5, np.float16),
                           QuantScheme(4, False, ZeroPoint.NONE, "F16"), GroupMap.per_group(32))


@pytest.mark.parametrize("fmt", ["native", "gguf", "gptq", "compressed-tensors", "awq", "mlx"])
def test_b05_implicit_zero_point_is_the_centre(tmp_path, fmt):
    t = _b05_tensor()
    assert t.scheme.center == 8 and t.zero_points is None
    assert t.dequantize()[0, :3].tolist() == B05_RIGHT
    dst = tmp_path / ("out.gguf" if fmt == "gguf" else "out.safetensors" if fmt == "native" else "out")
    converter.save(Checkpoint.from_tensors([t], config={"model_type": "llama"}), dst, format=fmt)
    back = converter.load(dst)
    name = next(n for n in back.names() if "down_proj" in n)
    got = back[name].dequantize()[0, :3].tolist()
    assert got == B05_RIGHT and got != B05_BUGGY
    if fmt in ("gptq", "awq"):  # formats that always store zero points must write the centre, not 0
        words = load_file(str(dst / "model.safetensors"))["model.layers.0.mlp.down_proj.qzeros"].view(np.uint32)
        assert (words == 0x88888888).all() if fmt == "awq" else (words[0, 0] & 0xFF) == 0x88


def test_b05_packed_uint8_zero_points_are_nibbles_not_fp16(tmp_path):
    two = np.array([0x83, 0x83], np.uint8)
    assert unpack_codes(two, 4, axis=0, length=4, container=np.uint8).tolist() == [3, 8, 3, 8]
    assert float(two.view(np.float16)[0]) == pytest.approx(-5.36e-05, rel=1e-3)  # the meaningless fp16 reading
    with pytest.raises(LayoutError, match="packed words have the wrong dtype"):
        unpack_codes(two.view(np.float16), 4, axis=0, length=4, container=np.uint16)
    # a GPTQ checkpoint whose qzeros are stored as fp16 is refused, never reinterpreted
    d = tmp_path / "g"
    d.mkdir()
    save_file({"l.qweight": np.zeros((1, 8), np.int32), "l.qzeros": two.view(np.float16).reshape(1, 1),
               "l.scales": np.full((1, 8), 0.5, np.float16), "l.g_idx": np.zeros(8, np.int32)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": -1, "sym": False, "desc_act": False,
        "checkpoint_format": "gptq_v2"}}))
    with pytest.raises(FormatError) as ei:
        converter.load(d)
    assert ei.value.tensor == "l.qzeros" and ei.value.field == "dtype"
    assert [f.code for f in validate(d).findings] == ["dtype"]
