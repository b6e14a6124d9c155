"""converter.kernels.crc32: the CRC-32 every read-back proof and digest takes equals ``zlib.crc32`` (the standard
library's, the definition the digests were specified with) on every input kind the callers pass, chained or whole,
whichever library computes it; with the fast extra installed it is zlib-ng's."""

import importlib.util
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter.kernels import crc32 as crc_module
from converter.kernels.crc32 import crc32
from converter.ops.row_digest import crc32_combine


def test_known_values():
    # CRC-32/ISO-HDLC check value (the catalogue's "123456789" -> 0xCBF43926) and the empty input
    assert crc32(b"123456789") == 0xCBF43926
    assert crc32(b"") == 0 and crc32(b"", 0x1234) == 0x1234


@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=5000), split=st.integers(0, 5000), start=st.integers(0, 2**32 - 1))
def test_equals_zlib_whole_and_chained(data, split, start):
    split = min(split, len(data))
    assert crc32(data, start) == zlib.crc32(data, start)
    assert crc32(data[split:], crc32(data[:split])) == zlib.crc32(data)
    assert crc32_combine(crc32(data[:split]), crc32(data[split:]), len(data) - split) == zlib.crc32(data)


def test_buffers_the_callers_pass():
    a = np.random.default_rng(0).integers(-2**31, 2**31, (300, 257), dtype=np.int64).astype(np.int32)
    big = np.random.default_rng(1).integers(0, 256, 3 << 20, dtype=np.uint8)  # several MiB: the vectorised path
    for buf in (a, a.data, memoryview(a).cast("B"), bytearray(a.tobytes()), a[7:11], big, memoryview(big)[5:]):
        assert crc32(buf) == zlib.crc32(buf)
    with pytest.raises(ValueError):
        crc32(a[:, ::2])  # not contiguous: refused as zlib refuses it


def test_zlib_ng_is_used_when_installed():
    expected = "zlib-ng" if importlib.util.find_spec("zlib_ng") is not None else "zlib"
    assert crc_module.implementation() == expected


def test_without_zlib_ng_the_standard_library_computes_it(monkeypatch):
    """The default install (no fast extra): ``_pick`` falls back to ``zlib.crc32`` (import blocked here)."""
    import sys
    monkeypatch.setitem(sys.modules, "zlib_ng", None)  # import zlib_ng -> ImportError
    fn, name = crc_module._pick()
    assert (fn, name) == (zlib.crc32, "zlib") and fn(b"123456789") == 0xCBF43926
