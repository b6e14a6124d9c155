"""The executor interface a distributed write runs on: run a function on every node, map a function over
task specs with bounded retries of system failures, close.

Two implementations, each an optional extra imported only when asked for: :mod:`.ray_engine`
(``pip install 'qckpt[ray]'``) and :mod:`.dask_engine` (``pip install 'qckpt[dask]'``). The local
process pool (:func:`converter.write.engine.run_tasks`) stays the default engine and is not one of
these: ``--engine local`` never reaches this module.

What crosses the engine is small: a task spec (command, paths, options, shard number) out, a
result (report rows, digests, node facts, or a packed qckpt error) back. Tensor bytes never do:
workers open the source shards and the staged output on the shared filesystem themselves.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Protocol, Sequence

from converter.errors import EngineError, MissingExtraError

__all__ = ["Executor", "ENGINES", "open_executor", "DEFAULT_RETRIES"]

#: Engine names of ``--engine`` (``local``: the process pool, no executor).
ENGINES = ("local", "ray", "dask")
#: Times a task lost to a system failure (its worker died, an ``OSError``) is run again.
DEFAULT_RETRIES = 2


class Executor(Protocol):
    """A connected engine.

    Attributes
    ----------
    name : str
        ``ray`` or ``dask``.
    address : str
        Where the cluster is (``local``: a cluster this process started on 127.0.0.1).
    """

    name: str
    address: str

    def on_every_node(self, fn: Callable[[], Any]) -> dict[str, Any]:
        """``fn()`` once on every node (worker) of the cluster: node name -> result."""

    def map(self, fn: Callable[[Any], Any], specs: Sequence[Any], *, retries: int) -> Iterator[tuple[int, Any]]:
        """``fn(spec)`` for every spec, one task each, yielding ``(index, result)`` in completion order.

        A task whose worker dies, or that raises (a task returns qckpt errors as values, so what it
        raises is a system failure), runs again up to ``retries`` times; then :class:`EngineError`.
        Closing the iterator early cancels the tasks not finished."""

    def close(self) -> None:
        """Disconnect; a cluster this executor started is shut down and leaves no process."""


def open_executor(name: str, address: str | None, *, workers: int) -> Executor:
    """Connect to (``address``: ``auto`` or ``HOST:PORT``) or start (``None``: ``workers`` worker slots
    on 127.0.0.1) a ``name`` cluster.

    Raises
    ------
    EngineError
        An unknown engine, or the cluster cannot be reached.
    MissingExtraError
        The engine's extra is not installed (a usage error, exit 2, as for every missing extra).
    """
    if name not in ("ray", "dask"):
        raise EngineError("unknown engine", field="--engine", expected=" | ".join(ENGINES), found=name)
    try:
        if name == "ray":
            from converter.distributed.ray_engine import RayExecutor as cls
        else:
            from converter.distributed.dask_engine import DaskExecutor as cls  # type: ignore[assignment]
    except ImportError as exc:
        raise MissingExtraError(f"--engine {name} needs its extra: {exc}", field="--engine", found=name,
                                hint=f"pip install 'qckpt[{name}]'") from None
    try:
        return cls(address, workers=workers)
    except EngineError:
        raise
    except Exception as exc:  # noqa: BLE001 - the engine's own connection errors, named
        raise EngineError(f"cannot start or reach the {name} cluster: {type(exc).__name__}: {exc}",
                          field="--address", found=address or "a local cluster") from exc
