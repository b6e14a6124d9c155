"""``qckpt convert --to FORMAT``: exact repack between formats, proven by reading the output back.

Per tensor ``mode``: ``exact`` (codes identical in the unsigned domain and dequantized values
bit-identical in float32), ``exact_up_to_rounding`` (codes identical, values differ only by the
target's rounding of a derived parameter, e.g. an MLX bias ``-z*s`` cast to fp16),
``passthrough`` (dense, bytes identical), ``tied`` (an ``lm_head`` identical to the embedding
under ``tie_word_embeddings``, stored once: the embedding read back holds its values), ``dequantized`` (target
``plain``: float32 values equal the source's dequantization bit-for-bit), ``changed`` / ``missing`` (a
failure).

Before any data moves, every quantized tensor's scheme is checked against the target
(``FormatHandler.check_target``); if one is not representable, nothing is written and the error
names the tensors and the requantize options (never a silent requantize). The output is written
into a staging directory beside DST, read back there with the target's reader and compared with the
source tensor by tensor: codes (in a common unsigned domain), scales, and the dequantized values
(:func:`verify_output`: tensors spread over the worker processes). Only a proven output is renamed
into place; a tensor that reads back otherwise is a :class:`~converter.errors.ProofFailedError` naming
it, and DST is left as it was (:func:`converter.ops.compare.refuse_failed_proof`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any


from converter.errors import ConverterError, NotRepresentableError, UnsupportedError
from converter.formats import registry
from converter.formats.activations import activation_scales, owner
from converter.groups import Granularity
from converter.layout import IN
from converter.ops.compare import compare_offset, compare_tensors, refuse_failed_proof
from converter.ops.module_policy import apply_module_policy, summarize_decisions
from converter.ops.value_source import point_at_stored
from converter.runtime import auto_workers, current
from converter.quant.requant import target_spec
from converter.quant.target import Target
from converter.ops.plan_doc import plan_document, tensor_rows
from converter.tensor import Checkpoint, opaque_reason
from converter.write.dry_run import DryRunPlanned
from converter.write.atomic import check_not_inside, retarget_paths, staged_output
from converter.write.engine import run_tasks

REQUANTIZE_HINT = ("to requantize instead, pass a target layout: --per-tensor | --per-channel | --group-size G, "
                   "--bits B, --sym | --asym, --scale-dtype")


def refuse_undecodable(ckpt: Checkpoint, to: str, *, exact: bool = True) -> None:
    """Raise UnsupportedError when ``ckpt`` lists tensors in a storage type qckpt cannot decode (``opaque``
    specs: quantized types without a decoder): they are quantized, not dense, and no option converts them.
    The message counts them by type. With ``exact`` (a repack), also for tensors known by their values
    only (``decoded_by``: GGUF IQ* / TQ* through gguf-py): no codes or scales to carry, so only a
    requantization converts them."""
    if exact:
        decoded = [s for s in ckpt.specs() if s.kind == "opaque" and s.decoded_by]
        if decoded:
            raise UnsupportedError(f"cannot convert to {to} exactly: {opaque_reason(decoded[0])}", file=ckpt.path,
                                   tensor=decoded[0].name, field="dtype", expected="codes and scales qckpt decodes",
                                   found=decoded[0].dtype)
    opaque = [s for s in ckpt.specs() if s.kind == "opaque" and not s.decoded_by]
    if not opaque:
        return
    by_type: dict[str, int] = {}
    for s in opaque:
        by_type[str(s.dtype)] = by_type.get(str(s.dtype), 0) + 1
    types = ", ".join(f"{t} ({n})" for t, n in by_type.items())
    raise UnsupportedError(f"cannot convert to {to}: {len(opaque)} of the source's tensors are quantized in a "
                           f"type qckpt lists but cannot decode: {types}", file=ckpt.path, tensor=opaque[0].name,
                           field="dtype", expected="a quantized type qckpt decodes", found=opaque[0].dtype,
                           hint="qckpt inspect and audit read them; to convert, decode them to float with the "
                                "tool that wrote them, then qckpt quantize")


def refuse_float_source(ckpt: Checkpoint, to: str, source_format: str | None = None) -> None:
    """Raise NotRepresentableError when ``ckpt`` holds no quantized tensor: a float checkpoint is quantized by
    ``qckpt quantize``, never repacked or requantized by ``convert``. ``source_format``: the format to name
    when ``ckpt`` is a view (a requantize plan), not the source read."""
    if ckpt.quantized_names():
        return
    n = f"{len(ckpt)} dense tensor{'' if len(ckpt) == 1 else 's'}"
    raise NotRepresentableError(f"the source is a float checkpoint ({source_format or ckpt.format}, {n}): convert "
                                f"repacks or requantizes quantized tensors, there are none to write into {to}",
                                file=ckpt.path, field="--to", expected="a quantized source",
                                found=f"{n}, none quantized",
                                hint=f"quantize it: qckpt quantize SRC DST --to {to} --bits B "
                                     "(--per-channel | --group-size G)")


def plan_exact(ckpt: Checkpoint, to: str, options: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Per quantized tensor: None (representable) or the reason it is not. Raises if any is not.

    ``options`` are the writer's options; those the target understands (its
    ``FormatHandler.target_options``) are passed to its ``check_target`` (a compressed-tensors ``ct_version`` that still
    stores ``weight_g_idx``, ...). ``allow_partial_groups=True`` writes partial final groups to a target whose common
    loaders cannot read them (:func:`_refuse_partial_groups`; e.g. for GPTQModel's padding kernels, CASES.md B14).
    """
    handler = registry.check_writable(to)
    refuse_undecodable(ckpt, to)  # not a scheme question: requantizing cannot help either
    if not handler.output.dense_source:
        refuse_float_source(ckpt, to)
    if not (options or {}).get("allow_partial_groups"):
        _refuse_partial_groups(ckpt, handler)
    problems = []
    for spec in ckpt.specs():
        if spec.kind != "quantized":
            continue
        reason = handler.target_reason(spec, options)
        if reason:
            problems.append((spec.name, reason))
    if problems:
        name, reason = problems[0]
        more = f" (and {len(problems) - 1} more tensors)" if len(problems) > 1 else ""
        raise NotRepresentableError(f"not representable in {to}: {reason}{more}", file=ckpt.path, tensor=name,
                                    field="scheme", hint=REQUANTIZE_HINT)
    reason = handler.model_reason(ckpt.specs())
    if reason:
        raise NotRepresentableError(f"not representable in {to}: {reason}", file=ckpt.path, field="quantization_config",
                                    hint=REQUANTIZE_HINT)
    return []


