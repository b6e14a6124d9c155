"""What runs on a worker node: one output shard per task, and its read-back proof.

A write task gets a :class:`TaskSpec`: the command (a module-level function and its arguments, with
the staging directory as destination), the run options and its shard number. It runs the command
itself, on this node, under a run option (:class:`WorkerJob`) that makes
:func:`converter.write.files.write_model_dir` write only this task's shard: planning is the command's
own, from the source's headers, which the node opens on the shared filesystem; the shard, pre-created
by the coordinator, is opened without ``O_CREAT``, filled at its planned offsets by this node's own
process pool and fsynced. The command then stops (:class:`ShardWritten`): what the encoders reported
(:func:`converter.write.engine.task_result`: quantize / requantize rows) goes back with the shard's
digests and the node's facts.

A qckpt error (any exception but an ``OSError``) comes back as a value, its class and fields kept
(:func:`converter.write.engine.pack_error`), and is not retried; an ``OSError`` is raised, for the
engine to retry. Every attempt leaves a marker in the staging's control directory (the retry count).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import resource
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from converter.errors import ConverterError, EngineError, FormatError
from converter.runtime import run_options
from converter.write.engine import collect_results, deliver_results, pack_error
from converter.write.files import shard_file_names, write_plans
from converter.write.staged import StagedShardWriter, shard_digests

__all__ = ["TaskSpec", "ShardWritten", "ShardProven", "WorkerJob", "write_task", "rows_task", "proof_task",
           "qckpt_version", "node_name"]


@lru_cache(maxsize=1)
def qckpt_version() -> str:
    """This node's qckpt: the installed distribution's version and a SHA-256 of the ``converter``
    package's Python sources (two checkouts of one version that differ are told apart)."""
    try:
        from importlib.metadata import version
        ver = version("qckpt")
    except Exception:  # noqa: BLE001 - run from a checkout without an install
        ver = "unknown"
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return f"{ver}+{digest.hexdigest()[:16]}"


def node_name() -> str:
    """This worker's node: the engine's node id where one is known (Ray node, Dask worker address),
    with the host name."""
    host = socket.gethostname()
    if "ray" in sys.modules:
        try:
            import ray
            if ray.is_initialized():
                return f"{host}/ray:{ray.get_runtime_context().get_node_id()[:12]}"
        except Exception:  # noqa: BLE001, S110 - not inside a Ray worker
            pass
    if "distributed" in sys.modules:
        try:
            from distributed import get_worker
            return f"{host}/dask:{get_worker().address}"
        except Exception:  # noqa: BLE001, S110 - not inside a Dask worker
            pass
    return f"{host}/pid:{os.getpid()}"


@dataclass(frozen=True)
class TaskSpec:
    """One task of a distributed write (small and picklable: no tensor data).

    Attributes
    ----------
    fn, args, kwargs
        The command, called as ``fn(*args, **kwargs)`` (its destination the staging directory).
    options : dict
        The coordinator's run options (``workers``, ``max_memory``, ``max_shard_size``, ``kernels``; the user's
        ``engine_words`` and ``overwrite_given``, which a refusal's suggested command line repeats).
    shard : int
        This task's shard (0-based).
    staging, ctl : str
        The staging directory and its control directory (attempt markers).
    shard_file : str
        The shard's file name in the staging directory, as the coordinator planned it.
    mode : str
        ``write`` (fill the shard) or ``rows`` (the command's own read-back proof of the source tensors
        this shard holds, on the complete staging directory: :func:`rows_task`).
    summary : dict, optional
        With ``rows``: the write's summary on the coordinator (tied head, renames), which the command's
        proof needs; the node does not write again.
    results : dict, optional
        With ``rows``: what the write tasks' encoders reported (:func:`converter.write.engine.task_result`),
        delivered to the command again on the node (requantize's digests, which its read-back checks).
    version : str
        The coordinator's :func:`qckpt_version`: a node running another refuses the task.
    hooks : dict
        Test-only fault injection (``QCKPT_TEST_ENGINE_*``), read on the coordinator.
    """

    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
    options: dict
    shard: int
    staging: str
    ctl: str
    version: str
    shard_file: str = ""
    hooks: dict = field(default_factory=dict)
    mode: str = "write"
    summary: dict | None = None
    results: dict | None = None


