"""Row-parallel kernels: one matrix split into contiguous row ranges, one thread per range.

numpy releases the GIL inside its loops, so the blocked kernels (:mod:`converter.quant.kernels`)
run on several cores when each thread works on its own rows with its own buffers. The thread
count follows the parallelism the user allowed: ``--workers N`` (the cores by default) in a
process that is not itself one of the workers of a pool; inside a pool worker, or with
``--workers 1``, kernels run in the calling thread, so processes and threads never oversubscribe
the cores. Codes, scales and values do not depend on the thread count (every row is computed
the same way); error-report sums are kept per row and added in row order, so they do not either.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Callable

#: Fewest rows x columns per thread worth a hand-off.
MIN_ELEMENTS_PER_THREAD = 1 << 20

_POOL: tuple[int, ThreadPoolExecutor] | None = None
_IN_WORKER = False


def mark_worker_process() -> None:
    """Called in each worker process of a pool: its kernels stay single-threaded."""
    global _IN_WORKER, _POOL
    _IN_WORKER = True
    _POOL = None  # a pool's threads do not survive fork


def kernel_threads(elements: int) -> int:
    """Threads a kernel on ``elements`` values may use (1 in a pool worker or for small work)."""
    if _IN_WORKER:
        return 1
    from ..io.parallel import current
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
    (the first in the calling thread). An exception in any range is raised after all finish."""
    if getattr(_LOCAL, "inside", False):  # nested in a range: no second hand-off (no deadlock)
        threads = 1
    ranges = split_rows(rows, step, threads)
    if len(ranges) <= 1:
        return [fn(*r) for r in ranges]
    pool = _pool(len(ranges) - 1)
    futures = [pool.submit(_in_range, fn, a, b) for a, b in ranges[1:]]
    try:
        first = _in_range(fn, *ranges[0])
    finally:
        wait(futures)  # every range finishes before anything is raised or returned
    return [first] + [f.result() for f in futures]  # (re-raises a range's exception)
