"""Output files: one safetensors file from plans, a model directory (shards with an index), a file
of fixed offsets (GGUF). Every one is a list of tasks for :func:`converter.write.engine.run_tasks`.

Each task loads one source tensor, encodes it (whole, or in row blocks when it is larger than
the per-worker memory budget and its plan allows, :class:`converter.write.plan.RowSplit`) and
writes its bytes at their planned offsets through the background writer; the task returns what
it wrote. The bytes do not depend on the number of workers. Outputs are committed atomically
(:func:`converter.write.atomic.atomic_output`); progress is one :class:`Progress` per output.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from converter.errors import ConverterError, FormatError, UnsupportedError
from converter.runtime import auto_workers, current, drop_pages
from converter import tensor, tensor_rows
from converter.kernels import buffers
from converter.write.atomic import atomic_output
from converter.write.background import DEFAULT_LIMIT, BackgroundWriter
from converter.write.dry_run import DryRunPlanned
from converter.write.engine import run_tasks
from converter.write.plan import TensorPlan, block_rows, shard_plans
from converter.write.progress import Progress
from converter.write.safetensors import SafetensorsWriter

__all__ = ["INDEX_NAME", "write_plans", "write_single_file", "write_model_dir", "write_at_offsets", "shard_name",
           "shard_file_names", "shard_index", "write_side_files", "dir_summary", "dump_json"]

#: The shard index of a sharded model directory (huggingface_hub naming).
INDEX_NAME = "model.safetensors.index.json"


def shard_name(i: int, n: int) -> str:
    """``model-0000i-of-0000N.safetensors`` (1-based ``i``; huggingface_hub naming)."""
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def _completed(w: SafetensorsWriter, plan: TensorPlan) -> list[str]:
    """The outputs of ``plan`` that ``w`` has complete (in this process)."""
    return sorted(name for name, _, _ in plan.outputs if w.complete(name))


def _encode_into(w: SafetensorsWriter, plan: TensorPlan, ckpt, budget: int) -> tuple[list[str], int]:
    """Load, encode and write one plan (whole, or in row blocks).

    Returns
    -------
    written : list of str
        The output arrays of ``plan`` now complete (all of them, unless the encoder left one out:
        then the writer's close names it).
    nbytes : int
        The plan's bytes.
    """
    try:
        spec = ckpt.spec(plan.source) if hasattr(ckpt, "spec") else None
        t = ckpt[plan.source]
        step = block_rows(plan, spec, budget)
        if step is None or not tensor_rows.row_splittable(t):
            arrays = plan.encode(t)
            for name, arr in arrays.items():
                w.write(name, arr)
            return _completed(w, plan), plan.nbytes
        split = plan.row_split
        rows = int(t.shape[0])
        for r0 in range(0, rows, step):
            arrays = plan.encode(tensor_rows.take_rows(t, r0, min(rows, r0 + step)))
            for name, arr in arrays.items():
                if name in split.rows:
                    w.write_rows(name, arr, r0)
                elif name in split.fixed:
                    continue
                elif name in split.once:
                    if r0 == 0:
                        w.write(name, arr)
                else:
                    raise FormatError("row block returned an output its plan does not list", tensor=plan.source,
                                      field=name, expected=list(split.rows) + list(split.once), found=name)
            del arrays
            drop_pages(*tensor.source_arrays(t))
        for name, arr in split.fixed.items():
            w.write(name, arr)
        return _completed(w, plan), plan.nbytes
    except ConverterError as exc:
        exc.with_context(tensor=plan.source)
        raise


#: Bytes in flight to a worker's background writer, at least (:func:`write_plans`).
MIN_IN_FLIGHT = 32 * 2**20
#: A dense tensor at least this large is a copy task spread among the others (:func:`task_order`).
SPREAD_BYTES = 16 * 2**20


def task_order(plans: Sequence[TensorPlan], ckpt) -> list[int]:
    """The order the tasks of ``plans`` run in (the file's layout does not change): large dense
    tensors (passed through: plain copies, bound by the disk and the memory bus) spread evenly
    among the others (decoded, requantized or repacked: bound by the cores), never first, so that
    copies run beside computation instead of all at once (every worker copying while the cores
    idle). Other tasks keep their order."""
    def dense(p: TensorPlan) -> bool:
        spec = ckpt.spec(p.source) if hasattr(ckpt, "spec") else None
        return spec is not None and spec.kind == "dense" and p.nbytes >= SPREAD_BYTES
    copies = [i for i, p in enumerate(plans) if dense(p)]
    taken = set(copies)
    others = [i for i in range(len(plans)) if i not in taken]
    if not copies or not others:
        return list(range(len(plans)))
    order: list[int] = []
    every = len(others) / (len(copies) + 1)  # one copy after each stretch of this many other tasks
    k = 0
    for j, i in enumerate(others):
        order.append(i)
        while k < len(copies) and j + 1 >= every * (k + 1):
            order.append(copies[k])
            k += 1
    return order + copies[k:]


def write_plans(path: Path, plans: Sequence[TensorPlan], ckpt, metadata: Mapping[str, str] | None,
                progress: Progress | None = None, open_writer: Callable[..., SafetensorsWriter] = SafetensorsWriter
                ) -> None:
    """Stream the planned arrays of ``plans`` into one safetensors file at ``path`` (not atomic itself).

    One task per plan, in the worker processes and memory budget in force
    (:func:`converter.runtime.auto_workers`; the default forks a pool only when the work repays
    it). Each task's return value names the arrays it wrote; the parent counts them as written.
    ``open_writer(path, entries, metadata)``: the file's writer (a shard pre-created by a distributed
    write: :class:`converter.write.staged.StagedShardWriter`).
    """
    entries = [o for p in plans for o in p.outputs]
    names = [e[0] for e in entries]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise FormatError("two output arrays share a name", file=path, tensor=dup[0])
    total = sum(p.nbytes for p in plans)
    workers = auto_workers(total, len(plans))
    budget = max(1, current().memory // workers)
    own = progress is None
    if own:
        progress = Progress("writing", len(plans), total)
    try:
        with open_writer(path, entries, metadata) as w:
            # each worker queues its own arrays: together no more than one process would (the codes of about two
            # 7B MLP matrices), so the workers' peak memory does not grow with their number
            w.limit_in_flight(max(MIN_IN_FLIGHT, DEFAULT_LIMIT // workers))

            def done(i: int, res: tuple[list[str], int]) -> None:
                written, nbytes = res
                w.adopt(written)
                progress.advance(1, nbytes)
            order = task_order(plans, ckpt)
            run_tasks(len(plans), lambda i: _encode_into(w, plans[order[i]], ckpt, budget), workers=workers,
                      on_result=done)
    finally:
        buffers.release()  # (the codes slabs of this process: nothing to reuse them for until the next write)
        if own:
            progress.close()


def _test_shard_delay() -> None:
    """Test-only hook: sleep ``$QCKPT_TEST_SHARD_DELAY`` seconds after each shard, so a test can
    kill a multi-shard write mid-way deterministically (tests/io/test_kill.py). Unset: no effect."""
    delay = os.environ.get("QCKPT_TEST_SHARD_DELAY")
    if delay:
        time.sleep(float(delay))


def dump_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as the JSON side files of a model directory are written (indented, sorted keys)."""
    _dump(path, obj)


def _dump(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_model_dir(dst: Path, plans: Sequence[TensorPlan], ckpt, *, metadata: Mapping[str, str] | None,
                    config: Mapping[str, Any] | None, extra_json: Mapping[str, Any] | None = None,
                    extra_files: Sequence[str | Path] = (), max_shard_bytes: int | None = None,
                    overwrite: bool = False, tied_head: Mapping[str, Any] | None = None) -> dict:
    """Write a Hugging Face style model directory atomically.

    ``model.safetensors`` (or :func:`shard_name` shards with :data:`INDEX_NAME`), ``config.json``
    (when given), other JSON files (``extra_json``: file name -> object), copied ``extra_files``
    and the checkpoint's generated ``side_files`` (a GGUF's tokenizer; a copied file of the same
    name wins). ``tied_head``: the tied-embedding decision already applied to ``plans`` and
    ``config`` by the caller (:func:`converter.formats.model_dir.write_model_dir`), reported as is.

    Returns
    -------
    dict with ``files`` (names written), ``tensors`` (count), ``tied_head`` when given, and
    ``side_files_skipped`` (file name -> reason) for the side files the source could not make
    (``metadata["side_files_skipped"]``).
    """
    if max_shard_bytes is None:  # the run's option (qckpt --max-shard-size; default 5 GB, 0: one file)
        max_shard_bytes = current().max_shard_size or None
    shards = shard_plans(plans, max_shard_bytes)
    if current().dry_run:  # the plan, to the byte count of tensor data; nothing created
        names = ["model.safetensors"] if len(shards) == 1 else [shard_name(i, len(shards))
                                                               for i in range(1, len(shards) + 1)]
        raise DryRunPlanned({"files": [{"name": n, "bytes": sum(p.nbytes for p in sh), "tensors": len(sh)}
                                       for n, sh in zip(names, shards)]
                             + ([{"name": INDEX_NAME, "bytes": None, "tensors": 0}] if len(shards) > 1 else []),
                             "config": dict(config) if config is not None else None})
    job = current().shard_job
    if job is not None:  # --engine ray|dask: one task per shard on the cluster (converter.distributed)
        return job.write_model_dir(dst, shards, ckpt, metadata=metadata, config=config, extra_json=extra_json,
                                   extra_files=extra_files, tied_head=tied_head)
    written: list[str] = []
    with atomic_output(dst, overwrite=overwrite, is_dir=True) as tmp, \
            Progress("writing", len(plans), sum(p.nbytes for p in plans)) as progress:
        tmp.mkdir(parents=True, exist_ok=True)
        if len(shards) == 1:
            write_plans(tmp / "model.safetensors", shards[0], ckpt, metadata, progress)
            written.append("model.safetensors")
        else:
            for i, shard in enumerate(shards, 1):
                fname = shard_name(i, len(shards))
                write_plans(tmp / fname, shard, ckpt, metadata, progress)
                written.append(fname)
                _test_shard_delay()
            _dump(tmp / INDEX_NAME, shard_index(shards))
            written.append(INDEX_NAME)
        failed = write_side_files(tmp, written, ckpt, config=config, extra_json=extra_json, extra_files=extra_files)
    return dir_summary(written, len(plans), ckpt, tied_head, failed)


def shard_file_names(shards: Sequence[Sequence[TensorPlan]]) -> list[str]:
    """The file of each shard: ``model.safetensors`` alone, else :func:`shard_name` ``i`` of ``n``."""
    if len(shards) == 1:
        return ["model.safetensors"]
    return [shard_name(i, len(shards)) for i in range(1, len(shards) + 1)]


def shard_index(shards: Sequence[Sequence[TensorPlan]]) -> dict:
    """The :data:`INDEX_NAME` document of a sharded directory: total tensor bytes, output name -> shard file."""
    weight_map: dict[str, str] = {}
    total = 0
    for fname, shard in zip(shard_file_names(shards), shards):
        for p in shard:
            total += p.nbytes
            for o in p.outputs:
                weight_map[o[0]] = fname
    return {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}


def write_side_files(tmp: Path, written: list[str], ckpt, *, config: Mapping[str, Any] | None,
                     extra_json: Mapping[str, Any] | None = None, extra_files: Sequence[str | Path] = ()
                     ) -> dict[str, str]:
    """Write a model directory's files other than the shards and index into ``tmp`` (appending their names
    to ``written``): ``config.json``, ``extra_json``, copied ``extra_files``, the source's generated side
    files. Returns the side files the source could not make (file name -> reason)."""
    if config is not None:
        _dump(tmp / "config.json", config)
        written.append("config.json")
    for fname, obj in (extra_json or {}).items():
        _dump(tmp / fname, obj)
        written.append(fname)
    for f in extra_files:
        f = Path(f)
        if f.name not in written:
            shutil.copyfile(f, tmp / f.name)
            written.append(f.name)
    failed: dict[str, str] = {}
    for fname, make in getattr(ckpt, "side_files", {}).items():
        if fname not in written:
            try:
                data = make()
            except ConverterError as exc:  # a side file the source cannot make: the tensors still go
                failed[fname] = exc.render()
                continue
            (tmp / fname).write_bytes(data)
            written.append(fname)
    return failed


def dir_summary(written: list[str], n_plans: int, ckpt, tied_head: Mapping[str, Any] | None,
                failed: Mapping[str, str]) -> dict:
    """:func:`write_model_dir`'s summary (see there) from the names written and the side files that failed."""
    result: dict[str, Any] = {"files": written, "tensors": n_plans}
    if tied_head is not None:
        result["tied_head"] = tied_head
    skipped = {k: (v if k not in written else f"written without the model's hyperparameters: {v}")
               for k, v in (getattr(ckpt, "metadata", {}) or {}).get("side_files_skipped", {}).items()
               if k not in written or k == "config.json"}
    skipped.update(failed)
    if skipped:
        result["side_files_skipped"] = skipped
    return result


def write_single_file(dst: Path, plans: Sequence[TensorPlan], ckpt, *, metadata: Mapping[str, str] | None,
                      overwrite: bool = False) -> dict:
    """Write one safetensors file atomically."""
    if current().dry_run:
        raise DryRunPlanned({"files": [{"name": Path(dst).name, "bytes": sum(p.nbytes for p in plans),
                                        "tensors": len(plans)}], "config": None})
    if current().shard_job is not None:
        raise UnsupportedError("a distributed engine writes model directories (one task per shard), not one file",
                               file=dst, field="--engine", expected="a directory DST", found=Path(dst).name,
                               hint="give a directory DST, or drop --engine")
    with atomic_output(dst, overwrite=overwrite) as tmp:
        write_plans(tmp, plans, ckpt, metadata)
    return {"files": [Path(dst).name], "tensors": len(plans)}


#: Bytes of one large array written before its (mapped) pages are released.
_MAPPED_CHUNK = 32 * 2**20


def write_at_offsets(path, size: int, n_items: int, produce: Callable[[int], tuple[int, Any]], *,
                     label: str = "writing", total_bytes: int | None = None) -> None:
    """Fill a file of ``size`` bytes whose layout is fixed: item ``i`` is ``produce(i) -> (offset,
    array)``, written at ``offset`` by whichever worker runs it; or ``(offset, iterator)`` of
    ``(offset in the item, array)`` pieces, each written as it is made (an item never whole in memory).

    For formats whose header is written first by their own library (GGUF): every offset is known,
    so the items are tasks of the same engine as :func:`write_plans` (workers and progress from
    the options in force) and the bytes are the same for any number of workers. Gaps are zero
    (``ftruncate``). ``produce`` must return an array nobody modifies afterwards; arrays over
    32 MiB go in chunks, their (mapped) pages released after each. The file is fsynced.
    """
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        bg = BackgroundWriter(fd, path=path)

        def task(i: int) -> int:
            offset, arr = produce(i)
            if isinstance(arr, Iterator):  # pieces made one after another: each written as it comes
                total = 0
                for start, piece in arr:
                    view = memoryview(np.ascontiguousarray(piece).reshape(-1).view(np.uint8))
                    bg.submit(view, offset + start)
                    total += view.nbytes
                return total
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

        try:
            with Progress(label, n_items, total_bytes if total_bytes is not None else size) as progress:
                run_tasks(n_items, task, workers=auto_workers(size, n_items),
                          on_result=lambda i, n: progress.advance(1, n))
            bg.close()
        except BaseException:
            bg.abandon()
            raise
        os.fsync(fd)
    finally:
        os.close(fd)
