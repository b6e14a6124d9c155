"""The task runner (converter.write.engine): worker errors keep their type and traceback, no fork
while a qckpt thread lives, and results come back explicitly (same report for 1 or 2 workers)."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
from click.testing import CliRunner

from converter import exit_codes
from converter.cli import main
from converter.errors import QuantizationError, WorkerDiedError
from converter.kernels import threads as kthreads
from converter.runtime import current, run_options
from converter.write.background import BackgroundWriter
from converter.write.engine import RemoteTraceback, WorkerError, collect_results, run_tasks, task_result
from tests.conftest import SAMPLES


class _Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.handle = threading.Lock()  # a lock cannot be pickled

    def __reduce__(self):
        raise TypeError("not picklable")


def _raise_value_error_in_task(i: int) -> int:
    if i == 2:
        raise ValueError(f"bad value in task {i}")
    return i


@pytest.mark.parametrize("workers", [1, 2])
def test_a_value_error_arrives_as_value_error_with_the_remote_traceback(workers):
    with pytest.raises(ValueError, match="bad value in task 2") as ei:
        run_tasks(4, _raise_value_error_in_task, workers=workers, on_result=lambda i, r: None)
    if workers > 1:
        cause = ei.value.__cause__
        assert isinstance(cause, RemoteTraceback)
        assert "_raise_value_error_in_task" in cause.tb and "ValueError: bad value in task 2" in cause.tb
        assert "Traceback (most recent call last)" in str(cause)


def test_a_converter_error_keeps_its_fields_and_the_remote_traceback():
    def boom(i):
        if i == 1:
            raise QuantizationError("bad scale", tensor="t1", field="scales", expected=1, found=2)
        return i
    with pytest.raises(QuantizationError) as ei:
        run_tasks(3, boom, workers=2, on_result=lambda i, r: None)
    assert (ei.value.tensor, ei.value.field, ei.value.expected, ei.value.found) == ("t1", "scales", 1, 2)
    assert isinstance(ei.value.__cause__, RemoteTraceback) and "in boom" in ei.value.__cause__.tb


def test_an_unpicklable_worker_error_names_its_type():
    def boom(i):
        raise _Unpicklable("cannot travel")
    with pytest.raises(WorkerError, match="_Unpicklable: cannot travel") as ei:
        run_tasks(2, boom, workers=2, on_result=lambda i, r: None)
    assert ei.value.type_name.endswith("_Unpicklable")
    assert isinstance(ei.value.__cause__, RemoteTraceback) and "cannot travel" in ei.value.__cause__.tb


def test_the_pool_is_usable_after_a_failure():
    with pytest.raises(ValueError):
        run_tasks(4, _raise_value_error_in_task, workers=2, on_result=lambda i, r: None)
    got = {}
    run_tasks(4, lambda i: i * 10, workers=2, on_result=got.__setitem__)
    assert got == {0: 0, 1: 10, 2: 20, 3: 30}


_AT_FORK: list[list[str]] | None = None


def _record_threads() -> None:
    """The qckpt threads (all named ``qckpt-*``) alive at a fork. Other libraries' threads are theirs to
    make fork-safe (a Dask client leaves a ``Dask-Offload`` thread behind in this test process)."""
    if _AT_FORK is not None:
        _AT_FORK.append(sorted(t.name for t in threading.enumerate()
                               if t is not threading.main_thread() and t.name.startswith("qckpt")))


os.register_at_fork(before=_record_threads)


def test_no_fork_while_a_kernel_pool_or_a_background_writer_lives(tmp_path):
    """A threaded kernel and a background write leave threads behind; the workers are forked only
    after both are stopped (a fork with a live thread can deadlock the child)."""
    global _AT_FORK
    with run_options(workers=2):
        kthreads.run_rows(lambda a, b: a, rows=4, step=1, threads=2)  # starts the kernel pool
    assert any(t.name.startswith("qckpt-kernel") for t in threading.enumerate())
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    bg = BackgroundWriter(fd, path=tmp_path / "f")
    bg.submit(memoryview(np.arange(16, dtype=np.uint8)), 0)
    bg.drain()
    assert any(t.name == "qckpt-pwrite" for t in threading.enumerate())
    _AT_FORK = []
    try:
        got = {}
        run_tasks(3, lambda i: os.getpid(), workers=2, on_result=got.__setitem__)
    finally:
        forks, _AT_FORK = _AT_FORK, None
    assert forks and all(names == [] for names in forks), forks
    assert len(set(got.values()) - {os.getpid()}) >= 1  # really ran in forked workers
    # both restart on demand afterwards
    bg.submit(memoryview(np.arange(16, dtype=np.uint8)[::-1].copy()), 16)
    bg.close()
    os.close(fd)
    assert (tmp_path / "f").read_bytes() == bytes(range(16)) + bytes(range(15, -1, -1))
    with run_options(workers=2):
        assert kthreads.run_rows(lambda a, b: (a, b), rows=4, step=1, threads=2) == [(0, 2), (2, 4)]


def _report(args, dst):
    r = CliRunner().invoke(main, [*map(str, args), str(dst), "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    doc.pop("destination")
    return doc


def test_quantize_stats_identical_for_one_and_two_workers(tmp_path):
    src = SAMPLES / "minilm_fp16.safetensors"
    docs = [_report(["quantize", src, "--bits", 4, "--group-size", 32, "--workers", w], tmp_path / f"q{w}.safetensors")
            for w in (1, 2)]
    assert docs[0]["tensors"] and docs[0] == docs[1]
    assert (tmp_path / "q1.safetensors").read_bytes() == (tmp_path / "q2.safetensors").read_bytes()


def test_requantize_report_identical_for_one_and_two_workers(tmp_path):
    src = SAMPLES / "ct_pack_w4a16_group128_sym"
    docs = [_report(["convert", src, "--per-channel", "--workers", w], tmp_path / f"r{w}") for w in (1, 2)]
    rows = docs[0]["tensors"]
    assert rows and all(r.get("readback_bit_exact") is True for r in rows)
    assert docs[0] == docs[1]


@pytest.mark.parametrize("workers", [1, 2])
def test_tasks_run_with_one_blas_thread_for_library_callers_too(workers):
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads(i):
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]
    with threadpool_limits(limits=2, user_api="blas"):  # a library caller's default (no qckpt cap)
        outside = blas_threads(0)
        got = {}
        run_tasks(2, blas_threads, workers=workers, on_result=got.__setitem__)
        assert blas_threads(0) == outside  # restored after the run
    assert outside and outside == [2] * len(outside) and all(v == [1] * len(outside) for v in got.values())


def _kill_self_in_task(i: int) -> int:
    if i == 1:
        os.kill(os.getpid(), 9)  # as the kernel's OOM killer would
    return i


def test_a_killed_worker_is_a_typed_error_naming_the_way_out():
    with pytest.raises(WorkerDiedError, match="a worker process died before finishing its task") as ei:
        run_tasks(3, _kill_self_in_task, workers=2, on_result=lambda i, r: None)
    assert ei.value.field == "--workers" and "--workers 1" in ei.value.hint
    assert ei.value.exit_code == exit_codes.UNREADABLE


def _exit_in_task(i: int) -> int:
    if i == 0:
        raise SystemExit(3)
    return i


def test_a_system_exit_in_a_task_does_not_end_the_parent():
    with pytest.raises(WorkerError, match="SystemExit: 3"):
        run_tasks(2, _exit_in_task, workers=2, on_result=lambda i, r: None)


def test_results_reported_from_a_kernel_row_thread_reach_the_collector():
    """A result reported inside a row range (the kernels' thread pool) joins the running task's
    results, as one reported from the task's own thread does (the ranges run in the caller's context)."""
    def task(i: int) -> int:
        def rows(a: int, b: int) -> None:
            task_result("rows", f"{i}:{a}", b - a)
        kthreads.run_rows(rows, 8, 2, 4)  # 4 ranges: 3 of them on the pool's threads
        return i
    with run_options(workers=4), collect_results() as got:
        run_tasks(2, task, workers=1, on_result=lambda i, r: None)
    assert got == {("rows", f"{i}:{a}"): 2 for i in range(2) for a in (0, 2, 4, 6)}


def test_run_options_reach_the_kernel_row_threads():
    seen = []
    with run_options(workers=3, max_memory="64M", quiet=False):
        kthreads.run_rows(lambda a, b: seen.append(current()), 6, 2, 3)
    assert len(seen) == 3 and all((o.workers, o.max_memory, o.quiet) == (3, 64 * 2**20, False) for o in seen)


# -- deferred results (a digest computed on its own thread while the task goes on) ------------------

def _deferred_task(i: int) -> int:
    """Reports a result computed on another thread, which finishes only after the task's function returned."""
    from converter.write.engine import Deferred
    release = threading.Event()

    def slow(k: int) -> tuple[int, int]:
        release.wait(5)
        return k, threading.get_ident()
    task_result("deferred", str(i), ("row", Deferred(slow, i * 10)))
    release.set()
    return i


