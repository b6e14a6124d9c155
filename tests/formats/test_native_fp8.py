"""The native format round-trips FP8 tensors: E4M3 codebooks (NaN codes included), 2-D block group
maps (partial edge blocks, per expert), every FP8 scale dtype; bytes compared, not values."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import converter
from converter import codebooks
from converter.groups import GroupMap
from converter.runtime import run_options
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, QuantizedTensor

SCALE_NP = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "F16": np.float16, "F8_E8M0": ml_dtypes.float8_e8m0fnu}


def _tensor(name, shape, axes, gm, scale_dtype, seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, shape, dtype=np.uint8)  # every byte, 0x7F / 0xFF (NaN) included
    pshape = gm.param_shape(shape, axes)
    scales = (rng.random(pshape) + 0.5).astype(SCALE_NP[scale_dtype])
    scheme = QuantScheme(8, False, scale_dtype=scale_dtype, codebook=codebooks.E4M3)
    return QuantizedTensor(name, axes, codes, scales, scheme, gm)


@pytest.mark.parametrize("scale_dtype, block", [("F32", (128, 128)), ("BF16", (128, 128)), ("F16", (None, 128)),
                                                 ("F8_E8M0", (1, 32)), ("F32", (128, None))])
@pytest.mark.parametrize("shape, axes", [((192, 577), ("out", "in")), ((3, 192, 576), ("expert", "out", "in"))])
def test_block_fp8_round_trip(tmp_path, scale_dtype, block, shape, axes):
    t = _tensor("model.layers.0.mlp.down_proj.weight", shape, axes, GroupMap.per_block(*block), scale_dtype)
    p = tmp_path / "m.safetensors"
    converter.save(Checkpoint.from_tensors([t]), p, format="native")
    back = converter.load(p)[t.name]
    assert back.scheme == t.scheme and back.scheme.describe() == "e4m3 float"
    assert back.group_map.block == t.group_map.block and back.axes == t.axes
    assert np.array_equal(back.codes, t.codes)
    assert back.scales.dtype == t.scales.dtype
    assert np.array_equal(back.scales.view(np.uint8), t.scales.view(np.uint8))
    assert np.array_equal(back.dequantize(), t.dequantize(), equal_nan=True)


def test_block_tensor_written_under_a_small_memory_budget(tmp_path):
    """Regression: the native plan split 2-D block tensors into row blocks, whose scales are per row
    (converter.groups.as_row_groups), and failed writing them into the [ceil(out/128), ceil(in/128)] grid."""
    t = _tensor("w", (576, 1536), ("out", "in"), GroupMap.per_block(128, 128), "F32", seed=1)
    p = tmp_path / "m.safetensors"
    with run_options(max_memory="1M", workers=1):
        converter.save(Checkpoint.from_tensors([t]), p, format="native")
    back = converter.load(p)["w"]
    assert back.scales.shape == (5, 12) and np.array_equal(back.scales, t.scales)
    assert np.array_equal(back.codes, t.codes)
