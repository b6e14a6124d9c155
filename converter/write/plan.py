"""Write plans: output arrays known (name, dtype, shape) before any data moves.

A writer turns each source tensor into a :class:`TensorPlan` from its spec alone (shape
arithmetic), then the arrays are produced one source tensor at a time and streamed into a
planned safetensors file, so memory stays bounded by the largest tensor (zarr-style codecs that
compute output shapes first; DESIGN.md section 6).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from converter.errors import ConverterError, FormatError
from converter.write.atomic import atomic_output
from converter.formats.safetensors_io import SafetensorsWriter
from converter.formats.source import INDEX_NAME


@dataclass(frozen=True)
class RowSplit:
    """How a plan's outputs can be produced for a block of rows of its tensor.

    A plan that carries one may be encoded on ``take_rows(tensor, r0, r1)`` (the outermost
    logical axis: ``out`` for a weight) and its blocks written at ``offset + r0 * row_bytes``,
    so a tensor larger than the memory budget never has to be materialised whole.

    Attributes
    ----------
    rows : tuple of str
        Outputs whose leading stored axis is the tensor's outermost logical axis, one stored row
        per logical row (codes packed along ``in``, per-row scales, dense data ...).
    once : tuple of str
        Outputs that do not depend on the rows (``g_idx`` ...): written from the first block.
    fixed : dict of str -> ndarray
        Outputs whose value is known from the spec (compressed-tensors ``weight_shape``): written
        as given, whatever the blocks return for them.

    Formats whose stored arrays put ``out`` on a later axis (GPTQ / AWQ ``[in, out]``) or pack
    along ``out`` declare no split: their tensors are worked on whole (a transposed block
    would need one strided write per stored row).
    """

    rows: tuple[str, ...]
    once: tuple[str, ...] = ()
    fixed: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass
class TensorPlan:
    """How one source tensor becomes output arrays.

    Attributes
    ----------
    source : str
        Name of the tensor in the source checkpoint.
    outputs : list of (name, dtype, shape)
        Arrays the encoder will return, with safetensors dtype strings.
    encode : callable(tensor) -> dict name -> ndarray
    notes : list of str
        What the writer did (for reports): "exact repack", "scales rounded to fp16" ...
    row_split : RowSplit, optional
        Set when the outputs can be produced in blocks of rows (see :class:`RowSplit`).
    """

    source: str
    outputs: list[tuple[str, str, tuple[int, ...]]]
    encode: Callable[[Any], Mapping[str, np.ndarray]]
    notes: list[str] = field(default_factory=list)
    row_split: RowSplit | None = None

    @property
    def nbytes(self) -> int:
        from converter.dtypes import lookup
        total = 0
        for _, dt, shape in self.outputs:
            n = int(np.prod(shape, dtype=np.int64)) if shape else 1
            total += (n * lookup(dt).bits + 7) // 8
        return total


def rows_plan(plan: TensorPlan, *, once: Sequence[str] = (), fixed: Mapping[str, np.ndarray] | None = None,
              rows: Sequence[str] | None = None) -> TensorPlan:
    """``plan`` marked row-splittable: every output not in ``once`` / ``fixed`` is a rows output."""
    fixed = dict(fixed or {})
    if rows is None:
        rows = [o[0] for o in plan.outputs if o[0] not in once and o[0] not in fixed]
    plan.row_split = RowSplit(tuple(rows), tuple(once), fixed)
    return plan


def work_bytes(plan: TensorPlan, spec) -> int:
    """Estimated peak working set of encoding ``plan`` whole: bytes read + bytes written, plus
    float32 values for quantized tensors (dequantize / requantize work in float32)."""
    read = sum(int(a.nbytes) for a in spec.stored) if spec is not None else 0
    extra = 4 * spec.numel if spec is not None and spec.kind == "quantized" else 0
    return read + plan.nbytes + extra


def _block_rows(plan: TensorPlan, spec, budget: int) -> int | None:
    """Rows per block when ``plan`` must be split to fit ``budget``, else None."""
    if plan.row_split is None or spec is None or not spec.shape or spec.shape[0] < 2:
        return None
    est = work_bytes(plan, spec)
    if est <= budget:
        return None
    rows = int(spec.shape[0])
    return max(1, min(rows, rows * budget // max(est, 1)))


def _encode_into(w: SafetensorsWriter, plan: TensorPlan, ckpt, budget: int) -> int:
    """Load, encode and write one plan (whole, or in row blocks); returns bytes written."""
    from converter.write.parallel import drop_pages
    from converter.tensor import row_splittable, source_arrays, take_rows
    try:
        spec = ckpt.spec(plan.source) if hasattr(ckpt, "spec") else None
        t = ckpt[plan.source]
        step = _block_rows(plan, spec, budget)
        if step is None or not row_splittable(t):
            arrays = plan.encode(t)
            for name, arr in arrays.items():
                w.write(name, arr)
            return plan.nbytes
        split = plan.row_split
        rows = int(t.shape[0])
        for r0 in range(0, rows, step):
            arrays = plan.encode(take_rows(t, r0, min(rows, r0 + step)))
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
            drop_pages(*source_arrays(t))
        for name, arr in split.fixed.items():
            w.write(name, arr)
        return plan.nbytes
    except ConverterError as exc:
        raise exc.with_context(tensor=plan.source)


def write_plans(path: Path, plans: Sequence[TensorPlan], ckpt, metadata: Mapping[str, str] | None,
                progress=None) -> None:
    """Stream the planned arrays of ``plans`` into one safetensors file at ``path`` (not atomic itself).

    Tensors go to the worker processes and memory budget in force
    (:mod:`converter.write.parallel`): each task loads one source tensor, encodes it (whole, or in
    row blocks when it is larger than the per-worker budget and its plan allows) and writes its
    arrays at their planned offsets. The file's bytes do not depend on the number of workers.
    """
    from converter.runtime import auto_workers, current
    from converter.write.parallel import Progress, run_tasks
    entries = [o for p in plans for o in p.outputs]
    names = [e[0] for e in entries]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise FormatError("two output arrays share a name", file=path, tensor=dup[0])
    opts = current()
    total = sum(p.nbytes for p in plans)
    # default (no --workers): a process pool only when there is enough work to repay the forks
    workers = auto_workers(total, len(plans))
    budget = max(1, opts.memory // workers)
    own = progress is None
    if own:
        progress = Progress("writing", len(plans), sum(p.nbytes for p in plans))
    try:
        with SafetensorsWriter(path, entries, metadata) as w:
            def task(i: int):
                p = plans[i]
                before = set(w._written)
                nbytes = _encode_into(w, p, ckpt, budget)
                return sorted(set(w._written) - before), list(p.notes), nbytes

            def done(i: int, res) -> None:
                written, notes, nbytes = res
                w.adopt(written)
                for n in notes:
                    if n not in plans[i].notes:
                        plans[i].notes.append(n)
                progress.advance(1, nbytes)
            run_tasks(len(plans), task, workers=workers, on_result=done)
    finally:
        if own:
            progress.close()


def shard_plans(plans: Sequence[TensorPlan], max_shard_bytes: int | None) -> list[list[TensorPlan]]:
    """Split plans into shards of at most ``max_shard_bytes`` (a tensor's arrays stay together)."""
    if not max_shard_bytes:
        return [list(plans)]
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for p in plans:
        if shards[-1] and size + p.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(p)
        size += p.nbytes
    return shards


def _test_shard_delay() -> None:
    """Test-only hook: sleep ``$QCKPT_TEST_SHARD_DELAY`` seconds after each shard, so a test can
    kill a multi-shard write mid-way deterministically (tests/io/test_kill.py). Unset: no effect."""
    delay = os.environ.get("QCKPT_TEST_SHARD_DELAY")
    if delay:
        time.sleep(float(delay))


def write_model_dir(dst: Path, plans: Sequence[TensorPlan], ckpt, *, metadata: Mapping[str, str] | None,
                    config: Mapping[str, Any] | None, extra_json: Mapping[str, Any] | None = None,
                    extra_files: Sequence[str | Path] = (), max_shard_bytes: int | None = None,
                    overwrite: bool = False) -> dict:
    """Write a Hugging Face style model directory atomically.

    ``model.safetensors`` (or ``model-0000i-of-0000N.safetensors`` shards with
    ``model.safetensors.index.json``, huggingface_hub naming), ``config.json`` (when given),
    other JSON files (``extra_json``: file name -> object), copied ``extra_files`` and the
    checkpoint's generated ``side_files`` (a GGUF's tokenizer; a copied file of the same name wins).

    Tied embeddings (:mod:`converter.formats.ties`, CASES.md B32/B33): when the config says
    ``tie_word_embeddings: true`` and an ``lm_head.weight`` is planned, an head identical to the
    embedding is stored once (its plan dropped); a different one is kept and the written config
    says ``tie_word_embeddings: false``. Either way the summary's ``tied_head`` says so.

    Returns
    -------
    dict with ``files`` (names written), ``tensors`` (count) and, when the rule applied,
    ``tied_head`` (head, embedding, identical, max_abs_diff, note); ``side_files_skipped`` (file name
    -> reason) for the side files the source could not make (``metadata["side_files_skipped"]``).
    """
    from converter.write.parallel import Progress
    from converter.formats.ties import resolve_tied_head
    drop, config, tie = resolve_tied_head(ckpt, config, {p.source for p in plans})
    plans = [p for p in plans if p.source not in drop]
    shards = shard_plans(plans, max_shard_bytes)
    written: list[str] = []
    with atomic_output(dst, overwrite=overwrite, is_dir=True) as tmp, \
            Progress("writing", len(plans), sum(p.nbytes for p in plans)) as progress:
        tmp.mkdir(parents=True, exist_ok=True)
        if len(shards) == 1:
            write_plans(tmp / "model.safetensors", shards[0], ckpt, metadata, progress)
            written.append("model.safetensors")
        else:
            n = len(shards)
            weight_map: dict[str, str] = {}
            total = 0
            for i, shard in enumerate(shards, 1):
                fname = f"model-{i:05d}-of-{n:05d}.safetensors"
                write_plans(tmp / fname, shard, ckpt, metadata, progress)
                written.append(fname)
                _test_shard_delay()
                for p in shard:
                    total += p.nbytes
                    for o in p.outputs:
                        weight_map[o[0]] = fname
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
            written.append(INDEX_NAME)
        if config is not None:
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            written.append("config.json")
        for fname, obj in (extra_json or {}).items():
            (tmp / fname).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
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
    result: dict[str, Any] = {"files": written, "tensors": len(plans)}
    if tie is not None:
        result["tied_head"] = tie
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
    with atomic_output(dst, overwrite=overwrite) as tmp:
        write_plans(tmp, plans, ckpt, metadata)
    return {"files": [Path(dst).name], "tensors": len(plans)}


def dense_plan(spec, name: str | None = None) -> TensorPlan:
    """Pass a dense tensor through bit-exact."""
    out = name or spec.name
    plan = TensorPlan(spec.name, [(out, spec.dtype, tuple(spec.shape))],
                      lambda t, out=out: {out: np.ascontiguousarray(t.data)}, ["passed through"])
    from converter.dtypes import DTYPES
    if spec.shape and DTYPES.get(spec.dtype) is not None and DTYPES[spec.dtype].numpy is not None:
        rows_plan(plan)
    return plan
