"""Run options shared by every writing command: worker processes, a memory budget, progress.

The write path (:func:`converter.write.plan.write_plans`) reads the options in force from here,
so formats never see them. ``qckpt`` sets them once per command (``--workers``, ``--max-memory``,
``--quiet``; :func:`converter.cli.run_options_flags`); library callers use :func:`run_options`::

    with run_options(workers=2, max_memory="256M"):
        converter.save(ckpt, "out", format="compressed-tensors")

Workers are forked processes (``multiprocessing`` ``"fork"`` context): each inherits the planned
output file layout and the lazily opened checkpoint, opens the output itself and ``pwrite``\\ s its
tensors' arrays at their planned offsets. No array crosses a process boundary (only task numbers
and small results), and the bytes written do not depend on which worker wrote what, so the output
is byte-identical for any number of workers.

Memory: a tensor is worked on whole when its estimated working set fits the per-worker share of
``max_memory``; otherwise, when its plan allows it (:class:`converter.write.plan.RowSplit`), in
blocks of rows, dropping the source pages it has read after each block (:func:`drop_pages`), so
peak resident memory is bounded by the budget and not by the number or size of tensors.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sys
import time
import weakref
from typing import Any, Callable

import numpy as np

from converter.errors import ConverterError
from converter.runtime import auto_workers, current, limit_blas_threads, mark_worker_process
from converter.write.background import BackgroundWriter

__all__ = ["drop_pages", "Progress", "run_tasks", "SharedDict"]

def drop_pages(*arrays: Any) -> None:
    """Release the resident pages of memory-mapped arrays (``madvise(MADV_DONTNEED)``).

    The mapping stays valid: the next access faults the pages in again from the page cache.
    Arrays that are not memory maps (or views of one) are ignored. Used between row blocks so a
    huge tensor read through a map does not stay resident as a whole.
    """
    for a in arrays:
        seen = 0
        while a is not None and seen < 8:
            if isinstance(a, mmap.mmap):
                with contextlib.suppress(ValueError, OSError):
                    a.madvise(mmap.MADV_DONTNEED)
                break
            mm = getattr(a, "_mmap", None)
            if isinstance(mm, mmap.mmap):
                with contextlib.suppress(ValueError, OSError):
                    mm.madvise(mmap.MADV_DONTNEED)
                break
            a = getattr(a, "base", None)
            seen += 1


# --------------------------------------------------------------------------------------------- progress

def _fmt_time(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Progress:
    """A one-line progress bar on stderr: items and bytes done, rate, time left.

    Silent when the options say quiet or stderr is not a terminal (set ``QCKPT_PROGRESS=1`` to
    force it); appears only once the work has run longer than ``delay`` seconds, so quick
    commands print nothing. Never writes to stdout (JSON output is unaffected).
    """

    def __init__(self, label: str, total_items: int, total_bytes: int, *, delay: float = 0.5,
                 stream=None, enabled: bool | None = None) -> None:
        self.label, self.total_items, self.total_bytes = label, int(total_items), int(total_bytes)
        self.items = self.bytes = 0
        self.stream = stream or sys.stderr
        if enabled is None:
            force = os.environ.get("QCKPT_PROGRESS")
            enabled = not current().quiet and (force == "1" or (force != "0" and self.stream.isatty()))
        self.enabled = enabled
        self.t0 = time.monotonic()
        self.delay = delay
        self._last = 0.0
        self._shown = False

    def advance(self, items: int = 0, nbytes: int = 0) -> None:
        self.items += items
        self.bytes += nbytes
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.t0 < self.delay or (now - self._last < 0.1 and self.items < self.total_items):
            return
        self._last = now
        self._draw(now)

    def _draw(self, now: float) -> None:
        el = max(now - self.t0, 1e-9)
        frac = self.bytes / self.total_bytes if self.total_bytes else (self.items / self.total_items if self.total_items else 1)
        width = 24
        fill = int(width * min(1.0, frac))
        rate = self.bytes / el
        left = (self.total_bytes - self.bytes) / rate if rate > 0 else 0
        line = (f"\r{self.label} [{'#' * fill}{'.' * (width - fill)}] {self.items}/{self.total_items} tensors "
                f"{self.bytes / 1e9:.2f}/{self.total_bytes / 1e9:.2f} GB {rate / 1e9:.2f} GB/s "
                f"elapsed {_fmt_time(el)} left {_fmt_time(left)} ")
        self.stream.write(line)
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self.enabled and (self._shown or time.monotonic() - self.t0 >= self.delay):
            self._draw(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------------------------- workers

def _pack_error(exc: BaseException) -> tuple:
    """A worker's exception in a form that survives pickling with its fields."""
    if isinstance(exc, ConverterError):
        return ("converter", type(exc), dict(exc.__dict__))
    return ("other", type(exc).__name__, str(exc))


def _unpack_error(packed: tuple) -> BaseException:
    if packed[0] == "converter":
        cls, fields = packed[1], packed[2]
        exc = cls.__new__(cls)
        exc.__dict__.update(fields)
        Exception.__init__(exc, exc.render())
        if isinstance(exc, OSError) and "_errno" in fields:
            exc.errno = fields["_errno"]
        return exc
    return RuntimeError(f"worker failed: {packed[1]}: {packed[2]}")


