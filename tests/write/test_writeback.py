"""converter.write.writeback: an early-writeback hint that never changes what is written."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from converter.formats.safetensors_io import read_header, read_tensor
from converter.write.safetensors import SafetensorsWriter
from converter.write import writeback
from converter.write.writeback import MIN_BYTES, PAGE, start_writeback


def test_small_or_sub_page_ranges_are_skipped(tmp_path):
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT)
    try:
        os.pwrite(fd, b"x" * 100, 0)
        assert start_writeback(fd, 0, 100) is False
        assert start_writeback(fd, 1, MIN_BYTES) is (writeback._sync_file_range() is not None)
    finally:
        os.close(fd)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux-only")
def test_large_range_is_handed_to_the_disk_and_bytes_stay(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, size=3 * MIN_BYTES + 123, dtype=np.uint8)
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        os.pwrite(fd, data.tobytes(), 7)
        assert start_writeback(fd, 7, data.nbytes)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert path.read_bytes()[7:] == data.tobytes() and PAGE % 512 == 0


def test_unavailable_is_a_no_op(tmp_path, monkeypatch):
    monkeypatch.setattr(writeback, "_LOOKED_UP", True)
    monkeypatch.setattr(writeback, "_FN", None)
    big = np.arange(MIN_BYTES, dtype=np.uint32).reshape(-1, 256)
    with SafetensorsWriter(tmp_path / "a.safetensors", [("big", "U32", big.shape)]) as w:
        w.write("big", big)
    assert np.array_equal(read_tensor(read_header(tmp_path / "a.safetensors"), "big"), big)
