"""``qckpt convert SRC DST [--to FORMAT] --per-channel | --group-size G | --bits B ...``: requantize.

Plan first, from headers only: every quantized tensor is classified exact or lossy
(:func:`converter.quant.requant.classify`; a target format with its own quantizer, e.g. GGUF,
adapts the target to its types first, :mod:`converter.quant.format_quant`) and the requantized
specs are checked against the target format (:func:`converter.ops.convert.plan_exact`); a scheme the target cannot store
is refused before anything is written, naming the option to change. Then a lazy Checkpoint view
requantizes tensor by tensor as the target's writer asks for them (one tensor in memory at a
time), each loading task returning its report row and a digest of what it wrote as its result
(:func:`converter.write.engine.task_result`, kind :data:`RESULT_KIND`); dense tensors pass
through. Finally the output is read back and each tensor's dequantized values compared with
what was written.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from converter.errors import ConverterError, NotRepresentableError, ProofFailedError
from converter.formats import registry
from converter.kernels import compiled
from converter.kernels.compiled.rtn_rows import warm
from converter.write.engine import collect_results, task_result
from converter.quant.error_report import metadata_cost, summarize, tensor_report
from converter.layout import EXPERT, IN, OUT
from converter.quant.format_quant import FormatQuantizer, QuantizedRows, quantize_with, streamable
from converter.quant.requant import (RequantResult, Target, classify, format_rows_target, quantized_spec, requantize,
                                     target_spec)
from converter.quant.quantize import quantize as quantize_values
from converter.quant.target import resolve
from converter.scheme import QuantScheme
from converter.scheme import ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, TensorSpec
from converter.write.dry_run import DryRunPlanned
from converter.runtime import current
from converter.write.atomic import check_not_inside, retarget_paths, staged_output
from converter.ops.convert import plan_exact, refuse_float_source, refuse_undecodable
from converter.ops.plan_doc import plan_document, tensor_rows
from converter.ops.readback import digest_later, verify_readback
from converter.ops.row_digest import RowDigest
from converter.ops.module_policy import (KEPT_DENSE, QUANTIZED, apply_module_policy, summarize_decisions,
                                         verify_dequantized)
from converter.ops.value_source import point_at_stored
from converter.ops.command_line import command_line
from converter.ops.target_plan import complete_target, describe_changes, effective, target_blocking

#: The kind of the per-tensor results the requantizing loader reports: name -> (report row, digest).
RESULT_KIND = "requantize"

OPTION_HINT = ("change the target: --per-tensor | --per-channel | --group-size G, --bits B, --sym | --asym, "
               "--scale-dtype, or pick another --to format")


def refuse_unproven(rows: dict[str, dict], modules: list[dict], dst: str | Path) -> None:
    """Raise :class:`ProofFailedError` when a tensor read back from the staged output has another digest
    than the one computed (``readback_bit_exact`` false), or a module written dense reads back otherwise;
    nothing is then renamed into place. Names every such tensor. A row whose digests cannot be compared
    (``readback``: :data:`converter.ops.readback.NOT_COMPARABLE`) is reported unproven, not refused."""
    bad = [name for name, row in rows.items() if row.get("readback_bit_exact") is False and "readback" not in row]
    bad += [d["tensor"] for d in modules if d.get("readback_bit_exact") is False]
    if bad:
        raise ProofFailedError(f"the written output read back differs from what was computed in {len(bad)} "
                               "tensor(s); nothing was written", file=dst, tensor=bad[0], field="read-back proof",
                               expected="every tensor read back with the digest computed while writing",
                               found=", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else ""))


def plan(ckpt: Checkpoint, target: Target, fmt: FormatQuantizer | None = None,
         overrides: Mapping[str, Target] | None = None) -> dict[str, tuple[str, str]]:
    """``name -> (exact|lossy, reason)`` for every quantized tensor, from specs only.

    ``overrides``: per tensor name, the target the target format's module policy gives it instead
    of ``target`` (``FormatHandler.requant_targets``).

    Raises
    ------
    NotRepresentableError
        ``fmt`` refuses a target (names the tensor and the option).
    """
    out = {}
    for s in ckpt.specs():
        if s.kind == "dense" and s.name in (overrides or {}) and fmt is not None:
            out[s.name] = ("lossy", "float weights quantized by the target format's own quantizer")
            continue
        if s.kind == "opaque" and s.decoded_by:  # only values: always a lossy requantization
            out[s.name] = ("lossy", f"{s.dtype} values (decoded by {s.decoded_by.split(' (')[0]}) requantized")
            continue
        if s.kind != "quantized":
            continue
        try:
            out[s.name] = classify(s, (overrides or {}).get(s.name, target), fmt)
        except ConverterError as exc:
            exc.with_context(file=ckpt.path, tensor=s.name)
            raise
    return out


def _float_axes(spec: TensorSpec) -> tuple[str, ...]:
    return (OUT, IN) if len(spec.shape) == 2 else (EXPERT, OUT, IN)


def _float_target(spec: TensorSpec, target: Target, fmt: FormatQuantizer):
    """Scheme and groups a target format's quantizer gives a float weight (a named ``quant_type``
    target: the format's ``adapt`` needs no source scheme)."""
    scheme, gm = fmt.adapt(None, None, target)
    gm.check_shape(spec.shape, _float_axes(spec))
    return scheme, gm


