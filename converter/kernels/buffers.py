"""Large output buffers reused from tensor to tensor instead of fresh pages each time (:func:`empty`).

A requantization writes every tensor's codes into a new array; with large blocks served by ``mmap``
(:func:`converter.runtime.fixed_mmap_threshold`, for a flat RSS) each one is new memory, which the
kernel zeroes page by page on first touch before the codes are written: on a 2-core VM about 1 ns
per byte, a tenth of a requantize command's CPU (measured with ``perf``: ``clear_page_erms`` 9.5%).
:func:`empty` hands out arrays carved from a few retained slabs instead, a slab being free again
once nothing refers to it (no array, view or memoryview of it is alive: its reference count), so
a slab is never handed out while the writer or a digest still reads the array made from it.

At most :data:`SLABS` slabs per process are kept (about the tensors in flight between the
quantizer and the background writer, whose queue is bounded: the peak memory does not grow);
a request no free slab can hold gets a slab of its own when there is room, else a plain
``numpy.empty``. A forked worker starts with its parent's slabs (copy-on-write, then its own).
"""

from __future__ import annotations

import sys
import threading

import numpy as np

__all__ = ["empty", "release", "SLABS", "MIN_BYTES"]

#: Slabs kept per process: the codes of the tensor being quantized and of those queued for the background
#: writer (its 96 MiB bound holds about two 7B MLP matrices' int8 codes), as many as were alive before.
SLABS = 3
#: Smaller requests are plain ``numpy.empty`` (the heap reuses them without zeroing anyway).
MIN_BYTES = 4 * 2**20

_LOCK = threading.Lock()
_SLABS: list[np.ndarray] = []


def _refs(slabs: list[np.ndarray], i: int) -> int:
    return sys.getrefcount(slabs[i])


#: References to a slab nothing else holds, as :func:`_refs` counts them in this interpreter (measured, not
#: assumed: the list's own reference and the call's temporaries).
_FREE = _refs([np.empty(1)], 0)


def empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A C-contiguous uninitialised array like ``numpy.empty(shape, dtype)``, its memory a reused slab
    when it is at least :data:`MIN_BYTES` (see the module docstring); the caller owns it like any array."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes < MIN_BYTES:
        return np.empty(shape, dtype=dtype)
    with _LOCK:
        free = [i for i in range(len(_SLABS)) if _refs(_SLABS, i) == _FREE]
        fits = [i for i in free if _SLABS[i].nbytes >= nbytes]
        if fits:  # the smallest free slab that holds it
            i = min(fits, key=lambda k: _SLABS[k].nbytes)
        else:
            if len(_SLABS) >= SLABS and free:  # a free slab too small: replaced by one that fits
                del _SLABS[free[0]]
            if len(_SLABS) >= SLABS:
                return np.empty(shape, dtype=dtype)
            _SLABS.append(np.empty(nbytes, dtype=np.uint8))
            i = len(_SLABS) - 1
        return _SLABS[i][:nbytes].view(dtype).reshape(shape)


def release() -> int:
    """Drop the slabs nothing refers to (their memory goes back to the system); returns how many. Called when
    a write ends (:func:`converter.write.files.write_plans`): the read-back proof that follows holds no codes
    of its own, so the slabs would only add to its peak."""
    with _LOCK:
        keep = [i for i in range(len(_SLABS)) if _refs(_SLABS, i) != _FREE]
        dropped = len(_SLABS) - len(keep)
        _SLABS[:] = [_SLABS[i] for i in keep]
        return dropped


def _forget() -> None:
    """Drop every slab (tests)."""
    with _LOCK:
        _SLABS.clear()
