"""The task runner: ``n`` tasks run inline or in forked worker processes, results returned explicitly.

Every write (a safetensors file from plans, a GGUF file of fixed offsets) and every read-back
proof is a list of tasks numbered ``0 .. n - 1``. :func:`run_tasks` runs them inline (one worker)
or in a :class:`concurrent.futures.ProcessPoolExecutor` of ``fork``\\ ed processes, which inherit
the lazily opened checkpoint and the planned output; only task numbers and small results cross a
process boundary.

**Results.** What a task produces comes back as its return value, handed to the caller's
``on_result(i, result)`` in the parent. What the *loading* of a tensor computes along the way
(``qckpt quantize``'s error figures, ``requantize``'s report rows, while a format's encoder asks
the checkpoint for the tensor) is reported with :func:`task_result` into the running task's own
results, which travel back with the task's return value and are delivered to the
:func:`collect_results` block of the caller in the parent. Nothing is shared between processes.
A result may be a :class:`Deferred` (or a tuple holding some): computed on its own thread while the
task goes on (a digest of a tensor while the writer encodes and writes it), it is waited for when
the task's function returns, before the task counts as done, so nothing outlives its task.

**Process start.** A ``fork`` copies only the calling thread; a lock held by another thread at that
moment stays locked forever in the child. So before the workers are forked, the kernels' thread
pool is shut down (:func:`converter.kernels.threads.shutdown_pool`) and the background writers'
threads are stopped (:func:`converter.write.background.pause_threads`); both restart on demand.
The executor forks its workers on the first submission, before it starts its own thread.

**Errors.** The first failing task stops the pool and its exception is raised in the parent with
its own type and fields (a :class:`ConverterError` keeps its class and every field), chained to
a :class:`RemoteTraceback` holding the worker's traceback text, as :mod:`concurrent.futures` does.
An exception that cannot be pickled arrives as a :class:`WorkerError` naming its type; a
``SystemExit`` raised inside a task arrives as a :class:`WorkerError` too (it must not end the
parent silently; a ``KeyboardInterrupt`` stays itself: Ctrl-C reaches every process). A worker
that dies without reporting (killed by a signal, e.g. by the kernel for memory) raises
:class:`~converter.errors.WorkerDiedError`.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import pickle
import threading
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterator

from converter.errors import ConverterError, WorkerDiedError
from converter.kernels.blas import blas_threads
from converter.kernels.compiled import settle
from converter.kernels.threads import forget_pool, shutdown_pool
from converter.runtime import limit_blas_threads, mark_worker_process
from converter.write.background import drain_process, pause_threads

__all__ = ["run_tasks", "task_result", "task_count", "collect_results", "Deferred", "RemoteTraceback", "WorkerError",
           "deliver_results", "pack_error", "unpack_error",
           "prepare_fork"]


class RemoteTraceback(Exception):
    """The traceback text of an exception raised in a worker process (set as its ``__cause__``)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return self.tb


class WorkerError(RuntimeError):
    """A worker's exception that could not be pickled: its type name, message and traceback text.

    Attributes
    ----------
    type_name : str
        ``module.qualname`` of the original exception.
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"worker failed: {type_name}: {message}")
        self.type_name = type_name


# --------------------------------------------------------------------------------------------- results

#: Results reported by the task running in this thread (None outside a task).
_SINK: contextvars.ContextVar[dict | None] = contextvars.ContextVar("qckpt_task_sink", default=None)
#: The caller's open :func:`collect_results` blocks, innermost last.
_COLLECTORS: contextvars.ContextVar[tuple[dict, ...]] = contextvars.ContextVar("qckpt_collectors", default=())


class Deferred:
    """``fn(*args)`` running on its own (daemon) thread from construction, in a copy of the caller's
    :mod:`contextvars` context (the run options in force); :meth:`result` waits for it.

    For work that releases the GIL (numpy, CRC-32) and may overlap what the task does next.
    A task's :class:`Deferred` results are waited for before the task returns (:func:`task_result`).
    """

    __slots__ = ("_thread", "_value", "_error")

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._run, fn, args), name="qckpt-deferred",
                                        daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            self._value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - raised by result(), in the task's thread
            self._error = exc

    def result(self) -> Any:
        """The value (waits for the thread); its exception re-raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def _resolve(value: Any) -> Any:
    """``value`` with its :class:`Deferred` parts (itself, or items of a tuple) replaced by their results."""
    if isinstance(value, Deferred):
        return value.result()
    if isinstance(value, tuple) and any(isinstance(v, Deferred) for v in value):
        return tuple(v.result() if isinstance(v, Deferred) else v for v in value)
    return value