def _decoded_target(spec: TensorSpec, target: Target, fmt: FormatQuantizer | None):
    """Scheme and groups of a tensor known by its values only (``decoded_by``): a named type of the format's
    quantizer, else ``target`` applied to a signed symmetric grid (F32 scales; options left out keep it) whose
    layout the target must name, adapted by the format quantizer when there is one."""
    if fmt is not None and target.quant_type is not None:  # a named type of the format (Q4_K ...)
        return _float_target(spec, target, fmt)
    gm = target.group_map()
    if gm is None:
        raise NotRepresentableError(f"{spec.name} is stored as {spec.dtype} (values only): there is no source group "
                                    "layout to keep", tensor=spec.name, field="--group-size",
                                    expected="a target layout", found=None,
                                    hint="pass --per-channel, --group-size G or --per-tensor")
    base = QuantScheme(int(target.bits or 8), signed=True, zero_point=ZeroPoint.NONE, scale_dtype="F32")
    scheme, gm = resolve(base, gm, target, fmt)
    gm.check_shape(spec.shape, _float_axes(spec))
    return scheme, gm


def _float_spec(spec: TensorSpec, target: Target, fmt: FormatQuantizer | None) -> TensorSpec:
    """The spec of a float ``spec`` quantized to the target's scheme / groups, from its shape alone (integer
    zero points left implicit, float biases stored, as the format quantizer returns them)."""
    scheme, gm = _decoded_target(spec, target, fmt) if spec.decoded_by else _float_target(spec, target, fmt)
    return quantized_spec(spec.name, spec.shape, _float_axes(spec), scheme, gm, integer_zero=False)


