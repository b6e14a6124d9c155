"""BLAS thread cap for the kernels' matrix products (``threadpoolctl``).

The error figures multiply ``(rows, in)`` blocks by a thin ``(in, 8)`` matrix of random inputs.
On such products a multi-threaded BLAS (OpenBLAS starts one thread per core) spends more time
waking and joining its threads than multiplying, and it competes with the kernels' own row
threads (:mod:`converter.kernels.threads`): one BLAS thread per kernel thread is fastest. The
CLI sets this for the whole process (:func:`converter.runtime.limit_blas_threads`); the kernels
set it themselves around their products, so library callers get it too.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from threadpoolctl import ThreadpoolController

_CONTROLLER: ThreadpoolController | None = None
_LOCK = threading.Lock()
_DEPTH = 0
_LIMITER = None


def _controller() -> ThreadpoolController:
    global _CONTROLLER
    if _CONTROLLER is None:  # (scans the loaded libraries once)
        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER


@contextlib.contextmanager
def blas_threads(n: int = 1) -> Iterator[None]:
    """Cap the BLAS libraries numpy loaded at ``n`` threads inside the block (restored after).

    Nested or concurrent uses share the first cap, restored when the last one leaves (the BLAS
    thread count is one setting for the whole process).
    """
    global _DEPTH, _LIMITER
    with _LOCK:
        if _DEPTH == 0:
            _LIMITER = _controller().limit(limits=n, user_api="blas")
        _DEPTH += 1
    try:
        yield
    finally:
        with _LOCK:
            _DEPTH -= 1
            if _DEPTH == 0 and _LIMITER is not None:
                _LIMITER.restore_original_limits()
                _LIMITER = None