#: FP8 targets offered by :func:`requantize_hint` when no integer grid fits, in the order tried.
FP8_HINT_TARGETS = ({"granularity": "block", "block": (128, 128)}, {"granularity": "channel"},
                    {"granularity": "tensor"})


def requantize_hint(view: Checkpoint, handler: registry.FormatHandler, src: Any, dst: Any, to: str, *,
                    overwrite: bool = False, values_refused: bool = False, source_format: str | None = None,
                    options: dict[str, Any] | None = None) -> str:
    """The hint of a refused repack of ``view`` (the source after the target's module policy) into
    ``to``: one complete ``qckpt convert`` command line that requantizes it into a target the format
    takes, with every option it needs (:func:`converter.ops.target_plan.complete_target`; an FP8
    element when the format holds no integer grid), or :data:`REQUANTIZE_HINT` when none is found.
    ``values_refused``: the writer refused the source's values, so a plan that carries them exactly is
    not offered."""
    from converter.ops.command_line import command_line  # (ops siblings)
    from converter.ops.target_plan import complete_target
    acts = activation_scales(view)

    def companions_held(target: Target) -> bool:
        """Not a target whose tensors need a companion the source lacks (ModelOpt per-tensor FP8 is W8A8:
        it needs each module's static activation scale)."""
        if handler.probe_companions is None:
            return True
        spec = next((s for s in view.specs() if s.kind == "quantized" and len(s.shape) == 2), None)
        if spec is None:
            return True
        try:
            probe = target_spec(spec, target)  # (shapes only: name, scheme, groups)
        except ConverterError:
            return False
        return all(owner(c.name) in acts for c in handler.probe_companions(probe))
    try:
        plan = complete_target(view, handler, require_change=True, avoid_exact=values_refused)
        for kw in FP8_HINT_TARGETS if plan is None else ():
            cand = complete_target(view, handler, Target(element="e4m3", **kw))
            if cand is not None and companions_held(cand.target):
                plan = cand
                break
    except ConverterError:
        plan = None
    if plan is None:
        return REQUANTIZE_HINT
    how = "exact" if plan.exact else "lossy, with an error report"
    what = "requantize to FP8 instead" if plan.target.element is not None else "requantize instead"
    line = command_line(src, dst, to, plan.target, overwrite=overwrite, source_format=source_format,
                        write_options=options)
    return f"{what} ({how}): {line}"


