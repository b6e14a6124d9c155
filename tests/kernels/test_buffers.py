"""Reused output buffers (converter.kernels.buffers): a slab is handed out again only when nothing refers to
it, never while an array, view or memoryview made from it is alive (the background writer and the digest
hold such views while the next tensor is quantized); small requests are plain arrays."""

import numpy as np
import pytest

from converter.kernels import buffers


@pytest.fixture(autouse=True)
def fresh():
    buffers._forget()
    yield
    buffers._forget()


def _shape():
    return (1000, buffers.MIN_BYTES // 1000 + 1)


def test_a_free_slab_is_reused_and_a_held_one_never():
    a = buffers.empty(_shape(), np.int8)
    a[:] = 7
    b = buffers.empty(_shape(), np.uint8)  # a still alive: another slab
    assert not np.shares_memory(a, b)
    held = memoryview(a.reshape(-1).view(np.uint8))  # what the background writer keeps
    del a
    c = buffers.empty(_shape(), np.uint8)
    assert not np.shares_memory(c, np.frombuffer(held, dtype=np.uint8)) and not np.shares_memory(c, b)
    assert bytes(held[:3]) == b"\x07\x07\x07"  # untouched
    del held
    d = buffers.empty(_shape(), np.int16)  # the first slab is free again, but too small for int16: a new one
    assert d.nbytes == 2 * b.nbytes
    del b, c, d
    e = buffers.empty(_shape(), np.int8)
    f = buffers.empty(_shape(), np.int8)
    assert len(buffers._SLABS) <= buffers.SLABS
    assert e.shape == _shape() and e.dtype == np.int8 and e.flags.c_contiguous and e.flags.writeable
    assert not np.shares_memory(e, f)


def test_small_requests_and_a_full_pool_get_plain_arrays():
    small = buffers.empty((10, 10), np.float32)
    assert small.base is None and not buffers._SLABS
    held = [buffers.empty(_shape(), np.uint8) for _ in range(buffers.SLABS)]
    extra = buffers.empty(_shape(), np.uint8)
    assert extra.base is None and len(buffers._SLABS) == buffers.SLABS
    assert not any(np.shares_memory(extra, h) for h in held)


def test_release_drops_only_the_free_slabs():
    held = buffers.empty(_shape(), np.uint8)
    free = buffers.empty(_shape(), np.uint8)
    del free
    assert len(buffers._SLABS) == 2
    assert buffers.release() == 1
    assert len(buffers._SLABS) == 1 and np.shares_memory(buffers._SLABS[0], held)
