"""The Dask executor (``--engine dask``, extra ``qckpt[dask]``): tasks are ``distributed`` futures.

The scheduler reschedules the task of a worker that dies (``distributed.scheduler.allowed-failures``
times; then ``KilledWorker``); a task that raises (an ``OSError``: qckpt errors come back as values)
runs again up to ``retries`` times. :meth:`DaskExecutor.on_every_node` is ``Client.run``. Without an
address a :class:`distributed.LocalCluster` is started on 127.0.0.1 (``workers`` single-threaded worker
processes, no dashboard) with ``distributed.worker.daemon`` off, so a task may fork qckpt's own pool
inside a worker process; :meth:`close` shuts it down.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import dask
from distributed import Client, LocalCluster, as_completed
from distributed.scheduler import KilledWorker

from converter.distributed.executor import DEFAULT_RETRIES
from converter.errors import EngineError

__all__ = ["DaskExecutor"]


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
        try:
            for fut in as_completed(futures):
                try:
                    result = fut.result()
                except KilledWorker as exc:
                    raise EngineError("a task's worker died more times than the retries allow", field="--engine",
                                      found=str(exc)[:300]) from exc
                except OSError as exc:
                    raise EngineError(f"a task failed after {retries} retries: {exc}", field="--engine",
                                      found=type(exc).__name__) from exc
                yield index[fut.key], result
        finally:
            self._client.cancel([f for f in futures if not f.done()], force=True)

    def close(self) -> None:
        self._client.close()
        if self._cluster is not None:
            self._cluster.close()
