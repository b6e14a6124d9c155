"""QuantizedTensor.dequantize: blocks along ``in`` are sequential (B07) and arithmetic on bf16
parameters happens in float32, narrowing once at the end (B25), through the readers and writers.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file

import converter
from converter.cli import main
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor
from tests.synthetic import mlx_dir, rows_u32


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# -- B07: blocks along axis 1 are sequential, through the dequantizer and the writers --------------
B07_RIGHT = [8, 8, 14, 14, 18, 18, 20, 20]
B07_BUGGY = [8, 14, 8, 14, 18, 20, 18, 20]


@pytest.mark.parametrize("fmt", [None, "native", "gptq", "compressed-tensors", "awq"])
def test_b07_blocked_dequant_is_sequential(tmp_path, fmt):
    rows = 8 if fmt == "awq" else 2  # AWQ GEMM packs 8 output channels per word
    s = np.tile(np.array([[1, 2], [3, 4]], np.float16), (rows // 2, 1))
    t = QuantizedTensor("m.l.weight", (OUT, IN), np.full((rows, 4), 9, np.uint8), s,
                        QuantScheme(4, False, ZeroPoint.INTEGER, "F16"), GroupMap.per_group(2),
                        zero_points=s.astype(np.int16))  # zero points equal to the scales
    if fmt is not None:
        converter.save(Checkpoint.from_tensors([t]), tmp_path / fmt, format=fmt)
        t = converter.load(tmp_path / fmt)["m.l.weight"]
    got = t.dequantize()[:2].reshape(-1).tolist()
    assert got == B07_RIGHT and got != B07_BUGGY


# -- B25: arithmetic on bf16 parameters happens in float32, narrowing once at the end --------------
def test_b25_bf16_affine_dequant_in_float32(tmp_path):
    bf = ml_dtypes.bfloat16
    w = np.array([3.140625, 0.01171875, -0.3046875], np.float32)  # bf16-exact
    right = [4.140625, 1.01171875, 0.6953125]
    buggy = [4.125, 1.015625, 0.6953125]  # + 1 in bf16
    assert (w.astype(bf) + np.array(1, bf)).astype(np.float32).tolist() == buggy
    # MLX affine: w = s*q + b with q = 1, s = w, b = 1 (bf16 scales and biases)
    codes = np.zeros((3, 32), np.uint8)
    codes[:, 0] = 1
    d = mlx_dir(tmp_path / "m", {"model.layers.0.mlp.up_proj.weight": rows_u32(codes, 4),
                                 "model.layers.0.mlp.up_proj.scales": w.reshape(3, 1).astype(bf),
                                 "model.layers.0.mlp.up_proj.biases": np.ones((3, 1), bf)},
                {"group_size": 32, "bits": 4})
    assert converter.load(d)["model.layers.0.mlp.up_proj.weight"].dequantize()[:, 0].tolist() == right
    for dt in ("f32", "f16"):  # both hold the float32 results exactly
        out = tmp_path / f"{dt}.safetensors"
        assert cli("dequantize", d, out, "--dtype", dt).exit_code == 0
        assert load_file(str(out))["model.layers.0.mlp.up_proj.weight"][:, 0].astype(np.float32).tolist() == right


def test_checkpoint_aliases_resolve_to_names_and_a_name_wins():
    import numpy as np
    from converter.tensor import Checkpoint, DenseTensor
    a, b = DenseTensor("a.weight", np.zeros((2, 2), np.float32)), DenseTensor("b.weight", np.ones((2,), np.float32))
    ckpt = Checkpoint.from_tensors([a, b], aliases={"x": "a.weight", "b.weight": "a.weight", "y": "absent"})
    assert ckpt.aliases == {"x": "a.weight"}  # an alias that is a name, or names no tensor, is dropped
    assert ckpt["x"] is a and ckpt["b.weight"] is b and "x" in ckpt and "y" not in ckpt
    assert ckpt.names() == ["a.weight", "b.weight"] and ckpt.spec("x").name == "a.weight"