#: group sizes offered when a target refuses partial final groups (the sizes kernels take).
COMMON_GROUP_SIZES = (32, 64, 128, 256)


def dividing_group_sizes(ckpt: Checkpoint) -> list[int]:
    """The common group sizes (:data:`COMMON_GROUP_SIZES`) that divide the ``in`` width of every
    quantized tensor of ``ckpt`` (so that no group is partial), from specs only."""
    widths = {int(dict(zip(s.axes, s.shape))[IN]) for s in ckpt.specs()
              if s.kind == "quantized" and s.axes and IN in s.axes}
    return [g for g in COMMON_GROUP_SIZES if all(w % g == 0 for w in widths)]


def _refuse_partial_groups(ckpt: Checkpoint, handler) -> None:
    """Raise before any data moves when ``handler``'s loaders cannot read partial final groups
    (``FormatHandler.partial_groups`` False) and a tensor of ``ckpt`` has one.

    Raises
    ------
    NotRepresentableError
        Naming the first such tensor (and how many more), its ``in`` width and group size, and the
        group sizes that divide every layer.
    """
    if handler.partial_groups:
        return
    bad = [(s.name, int(dict(zip(s.axes, s.shape))[s.group_map.axis]), s.group_map.group_size)
           for s in ckpt.specs()
           if s.kind == "quantized" and s.group_map.granularity is Granularity.GROUP
           and s.group_map.partial_tail(s.shape, s.axes)]
    if not bad:
        return
    name, width, g = bad[0]
    more = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
    fits = dividing_group_sizes(ckpt)
    hint = (f"use --group-size {' or '.join(map(str, fits))} (divides every layer)" if fits else
            "no common group size divides every layer: use --per-channel")
    raise NotRepresentableError(f"partial final group: {handler.name} loaders cannot read a group that runs past "
                                f"the end of a row{more}", file=ckpt.path, tensor=name, field="group_size",
                                expected=f"a group size dividing in_features {width}", found=g, hint=hint)


def proof_row(ckpt: Checkpoint, out: Checkpoint, name: str, tied: dict[str, Any] | None = None,
              renamed: dict[str, str] | None = None, dropped: dict[str, str] | None = None,
              offsets: dict[str, float] | None = None) -> dict[str, Any]:
    """The report row of source tensor ``name``: :func:`compare_tensors` against ``out[name]``.

    A tensor absent from ``out`` is ``missing``, except an ``lm_head`` stored once as the
    embedding (``tied``: the writer's ``tied_head`` summary, identical): it is compared with the
    embedding read back and is ``tied`` when bit-exact; and a tensor the writer stored under the
    target's spelling (``renamed``: the writer's summary, source -> written name; activation scales)
    is compared with that one and the row names it (``renamed_to``); a dense tensor the writer left
    out on purpose (``dropped``: source name -> reason; activation scales a target has no place for)
    is ``dropped``, with the reason, and is not counted as changed; a dense tensor the target stores with an offset
    (``offsets``: the writer's summary, name -> offset added; Gemma's norm weights in GGUF) is compared with the
    source plus the offset in its own dtype, read back minus the offset in float32: ``exact`` when that gives the
    source's values, ``exact_up_to_rounding`` when only those two roundings differ, else ``changed``.
    """
    tied = tied or {}
    if name in (offsets or {}) and name in out and ckpt.spec(name).kind == "dense":
        return compare_offset(ckpt[name], out[name], float(offsets[name]))
    if name in (dropped or {}) and name not in out and ckpt.spec(name).kind == "dense":
        return {"name": name, "kind": "dense", "mode": "dropped", "bit_exact": False, "reason": dropped[name]}
    new = (renamed or {}).get(name)
    if name not in out and new is not None and new in out:
        row = compare_tensors(ckpt[name], out[new])
        row["renamed_to"] = new
        return row
    b = out[name] if name in out else None
    if b is None and tied.get("identical") and name == tied.get("head") and tied.get("embedding") in out:
        # stored once as the embedding (tie_word_embeddings): prove the embedding holds its values
        row = compare_tensors(ckpt[name], out[tied["embedding"]])
        row["name"] = name
        row["mode"] = "tied" if row["bit_exact"] else "changed"
        row["tied_to"] = tied["embedding"]
        return row
    row = compare_tensors(ckpt[name], b, (ckpt.metadata or {}).get("dense_axes", {}).get(name))
    if b is None:
        row["mode"] = "missing"
    return row


