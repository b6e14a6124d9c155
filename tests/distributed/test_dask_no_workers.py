"""A local Dask cluster whose workers are all gone (Ctrl-C reaches the worker processes too) ends the job with
EngineError instead of waiting for the pending tasks forever (a new user's interrupted run hung 10 minutes)."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("distributed")

from converter.errors import EngineError  # noqa: E402


def _slow(x):
    import time as t
    t.sleep(60)
    return x


def test_no_worker_left_ends_the_job(monkeypatch):
    from converter.distributed import dask_engine

    monkeypatch.setattr(dask_engine, "NO_WORKERS_SECONDS", 1.0)
    monkeypatch.setattr(dask_engine, "POLL_SECONDS", 0.2)
    ex = dask_engine.DaskExecutor(None, workers=1)
    try:
        results = ex.map(_slow, [1], retries=0)
        stop = threading.Timer(1.0, lambda: ex._cluster.scale(0))  # every worker gone while the task runs
        stop.start()
        t0 = time.monotonic()
        with pytest.raises(EngineError, match="no worker left"):
            next(results)
        assert time.monotonic() - t0 < 30
        stop.join()
    finally:
        ex.close()
