import numpy as np
import pytest

from converter import AxisMap
from converter.errors import LayoutError


def test_gptq_like_axis_map_round_trip_rectangular():
    # codes logical (out=5, in=16), stored [in/8, out] packed along in: distinct codes expose any swap
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, size=(5, 16)).astype(np.uint8)
    am = AxisMap(("in", "out"), packed_axis="in", bits=4, container="I32")
    stored = am.to_stored(codes, ("out", "in"))
    assert stored.shape == (2, 5) and stored.dtype == np.int32
    # word [0, o] holds inputs 0..7 of output o, LSB first
    w = int(stored[0, 3]) & 0xFFFFFFFF
    assert [(w >> (4 * k)) & 0xF for k in range(8)] == codes[3, :8].tolist()
    np.testing.assert_array_equal(am.to_logical(stored, ("out", "in"), {"out": 5, "in": 16}), codes)


def test_awq_like_axis_map_interleave():
    codes = np.arange(1, 9, dtype=np.uint8).reshape(1, 8)  # out columns 0..7 of one input row
    am = AxisMap(("in", "out"), packed_axis="out", bits=4, container="I32", order=(0, 2, 4, 6, 1, 3, 5, 7))
    stored = am.to_stored(codes.T.copy().T, ("in", "out"))
    assert int(stored[0, 0]) & 0xFFFFFFFF == 0x86427531  # CASES.md B09


def test_signed_codes_store_twos_complement():
    codes = np.array([[-8, -1, 0, 7, 3, -3, 1, 2]], np.int8)
    am = AxisMap(("out", "in"), packed_axis="in", bits=4, container="U32")
    back = am.to_logical(am.to_stored(codes, ("out", "in")), ("out", "in"), {"out": 1, "in": 8}, signed=True)
    np.testing.assert_array_equal(back, codes)


def test_shape_mismatch_named():
    am = AxisMap(("in", "out"), packed_axis="in", bits=4, container="I32")
    with pytest.raises(LayoutError, match="stored shape"):
        am.to_logical(np.zeros((3, 5), np.int32), ("out", "in"), {"out": 5, "in": 16})
    with pytest.raises(LayoutError):
        AxisMap(("in", "out"), packed_axis="out", bits=9, container="I32")


def test_to_logical_refuses_float_words_of_the_container_size():
    import pytest
    from converter.errors import LayoutError
    m = AxisMap(("out", "in"), packed_axis="in", bits=4, container="U32")
    words = np.array([[0x76543210]], np.uint32)
    assert m.to_logical(words, ("out", "in"), {"out": 1, "in": 8}).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert m.to_logical(words.view(np.int32), ("out", "in"), {"out": 1, "in": 8}).tolist() == [[0, 1, 2, 3, 4, 5, 6, 7]]
    with pytest.raises(LayoutError, match="wrong dtype") as e:
        m.to_logical(words.view(np.float32), ("out", "in"), {"out": 1, "in": 8})
    assert e.value.field == "dtype"


@pytest.mark.parametrize("kw", [{"bits": 4}, {"order": (0, 2, 4, 6, 1, 3, 5, 7)}, {"bits": 4, "order": (1, 0)}])
def test_packing_fields_without_a_packed_axis_are_refused(kw):
    with pytest.raises(LayoutError, match="without a packed axis") as e:
        AxisMap(("out", "in"), **kw)
    assert e.value.field == ("order" if "order" in kw else "bits")
