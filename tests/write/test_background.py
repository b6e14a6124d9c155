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