def requantize_checkpoint(src: Checkpoint, target: Target, *, reference: Checkpoint | None = None,
                          fmt: FormatQuantizer | None = None, overrides: Mapping[str, Target] | None = None
                          ) -> tuple[Checkpoint, dict[str, tuple[str, str]]]:
    """A lazily requantized view of ``src``, and the plan.

    Loading a quantized tensor requantizes it and reports ``(report row, digest)`` as the running
    task's result ``(RESULT_KIND, name)`` (:func:`requant_results` sorts them out): the row of
    :func:`converter.quant.error_report.tensor_report` and the :func:`converter.ops.readback.digest` of
    the tensor the target's reader should read back (computed on its own thread meanwhile).

    ``fmt``: the target format's own quantizer (``FormatHandler.quantizer``, :mod:`converter.quant.format_quant`),
    which adapts every target and produces the types it defines (:func:`converter.quant.requant.requantize`).
    ``overrides``: per tensor name, the target used instead of ``target`` (see :func:`plan`).
    """
    overrides = dict(overrides or {})
    plans = plan(src, target, fmt, overrides)
    specs = {}
    for spec in src.specs():
        if spec.kind == "quantized":
            specs[spec.name] = target_spec(spec, overrides.get(spec.name, target), fmt)
        elif spec.name in plans:  # a float weight the target format's quantizer quantizes, or decoded values
            specs[spec.name] = _float_spec(spec, overrides.get(spec.name, target), fmt)
        else:
            specs[spec.name] = spec

    def load(name: str):
        t = src[name]
        spec = src.spec(name)
        if isinstance(t, DenseTensor) and spec.decoded_by and fmt is None:  # values only, qckpt's RTN
            scheme, gm = _decoded_target(spec, overrides.get(name, target), fmt)
            x = np.asarray(t.data, dtype=np.float32)
            result = RequantResult(quantize_values(x, scheme, gm, name=name), "requantized", values=x)
        elif isinstance(t, DenseTensor) and name in plans:
            scheme, gm = (_decoded_target if spec.decoded_by else _float_target)(spec, overrides.get(name, target), fmt)
            axes = _float_axes(spec)
            result = dataclasses.replace(quantize_with(fmt, t.data, scheme, gm, axes=axes, name=name),
                                         quantizer=fmt.accepts(scheme, gm, tuple(spec.shape), axes))
        elif not isinstance(t, QuantizedTensor):
            return t
        else:
            result = requantize(t, overrides.get(name, target), fmt=fmt)
        out = result.tensor
        # the digest of what the target's reader should read back (in its form when the format stores it
        # otherwise, e.g. GGUF's 32-element blocks), on its own thread while the report row is computed and
        # the writer encodes and writes the tensor (waited for before the task returns): one tensor in memory
        digest = digest_later(fmt.stored(out) if fmt is not None and fmt.stored is not None else out)
        ref = None
        if reference is not None and name in reference:
            ref = reference[name].dequantize()
            if tuple(ref.shape) != tuple(t.shape):
                raise NotRepresentableError("reference tensor shape differs", file=reference.path, tensor=name,
                                            field="shape", expected=list(t.shape), found=list(ref.shape))
        row = tensor_report(t, result, plans[name], reference=ref,
                            src_spec=src.spec(name) if isinstance(t, QuantizedTensor) else None)
        task_result(RESULT_KIND, name, (row, digest))
        return out

    def row_blocks(name: str, values_only: bool = False):
        """The tensor as row blocks when the format quantizer makes it from rows (``load``'s routes, never whole);
        ``values_only``: no error figures, digest or report row (a proof that only reads the values)."""
        if fmt is None or reference is not None or name not in plans:
            return None
        t, spec, tgt = src[name], src.spec(name), overrides.get(name, target)
        if isinstance(t, DenseTensor):
            scheme, gm = (_decoded_target if spec.decoded_by else _float_target)(spec, tgt, fmt)
            axes = _float_axes(spec)
            if not streamable(t.shape, gm, axes):
                return None
            return _streamed(name, t, t.data, scheme, gm, axes, fmt.accepts(scheme, gm, tuple(spec.shape), axes),
                             values_only)
        route = format_rows_target(t, tgt, fmt) if isinstance(t, QuantizedTensor) else None
        return None if route is None else _streamed(name, t, t, *route[:2], tuple(t.axes), route[2], values_only)

    def _streamed(name, t, values, scheme, gm, axes, label, values_only):
        rows = QuantizedRows(fmt, values, scheme, gm, axes=axes, name=name, figures=not values_only)
        if values_only:
            yield from rows
            return
        readback = RowDigest(rows.shape, axes)  # the digest of what the target's reader should read back
        for r0, block in rows:
            readback.add(fmt.stored(block) if fmt.stored is not None else block)
            yield r0, block
        result = dataclasses.replace(rows.result(), quantizer=label)
        row = tensor_report(t, result, plans[name], src_spec=src.spec(name) if isinstance(t, QuantizedTensor) else None)
        task_result(RESULT_KIND, name, (row, readback.hexdigest()))

    view = Checkpoint(specs, load, format="memory", path=src.path, config=src.config,
                      metadata={**src.metadata, "source_format": src.format}, files=(), extra_files=src.extra_files,
                      side_files=src.side_files, row_blocks=row_blocks)
    return view, plans


def warm_kernels(view: Checkpoint, plans: Mapping[str, tuple[str, str]]) -> bool:
    """Load the compiled requantize kernels ahead, on a thread (:func:`converter.kernels.compiled.warm_up`),
    when a lossy 2-D integer target is large enough for them (:func:`~converter.kernels.compiled.use_compiled`):
    their ~0.4 s load overlaps the planning and the first reads, and forked workers inherit them. Returns
    whether it started one."""
    big = [view.spec(name) for name, (kind, _) in plans.items() if kind == "lossy"]
    big = [s for s in big if s.kind == "quantized" and len(s.shape) == 2 and s.scheme is not None
           and s.scheme.codebook is None and compiled.use_compiled(s.numel)]
    if not big:
        return False
    dtypes = {s.scheme.code_dtype for s in big}
    compiled.warm_up(lambda: warm(dtypes))
    return True