class ShardWritten(Exception):  # noqa: N818 - a signal that the task's work is done, not an error
    """Raised by :class:`WorkerJob` once its shard is written: stops the command there."""

    def __init__(self, digests: dict) -> None:
        super().__init__("shard written")
        self.digests = digests


class ShardProven(Exception):  # noqa: N818 - a signal, not an error
    """Raised by :class:`WorkerJob` once its shard's proof rows are computed: stops the command there."""

    def __init__(self, rows: dict) -> None:
        super().__init__("shard proven")
        self.rows = rows


class WorkerJob:
    """The ``shard_job`` run option on a worker: :meth:`write_model_dir` writes one shard and stops
    (``write``), or returns the coordinator's summary so that the command goes on to its proof, where
    :meth:`prove_rows` proves this shard's source tensors and stops (``rows``)."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self._mine: set[str] = set()
        self._planned: set[str] = set()

    def proves(self, name: str) -> bool:
        """Source tensor ``name`` is proven by this task: its plan is in this shard, or it is in no shard
        (a tied head, a dropped tensor) and this is the first shard."""
        return name in self._mine or (self.spec.shard == 0 and name not in self._planned)

    def prove_rows(self, names: list[str], prove) -> list:
        """The command's read-back proof (``prove(names) -> one value per name``), on this shard's names:
        stops the command with them (:class:`ShardProven`)."""
        if self.spec.mode != "rows":
            raise EngineError("a write task reached the proof", field="--engine", expected="rows", found=self.spec.mode)
        subset = [n for n in names if self.proves(n)]
        raise ShardProven(dict(zip(subset, prove(subset))))

    def write_model_dir(self, dst: Path, shards, ckpt, *, metadata, **_: Any) -> dict:
        spec = self.spec
        names = shard_file_names(shards)
        if not 0 <= spec.shard < len(shards) or names[spec.shard] != spec.shard_file:
            raise EngineError("the worker planned other shards than the coordinator", file=dst, field="shards",
                              expected=spec.shard_file, found=f"{len(shards)} shards")
        self._mine = {p.source for p in shards[spec.shard]}
        self._planned = {p.source for shard in shards for p in shard}
        if spec.mode == "rows":  # the staging is complete: the encoders' results as the coordinator got them
            deliver_results(spec.results or {})
            return dict(spec.summary or {})
        path = Path(dst) / names[spec.shard]
        _test_kill(spec, path)
        write_plans(path, shards[spec.shard], ckpt, metadata, open_writer=StagedShardWriter)
        digests = shard_digests(path)
        if spec.hooks.get("corrupt") == spec.shard:  # test-only: a byte lost after the writer read it back
            _flip_last_byte(path)
        raise ShardWritten(digests)


def _flip_last_byte(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([b[0] ^ 0xFF]))


def _first(spec: TaskSpec, marker: str) -> bool:
    """True once per staging directory for ``marker`` (test hooks: the first attempt only)."""
    try:
        fd = os.open(Path(spec.ctl) / f"{marker}-{spec.shard}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _test_kill(spec: TaskSpec, path: Path) -> None:
    """Test-only: the first attempt of shard ``hooks["kill"]`` (every attempt of ``hooks["kill_always"]``)
    scribbles over its data and SIGKILLs its own worker process (a node lost mid-task); the marker file
    makes the retry run normally. ``hooks["oserror"]``: the first attempt raises an ``OSError``."""
    if spec.hooks.get("oserror") == spec.shard and _first(spec, "oserror"):
        raise OSError(5, "injected I/O error (QCKPT_TEST_ENGINE_OSERROR)", str(path))
    always = spec.hooks.get("kill_always") == spec.shard
    if spec.hooks.get("kill") != spec.shard and not always:
        return
    if not always and not _first(spec, "killed"):
        return
    with open(path, "r+b") as fh:
        fh.seek(-16, os.SEEK_END)
        fh.write(b"\xa5" * 16)
    os.kill(os.getpid(), signal.SIGKILL)


def _facts(t0: float) -> dict:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"node": node_name(), "pid": os.getpid(), "seconds": time.perf_counter() - t0,
            "peak_rss_bytes": int(max(own, children))}


def _attempt(spec: TaskSpec, kind: str) -> None:
    (Path(spec.ctl) / "attempts" / f"{spec.shard}-{kind}-{secrets.token_hex(4)}").touch()


def _run_command(spec: TaskSpec) -> tuple:
    t0 = time.perf_counter()
    try:
        _attempt(spec, spec.mode)
        if qckpt_version() != spec.version:
            raise EngineError("a node runs another qckpt", field="version", expected=spec.version,
                              found=f"{qckpt_version()} on {node_name()}",
                              hint="install the same qckpt on every node of the cluster")
        if spec.hooks.get("fail") == spec.shard and spec.mode == "write":  # test-only: a qckpt error in one task
            raise FormatError("injected failure (QCKPT_TEST_ENGINE_FAIL)", file=spec.staging, tensor="shard",
                              field="test", expected="no failure", found=f"shard {spec.shard}")
        options = dict(spec.options)
        if multiprocessing.current_process().daemon:  # a daemonic worker cannot fork qckpt's pool
            options["workers"] = 1
        with run_options(**options, shard_job=WorkerJob(spec)), collect_results() as got:
            try:
                spec.fn(*spec.args, **spec.kwargs)
            except ShardWritten as done:
                return "ok", dict(got), done.digests, _facts(t0)
            except ShardProven as done:
                return "ok", done.rows, _facts(t0)
        raise EngineError(f"the command finished on the worker without reaching its shard ({spec.mode})",
                          field="--engine", expected="a model directory output", found="no shard written")
    except OSError as exc:
        if isinstance(exc, ConverterError):
            return "error", pack_error(exc), _facts(t0)
        if not Path(spec.staging).is_dir():  # the job failed or was cancelled meanwhile: nothing to retry
            gone = EngineError("the staging directory is gone (the job was cancelled)", file=spec.staging,
                               field="--engine", found=str(exc))
            return "error", pack_error(gone), _facts(t0)
        raise
    except Exception as exc:  # noqa: BLE001 - a qckpt error (or a bug): a value, never retried
        return "error", pack_error(exc), _facts(t0)


def write_task(spec: TaskSpec) -> tuple:
    """Write shard ``spec.shard`` (see the module). Returns ``("ok", results, digests, facts)`` or
    ``("error", packed error, facts)``; raises an ``OSError`` (the engine retries it)."""
    return _run_command(spec)


def rows_task(spec: TaskSpec) -> tuple:
    """The command's own read-back proof of shard ``spec.shard``'s source tensors (``spec.mode`` ``rows``):
    ``("ok", {name: row}, facts)`` or ``("error", packed error, facts)``."""
    return _run_command(spec)


def proof_task(spec: TaskSpec) -> tuple:
    """Read staged shard ``spec.shard`` back on this node: ``("ok", digests, facts)`` or ``("error", ...)``."""
    t0 = time.perf_counter()
    try:
        _attempt(spec, "proof")
        return "ok", shard_digests(Path(spec.staging) / spec.shard_file), _facts(t0)
    except OSError as exc:
        if isinstance(exc, ConverterError):
            return "error", pack_error(exc), _facts(t0)
        if not Path(spec.staging).is_dir():
            gone = EngineError("the staging directory is gone (the job was cancelled)", file=spec.staging,
                               field="--engine", found=str(exc))
            return "error", pack_error(gone), _facts(t0)
        raise
    except Exception as exc:  # noqa: BLE001
        return "error", pack_error(exc), _facts(t0)