def _resolve_all(results: dict) -> dict:
    """Every value resolved (:func:`_resolve`), each waited for even when an earlier one failed (no
    thread outlives its task); the first exception raised after."""
    error = None
    for key, value in results.items():
        try:
            results[key] = _resolve(value)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            error = error or exc
    if error is not None:
        raise error
    return results


def task_result(kind: str, name: str, value: Any) -> None:
    """Report ``value`` (picklable) as the result ``(kind, name)`` of the running task.

    Inside a task (inline or in a worker process) it joins the task's results, which come back
    with the task's return value; outside one it is delivered at once. Either way it ends up in
    every :func:`collect_results` block open in the parent (a later value for the same key wins).
    ``value`` may be a :class:`Deferred`, or a tuple holding some: inside a task it is waited for when
    the task's function returns; outside one, at once.
    """
    sink = _SINK.get()
    if sink is not None:
        sink[(kind, name)] = value
    else:
        _deliver(_resolve_all({(kind, name): value}))


def task_count(kind: str, name: str, n: int) -> None:
    """Add ``n`` to the count ``(kind, name)`` of the running task (the row blocks of one tensor, each reporting
    its own, add up), delivered as :func:`task_result` delivers; outside a task, ``n`` is delivered at once."""
    sink = _SINK.get()
    if sink is not None:
        sink[(kind, name)] = sink.get((kind, name), 0) + int(n)
    else:
        task_result(kind, name, int(n))


def _deliver(results: dict) -> None:
    for got in _COLLECTORS.get():
        got.update(results)


@contextlib.contextmanager
def collect_results() -> Iterator[dict[tuple[str, str], Any]]:
    """Collect the :func:`task_result`\\ s of the tasks run inside the block.

    Yields
    ------
    dict of (kind, name) -> value
        Filled in the parent as tasks complete (in completion order; a key keeps the position of
        its first value).
    """
    got: dict[tuple[str, str], Any] = {}
    token = _COLLECTORS.set(_COLLECTORS.get() + (got,))
    try:
        yield got
    finally:
        _COLLECTORS.reset(token)


def _call(fn: Callable[[int], Any], i: int) -> tuple[Any, dict]:
    """``fn(i)`` with its own result sink: returns ``(return value, reported results)``, every
    :class:`Deferred` result waited for (also when ``fn`` raised: its exception wins)."""
    sink: dict = {}
    token = _SINK.set(sink)
    try:
        try:
            res = fn(i)
        except BaseException:
            with contextlib.suppress(BaseException):
                _resolve_all(sink)
            raise
        return res, _resolve_all(sink)
    finally:
        _SINK.reset(token)


# --------------------------------------------------------------------------------------------- errors

