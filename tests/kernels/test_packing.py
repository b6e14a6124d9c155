"""Tests for converter.kernels.packing: hand-computed words, case tables and round-trip properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from converter.errors import LayoutError, QuantizationError
from converter.formats.awq import ORDER as AWQ_ORDER
from converter.formats.bnb import NIBBLE_ORDER as BNB_NIBBLE_ORDER
from converter.kernels.packing import (pack_codes, packed_length,
                                     padding_bits, unpack_codes)

CONTAINERS = (np.uint8, np.uint16, np.uint32)
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ hand-computed words

def test_4bit_lsb_first():
    assert int(pack_codes(np.arange(1, 9), 4, axis=0)[0]) == 0x87654321


def test_4bit_awq_order_case_b09():
    words = pack_codes(np.arange(1, 9), 4, axis=0, order=AWQ_ORDER)
    assert int(words[0]) == 0x86427531


def test_awq_unpack_of_linear_word_scrambles_case_b09():
    codes = unpack_codes(np.array([0x87654321], np.uint32), 4, axis=0, length=8, order=AWQ_ORDER)
    assert codes.tolist() == [1, 5, 2, 6, 3, 7, 4, 8]


def test_awq_round_trip_on_int32_words():
    words = pack_codes(np.arange(1, 9), 4, axis=0, order=AWQ_ORDER).view(np.int32)
    assert unpack_codes(words, 4, axis=0, length=8, order=AWQ_ORDER).tolist() == list(range(1, 9))


def test_bnb_high_nibble_first():
    words = pack_codes(np.array([1, 2]), 4, axis=0, container=np.uint8, order=BNB_NIBBLE_ORDER)
    assert words.dtype == np.uint8 and words.tolist() == [0x12]


def test_3bit_stream_is_96bit_little_endian_integer():
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 8, size=32)
    stream = sum(int(c) << (3 * k) for k, c in enumerate(codes))
    expected = [(stream >> (32 * w)) & 0xFFFFFFFF for w in range(3)]
    words = pack_codes(codes, 3, axis=0)
    assert words.dtype == np.uint32 and words.tolist() == expected
    assert unpack_codes(words, 3, axis=0, length=32).tolist() == codes.tolist()


def test_3bit_stream_along_axis0_like_gptq_qweight():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 8, size=(32, 5))  # [I, O], packed along I
    words = pack_codes(codes, 3, axis=0)
    assert words.shape == (3, 5)
    for o in range(5):
        stream = sum(int(c) << (3 * k) for k, c in enumerate(codes[:, o]))
        assert words[:, o].tolist() == [(stream >> (32 * w)) & 0xFFFFFFFF for w in range(3)]


@pytest.mark.parametrize("bits,value,word", [(4, 7, 0x77777777), (2, 1, 0x55555555),
                                             (8, 127, 0x7F7F7F7F)])
def test_gptq_v1_zero_markers(bits, value, word):
    codes = np.full(32 // bits, value)
    assert pack_codes(codes, bits, axis=0).tolist() == [word]


def test_padded_3bit_word():
    codes = np.arange(10) % 8
    expected = sum(int(c) << (3 * k) for k, c in enumerate(codes))
    words = pack_codes(codes, 3, axis=0, layout="padded")
    assert words.tolist() == [expected] and expected < 1 << 30


def test_output_contiguous_and_dtype():
    codes = np.asfortranarray(np.random.default_rng(2).integers(0, 16, size=(6, 16)))
    for axis in (0, 1):
        words = pack_codes(codes, 4, axis=axis, container=np.int16)
        assert words.dtype == np.uint16 and words.flags.c_contiguous
        back = unpack_codes(words.view(np.int16), 4, axis=axis, length=codes.shape[axis],
                            container=np.int16)
        assert back.dtype == np.uint8 and back.flags.c_contiguous
        np.testing.assert_array_equal(back, codes)


# ------------------------------------------------------------------ case B29 table

@pytest.mark.parametrize("bits,dense,padded", [(3, 48, 52), (5, 80, 86), (6, 96, 103), (7, 112, 128)])
def test_packed_length_case_b29(bits, dense, padded):
    assert packed_length(512, bits, layout="stream") == dense
    assert packed_length(512, bits, layout="padded") == padded
    assert padding_bits(512, bits, layout="stream") == dense * 32 - 512 * bits
    assert padding_bits(512, bits, layout="padded") == padded * 32 - 512 * bits


@pytest.mark.parametrize("bits", [4, 8])
def test_packed_length_dividing_widths_agree(bits):
    assert packed_length(512, bits, layout="stream") == packed_length(512, bits, layout="padded") \
        == 512 * bits // 32
    assert padding_bits(512, bits) == 0


def test_padding_bits_tail():
    assert padding_bits(10, 4) == 32 + 32 - 40
    assert padding_bits(10, 3, layout="padded") == 2
    assert padding_bits(0, 3) == 0


# ------------------------------------------------------------------ errors

@pytest.mark.parametrize("bad", [16, -1])
def test_out_of_range_code_raises(bad):
    codes = np.array([1, 2, bad, 3], dtype=np.int64)
    with pytest.raises(QuantizationError) as info:
        pack_codes(codes, 4, axis=0)
    assert str(bad) in str(info.value) and "4 bits" in str(info.value)
    assert info.value.found == bad


def test_float_codes_raise():
    with pytest.raises(QuantizationError):
        pack_codes(np.zeros(8), 4, axis=0)


def test_wrong_packed_length_raises():
    words = np.zeros((3, 4), np.uint32)
    with pytest.raises(LayoutError) as info:
        unpack_codes(words, 4, axis=0, length=32)
    assert info.value.expected == 4 and info.value.found == 3


@pytest.mark.parametrize("kwargs", [dict(order=[0, 1, 2, 3, 4, 5, 6, 6]), dict(order=[0, 1]),
                                    dict(bits=3, order=list(range(10))), dict(bits=0),
                                    dict(bits=9), dict(layout="dense"), dict(container=np.uint64),
                                    dict(container=np.float32), dict(axis=2)])
def test_invalid_arguments_raise_layout_error(kwargs):
    args = dict(bits=4, axis=0)
    args.update(kwargs)
    codes = np.zeros((16, 2), np.uint8)
    with pytest.raises(LayoutError):
        pack_codes(codes, args.pop("bits"), **args)


def test_unpack_rejects_mismatched_word_size():
    with pytest.raises(LayoutError):
        unpack_codes(np.zeros(2, np.int16), 4, axis=0, length=8)


# ------------------------------------------------------------------ properties

@st.composite
def packing_cases(draw, with_order=True):
    container = draw(st.sampled_from(CONTAINERS))
    width = np.dtype(container).itemsize * 8
    bits = draw(st.integers(1, 8))
    layouts = ["stream"] + (["padded"] if bits < width else [])
    layout = draw(st.sampled_from(layouts))
    ndim = draw(st.integers(2, 3))
    shape = draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim))
    axis = draw(st.integers(-ndim, ndim - 1))
    shape[axis] = draw(st.integers(0, 70))
    order = None
    if with_order and (width % bits == 0 or layout == "padded") and draw(st.booleans()):
        order = draw(st.permutations(range(width // bits)))
    seed = draw(st.integers(0, 2**32 - 1))
    codes = np.random.default_rng(seed).integers(0, 1 << bits, size=shape, dtype=np.int64)
    dtype = draw(st.sampled_from([np.uint8, np.int16, np.int64]))
    return codes.astype(dtype), bits, axis, container, layout, order


@PROPS
@given(packing_cases())
def test_round_trip(case):
    codes, bits, axis, container, layout, order = case
    words = pack_codes(codes, bits, axis=axis, container=container, layout=layout, order=order)
    n = codes.shape[axis]
    assert words.dtype == np.dtype(container) and words.flags.c_contiguous
    assert words.shape[axis] == packed_length(n, bits, container=container, layout=layout)
    back = unpack_codes(words, bits, axis=axis, length=n, container=container, layout=layout,
                        order=order)
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, codes)


@PROPS
@given(packing_cases(with_order=False))
def test_stream_matches_python_bigint(case):
    codes, bits, axis, container, layout, _ = case
    width = np.dtype(container).itemsize * 8
    words = pack_codes(codes, bits, axis=axis, container=container, layout=layout)
    n_lines = codes.size // max(codes.shape[axis], 1)
    lines_c = np.moveaxis(codes, axis, -1).reshape(n_lines, codes.shape[axis])
    lines_w = np.moveaxis(words, axis, -1).reshape(n_lines, words.shape[axis])
    per_word = width // bits
    for line_c, line_w in zip(lines_c[:3], lines_w[:3]):
        if layout == "stream":
            offsets = [bits * k for k in range(len(line_c))]
        else:
            offsets = [width * (k // per_word) + bits * (k % per_word) for k in range(len(line_c))]
        stream = sum(int(c) << off for c, off in zip(line_c, offsets))
        expected = [(stream >> (width * w)) & ((1 << width) - 1) for w in range(len(line_w))]
        assert line_w.tolist() == expected


@PROPS
@given(packing_cases())
def test_signed_unpack_is_twos_complement(case):
    codes, bits, axis, container, layout, order = case
    words = pack_codes(codes, bits, axis=axis, container=container, layout=layout, order=order)
    got = unpack_codes(words, bits, axis=axis, length=codes.shape[axis], container=container,
                       layout=layout, order=order, signed=True)
    c = codes.astype(np.int64)
    expected = np.where(c >= 1 << (bits - 1), c - (1 << bits), c)
    assert got.dtype == np.int8
    np.testing.assert_array_equal(got, expected)


@PROPS
@given(packing_cases(), st.booleans())
def test_flip_xors_the_top_bit_before_sign_extension(case, signed):
    codes, bits, axis, container, layout, order = case
    words = pack_codes(codes, bits, axis=axis, container=container, layout=layout, order=order)
    got = unpack_codes(words, bits, axis=axis, length=codes.shape[axis], container=container,
                       layout=layout, order=order, signed=signed, flip=True)
    f = codes.astype(np.int64) ^ (1 << (bits - 1))
    expected = np.where(f >= 1 << (bits - 1), f - (1 << bits), f) if signed else f
    assert got.dtype == (np.int8 if signed else np.uint8)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("shape", [(2, 8), (3, 1, 16), (37, 64), (5, 6), (1, 130), (0, 8), (3, 0)])
@pytest.mark.parametrize("signed,flip", [(False, False), (True, False), (False, True), (True, True)])
def test_4bit_last_axis_fast_path_matches_slot_loop(container, shape, signed, flip, monkeypatch):
    """The bytewise 4-bit path (last axis, even length) gives what the slot loop gives, blocked or not."""
    from converter.kernels import packing

    codes = np.random.default_rng(sum(shape)).integers(0, 16, size=shape, dtype=np.uint8)
    words = pack_codes(codes, 4, axis=-1, container=container)
    kwargs = dict(axis=-1, length=shape[-1], container=container, signed=signed, flip=flip)
    fast = unpack_codes(words, 4, **kwargs)
    monkeypatch.setattr(packing, "_BLOCK_CODES", 7)
    blocked = unpack_codes(words, 4, **kwargs)
    # the same fields one axis up (axis 0 of the transposed words): the slot loop
    slow = unpack_codes(np.ascontiguousarray(np.moveaxis(words, -1, 0)), 4, axis=0, length=shape[-1],
                        container=container, signed=signed, flip=flip)
    np.testing.assert_array_equal(fast, np.moveaxis(slow, 0, -1))
    np.testing.assert_array_equal(blocked, fast)
    assert fast.dtype == slow.dtype and fast.flags.c_contiguous


@PROPS
@given(packing_cases(with_order=False), st.integers(0, 2**32 - 1))
def test_out_of_range_raises(case, seed):
    codes, bits, axis, container, layout, _ = case
    if codes.size == 0:
        return
    rng = np.random.default_rng(seed)
    bad = codes.astype(np.int64)
    index = tuple(int(rng.integers(0, s)) for s in bad.shape)
    value = int(rng.choice([-1, 1 << bits, (1 << bits) + int(rng.integers(0, 1000))]))
    bad[index] = value
    with pytest.raises(QuantizationError) as info:
        pack_codes(bad, bits, axis=axis, container=container, layout=layout)
    assert f"{bits} bits" in str(info.value)


@PROPS
@given(packing_cases(with_order=False), st.sampled_from([-2, -1, 1, 2]))
def test_wrong_packed_length_raises_property(case, delta):
    codes, bits, axis, container, layout, _ = case
    words = pack_codes(codes, bits, axis=axis, container=container, layout=layout)
    shape = list(words.shape)
    shape[axis] += delta
    if shape[axis] < 0:
        return
    with pytest.raises(LayoutError) as info:
        unpack_codes(np.zeros(shape, words.dtype), bits, axis=axis, length=codes.shape[axis],
                     container=container, layout=layout)
    assert info.value.found == shape[axis]


@PROPS
@given(packing_cases(), st.integers(1, 40))
def test_blocked_matches_unblocked(case, block):
    """Cache blocking (``_BLOCK_CODES``) must not change the words or the round trip."""
    from converter.kernels import packing

    codes, bits, axis, container, layout, order = case
    kwargs = dict(container=container, layout=layout, order=order)
    whole = pack_codes(codes, bits, axis=axis, **kwargs)
    saved, packing._BLOCK_CODES = packing._BLOCK_CODES, block
    try:
        blocked = pack_codes(codes, bits, axis=axis, **kwargs)
        back = unpack_codes(blocked, bits, axis=axis, length=codes.shape[axis], **kwargs)
    finally:
        packing._BLOCK_CODES = saved
    np.testing.assert_array_equal(blocked, whole)
    np.testing.assert_array_equal(back, codes)


def test_full_width_codes_unpack_to_a_writable_copy_of_the_bytes():
    """8-bit codes in 8-bit containers are the bytes themselves: unpack copies them (on either
    axis), sign-extends when asked, and never aliases the (often read-only, mapped) words."""
    words = np.array([[0, 1, 255], [128, 127, 7]], dtype=np.uint8)
    words.setflags(write=False)
    for axis in (0, 1):
        got = unpack_codes(words, 8, axis=axis, length=words.shape[axis], container=np.uint8)
        assert got.dtype == np.uint8 and got.flags.c_contiguous and got.flags.writeable
        assert got.tolist() == words.tolist() and not np.shares_memory(got, words)
    signed = unpack_codes(words, 8, axis=1, length=3, container=np.uint8, signed=True)
    assert signed.dtype == np.int8 and signed.tolist() == [[0, 1, -1], [-128, 127, 7]]


@pytest.mark.parametrize("container", [np.uint16, np.uint32])
def test_8bit_codes_in_wide_words_unpack_as_their_bytes(container):
    """8-bit codes packed LSB-first along the last axis of 16/32-bit words: same codes as the
    generic shift-and-mask path (compared with the codes that were packed)."""
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 256, (5, 10), dtype=np.uint8)
    words = pack_codes(codes, 8, axis=1, container=container)
    got = unpack_codes(words, 8, axis=1, length=10, container=container)
    assert got.tolist() == codes.tolist() and got.flags.writeable
    words0 = pack_codes(codes.T.copy(), 8, axis=0, container=container)  # packed axis not last
    assert unpack_codes(words0, 8, axis=0, length=10, container=container).tolist() == codes.T.tolist()


def test_8bit_bytes_path_applies_the_flip():
    """A flipped (offset) 8-bit field reads as the byte XOR 0x80, in both byte paths."""
    codes = np.array([[0, 1, 127, 128, 255, 7, 8, 9]], dtype=np.uint8)
    for container in (np.uint8, np.uint32):
        words = pack_codes(codes, 8, axis=1, container=container)
        got = unpack_codes(words, 8, axis=1, length=8, container=container, flip=True)
        assert got.tolist() == (codes ^ 0x80).tolist()
        signed = unpack_codes(words, 8, axis=1, length=8, container=container, flip=True, signed=True)
        assert signed.tolist() == ((codes ^ 0x80).view(np.int8)).tolist()
