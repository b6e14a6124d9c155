"""Issue 18 item 6: an offending value is printed as the number it is (never rounded to an integer) and the
error names the file and stored array it came from.

The case: an MLX affine source (float biases) converted to a format with integer zero points. Its one bad
group has ``-bias/scale = 124 + 2^-13`` in float32: ``:.6g`` printed that as ``124`` (an integer, so the
refusal "expected an integer, found 124" read as nonsense), and the error named the source folder and the
logical ``.weight`` while the value is the stored ``.biases`` in ``model.safetensors``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from converter.cli import main
from converter.errors import NotRepresentableError
from converter.ops.convert import convert_exact


def pack_stream(codes: np.ndarray, bits: int) -> np.ndarray:
    """MLX's packing, LSB first, each row one Python integer (independent of converter)."""
    rows = []
    for row in codes:
        acc = sum(int(c) << (k * bits) for k, c in enumerate(row.tolist()))
        rows.append([(acc >> (32 * w)) & 0xFFFFFFFF for w in range(-(-len(row) * bits // 32))])
    return np.array(rows, dtype=np.uint32)


#: scale 1/8 (exact); the bad group's zero point 124 + 2^-13: -bias = 15.500015258789062, exact in float32
SCALE = np.float32(0.125)
BAD_Z = 124 + 2.0 ** -13


def mlx_source(root: Path) -> Path:
    root.mkdir(parents=True)
    codes = (np.arange(2 * 64).reshape(2, 64) % 256).astype(np.uint8)
    scales = np.full((2, 2), SCALE, np.float32)
    biases = -(np.array([[100, 7], [3, BAD_Z]]) * SCALE).astype(np.float32)  # group (out 1, group 1) is bad
    assert float(-biases[1, 1] / scales[1, 1]) == BAD_Z  # the float32 quotient the check computes
    save_file({"l.weight": pack_stream(codes, 8), "l.scales": scales, "l.biases": biases,
               "l.bias": np.zeros(2, np.float16)}, str(root / "model.safetensors"), metadata={"format": "mlx"})
    q = {"group_size": 32, "bits": 8}
    (root / "config.json").write_text(json.dumps({"quantization": q, "quantization_config": q}))
    return root


@pytest.mark.parametrize("target", ["compressed-tensors"])
def test_float_bias_refusal_prints_the_value_and_its_file(tmp_path, target):
    src = mlx_source(tmp_path / "src")
    with pytest.raises(NotRepresentableError) as info:
        convert_exact(src, tmp_path / "out", target)
    exc = info.value
    assert exc.file == str(src / "model.safetensors") and exc.tensor == "l.biases" and exc.field == "zero_points"
    # the quotient to float32's shortest decimal (not "124"), then the stored bias and scale as stored
    assert str(np.float32(BAD_Z)) == "124.00012"
    assert exc.found.startswith("-bias/scale = 124.00012 at (out, group) [1, 1]"), exc.found
    assert "stored bias -15.500015, scale 0.125 F32" in exc.found and "1 of 4 groups" in exc.found
    assert not (tmp_path / "out").exists()


def test_cli_line_names_the_file_and_the_value(tmp_path):
    src = mlx_source(tmp_path / "src")
    r = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "out"), "--to", "compressed-tensors"])
    assert r.exit_code == 3, r.output
    line = r.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"qckpt: error: {src / 'model.safetensors'}: tensor 'l.biases' field 'zero_points'")
    assert "found -bias/scale = 124.00012 " in line and "found 124 " not in line


def test_scale_overflow_prints_the_scale_unrounded():
    """A computed scale past float16's 65504 is printed as the float32 it is: 123456.7 (``:g`` gave 123457)."""
    from converter.errors import QuantizationError
    from converter.kernels.rtn import safe_cast_scales
    from converter.scheme import QuantScheme, ZeroPoint

    scales = np.array([[1.0, 123456.7]], np.float32)
    grid = QuantScheme(4, False, ZeroPoint.NONE, scale_dtype="F16")
    with pytest.raises(QuantizationError) as info:
        safe_cast_scales(scales, grid, tensor="l.weight")
    assert f"{123456.7:g}" == "123457"  # what the message printed before
    assert info.value.found.startswith("123456.7 at group [0, 1]"), info.value.found


