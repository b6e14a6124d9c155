"""Start writing dirty file pages to disk early, so the final ``fsync`` has little left to wait for.

A writer that fills a multi-GB file and then calls ``fsync`` leaves the disk idle until the
kernel's background writeback starts (only once about 10 % of memory is dirty) and then waits
for most of the file at the end. :func:`start_writeback` asks Linux to begin writing a range
right after it was written (``sync_file_range(SYNC_FILE_RANGE_WRITE)``: asynchronous, no
durability promise), so the disk works while the next tensors are being encoded. The pages
stay in the page cache (a read-back right after the write still hits memory); ``fsync`` is
still what makes the file durable. Elsewhere (no ``sync_file_range``) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["start_writeback", "PAGE"]

#: Page size: only whole pages inside a written range are handed to the disk, so a page shared
#: with a neighbouring tensor (written later, maybe by another process) is never written twice.
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: ``SYNC_FILE_RANGE_WRITE`` (linux/fs.h): start writeback of dirty pages in the range, do not wait.
_SYNC_FILE_RANGE_WRITE = 2
#: Ranges smaller than this are left to the kernel (a syscall per tiny array buys nothing).
MIN_BYTES = 1 << 20

_FN = None
_LOOKED_UP = False


def _sync_file_range():
    """libc ``sync_file_range`` (Linux), or None."""
    global _FN, _LOOKED_UP
    if not _LOOKED_UP:
        _LOOKED_UP = True
        if sys.platform.startswith("linux"):
            try:
                # the symbols already loaded into this process (libc among them): no find_library, which
                # forks ``ldconfig -p`` (a fork of a process holding a tensor, mid-write)
                libc = ctypes.CDLL(None, use_errno=True)
                fn = libc.sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _FN = fn
            except (OSError, AttributeError):
                _FN = None
    return _FN


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Begin writing the whole pages of ``fd``'s bytes ``[offset, offset + nbytes)`` to disk.

    Parameters
    ----------
    fd : int
        An open file descriptor (written with ``pwrite``).
    offset, nbytes : int
        The byte range just written. Rounded inwards to page boundaries; ranges under
        :data:`MIN_BYTES` are skipped.

    Returns
    -------
    bool
        True when writeback was requested; False when skipped, unsupported or refused (never
        raises: this is only a hint, the caller's ``fsync`` remains the durability point).
    """
    if nbytes < MIN_BYTES:
        return False
    start = -(-int(offset) // PAGE) * PAGE
    end = (int(offset) + int(nbytes)) // PAGE * PAGE
    fn = _sync_file_range()
    if fn is None or end <= start:
        return False
    return fn(int(fd), start, end - start, _SYNC_FILE_RANGE_WRITE) == 0