def _pack_error(exc: BaseException) -> tuple:
    """A worker's exception in a form that survives pickling with its fields and traceback text."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if isinstance(exc, SystemExit):  # a task's exit must not end the parent silently (Ctrl-C stays itself)
        cls = type(exc)
        return ("other", f"{cls.__module__}.{cls.__qualname__}", str(exc), tb)
    if isinstance(exc, ConverterError):
        return ("converter", type(exc), dict(exc.__dict__), tb)
    try:
        data = pickle.dumps(exc)
        pickle.loads(data)
        return ("pickled", data, tb)
    except Exception:  # noqa: BLE001 - an exception that does not survive the trip
        cls = type(exc)
        return ("other", f"{cls.__module__}.{cls.__qualname__}", str(exc), tb)


def _unpack_error(packed: tuple) -> BaseException:
    """The exception :func:`_pack_error` packed, its ``__cause__`` the remote traceback."""
    kind, tb = packed[0], packed[-1]
    if kind == "converter":
        cls, fields = packed[1], packed[2]
        exc = cls.__new__(cls)
        exc.__dict__.update(fields)
        Exception.__init__(exc, exc.render())
        if isinstance(exc, OSError) and "_errno" in fields:
            exc.errno = fields["_errno"]
    elif kind == "pickled":
        exc = pickle.loads(packed[1])
    else:
        exc = WorkerError(packed[1], packed[2])
    exc.__cause__ = RemoteTraceback(f'\n"""\n{tb}"""')
    return exc


# --------------------------------------------------------------------------------------------- workers

_TASK_FN: Callable[[int], Any] | None = None


def _run_one(i: int) -> tuple[int, bool, Any, dict]:
    """In a worker: task ``i``; its writes are in the file before the parent hears it is done."""
    try:
        res, results = _call(_TASK_FN, i)  # type: ignore[arg-type]
        drain_process()
        return i, True, res, results
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        return i, False, _pack_error(exc), {}


def _worker_init() -> None:
    """In each worker process: one BLAS thread, single-threaded kernels (the processes share the cores)."""
    limit_blas_threads(1)
    mark_worker_process()
    forget_pool()


def prepare_fork() -> None:
    """Stop qckpt's threads in this process before it forks: the kernels' pool, the background
    writers' threads (each restarts on demand) and a compiled-kernel warm-up (waited for: the
    workers inherit the loaded kernels). A ``fork`` while they live could leave a lock held
    forever in the child."""
    settle()
    shutdown_pool()
    pause_threads()


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop a pool at once (after a failure): cancel what has not started, end the workers."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
    else:  # (the executor's own process table; a pool.shutdown alone would wait for running tasks)
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(Exception):
                proc.terminate()
    pool.shutdown(wait=True, cancel_futures=True)


def run_tasks(n_tasks: int, fn: Callable[[int], Any], *, workers: int,
              on_result: Callable[[int, Any], None], meanwhile: Callable[[], None] | None = None) -> None:
    """Run ``fn(0) .. fn(n_tasks - 1)``, in ``workers`` forked processes when more than one.

    Parameters
    ----------
    n_tasks : int
    fn : callable(i) -> result
        Runs in the worker (it sees the parent's state as of the fork); its small picklable
        return value is handed to ``on_result(i, result)`` in the parent, in completion order,
        and what it reported with :func:`task_result` to the open :func:`collect_results` blocks.
        Inline and in the workers alike, BLAS runs one thread (:func:`converter.kernels.blas.blas_threads`
        inline, :func:`converter.runtime.limit_blas_threads` in a worker), also for library callers.
    workers : int
    on_result : callable(i, result)
    meanwhile : callable(), optional
        Runs once in the parent while the workers work (after they are forked, so never in a
        worker): I/O-bound housekeeping such as deleting a replaced output overlaps the tasks.
        Inline (one worker) it runs before the first task. Its exception propagates after the
        pool is stopped.

    Raises
    ------
    BaseException
        The first failure, with its type and fields, its cause the worker's traceback text
        (:class:`RemoteTraceback`), after the pool is stopped.
    WorkerDiedError
        A worker process ended without reporting (killed by a signal).
    """
    global _TASK_FN
    workers = max(1, min(int(workers), n_tasks))
    if workers == 1 or n_tasks <= 1 or not hasattr(os, "fork"):
        if meanwhile is not None:
            meanwhile()
        with blas_threads(1):  # as in a worker (and under qckpt): the kernels' threads share the cores
            for i in range(n_tasks):
                res, results = _call(fn, i)
                _deliver(results)
                on_result(i, res)
        return
    import multiprocessing as mp
    prepare_fork()
    _TASK_FN = fn
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"), initializer=_worker_init)
    try:
        futures = [pool.submit(_run_one, i) for i in range(n_tasks)]  # (the workers fork at the first)
        if meanwhile is not None:
            meanwhile()  # results queue up in the meantime
        for fut in as_completed(futures):
            try:
                i, ok, res, results = fut.result()
            except BrokenProcessPool as exc:
                raise WorkerDiedError("a worker process died before finishing its task", field="--workers",
                                      hint="it was probably killed for memory: retry with --workers 1 or a smaller"
                                           " --max-memory") from exc
            if not ok:
                raise _unpack_error(res)
            _deliver(results)
            on_result(i, res)
    except BaseException:
        _stop(pool)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        _TASK_FN = None


# --------------------------------------------------------------------------------------------- other engines

def deliver_results(results: dict) -> None:
    """Hand results a task reported elsewhere (a distributed engine's task, :mod:`converter.distributed`)
    to the :func:`collect_results` blocks open here, as :func:`run_tasks` does with a worker's."""
    _deliver(results)


def pack_error(exc: BaseException) -> tuple:
    """A task's exception as a picklable value that keeps its class and fields (see :func:`unpack_error`)."""
    return _pack_error(exc)


def unpack_error(packed: tuple) -> BaseException:
    """The exception :func:`pack_error` packed, its ``__cause__`` the remote traceback text."""
    return _unpack_error(packed)