def test_point_at_stored_keeps_the_logical_name_for_a_transposed_array(tmp_path):
    """GPTQ stores scales [groups, out]: the error's (out, group) index would be false against that array, so
    only the data file is named; an array laid out as the logical [out, groups] is named itself."""
    from converter.groups import GroupMap
    from converter.ops.value_source import point_at_stored
    from converter.scheme import QuantScheme, ZeroPoint
    from converter.tensor import Checkpoint, StoredArray, TensorSpec

    scheme = QuantScheme(4, False, ZeroPoint.NONE, scale_dtype="F16")

    def ckpt(scale_shape):
        spec = TensorSpec("l.weight", "quantized", (8, 256), (
            StoredArray("l.qweight", "codes", "I32", (32, 8), 1024, "model.safetensors"),
            StoredArray("l.scales", "scales", "F16", scale_shape, 32, "model.safetensors")),
            axes=("out", "in"), scheme=scheme, group_map=GroupMap.per_group(128))
        return Checkpoint({spec.name: spec}, lambda n: None, format="x", path=str(tmp_path),
                          files=(str(tmp_path / "model.safetensors"),))

    for shape, tensor in (((2, 8), "l.weight"), ((8, 2), "l.scales")):
        exc = NotRepresentableError("scale not representable", tensor="l.weight", field="scales", found="x")
        point_at_stored(ckpt(shape), exc)
        assert (exc.file, exc.tensor) == (str(tmp_path / "model.safetensors"), tensor), shape


def test_a_requantized_value_is_not_blamed_on_a_stored_array(tmp_path):
    """A value the requantization computed (``--asym`` zero points of a symmetric GPTQ source, refused by the v1
    writer because v1 stores z-1) is in no stored array of the source: the error names the source checkpoint, not
    its data file and a stored ``zero_points`` array. The source's own zero points are all 8 (symmetric 4-bit,
    stored as 7 = 0x77777777 words by v1), so "zero point 0" cannot come from the file."""
    import json

    import numpy as np
    from safetensors.numpy import load_file

    from tests.conftest import SAMPLES

    src = SAMPLES / "gptq_w4_g128_sym"
    stored = load_file(str(src / "model.safetensors"))
    assert {int(w) for k, v in stored.items() if k.endswith("qzeros") for w in np.unique(v.view(np.uint32))} \
        == {0x77777777}
    r = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "out"), "--bits", "3", "--group-size", "32",
                                  "--asym", "--gptq-format", "v1", "--quiet", "--json"])
    assert r.exit_code == 3 and not (tmp_path / "out").exists()
    doc = json.loads(r.output)
    assert "zero point of 0" in doc["message"]
    assert doc["file"] == str(src) and doc["tensor"] == "encoder.layer.0.attention.output.dense.weight"


def test_gguf_block_field_keeps_the_tensor_name(tmp_path):
    """A GGUF Q4_1 min (``m``) is a field inside each block, not an array of its own: the refusal names the
    tensor (its logical name, ``blk.0.attn_q.weight`` in the file) and the file, not a made-up
    ``blk.0.attn_q.weight:m``. Q4_1 mins of a real
    llama.cpp file are not integer zero points (e.g. -m/d = 9.308 in block [0, 0] of the shipped MiniLM)."""
    from tests.conftest import SAMPLES

    src = SAMPLES / "gguf" / "minilm_gguf_Q4_1.gguf"
    with pytest.raises(NotRepresentableError) as e:
        convert_exact(src, tmp_path / "o", "gptq")
    assert e.value.tensor == "encoder.layer.0.attention.self.query.weight" and e.value.field == "zero_points"
    assert Path(e.value.file).name == "minilm_gguf_Q4_1.gguf"
    assert ":m" not in str(e.value)
