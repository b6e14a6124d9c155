"""The Dask executor (``--engine dask``, extra ``qckpt[dask]``): tasks are ``distributed`` futures.

The scheduler reschedules the task of a worker that dies (``distributed.scheduler.allowed-failures``
times; then ``KilledWorker``); a task that raises (an ``OSError``: qckpt errors come back as values)
runs again up to ``retries`` times. :meth:`DaskExecutor.on_every_node` is ``Client.run``. Without an
address a :class:`distributed.LocalCluster` is started on 127.0.0.1 (``workers`` single-threaded worker
processes, no dashboard) with ``distributed.worker.daemon`` off, so a task may fork qckpt's own pool
inside a worker process; :meth:`close` shuts it down.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Sequence

import dask
from distributed import Client, LocalCluster, wait
from distributed.scheduler import KilledWorker

from converter.distributed.executor import DEFAULT_RETRIES
from converter.errors import EngineError

__all__ = ["DaskExecutor"]

#: Seconds between checks of the pending tasks (results are taken as they complete).
POLL_SECONDS = 1.0
#: A local cluster with no worker for this long ends the job (EngineError; the staging is removed).
NO_WORKERS_SECONDS = 10.0


class DaskExecutor:
    """See :class:`converter.distributed.executor.Executor`."""

    name = "dask"

    def __init__(self, address: str | None, *, workers: int) -> None:
        self._cluster = None
        with dask.config.set({"distributed.worker.daemon": False,
                              "distributed.scheduler.allowed-failures": DEFAULT_RETRIES}):
            if address is None:
                self._cluster = LocalCluster(n_workers=max(1, int(workers)), threads_per_worker=1, processes=True,
                                             host="127.0.0.1", dashboard_address=None, silence_logs=50)
                self._client = Client(self._cluster)
                self.address = "local"
            else:
                self._client = Client(None if address == "auto" else address)
                self.address = address

    def on_every_node(self, fn: Callable[[], Any]) -> dict[str, Any]:
        return dict(self._client.run(fn))

    def map(self, fn: Callable[[Any], Any], specs: Sequence[Any], *, retries: int) -> Iterator[tuple[int, Any]]:
        futures = self._client.map(fn, list(specs), retries=int(retries), pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        pending, idle_since = set(futures), None
        try:
            while pending:
                # polled, not a blocking as_completed: a local cluster whose workers are all gone (Ctrl-C reaches
                # the worker processes too) would otherwise be waited for forever
                try:
                    done, pending = wait(pending, timeout=POLL_SECONDS, return_when="FIRST_COMPLETED")
                except TimeoutError:  # (distributed.wait raises when nothing completed in time)
                    done = set()
                for fut in done:
                    yield index[fut.key], self._result(fut, retries)
                if done or self._cluster is None or self._client.scheduler_info().get("workers"):
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > NO_WORKERS_SECONDS:
                    raise EngineError("the local Dask cluster has no worker left (stopped or interrupted)",
                                      field="--engine", expected="a running worker", found="none")
        finally:
            self._client.cancel([f for f in futures if not f.done()], force=True)

    @staticmethod
    def _result(fut, retries: int) -> Any:
        try:
            return fut.result()
        except KilledWorker as exc:
            raise EngineError("a task's worker died more times than the retries allow", field="--engine",
                              found=str(exc)[:300]) from exc
        except OSError as exc:
            raise EngineError(f"a task failed after {retries} retries: {exc}", field="--engine",
                              found=type(exc).__name__) from exc

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()
