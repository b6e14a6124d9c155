"""The Ray executor (``--engine ray``, extra ``qckpt[ray]``): tasks are Ray remote functions.

A lost worker is a system failure Ray retries itself (``max_retries``); a task that raises an
``OSError`` is retried too (``retry_exceptions``); qckpt errors come back as values and are never
retried. :meth:`RayExecutor.on_every_node` pins one task to each alive node
(``NodeAffinitySchedulingStrategy``, not soft). Without an address a local cluster is started on
this machine (``ray.init(num_cpus=workers)``, no dashboard) and shut down by :meth:`close`.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterator, Sequence

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from converter.errors import EngineError

__all__ = ["RayExecutor"]

#: Object store of a local cluster (bytes): only task specs and small results travel.
_LOCAL_OBJECT_STORE = 80 * 2**20


def _call(fn: Callable[[], Any]) -> Any:
    """``fn()`` (a Ray remote function must be a plain function; ``fn`` may be any callable)."""
    return fn()


def _apply(fn: Callable[[Any], Any], spec: Any) -> Any:
    return fn(spec)


class RayExecutor:
    """See :class:`converter.distributed.executor.Executor`."""

    name = "ray"

    def __init__(self, address: str | None, *, workers: int) -> None:
        # the driver prints the raylet's messages ("a worker died ...") to sys.stdout from its own thread:
        # while connected they go to stderr, so stdout stays the command's (one JSON document under --json)
        self._stdout = contextlib.redirect_stdout(sys.stderr)
        self._stdout.__enter__()
        try:
            self._connect(address, workers)
        except BaseException:
            self._stdout.__exit__(None, None, None)
            raise

    def _connect(self, address: str | None, workers: int) -> None:
        self._started = not ray.is_initialized()
        if address is None:
            ray.init(num_cpus=max(1, int(workers)), include_dashboard=False, log_to_driver=False,
                     object_store_memory=_LOCAL_OBJECT_STORE, configure_logging=False, ignore_reinit_error=True)
            self.address = "local"
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False, ignore_reinit_error=True)
            self.address = address

    def on_every_node(self, fn: Callable[[], Any]) -> dict[str, Any]:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        remote = ray.remote(num_cpus=0, max_retries=0)(_call)
        refs = {n["NodeID"]: remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                                            ).remote(fn) for n in nodes}
        return {node: ray.get(ref) for node, ref in refs.items()}

    def map(self, fn: Callable[[Any], Any], specs: Sequence[Any], *, retries: int) -> Iterator[tuple[int, Any]]:
        remote = ray.remote(num_cpus=1, max_retries=int(retries), retry_exceptions=[OSError])(_apply)
        refs = [remote.remote(fn, spec) for spec in specs]
        index = {ref: i for i, ref in enumerate(refs)}
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                try:
                    result = ray.get(done[0])
                except (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                        ray.exceptions.RayTaskError, ray.exceptions.TaskCancelledError) as exc:
                    raise EngineError(f"a task failed after {retries} retries: {type(exc).__name__}",
                                      field="--engine", found=str(exc).splitlines()[0][:300]) from exc
                yield index[done[0]], result
        finally:
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001, S110 - cancelling what may have finished meanwhile
                    pass

    def close(self) -> None:
        try:
            if self._started:
                ray.shutdown()
        finally:
            self._stdout.__exit__(None, None, None)