@pytest.mark.parametrize("workers", [1, 2])
def test_deferred_results_are_waited_for_and_delivered_resolved(workers):
    done = {}
    with collect_results() as got:
        run_tasks(4, _deferred_task, workers=workers, on_result=lambda i, r: done.setdefault(i, r))
    assert done == {0: 0, 1: 1, 2: 2, 3: 3}
    assert sorted(got) == [("deferred", str(i)) for i in range(4)]
    for i in range(4):
        row, (value, ident) = got[("deferred", str(i))]
        assert row == "row" and value == 10 * i
        assert ident != threading.get_ident()  # computed on another thread
    assert not [t for t in threading.enumerate() if t.name == "qckpt-deferred"]  # none outlives its task


def _failing_deferred_task(i: int) -> int:
    from converter.write.engine import Deferred

    def fail() -> None:
        raise QuantizationError("deferred digest failed", tensor=f"t{i}")
    task_result("deferred", str(i), Deferred(fail))
    return i


@pytest.mark.parametrize("workers", [1, 2])
def test_a_deferred_result_that_fails_fails_its_task(workers):
    with pytest.raises(QuantizationError) as info, collect_results():
        run_tasks(3, _failing_deferred_task, workers=workers, on_result=lambda i, r: None)
    assert info.value.tensor in {"t0", "t1", "t2"}


def test_a_deferred_result_outside_a_task_is_delivered_at_once():
    from converter.write.engine import Deferred
    with collect_results() as got:
        task_result("deferred", "x", Deferred(lambda: 7))
    assert got == {("deferred", "x"): 7}


def test_a_deferred_result_sees_the_run_options_in_force():
    from converter.write.engine import Deferred
    with run_options(workers=3, max_memory="123M"):
        d = Deferred(lambda: (current().n_workers, current().max_memory))
    assert d.result() == (3, 123 * 2**20)
