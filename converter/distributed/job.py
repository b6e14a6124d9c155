"""The coordinator of a distributed write: plan, stage, dispatch one task per shard, prove, commit.

:func:`run_command` runs the command (``convert`` / ``quantize`` / ``dequantize``) on this machine
with the staging directory as its destination and :class:`CoordinatorJob` as the ``shard_job`` run
option. The command plans from the source's headers as it always does; when it reaches
:func:`converter.write.files.write_model_dir`, the job

1. pre-creates every shard in the staging directory with its planned header at its final size
   (:func:`converter.write.staged.precreate_shard`) and writes the index, ``config.json`` and the
   other side files;
2. runs one write task per shard on the engine (:func:`converter.distributed.task.write_task`): the
   node plans again from the headers, fills its shard in place and returns what its encoders
   reported, which is delivered to the command's result blocks exactly as the local pool's tasks'
   results are, so the report rows are the local run's;
3. runs one proof task per shard (:func:`converter.distributed.task.proof_task`): the staged shard read
   back on a node must hold the header and tensor bytes the writer read back after its fsync, else
   :class:`~converter.errors.ProofFailedError`.

The command then goes on as on one machine. Its own read-back proof (convert's
:func:`converter.ops.convert.verify_output`, requantize's :func:`converter.ops.requantize_model.verify_readback`)
asks the job (:meth:`CoordinatorJob.prove_rows`), which runs one more task per shard: the node runs the
command again up to its proof (the encoders' results handed back to it, nothing encoded again) and proves
the source tensors of its shard against the staged directory; the values merged in the command's order
are the local run's. Only when the command
returns is the staging directory renamed onto the destination and the parent fsynced; any failure (a
task's qckpt error, a lost task past its retries, a failed proof, Ctrl-C) cancels the tasks left and
removes the staging directory.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from converter.distributed.executor import DEFAULT_RETRIES, Executor, open_executor
from converter.distributed.staging import Staging
from converter.distributed.task import TaskSpec, proof_task, qckpt_version, rows_task, write_task
from converter.errors import ConverterError, EngineError, ProofFailedError
from converter.runtime import current, run_options
from converter.write import atomic
from converter.write.engine import deliver_results, unpack_error
from converter.write.files import INDEX_NAME, dir_summary, dump_json, shard_file_names, shard_index, write_side_files
from converter.write.progress import Progress
from converter.write.staged import precreate_shard

__all__ = ["CoordinatorJob", "run_command", "test_hooks"]


def test_hooks() -> dict:
    """Test-only fault injection, read from the coordinator's environment and sent with every task:
    ``QCKPT_TEST_ENGINE_KILL=k`` (shard ``k``'s first attempt kills its worker mid-write),
    ``QCKPT_TEST_ENGINE_FAIL=k`` (shard ``k`` raises a qckpt error), ``QCKPT_TEST_ENGINE_CORRUPT=k``
    (shard ``k`` loses a byte after its writer read it back: the proof fails), ``QCKPT_TEST_ENGINE_KILL_ALWAYS=k``
    (every attempt of shard ``k`` is killed: the retries run out), ``QCKPT_TEST_ENGINE_OSERROR=k`` (shard ``k``'s
    first attempt raises an ``OSError``: retried)."""
    hooks = {}
    for key in ("kill", "fail", "corrupt", "kill_always", "oserror"):
        value = os.environ.get(f"QCKPT_TEST_ENGINE_{key.upper()}")
        if value is not None and value.strip().isdigit():
            hooks[key] = int(value)
    return hooks


class CoordinatorJob:
    """The ``shard_job`` run option on the coordinator (see the module); collects the engine's facts."""

    def __init__(self, executor: Executor, staging: Staging, fn: Callable[..., Any], args: tuple, kwargs: dict,
                 options: dict, *, retries: int = DEFAULT_RETRIES) -> None:
        self.executor, self.staging = executor, staging
        self.fn, self.args, self.kwargs, self.options = fn, args, kwargs, options
        self.retries = retries
        self.used = False
        self.attempts: dict[int, int] = {}
        self.facts: list[tuple[str, int, dict]] = []
        self.seconds: dict[str, float] = {}
        self.specs: list[TaskSpec] = []
        self.summary: dict = {}
        self.results: dict = {}

    def _run(self, kind: str, fn: Callable[[TaskSpec], tuple], specs: list[TaskSpec], on_ok) -> None:
        t0 = time.perf_counter()
        with contextlib.closing(self.executor.map(fn, specs, retries=self.retries)) as results:
            for i, res in results:
                self.facts.append((kind, i, res[-1]))
                if res[0] != "ok":
                    raise unpack_error(res[1])
                on_ok(i, res)
        self.seconds[kind] = time.perf_counter() - t0

    def write_model_dir(self, dst: Path, shards, ckpt, *, metadata, config, extra_json=None, extra_files=(),
                        tied_head=None) -> dict:
        dst = Path(dst)
        if dst != self.staging.path:
            raise EngineError("the command wrote another directory than the staging one", file=dst,
                              expected=str(self.staging.path), found=str(dst))
        names = shard_file_names(shards)
        t0 = time.perf_counter()
        for fname, shard in zip(names, shards):
            precreate_shard(dst / fname, [o for p in shard for o in p.outputs], metadata)
        written = list(names)
        if len(shards) > 1:
            dump_json(dst / INDEX_NAME, shard_index(shards))
            written.append(INDEX_NAME)
        failed = write_side_files(dst, written, ckpt, config=config, extra_json=extra_json, extra_files=extra_files)
        self.seconds["stage"] = time.perf_counter() - t0
        specs = [TaskSpec(self.fn, self.args, self.kwargs, self.options, k, str(dst), str(self.staging.ctl),
                          qckpt_version(), names[k], test_hooks()) for k in range(len(shards))]
        digests: dict[int, dict] = {}
        sizes = [sum(p.nbytes for p in shard) for shard in shards]
        with Progress("writing", len(shards), sum(sizes)) as progress:
            def written_ok(i: int, res: tuple) -> None:
                deliver_results(res[1])
                self.results.update(res[1])
                digests[i] = res[2]
                progress.advance(1, sizes[i])
            self._run("write", write_task, specs, written_ok)

        def proven(i: int, res: tuple) -> None:
            got, want = res[1], digests[i]
            if got == want:
                return
            bad = sorted(n for n in set(got["tensors"]) | set(want["tensors"])
                         if got["tensors"].get(n) != want["tensors"].get(n))
            first = bad[0] if bad else None
            raise ProofFailedError("the staged shard read back differs from what its writer wrote",
                                   file=dst / names[i], tensor=first, field="bytes" if bad else "header",
                                   expected=f"SHA-256 {want['tensors'].get(first, '')[:16]}" if bad else want["header"],
                                   found=f"SHA-256 {got['tensors'].get(first, '')[:16]}" if bad else got["header"],
                                   hint="nothing was committed; check the shared filesystem and run again")
        self._run("proof", proof_task, specs, proven)
        self.attempts = self.staging.attempts()  # (the control directory goes at the commit)
        self.used = True
        self.specs = specs
        self.summary = dir_summary(written, sum(len(s) for s in shards), ckpt, tied_head, failed)
        return dict(self.summary)

    def prove_rows(self, names: list[str], prove) -> list:
        """The command's read-back proof of ``names`` (convert's rows, requantize's read-back checks), one
        task per shard: each node proves the source tensors its shard holds (``prove`` is the local
        computation, which the nodes run on their subsets)."""
        rows: dict[str, Any] = {}
        specs = [replace(spec, mode="rows", summary=self.summary, results=self.results) for spec in self.specs]
        self._run("rows", rows_task, specs, lambda i, res: rows.update(res[1]))
        self.attempts = self.staging.attempts()
        missing = [n for n in names if n not in rows]
        if missing:
            raise EngineError("a source tensor was proven by no task", tensor=missing[0], field="--engine",
                              expected=f"{len(names)} rows", found=f"{len(names) - len(missing)} rows")
        return [rows[n] for n in names]

    def report(self, *, startup: float, nodes: int, total: float) -> dict:
        """The report's ``engine`` section (``schemas/engine.schema.json``)."""
        attempts = self.attempts
        per_node: dict[str, dict] = {}
        for kind, _, facts in self.facts:
            row = per_node.setdefault(facts["node"], {"node": facts["node"], "write_tasks": 0, "proof_tasks": 0,
                                                      "rows_tasks": 0, "seconds": 0.0, "peak_rss_bytes": 0})
            row[f"{kind}_tasks"] += 1
            row["seconds"] += facts["seconds"]
            row["peak_rss_bytes"] = max(row["peak_rss_bytes"], facts["peak_rss_bytes"])
        n_tasks = len({(k, i) for k, i, _ in self.facts})
        return {"name": self.executor.name, "address": self.executor.address, "nodes": nodes,
                "tasks": len({i for k, i, _ in self.facts if k == "write"}),
                "proof_tasks": len({i for k, i, _ in self.facts if k == "proof"}),
                "rows_tasks": len({i for k, i, _ in self.facts if k == "rows"}),
                "retries": max(0, sum(attempts.values()) - n_tasks),
                "startup_seconds": startup, "seconds": {"total": total, **self.seconds},
                "per_node": sorted(per_node.values(), key=lambda r: r["node"])}


def _retarget_doc(value: Any, staging: str, dst: str) -> Any:
    """``value`` (a report) with every mention of the staging directory rewritten to the destination."""
    if isinstance(value, str):
        return value.replace(staging, dst)
    if isinstance(value, dict):
        return {k: _retarget_doc(v, staging, dst) for k, v in value.items()}
    if isinstance(value, list):
        return [_retarget_doc(v, staging, dst) for v in value]
    return value


def run_command(fn: Callable[..., Any], src: str | os.PathLike, dst: str | os.PathLike, *, engine: str,
                address: str | None = None, overwrite: bool = False, retries: int = DEFAULT_RETRIES,
                **kwargs: Any) -> dict:
    """``fn(src, dst, overwrite=overwrite, **kwargs)`` (a module-level command function returning its
    report) with its model directory written on the ``engine`` cluster, one task per output shard, and
    committed atomically (see the module). ``engine="local"`` (or a ``--dry-run``) calls ``fn`` as is.

    Returns
    -------
    dict
        ``fn``'s report with its ``engine`` section (``schemas/engine.schema.json``).

    Raises
    ------
    ConverterError
        Whatever the command or a task raised, with its class and fields (nothing is left at ``dst``
        or beside it); :class:`~converter.errors.EngineError` when the engine cannot run the job
        (not installed, unreachable, another qckpt on a node, a task lost past its retries);
        :class:`~converter.errors.ProofFailedError` when a staged shard read back differs.
    """
    if engine == "local" or current().dry_run:
        return fn(src, dst, overwrite=overwrite, **kwargs)
    dst = Path(dst)
    if dst.suffix in (".safetensors", ".gguf"):
        raise EngineError(f"--engine {engine} writes a model directory, one output shard per task; {dst.name} is "
                          "one file", file=dst, field="--engine", expected="a directory DST", found=dst.name,
                          hint="give a directory DST, or drop --engine")
    atomic.refuse_existing(dst, overwrite)
    opts = current()
    t0 = time.perf_counter()
    executor = open_executor(engine, address, workers=opts.n_workers)
    startup = time.perf_counter() - t0
    try:
        versions = executor.on_every_node(qckpt_version)
        mine = qckpt_version()
        other = {node: v for node, v in versions.items() if v != mine}
        if other:
            node, version = next(iter(other.items()))
            raise EngineError("a node of the cluster runs another qckpt", field="version", expected=mine,
                              found=f"{version} on {node}", hint="install the same qckpt on every node")
        # a local cluster's worker slots are the parallelism: each task writes its shard inline
        # (the user's --engine / --address and --overwrite, for a refusal's suggested command line: the calls below
        # write the staging directory with overwrite)
        hint = {"engine_words": ("--engine", engine, *(("--address", address) if address else ())),
                "overwrite_given": overwrite}
        options = {"workers": 1 if executor.address == "local" else opts.workers, "max_memory": opts.max_memory,
                   "max_shard_size": opts.max_shard_size, "kernels": opts.kernels, "quiet": True, **hint}
        staging = Staging(dst)
        job = CoordinatorJob(executor, staging, fn, (src, str(staging.path)), {"overwrite": True, **kwargs},
                             options, retries=retries)
        try:
            with run_options(shard_job=job, **hint):
                doc = fn(src, staging.path, overwrite=True, **kwargs)
            if not job.used:
                raise EngineError("the command wrote no model directory through the engine", file=dst,
                                  field="--engine", expected="a model directory output", found="none")
            staging.commit(overwrite)
        except ConverterError as exc:
            staging.remove()
            atomic._retarget(exc, staging.path, dst)
            raise
        except BaseException:
            staging.remove()
            raise
    finally:
        executor.close()
    doc = _retarget_doc(doc, str(staging.path), str(dst))
    doc["engine"] = job.report(startup=startup, nodes=len(versions), total=time.perf_counter() - t0)
    return doc
