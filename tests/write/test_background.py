"""Background pwrite: bytes land at their offsets whatever the queue limit, a write error is
raised to the submitter (never dropped), forked workers drain their own queue, abandon stops."""

import os

import numpy as np
import pytest

from converter.write.background import BackgroundWriter, drain_process


def test_every_item_lands_at_its_offset_with_a_tiny_limit(tmp_path):
    p = tmp_path / "f.bin"
    rng = np.random.default_rng(0)
    items = [rng.integers(0, 256, int(n), dtype=np.uint8) for n in rng.integers(1, 5000, 40)]
    offsets = np.concatenate([[0], np.cumsum([len(a) for a in items])[:-1]])
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        w = BackgroundWriter(fd, limit=1000)  # most items exceed it: they go one at a time
        for k in rng.permutation(len(items)):  # any order
            w.submit(memoryview(items[k]), int(offsets[k]))
        w.close()
    finally:
        os.close(fd)
    assert p.read_bytes() == b"".join(a.tobytes() for a in items)


def test_a_failed_write_is_raised_not_dropped(tmp_path):
    p = tmp_path / "ro.bin"
    p.write_bytes(b"x")
    fd = os.open(p, os.O_RDONLY)  # pwrite fails with EBADF in the thread
    try:
        w = BackgroundWriter(fd)
        w.submit(memoryview(b"abc"), 0)
        with pytest.raises(OSError):
            w.drain()
        with pytest.raises(OSError):  # and stays failed
            w.submit(memoryview(b"d"), 0)
        w.abandon()
    finally:
        os.close(fd)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_child_writes_through_its_own_thread(tmp_path):
    p = tmp_path / "fork.bin"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.ftruncate(fd, 8)
    w = BackgroundWriter(fd)
    w.submit(memoryview(b"PARE"), 0)
    pid = os.fork()
    if pid == 0:  # child: its own queue and thread, drained before it exits
        try:
            w.submit(memoryview(b"CHLD"), 4)
            drain_process()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    w.close()
    os.close(fd)
    assert p.read_bytes() == b"PARECHLD"


def test_abandon_drops_queued_writes_and_stops(tmp_path, monkeypatch):
    """abandon() lets the write in progress finish, drops the queued ones, stops the thread."""
    import threading
    started, release = threading.Event(), threading.Event()
    real = os.pwrite

    def slow_pwrite(fd, data, offset):
        started.set()
        release.wait(5)
        return real(fd, data, offset)
    monkeypatch.setattr(os, "pwrite", slow_pwrite)
    p = tmp_path / "a.bin"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        w = BackgroundWriter(fd, limit=1 << 30)
        for k in range(5):
            w.submit(memoryview(np.full(100, k + 1, np.uint8)), 100 * k)
        assert started.wait(5)  # the first write is in progress, four are queued
        threading.Timer(0.2, release.set).start()
        w.abandon()
        assert w._thread is None
    finally:
        os.close(fd)
    assert p.read_bytes() == bytes([1]) * 100  # only the write that had started


def test_a_memory_mapped_item_goes_in_chunks_without_waiting_and_releases_each(tmp_path, monkeypatch):
    """A view of a memory-mapped file holds no memory of its own: it is not counted in the bytes in
    flight (the submitter never waits for it, however large), it is written in MAPPED_CHUNK pieces and
    ``release`` runs after each; the file's bytes are the same."""
    import threading

    from converter.write import background
    monkeypatch.setattr(background, "MAPPED_CHUNK", 1000)
    src = tmp_path / "src.bin"
    data = np.random.default_rng(1).integers(0, 256, 4500, dtype=np.uint8)
    src.write_bytes(data.tobytes())
    mapped = np.memmap(src, dtype=np.uint8, mode="r")
    p = tmp_path / "f.bin"
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    released = []
    gate = threading.Event()
    try:
        w = BackgroundWriter(fd, limit=100)
        w.submit(memoryview(b"H" * 10), 0)  # queued first (counted: 10 bytes in flight)
        w.submit(memoryview(mapped), 10, release=lambda: (gate.wait(5), released.append(1)))
        assert w._inflight <= 10  # the mapped bytes are not in flight: no wait, whatever the limit
        gate.set()
        w.close()
    finally:
        os.close(fd)
    assert len(released) == 5  # ceil(4500 / 1000) chunks, each released once written
    assert p.read_bytes() == b"H" * 10 + data.tobytes()


def test_the_safetensors_writer_queues_a_mapped_array_with_its_pages_released(tmp_path, monkeypatch):
    """A dense tensor passed through from a memory map goes to the background writer as mapped (released
    after writing), an array of its own as counted bytes; the file reads back the same."""
    from safetensors.numpy import load_file

    from converter.write import safetensors as st
    src = tmp_path / "m.bin"
    a = np.arange(3000, dtype=np.float32)
    a.tofile(src)
    mapped = np.memmap(src, dtype=np.float32, mode="r")
    own = np.ones((4, 5), dtype=np.float16)
    calls = []
    real = st.BackgroundWriter.submit

    def spy(self, view, offset, release=None):
        calls.append(release is not None)
        return real(self, view, offset, release)
    monkeypatch.setattr(st.BackgroundWriter, "submit", spy)
    out = tmp_path / "o.safetensors"
    with st.SafetensorsWriter(out, [("a", "F32", (3000,)), ("b", "F16", (4, 5))]) as w:
        w.write("a", mapped)
        w.write("b", own)
    assert calls == [True, False]
    got = load_file(out)
    assert np.array_equal(got["a"], a) and np.array_equal(got["b"], own)
