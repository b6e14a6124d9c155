"""Compiled pack / unpack (converter/kernels/compiled/packing.py) give numpy's words and codes exactly: every
word-aligned layout (1/2/4/8-bit stream, padded at any width), container, packed axis, in-word order, partial
last word, signed / flipped reads; straddling stream widths stay on numpy."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.kernels import compiled
from converter.kernels.packing import pack_codes, unpack_codes
from converter.runtime import run_options

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba (the fast extra) is not installed")


def test_gptq_orientation_hand_packed():
    # 8 codes 1..8 down axis 0 of one column pack into the word 0x87654321 (LSB first); 2 columns
    codes = np.stack([np.arange(1, 9), np.arange(8, 0, -1)], axis=1).astype(np.uint8)
    with run_options(kernels="numba"):
        words = pack_codes(codes, 4, axis=0)
        back = unpack_codes(words, 4, axis=0, length=8)
    assert words.tolist() == [[0x87654321, 0x12345678]]
    assert "converter.kernels.compiled.packing.pack_fields" in compiled.compile_seconds()
    assert np.array_equal(back, codes)


@settings(max_examples=120, deadline=None)
@given(data=st.data(), bits=st.integers(1, 8), container=st.sampled_from([np.uint8, np.uint16, np.uint32]),
       layout=st.sampled_from(["stream", "padded"]), shape=st.lists(st.integers(1, 13), min_size=2, max_size=3),
       signed=st.booleans(), flip=st.booleans(), ordered=st.booleans())
def test_compiled_equals_numpy(data, bits, container, layout, shape, signed, flip, ordered):
    width = np.dtype(container).itemsize * 8
    if bits > width:
        return
    aligned = width % bits == 0 or layout == "padded"
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    order = None
    if ordered and aligned:
        order = data.draw(st.permutations(list(range(width // bits))))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    dtype = data.draw(st.sampled_from([np.uint8, np.int32, np.int64]))
    codes = rng.integers(0, 1 << bits, size=shape).astype(dtype)
    kw = dict(axis=axis, container=container, layout=layout, order=order)
    with run_options(kernels="numpy"):
        words = pack_codes(codes, bits, **kw)
        back = unpack_codes(words, bits, length=shape[axis], signed=signed, flip=flip, **kw)
    with run_options(kernels="numba"):
        words_c = pack_codes(codes, bits, **kw)
        back_c = unpack_codes(words, bits, length=shape[axis], signed=signed, flip=flip, **kw)
    assert words_c.dtype == words.dtype and words_c.tobytes() == words.tobytes()
    assert back_c.dtype == back.dtype and back_c.shape == back.shape and back_c.tobytes() == back.tobytes()
    # random words (nonzero padding bits included) unpack alike
    noise = rng.integers(0, 1 << width, size=words.shape, dtype=np.uint64).astype(container)
    with run_options(kernels="numpy"):
        a = unpack_codes(noise, bits, length=shape[axis], signed=signed, flip=flip, **kw)
    with run_options(kernels="numba"):
        b = unpack_codes(noise, bits, length=shape[axis], signed=signed, flip=flip, **kw)
    assert a.tobytes() == b.tobytes()