def verify_output(ckpt: Checkpoint, out: Checkpoint, tied: dict[str, Any] | None = None, *,
                  meanwhile=None, renamed: dict[str, str] | None = None,
                  dropped: dict[str, str] | None = None,
                  offsets: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """Prove ``out`` (the written checkpoint, opened with the target's reader) against ``ckpt``.

    One :func:`proof_row` per source tensor, in ``ckpt.names()`` order. Tensors are compared
    in the worker processes of the options in force (:func:`converter.runtime.auto_workers`
    on the source's stored bytes; forked, each task reads one source tensor and its output
    counterpart from their files); ``meanwhile`` (no arguments) runs in this process while they
    work (:func:`converter.write.engine.run_tasks`). Under a distributed engine (the ``shard_job`` run
    option, :mod:`converter.distributed`) the rows come from the cluster: each node proves the source
    tensors of the shard it wrote, with this same function on its subset.

    Raises
    ------
    ConverterError
        Whatever reading a tensor raises (the first failure, with its fields).
    """
    def prove(names: list[str]) -> list[dict[str, Any]]:
        total = sum(int(a.nbytes) for name in names for a in ckpt.spec(name).stored)
        rows: list[dict[str, Any]] = [{} for _ in names]

        def done(i: int, row: dict[str, Any]) -> None:
            rows[i] = row
        run_tasks(len(names), lambda i: proof_row(ckpt, out, names[i], tied, renamed, dropped, offsets),
                  workers=auto_workers(total, len(names)), on_result=done, meanwhile=meanwhile)
        return rows
    job = current().shard_job
    if job is not None:  # --engine ray|dask: each node proves its own shard's tensors (converter.distributed)
        return job.prove_rows(ckpt.names(), prove)
    return prove(ckpt.names())


def convert_exact(src: str | Path, dst: str | Path, to: str, *, overwrite: bool = False,
                  options: dict[str, Any] | None = None, source_format: str | None = None) -> dict[str, Any]:
    """Repack ``src`` (read as ``source_format``, auto-detected when None) into format ``to`` at ``dst`` and
    prove it (report ``schemas/convert-report.schema.json``)."""
    check_not_inside(src, dst)
    ckpt = registry.load(src, format=source_format)
    handler = registry.check_writable(to)
    if handler.arrange is not None:  # the tensors as the target's loaders name and split them (exact)
        ckpt = handler.arrange(ckpt)
    # the target's module policy: what its loaders keep dense is written dense (exact dequantization)
    view, modules = apply_module_policy(ckpt, handler)
    dequantized = [m for m in modules if m["decision"] == "dequantized"]
    if ckpt.quantized_names() and not view.quantized_names() and not handler.output.dense_source:
        first = dequantized[0]
        raise NotRepresentableError(f"{to} keeps every quantized module of this source dense ({first['reason']}): "
                                    f"nothing to repack", file=ckpt.path, tensor=first["tensor"], field="--to",
                                    expected=f"a module {to} stores quantized",
                                    found=f"{len(dequantized)} quantized module(s), all kept dense by {to}",
                                    hint=f"convert to another format: requantizing does not give this source a module "
                                         f"{to} stores quantized")
    try:
        plan_exact(view, to, options)
    except NotRepresentableError as exc:  # one complete command line (every option the target needs)
        line = requantize_hint(view, handler, src, dst, to, overwrite=overwrite, source_format=source_format,
                               options=options)
        if exc.hint == REQUANTIZE_HINT or not exc.hint:
            exc.hint = line
        elif "qckpt convert" not in exc.hint and line != REQUANTIZE_HINT:  # e.g. the group sizes that fit
            exc.hint = f"{exc.hint}; or {line}"
        exc.args = (exc.render(),)
        raise
    # the output is written into a staging directory, read back and proven there, and renamed into place only
    # when the proof holds (write.atomic.staged_output); --engine ray|dask stages and proves on its nodes itself
    unstaged = current().shard_job is not None or current().dry_run  # (a dry run creates nothing at all)
    with (contextlib.nullcontext(Path(dst)) if unstaged else staged_output(dst, overwrite=overwrite)) as target:
        try:
            written = handler.write(view, target, overwrite=overwrite, **(options or {}))
        except DryRunPlanned as planned:  # --dry-run: the writer's plan, nothing written
            return plan_document("convert", source=str(src), source_format=ckpt.format, destination=str(dst),
                                 target_format=to, rows=tensor_rows(view, {d["tensor"]: ("dequantized", d["reason"])
                                                                          for d in dequantized}),
                                 outputs=planned.outputs, modules=modules)
        except NotRepresentableError as exc:  # a per-value check in the writer (nothing was left at dst)
            point_at_stored(ckpt, exc)  # the file and stored array the offending value came from
            if not exc.hint or "qckpt convert" not in exc.hint:
                line = requantize_hint(view, handler, src, dst, to, overwrite=overwrite, values_refused=True,
                                       source_format=source_format, options=options)
                exc.hint = (exc.hint + "; or " if exc.hint else "") + line
            exc.args = (exc.render(),)
            raise
        first = Path((written or {}).get("path") or target)  # a split output: its first part
        out = registry.load(first, format=to)
        rows = verify_output(ckpt, out, (written or {}).get("tied_head"),
                             renamed=(written or {}).get("renamed"), dropped=(written or {}).get("dropped"),
                             offsets=(written or {}).get("offsets"))
        if handler.prove_written is not None:  # the format's check that does not go through its reader
            failed = handler.prove_written(view, first, out)
            for r in rows:
                if r["name"] in failed:
                    r.update(mode="changed", bit_exact=False, reason=failed[r["name"]])
        refuse_failed_proof(rows, dst)
    written = retarget_paths(written, target, Path(dst))
    proven = {r["name"]: bool(r["bit_exact"]) for r in rows}
    for d in modules:
        if d["decision"] == "dequantized":
            d["readback_bit_exact"] = proven.get(d["tensor"], False)
    why = {d["tensor"]: d["reason"] for d in modules if d["decision"] != "quantized"}
    for r in rows:
        if r["name"] in why and r["mode"] in ("dequantized", "changed") and r["kind"] == "quantized":
            r["reason"] = why[r["name"]]
    return {"source": str(src), "source_format": ckpt.format, "destination": str(dst), "target_format": to,
            "mode": "repack", "written": written, "tensors": rows, "modules": modules,
            "module_summary": summarize_decisions(modules),
            **({"side_files_skipped": written["side_files_skipped"]}
               if (written or {}).get("side_files_skipped") else {}),
            "summary": summarize_rows(rows)}


#: row modes whose values are bit-identical to the source's (dense bytes, or float32 values)
BIT_EXACT_MODES = ("exact", "passthrough", "dequantized", "tied")


def summarize_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The convert summary: counts by outcome overall and for quantized and dense tensors apart.

    ``all_exact`` is True only when *every* tensor is bit-exact (``exact_up_to_rounding`` is not
    exact: its values differ by the target's rounding of a derived parameter, ``max_abs_diff``
    says by how much); ``within_rounding`` is True when every tensor is bit-exact or exact up to
    that stated rounding (codes identical), i.e. none ``changed`` (lossy) or ``missing``. Each kind's
    ``roundings`` states what was rounded (the rows' ``rounding``), in how many tensors and by how much.
    """
    def counts(sel: list[dict[str, Any]]) -> dict[str, Any]:
        rounding = [r for r in sel if r["mode"] == "exact_up_to_rounding"]
        out = {"tensors": len(sel), "exact": sum(r["mode"] in BIT_EXACT_MODES for r in sel),
               "exact_up_to_rounding": len(rounding),
               "changed": sum(r["mode"] in ("changed", "missing") for r in sel),
               "dropped": sum(r["mode"] == "dropped" for r in sel),
               "max_rounding_diff": max((r.get("max_abs_diff") or 0.0 for r in rounding), default=0.0)}
        by_reason: dict[str, dict[str, Any]] = {}  # the stated roundings: what was rounded, how many, how much
        for r in rounding:
            g = by_reason.setdefault(r.get("rounding") or "unstated", {"rounding": r.get("rounding") or "unstated",
                                                                       "tensors": 0, "max_abs_diff": 0.0})
            g["tensors"] += 1
            g["max_abs_diff"] = max(g["max_abs_diff"], r.get("max_abs_diff") or 0.0)
        if by_reason:
            out["roundings"] = list(by_reason.values())
        return out
    out = counts(rows)
    out["all_exact"] = out["exact"] == len(rows)
    out["within_rounding"] = out["changed"] == 0
    out["quantized"] = counts([r for r in rows if r["kind"] == "quantized"])
    out["dense"] = counts([r for r in rows if r["kind"] != "quantized"])
    return out
