"""2-D block group maps and float-element codebooks in the logical model (issue 14).

Every expected value is computed by hand in the test (E4M3 codes written as their bytes).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from converter import codebooks
from converter.errors import LayoutError
from converter.groups import Granularity, GroupMap
from converter.row_groups import as_row_groups
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor
from converter.tensor_rows import row_splittable, take_rows

E4M3 = QuantScheme(8, False, scale_dtype="F32", codebook=codebooks.E4M3)


def _e4m3_bytes(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def test_codebook_tables_are_the_elements():
    assert codebooks.E4M3[0x38] == 1.0 and codebooks.E4M3[0x7E] == 448.0
    assert np.isnan(codebooks.E4M3[0x7F]) and np.isnan(codebooks.E4M3[0xFF])
    assert codebooks.E4M3[0xB8] == -1.0
    assert codebooks.ELEMENTS["e5m2"].values[0x3C] == 1.0 and codebooks.ELEMENTS["e5m2"].max_finite == 57344.0
    assert codebooks.ELEMENTS["e4m3fnuz"].max_finite == 240.0 and np.isnan(codebooks.ELEMENTS["e4m3fnuz"].values[0x80])
    assert codebooks.E2M1[:8] == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    assert codebooks.element_of(codebooks.E4M3).storage_dtype == "F8_E4M3"
    assert codebooks.element_of(tuple(range(16))) is None
    assert codebooks.element_for_storage("F8_E5M2").name == "e5m2"


def test_scheme_names_the_element_and_round_trips_json():
    assert E4M3.describe() == "e4m3 float"
    obj = E4M3.to_json()
    assert obj["element"] == "e4m3" and obj["codebook"] is None
    back = QuantScheme.from_json(obj)
    assert np.asarray(back.codebook, dtype=np.float64).tobytes() == np.asarray(codebooks.E4M3).tobytes()


def test_block_map_counts_partial_edge_blocks():
    gm = GroupMap.per_block(128, 128)
    shape, axes = (192, 576), ("out", "in")
    assert gm.param_shape(shape, axes) == (2, 5)          # ceil(192/128), ceil(576/128)
    assert gm.n_groups(shape, axes) == 10
    assert gm.partial_blocks(shape, axes) == 10 - 1 * 4   # only 1 x 4 blocks are full
    assert gm.partial_tail(shape, axes) == 576 - 4 * 128
    assert gm.param_shape((3, 192, 576), ("expert", "out", "in")) == (3, 2, 5)
    assert gm.describe() == "block(out 128 x in 128)"
    assert gm.to_json(shape, axes)["block"] == {"out": 128, "in": 128}
    assert GroupMap.from_json(gm.to_json()).block == (("out", 128), ("in", 128))


@pytest.mark.parametrize("bad", [(("out", 0),), (("out", 2), ("out", 2)), (("expert", 2),), ()])
def test_block_map_rejects_bad_extents(bad):
    with pytest.raises(LayoutError):
        GroupMap(Granularity.BLOCK, block=bad)


def test_block_expand_and_reduce_by_hand():
    gm = GroupMap.per_block(2, 2)
    params = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    full = gm.expand(params, (3, 3), ("out", "in"))
    assert full.tolist() == [[1, 1, 2], [1, 1, 2], [3, 3, 4]]
    x = np.array([[1, -5, 2], [3, 0, -7], [9, 1, 1]], dtype=np.float32)
    assert gm.reduce(np.abs(x), np.maximum, ("out", "in")).tolist() == [[5, 7], [9, 1]]


def _block_tensor():
    # 3 x 3 E4M3 codes, 2 x 2 blocks: scales [[0.5, 2], [4, 0.25]] (partial last row and column)
    vals = np.array([[1.0, -2.0, 3.0], [0.5, 448.0, -1.5], [2.0, 6.0, -0.25]], dtype=np.float32)
    scales = np.array([[0.5, 2.0], [4.0, 0.25]], dtype=np.float32)
    return QuantizedTensor("w", ("out", "in"), _e4m3_bytes(vals), scales, E4M3, GroupMap.per_block(2, 2)), vals


def test_block_dequantize_by_hand():
    t, vals = _block_tensor()
    want = np.array([[0.5, -1.0, 6.0], [0.25, 224.0, -3.0], [8.0, 24.0, -0.0625]], dtype=np.float32)
    np.testing.assert_array_equal(t.dequantize(), want)
    assert (t.dequantize() == vals * t.group_map.expand(t.scales, (3, 3), t.axes)).all()


def test_block_rows_are_row_groups_with_the_same_values():
    t, _ = _block_tensor()
    assert row_splittable(t)
    part = take_rows(t, 1, 3)                   # straddles the block-row boundary
    assert part.group_map.describe() == "group(in, 2)"
    assert part.scales.tolist() == [[0.5, 2.0], [4.0, 0.25]]
    np.testing.assert_array_equal(part.dequantize(), t.dequantize()[1:3])
    gm, per_row = as_row_groups(t.group_map, t.scales, t.shape, t.axes)
    assert per_row.tolist() == [[0.5, 2.0], [0.5, 2.0], [4.0, 0.25]] and gm.group_size == 2


def test_expert_stack_blocks_dequantize_per_expert():
    t, _ = _block_tensor()
    codes = np.stack([t.codes, t.codes])
    scales = np.stack([t.scales, 2 * t.scales])
    s3 = QuantizedTensor("e", ("expert", "out", "in"), codes, scales, E4M3, GroupMap.per_block(2, 2))
    got = s3.dequantize()
    np.testing.assert_array_equal(got[0], t.dequantize())
    np.testing.assert_array_equal(got[1], 2 * t.dequantize())
    np.testing.assert_array_equal(take_rows(s3, 1, 2).dequantize()[0], 2 * t.dequantize())


def test_block_scales_shape_is_checked():
    t, _ = _block_tensor()
    with pytest.raises(LayoutError, match="scales shape"):
        t.replace(scales=np.ones((1, 2), dtype=np.float32))


def test_nan_code_dequantizes_to_nan():
    t, _ = _block_tensor()
    codes = t.codes.copy()
    codes[0, 0] = 0x7F
    assert np.isnan(t.replace(codes=codes).dequantize()[0, 0])


def test_codebook_from_an_array_is_the_element_table():
    """A float element's table built from a fresh array (new NaN objects) gives an equal scheme: the
    codebook is canonicalised to ``ELEMENTS[...].values`` (tuple ``==`` compares NaNs by identity)."""
    fresh = tuple(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32).tolist())
    assert fresh != codebooks.E4M3  # NaN != NaN: the trap
    a = QuantScheme(8, False, scale_dtype="F32", codebook=fresh)
    b = QuantScheme(8, False, scale_dtype="F32", codebook=codebooks.E4M3)
    assert a == b and a.codebook is codebooks.ELEMENTS["e4m3"].values
    e2m1 = QuantScheme(4, False, scale_dtype="F8_E8M0", codebook=np.asarray(codebooks.E2M1, np.float32))
    assert e2m1.codebook is codebooks.E2M1
    nf4 = (-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0, 0.0796, 0.1609, 0.2461, 0.3379,
           0.4407, 0.5626, 0.723, 1.0)
    assert QuantScheme(4, False, codebook=np.array(nf4)).codebook == nf4  # a learned table is kept as floats
    from converter.formats.mlx.writer import target_mode
    from converter.tensor import spec_of
    t = QuantizedTensor("w.weight", ("out", "in"), np.zeros((2, 32), np.uint8), np.ones((2, 1), np.float32), a,
                        GroupMap.per_channel("out"))
    assert target_mode(spec_of(t)) == "mxfp8"
