"""Row-parallel kernels: one matrix split into contiguous row ranges, one thread per range.

numpy releases the GIL inside its loops, so the blocked kernels (:mod:`converter.kernels.dequant`,
:mod:`converter.kernels.rtn`) run on several cores when each thread works on its own rows with its
own buffers. The thread count follows the parallelism the user allowed: ``--workers N`` (the cores
by default) in a process that is not itself one of the workers of a pool; inside a pool worker, or
with ``--workers 1``, kernels run in the calling thread, so processes and threads never
oversubscribe the cores. Codes, scales and values do not depend on the thread count (every row is
computed the same way); error-report sums are kept per row and added in row order, so they do not
either.
"""

from __future__ import annotations

import contextvars
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable

from converter.errors import QuantizationError
from converter.kernels.blas import blas_threads
from converter.runtime import current, in_worker_process

#: Fewest rows x columns per thread worth a hand-off.
MIN_ELEMENTS_PER_THREAD = 1 << 20

_POOL: tuple[int, ThreadPoolExecutor] | None = None


def forget_pool() -> None:
    """In a forked worker process: drop the parent's thread pool (its threads do not survive fork)."""
    global _POOL
    _POOL = None


def shutdown_pool() -> None:
    """Stop this process's kernel threads (waiting for them); the next kernel starts a new pool.

    Called before worker processes are forked (:mod:`converter.write.engine`): a fork while
    these threads live could leave a lock held forever in the child.
    """
    global _POOL
    if _POOL is not None and _POOL[0] == os.getpid():
        _POOL[1].shutdown(wait=True)
    _POOL = None


def kernel_threads(elements: int) -> int:
    """Threads a kernel on ``elements`` values may use (1 in a pool worker or for small work)."""
    if in_worker_process():
        return 1
    n = current().n_workers
    return max(1, min(n, elements // MIN_ELEMENTS_PER_THREAD))


_LOCAL = threading.local()


def _pool(n: int) -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid() or _POOL[1]._max_workers < n:
        if _POOL is not None and _POOL[0] == os.getpid():
            _POOL[1].shutdown(wait=False)
        _POOL = (os.getpid(), ThreadPoolExecutor(max_workers=n, thread_name_prefix="qckpt-kernel"))
    return _POOL[1]


def _in_range(fn: Callable[[int, int], Any], a: int, b: int) -> Any:
    """``fn(a, b)`` marked as running inside a kernel range: a nested :func:`run_rows` (a value
    cache dequantizing its rows ...) then runs inline instead of waiting on the pool it occupies."""
    _LOCAL.inside = True
    try:
        return fn(a, b)
    finally:
        _LOCAL.inside = False


def split_rows(rows: int, step: int, n: int) -> list[tuple[int, int]]:
    """``n`` (or fewer) contiguous ranges covering ``range(rows)``, boundaries on multiples of ``step``."""
    blocks = -(-rows // step)
    n = max(1, min(n, blocks))
    cuts = [min(rows, (blocks * k // n) * step) for k in range(n + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


def run_rows(fn: Callable[[int, int], Any], rows: int, step: int, threads: int) -> list[Any]:
    """``[fn(a, b) for each range of split_rows(rows, step, threads)]``, the ranges in parallel
    (the first in the calling thread), each in a copy of the caller's :mod:`contextvars` context.
    An exception in any range is raised after all finish."""
    if getattr(_LOCAL, "inside", False):  # nested in a range: no second hand-off (no deadlock)
        threads = 1
    ranges = split_rows(rows, step, threads)
    if len(ranges) <= 1:
        return [fn(*r) for r in ranges]
    pool = _pool(len(ranges) - 1)
    # each range runs in a copy of the caller's context: the run options and an open task's result
    # sink (ContextVars) are seen in the pool's threads as in the calling thread
    futures = [pool.submit(contextvars.copy_context().run, _in_range, fn, a, b) for a, b in ranges[1:]]
    try:
        first = _in_range(fn, *ranges[0])
    finally:
        wait(futures)  # every range finishes before anything is raised or returned
    return [first] + [f.result() for f in futures]  # (re-raises a range's exception)


def run_row_parts(work: Callable[[int, int], Any], rows: int, step: int, elements: int, sums: Any) -> int | None:
    """Run a row quantizer's ``work(a, b) -> (degenerate groups, error-sum part) | None`` over the row ranges
    (:func:`run_rows`, :func:`kernel_threads` of ``elements``), BLAS at one thread per range (the error sums'
    products), and fold the ranges' error-sum parts into ``sums`` (:meth:`ErrorSums.absorb`; None: no sums).

    Returns the total of degenerate groups, or None when a range returned None or raised
    :class:`~converter.errors.QuantizationError` (a NaN / inf: the whole-array path says where).
    """
    try:
        with blas_threads():
            parts = run_rows(work, rows, step, kernel_threads(elements))
    except QuantizationError:
        return None
    if any(p is None for p in parts):
        return None
    if sums is not None:
        for p in parts[1:]:
            sums.absorb(p[1])
    return sum(p[0] for p in parts)
