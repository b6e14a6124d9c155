import numpy as np
import pytest

from converter import GroupMap
from converter.errors import LayoutError
from converter.groups import Granularity


def test_param_shapes():
    axes = ("out", "in")
    assert GroupMap.per_tensor().param_shape((5, 12), axes) == (1, 1)
    assert GroupMap.per_channel("out").param_shape((5, 12), axes) == (5, 1)
    assert GroupMap.per_channel("in").param_shape((5, 12), axes) == (1, 12)
    assert GroupMap.per_group(8).param_shape((5, 12), axes) == (5, 2)
    assert GroupMap.per_group(2, axis="out").param_shape((5, 12), axes) == (3, 12)
    assert GroupMap.per_group(8).param_shape((2, 5, 12), ("expert", "out", "in")) == (2, 5, 2)
    assert GroupMap(Granularity.FLAT_BLOCK, group_size=64).param_shape((40, 96), axes) == (60,)


def test_partial_group_expand_sequential_blocks():
    # CASES.md B13: I=6, G=4 -> 2 groups, the tail uses scale 1, not scale 0
    gm = GroupMap.per_group(4)
    s = gm.expand(np.array([[0.1, 0.5]], np.float32), (1, 6), ("out", "in"))
    q = np.array([[2, -1, 3, 1, 4, -2]], np.float32)
    np.testing.assert_allclose(q * s, [[0.2, -0.1, 0.3, 0.1, 2.0, -1.0]], rtol=1e-6)


def test_blocks_are_sequential_not_interleaved():
    # CASES.md B07: [2,4] all 9s, blocks of 2 along in, scales [[1,2],[3,4]] and zero points equal to scales
    gm = GroupMap.per_group(2)
    s = gm.expand(np.array([[1, 2], [3, 4]], np.float32), (2, 4), ("out", "in"))
    out = (9 - s) * s
    assert out.reshape(-1).tolist() == [8, 8, 14, 14, 18, 18, 20, 20]


def test_g_idx_expand():
    gm = GroupMap.per_group(2, g_idx=np.array([1, 0, 1, 0]))
    s = gm.expand(np.array([[0.1, 1.0]], np.float32), (1, 4), ("out", "in"))
    np.testing.assert_allclose(np.array([[2, 3, 4, 5]]) * s, [[2.0, 0.3, 4.0, 0.5]], rtol=1e-6)


def test_invariants():
    with pytest.raises(LayoutError):
        GroupMap(Granularity.GROUP, axis="in", group_size=0)
    with pytest.raises(LayoutError):
        GroupMap(Granularity.TENSOR, axis="in")
    with pytest.raises(LayoutError):
        GroupMap.per_channel("expert")
    with pytest.raises(LayoutError, match="g_idx length"):
        GroupMap.per_group(2, g_idx=np.array([0, 0, 1])).check_shape((2, 4), ("out", "in"))
    with pytest.raises(LayoutError, match="without members"):
        GroupMap.per_group(2, g_idx=np.array([0, 0, 2, 2])).reduce(np.ones((1, 4)), np.maximum, ("out", "in"))


def test_row_local_decides_the_row_blocked_kernels():
    from converter.groups import GroupMap
    oi = ("out", "in")
    assert GroupMap.per_tensor().row_local(oi) and GroupMap.per_channel("out").row_local(oi)
    assert GroupMap.per_group(32, "in").row_local(oi)
    assert not GroupMap.per_channel("in").row_local(oi) and not GroupMap.per_group(32, "out").row_local(oi)
    assert not GroupMap.per_group(32, "in").row_local(("in", "out"))
    assert not GroupMap.per_group(32, "in").row_local(("expert", "out", "in"))
    assert not GroupMap(granularity="flat_block", group_size=32).row_local(oi)
    act = GroupMap.per_group(2, "in", g_idx=np.array([1, 0, 1, 0]))
    assert not act.row_local(oi) and act.row_local(oi, g_idx_ok=True)