def requant_results(got: Mapping[tuple[str, str], Any]) -> tuple[dict[str, dict], dict[str, str]]:
    """From collected task results (:func:`converter.write.engine.collect_results`): the report
    rows and the digests of what was written, by tensor name."""
    mine = {name: value for (kind, name), value in got.items() if kind == RESULT_KIND}
    return {n: v[0] for n, v in mine.items()}, {n: v[1] for n, v in mine.items()}


def _complete(ckpt: Checkpoint, handler, target: Target, *, src, dst, to: str, overwrite: bool,
              reference, source_format: str | None = None,
              write_options: Mapping[str, Any] | None = None) -> tuple[Target, list[dict[str, str]]]:
    """``target`` with the options ``handler`` needs filled in (:func:`converter.ops.target_plan.complete_target`,
    from specs only), and the ``filled_in`` report list (option, field, reason).

    Raises
    ------
    NotRepresentableError
        An option the user gave cannot be written as ``to``: the first reason, and the hint names one
        complete command line (the user's options changed as little as possible).
    """
    if target_blocking(ckpt, handler, target) is None:
        return target, []
    plan = complete_target(ckpt, handler, target, keep_given=True)
    if plan is not None:
        return plan.target, plan.to_json()
    alt = complete_target(ckpt, handler, target)
    if alt is None or not alt.changed:
        return target, []  # nothing better found: plan_exact below refuses with the options to change
    tensor, why, fld = target_blocking(ckpt, handler, target, strict_values=False) or \
        target_blocking(ckpt, handler, target)
    line = command_line(src, dst, to, alt.target, overwrite=overwrite, reference=reference,
                        source_format=source_format, write_options=write_options)
    raise NotRepresentableError(f"not representable in {to}: {why}", file=ckpt.path, tensor=tensor, field=fld,
                                hint=f"{describe_changes(alt)}: {line}")


