"""MLX decode cases from CASES.md: a layer left dense (B15), an e4m3-subnormal NVFP4 scale (B23),
4-bit/g32 codes labelled 2-bit/g64 (B27); independent packer in tests/synthetic.py.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file

import converter
from converter.cli import main
from converter.errors import FormatError
from converter.validate import validate
from tests.synthetic import mlx_dir, rows_u32


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# -- B15: a layer left dense is reported with its legal group sizes and stays at 16 bits -------------
def test_b15_skipped_layer_legal_sizes_and_16_bits(tmp_path):
    assert [4304 % g == 0 for g in (16, 32, 64, 128)] == [True, False, False, False]
    codes = np.arange(128, dtype=np.uint8).reshape(1, 128) % 16
    d = mlx_dir(tmp_path / "m", {"model.layers.0.mlp.up_proj.weight": rows_u32(codes, 4),
                                 "model.layers.0.mlp.up_proj.scales": np.ones((1, 2), np.float16),
                                 "model.layers.0.mlp.up_proj.biases": np.zeros((1, 2), np.float16),
                                 "model.layers.0.mlp.down_proj.weight": np.ones((2, 4304), np.float16)},
                {"group_size": 64, "bits": 4})
    ck = converter.load(d)
    assert ck.spec("model.layers.0.mlp.down_proj.weight").kind == "dense"
    rep = validate(d)
    f = next(f for f in rep.findings if f.code == "group-skip")
    assert f.tensor == "model.layers.0.mlp.down_proj.weight" and f.evidence["legal_group_sizes"] == [16]
    assert rep.exit_code == 0  # info only
    r = cli("audit", d, "--json")
    assert r.exit_code == 0
    row = next(t for t in json.loads(r.output)["tensors"] if t["name"] == "model.layers.0.mlp.down_proj.weight")
    assert row["kind"] == "dense" and row["stored_bytes"] * 8 == 16 * 2 * 4304  # 16 bits per weight


# -- B23: an e4m3-subnormal NVFP4 scale decodes exactly, and the bf16/fp16 outputs keep it -----------
B23_RIGHT = [0.001953125, -0.00390625, 0.005859375]  # [0.5, -1, 1.5] * 2^-8


def test_b23_nvfp4_subnormal_e4m3_scale(tmp_path):
    sbyte = np.array([2.0 ** -8], np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert int(sbyte[0]) == 0x02  # subnormal in e4m3 (smallest normal 2^-6)
    codes = np.zeros((1, 16), np.uint8)
    codes[0, :3] = [0b0001, 0b1010, 0b0011]  # E2M1: 0.5, -1.0, 1.5
    d = mlx_dir(tmp_path / "nv", {"model.layers.0.mlp.up_proj.weight": rows_u32(codes, 4),
                                  "model.layers.0.mlp.up_proj.scales": sbyte.reshape(1, 1)},
                {"group_size": 16, "bits": 4, "mode": "nvfp4"})
    t = converter.load(d)["model.layers.0.mlp.up_proj.weight"]
    assert t.dequantize()[0, :3].tolist() == B23_RIGHT
    f = next(f for f in validate(d).findings if f.code == "scale-subnormal")
    # mx.quantize nvfp4 writes amax / 6 as E4M3, subnormal for small groups routinely: info, so --strict passes
    assert f.severity == "info" and f.tensor == "model.layers.0.mlp.up_proj.weight"
    assert validate(d, strict=True).exit_code == 0
    for dt in ("bf16", "f16", "f32"):
        out = tmp_path / f"deq-{dt}.safetensors"
        assert cli("dequantize", d, out, "--dtype", dt).exit_code == 0
        w = load_file(str(out))["model.layers.0.mlp.up_proj.weight"].astype(np.float32)
        assert w[0, :3].tolist() == B23_RIGHT  # not q * 2^-112 ~ 0


# -- B27: the other direction: 4-bit/g32 codes labelled 2-bit/g64 --------------------------------------
def test_b27_4bit_g32_labelled_2bit_g64_is_refused(tmp_path):
    codes = np.random.default_rng(27).integers(0, 16, (8, 128)).astype(np.uint8)
    tensors = {"model.layers.0.mlp.up_proj.weight": rows_u32(codes, 4),
               "model.layers.0.mlp.up_proj.scales": np.ones((8, 4), np.float16),
               "model.layers.0.mlp.up_proj.biases": np.zeros((8, 4), np.float16)}
    assert tensors["model.layers.0.mlp.up_proj.weight"].shape == (8, 16)  # same as in=256, 2-bit
    bad = mlx_dir(tmp_path / "bad", tensors, {"group_size": 64, "bits": 2}, hidden_size=128)
    with pytest.raises(FormatError, match=r"bits=4, group_size=32"):
        converter.load(bad)
    assert [f.code for f in validate(bad).findings if f.severity == "error"] == ["config-mismatch"]
    good = mlx_dir(tmp_path / "good", tensors, {"group_size": 32, "bits": 4}, hidden_size=128)
    t = converter.load(good)["model.layers.0.mlp.up_proj.weight"]
    assert t.shape == (8, 128) and np.array_equal(t.codes, codes)