_SHARED: "weakref.WeakValueDictionary[int, SharedDict]" = weakref.WeakValueDictionary()
_PENDING: list[tuple[int, Any, Any]] = []


class SharedDict(dict):
    """A dict whose items set inside a worker process are also set in the parent's copy.

    For side results computed while a tensor is loaded or encoded (``qckpt quantize``'s error
    statistics): create it before the write starts; :func:`run_tasks` carries the items a task
    set back with its result (they must be picklable).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._owner = os.getpid()
        self._token = id(self)
        _SHARED[self._token] = self

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        if os.getpid() != self._owner:
            _PENDING.append((self._token, key, value))


def _apply_pending(records: list[tuple[int, Any, Any]]) -> None:
    for token, key, value in records:
        target = _SHARED.get(token)
        if target is not None:
            dict.__setitem__(target, key, value)


_TASK_FN: Callable[[int], Any] | None = None


def _run_one(i: int) -> tuple[int, bool, Any, list]:
    from converter.write.background import drain_process
    _PENDING.clear()
    try:
        res = _TASK_FN(i)  # type: ignore[misc]
        drain_process()  # the task's bytes are in the file before the parent hears it is done
        return i, True, res, list(_PENDING)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        return i, False, _pack_error(exc), []


def _worker_init() -> None:
    """In each pool worker: one BLAS thread, single-threaded kernels (the processes share the cores)."""
    from converter.kernels.threads import forget_pool
    limit_blas_threads()
    mark_worker_process()
    forget_pool()


def run_tasks(n_tasks: int, fn: Callable[[int], Any], *, workers: int,
              on_result: Callable[[int, Any], None], meanwhile: Callable[[], None] | None = None) -> None:
    """Run ``fn(0) .. fn(n_tasks - 1)``, in ``workers`` forked processes when more than one.

    ``fn`` runs in the worker (it sees the parent's state as of the fork); its small picklable
    result is handed to ``on_result(i, result)`` in the parent, in completion order. The first
    failure is re-raised in the parent (a :class:`ConverterError` keeps its class and fields)
    after the pool is stopped.

    ``meanwhile`` (optional, no arguments) runs once in the parent while the workers work (after
    they are forked, so it never runs in a worker): I/O-bound housekeeping such as deleting a
    replaced output overlaps the tasks instead of adding to them. Inline (one worker) it runs
    before the first task. An exception from it propagates after the pool is stopped.
    """
    global _TASK_FN
    workers = max(1, min(int(workers), n_tasks))
    if workers == 1 or n_tasks <= 1 or not hasattr(os, "fork"):
        if meanwhile is not None:
            meanwhile()
        for i in range(n_tasks):
            on_result(i, fn(i))
        return
    import multiprocessing as mp
    _TASK_FN = fn
    ctx = mp.get_context("fork")
    try:
        with ctx.Pool(workers, initializer=_worker_init) as pool:
            results = pool.imap_unordered(_run_one, range(n_tasks), chunksize=1)
            if meanwhile is not None:
                meanwhile()  # results queue up in the meantime
            for i, ok, res, records in results:
                if not ok:
                    pool.terminate()
                    raise _unpack_error(res)
                _apply_pending(records)
                on_result(i, res)
    finally:
        _TASK_FN = None


#: Bytes of one large array written before its (mapped) pages are released.
_MAPPED_CHUNK = 32 * 2**20


def write_at_offsets(path, size: int, n_items: int, produce: Callable[[int], tuple[int, Any]], *,
                     label: str = "writing", total_bytes: int | None = None) -> None:
    """Fill a file of ``size`` bytes whose layout is fixed: item ``i`` is ``produce(i) -> (offset,
    array)``, written with ``pwrite`` at ``offset`` by whichever worker process runs it.

    For formats written outside :func:`converter.write.plan.write_plans` (GGUF): the header and
    every offset are computed first, so tensors can be encoded in parallel (workers and progress
    from the options in force) and the bytes are the same for any number of workers. Gaps are
    zero (``ftruncate``). Arrays are written by a background thread (:mod:`converter.write.background`):
    ``produce`` must return an array nobody modifies afterwards; arrays over 32 MiB go in chunks,
    their (mapped) pages released after each. The file is fsynced.
    """
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)

        bg = BackgroundWriter(fd, path=path)

        def task(i: int) -> int:
            offset, arr = produce(i)
            data = np.ascontiguousarray(arr)
            view = memoryview(data.reshape(-1).view(np.uint8))
            if view.nbytes <= _MAPPED_CHUNK:
                bg.submit(view, offset)
                return view.nbytes
            # a large array (often a memory map of the source: a dense pass-through) goes in
            # chunks, its pages released after each, so it is never resident whole
            for start in range(0, view.nbytes, _MAPPED_CHUNK):
                bg.submit(view[start:start + _MAPPED_CHUNK], offset + start)
                bg.drain()
                drop_pages(data, arr)
            return view.nbytes

        workers = auto_workers(size, n_items)
        try:
            with Progress(label, n_items, total_bytes if total_bytes is not None else size) as progress:
                run_tasks(n_items, task, workers=workers, on_result=lambda i, n: progress.advance(1, n))
            bg.close()
        except BaseException:
            bg.abandon()
            raise
        os.fsync(fd)
    finally:
        os.close(fd)