def requantize_model(src: str | Path, dst: str | Path, target: Target, *, to: str | None = None,
                     reference: str | Path | None = None, overwrite: bool = False,
                     verify: bool = True, source_format: str | None = None,
                     write_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Requantize ``src`` (read as ``source_format``, auto-detected when None) to ``target``, write it as
    format ``to`` at ``dst``; return the error report.

    ``write_options``: keyword options of the target's writer (GPTQ ``checkpoint_format``, GGUF ``gguf_metadata``).

    Raises
    ------
    NotRepresentableError
        Before writing, when a requantized scheme cannot be written in ``to`` (hint names the options).
    QuantizationError
        A scale that overflows the target scale dtype (names tensor and group).
    """
    check_not_inside(src, dst)
    source = registry.load(src, format=source_format)
    to = to or source.format
    handler = registry.check_writable(to)
    refuse_undecodable(source, to, exact=False)  # quantized in a type without a decoder: no target helps
    if handler.arrange is not None:  # the tensors as the target's loaders name and split them (exact)
        source = handler.arrange(source)
    # the target's module policy first: what its loaders keep dense is dequantized, not requantized
    ckpt, modules = apply_module_policy(source, handler)
    # every option the target needs and the user left out is filled in (and reported), all at once;
    # an option of the user's the target cannot take is refused with one complete command line
    target, filled = _complete(ckpt, handler, target, src=src, dst=dst, to=to, overwrite=overwrite,
                               reference=reference, source_format=source_format, write_options=write_options)
    target = effective(target, handler)  # (what a float-bias source becomes; the one scale dtype it stores)
    if target.types_from is not None and handler.requant_targets is None:  # it would be ignored silently
        raise NotRepresentableError(f"the {to} writer does not take per-tensor types from a file", field="types_from",
                                    expected="a target format with per-tensor types", found=target.types_from)
    # the target format's per-module targets (GGUF's output head), with their reasons in the report
    chosen = handler.requant_targets(ckpt, target) if handler.requant_targets is not None else {}
    overrides = {name: t for name, (t, _) in chosen.items()}
    for d in modules:
        if d["tensor"] in chosen:
            d["reason"] = chosen[d["tensor"]][1]
            if d["decision"] == KEPT_DENSE:  # a float weight the target format's own quantizer quantizes
                d["decision"] = QUANTIZED
    ref_ckpt = registry.load(reference) if reference is not None else None
    view, plans = requantize_checkpoint(ckpt, target, reference=ref_ckpt, fmt=handler.quantizer,
                                        overrides=overrides)
    if not current().dry_run and handler.quantizer is None:
        warm_kernels(view, plans)
    if not handler.output.dense_source and not source.quantized_names():
        # nothing the target quantizes itself (GGUF --quant-type does): name the source's format, not the view's
        refuse_float_source(view, to, source_format=source.format)
    try:
        plan_exact(view, to)
    except NotRepresentableError as exc:
        exc.hint = (exc.hint + "; " if exc.hint and exc.field == "group_size" else "") + OPTION_HINT
        exc.args = (exc.render(),)
        raise
    # staged beside DST, read back and proven there, renamed into place only when the proof holds
    # (write.atomic.staged_output); --engine ray|dask stages and proves on its nodes; --dry-run creates nothing
    unstaged = not verify or current().shard_job is not None or current().dry_run
    with (contextlib.nullcontext(Path(dst)) if unstaged else staged_output(dst, overwrite=overwrite)) as out_path:
        with collect_results() as got:
            try:
                written = handler.write(view, out_path, overwrite=overwrite, **(write_options or {})) or {}
            except DryRunPlanned as planned:  # --dry-run: the writer's plan, nothing written (nothing requantized)
                modes = {**{d["tensor"]: ("dequantized", d["reason"]) for d in modules
                            if d["decision"] == "dequantized"}, **plans}
                return plan_document("convert", source=str(src), source_format=source.format, destination=str(dst),
                                     target_format=to, rows=tensor_rows(view, modes), outputs=planned.outputs,
                                     modules=modules)
            except ConverterError as exc:  # a per-value check in the writer: name the source (nothing left at dst)
                if isinstance(exc, NotRepresentableError) and plans.get(exc.tensor, ("exact",))[0] == "exact":
                    point_at_stored(ckpt, exc)  # a value carried from the source: the file and array it came from
                else:  # a value computed while requantizing (a scale too large, a new zero point ...): no stored
                    exc.with_context(file=ckpt.path)  # array of the source holds it
                raise
            for name in plans:  # a writer that skipped a tensor still gets a row
                if (RESULT_KIND, name) not in got:
                    view[name]
        rows, digests = requant_results(got)
        if verify:
            first = Path((written or {}).get("path") or out_path)  # a split output: its first part
            out = registry.load(first, format=to)
            verify_readback(out, rows, digests)
            if handler.prove_written is not None:  # the format's check that does not go through its reader
                for name in handler.prove_written(view, first, out):
                    if name in rows:
                        rows[name]["readback_bit_exact"] = False
            verify_dequantized(source, out, modules)
            for name, row in rows.items():  # the cost of what was written (a writer may narrow the scales:
                if name in out and out.spec(name).kind == "quantized":  # F32 powers of two -> MLX's E8M0)
                    row["metadata"]["after"] = metadata_cost(out.spec(name))
            refuse_unproven(rows, modules, dst)
    written = retarget_paths(written, out_path, Path(dst))
    passthrough = [s.name for s in ckpt.specs() if s.kind != "quantized" and s.name not in plans]
    doc = summarize(list(rows.values()), source=str(src), source_format=source.format, destination=str(dst),
                    target_format=to, target=target.to_json(),
                    reference=str(reference) if reference is not None else None, passthrough=passthrough)
    doc["filled_in"] = filled
    doc["modules"] = modules
    doc["module_summary"] = summarize_decisions(modules)
    if written.get("side_files_skipped"):
        doc["side_files_skipped"] = written["side_files_skipped"]
    if len(written.get("files") or ()) > 1 and written.get("path"):  # a split GGUF: the parts DST was written as
        doc["parts"] = [str(Path(written["path"]).parent / name) for name in written["files"]]
    return doc
