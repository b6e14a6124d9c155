"""``qckpt quantize``: float checkpoint -> quantized checkpoint (native, or any writable format's
handler with ``--to``), with an error report.

Targets: integer round-to-nearest (``--bits``, :func:`converter.quant.quantize.quantize`), a float
element (``--fp8 e4m3|e5m2``: per tensor, per output channel or per 2-D block,
:func:`converter.quant.float_quant.quantize_float`, compressed-tensors' arithmetic) or FP4
(``--fp4 mxfp4|nvfp4``, :func:`converter.quant.fp4_quant.quantize_fp4`: E2M1 codes in groups of 32 with
E8M0 scales / of 16 with E4M3 scales and an F32 global scale; rule ``ct`` = compressed-tensors, ``mlx``
= MLX mxfp4). NVFP4 global scales are shared by llm-compressor's fused sets (q/k/v of one attention
block, gate/up of one MLP: :func:`converter.quant.fp4_quant.fused_sets`): the absmax of the set's
selected members, each read once more in row blocks.

Streams tensor by tensor: each selected weight is quantized when the writer asks for it (in the
write's worker task), its error statistics reported as that task's result
(:func:`converter.write.engine.task_result`, kind :data:`RESULT_KIND`), and it is released before
the next one. :func:`quantize_model` collects the statistics the write returns. With ``--to``, the
target handler's ``check_target`` sees every quantized spec before any data moves; what only the data
decides (an NVFP4 divisor global scale with no exact multiplier / amax in the target) is refused by the
writer before its files are committed, nothing left at ``dst``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from converter.codebooks import element as float_element
from converter.sizes import SCALE_BYTES, theoretical_bytes, zero_point_bytes
from converter.errors import FormatError, NotRepresentableError, QuantizationError, UnsupportedError
from converter.formats import registry
from converter.formats.native import FORMAT as NATIVE
from converter.groups import GroupMap
from converter.ops.plan_doc import plan_document, tensor_rows
from converter.write.dry_run import DryRunPlanned
from converter.write.engine import collect_results, task_result
from converter.layout import IN, OUT
from converter.kernels.metrics import error_stats
from converter.quant.float_quant import arith_dtype_of, float_scheme, quantize_float
from converter.quant.fp4_quant import FP4_KINDS, fp4_group_map, fp4_scheme, fused_sets, quantize_fp4
from converter.kernels.fp4_rtn import tensor_amax
from converter.values import with_effective_scales
from converter.quant.quantize import quantize
from converter.rows import Rows
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, spec_of
from converter.vocabulary import group_map_for

DEFAULT_EXCLUDE = r"(embed|norm|lm_head|wte|wpe)"
#: The kind of the per-tensor results the quantizing loader reports (name -> statistics row).
RESULT_KIND = "quantize"


@dataclass(frozen=True)
class QuantizeOptions:
    """Target of ``qckpt quantize``: bits, granularity, symmetry and scale dtype, or a float element.

    Attributes
    ----------
    bits : int
        Bits per code (8 for a float element).
    granularity : ``"tensor" | "channel" | "group" | "block"``
    group_size : int, optional
        ``group`` only.
    symmetric : bool
        Integer targets: symmetric (implicit centre) or integer zero points. Float elements are
        symmetric.
    scale_dtype : ``"F16" | "BF16" | "F32"``, or None for a float element: each weight's own dtype
        (BF16 / F16 / F32; F32 for others), as compressed-tensors stores it.
    element : ``"e4m3" | "e5m2"``, optional
        A float-element (FP8) target instead of integers.
    block : ``(out, in)`` extents, optional
        ``block`` only (either may be None: that axis whole).
    fp4 : ``"mxfp4" | "nvfp4"``, optional
        An FP4 (E2M1) target (bits 4, groups of 32 / 16 along ``in``, E8M0 / E4M3 scales).
    fp4_rule : ``"ct" | "mlx"``
        Whose arithmetic (:data:`converter.kernels.fp4_rtn.FP4_RULES`; ``mlx`` NVFP4 has no global scale).
    keep_dense : callable(TensorSpec, group size or None) -> bool, optional
        The target's own default selection (:func:`default_selection`): True leaves the weight dense.
    """

    bits: int
    granularity: str  # "tensor" | "channel" | "group" | "block"
    group_size: int | None = None
    symmetric: bool = True
    scale_dtype: str | None = "F16"
    include: str | None = None
    exclude: str | None = DEFAULT_EXCLUDE
    element: str | None = None
    block: tuple[int | None, int | None] | None = None
    fp4: str | None = None
    fp4_rule: str = "ct"
    keep_dense: Callable[[TensorSpec, int | None], bool] | None = None

    def scheme(self, weight_dtype: str | None = None) -> QuantScheme:
        """The target scheme of a weight stored as ``weight_dtype`` (it matters for a float element
        without a scale dtype)."""
        if self.fp4 is not None:
            return fp4_scheme(self.fp4, self.fp4_rule)
        if self.element is not None:
            return float_scheme(float_element(self.element), self.scale_dtype or arith_dtype_of(weight_dtype))
        if self.symmetric:
            return QuantScheme(self.bits, signed=True, zero_point=ZeroPoint.NONE, scale_dtype=self.scale_dtype)
        return QuantScheme(self.bits, signed=False, zero_point=ZeroPoint.INTEGER, scale_dtype=self.scale_dtype)

    def group_map(self) -> GroupMap:
        if self.fp4 is not None:
            return fp4_group_map(self.fp4)
        if self.granularity == "group" and not self.group_size:
            raise FormatError("group granularity needs a group size", field="group_size")
        if self.granularity == "block":
            if not self.block:
                raise FormatError("block granularity needs block extents", field="block")
            return GroupMap.per_block(*self.block)
        return group_map_for(self.granularity, self.group_size)

    def target_json(self) -> dict[str, Any]:
        """The report's ``target`` object."""
        out: dict[str, Any] = {"bits": self.bits, "granularity": self.granularity, "group_size": self.group_size,
                               "symmetric": self.symmetric, "scale_dtype": self.scale_dtype}
        if self.element is not None:
            out["element"] = self.element
        if self.fp4 is not None:
            out.update(element=self.fp4, rule=self.fp4_rule, scale_dtype=FP4_KINDS[self.fp4][1])
        if self.block is not None:
            out["block"] = {"out": self.block[0], "in": self.block[1]}
        return out


def default_selection(to: str | None) -> dict[str, Any]:
    """``QuantizeOptions`` fields of the default selection for target format ``to`` (no ``--exclude``): the
    format's own rule (:attr:`~converter.formats.registry.FormatHandler.quantize_exclude`; MLX: what mlx-lm
    leaves dense) as ``keep_dense``, else ``exclude`` :data:`DEFAULT_EXCLUDE` (embeddings, norms, head: what
    GPTQ / AWQ / compressed-tensors tools leave dense)."""
    own = registry.check_writable(to).quantize_exclude if to is not None else None
    return {"exclude": None, "keep_dense": own} if own is not None else {"exclude": DEFAULT_EXCLUDE}


def selected(spec: TensorSpec, opts: QuantizeOptions) -> bool:
    """Quantize 2-D float ``*.weight`` tensors, minus ``exclude``, or those matching ``include``."""
    if spec.kind != "dense" or spec.dtype not in ("F32", "F16", "BF16", "F64") or len(spec.shape) != 2:
        return False
    if spec.numel == 0:
        return False
    if opts.include:
        return re.search(opts.include, spec.name) is not None
    if not spec.name.endswith("weight"):
        return False
    if opts.keep_dense is not None and opts.keep_dense(spec, opts.group_size):
        return False
    return not (opts.exclude and re.search(opts.exclude, spec.name))


def quantize_checkpoint(src: Checkpoint, opts: QuantizeOptions) -> Checkpoint:
    """A lazily quantized view of ``src``.

    Loading a selected tensor quantizes it and reports its statistics row
    (:func:`_tensor_stats`) as the running task's result ``(RESULT_KIND, name)``.
    """
    gm = opts.group_map()
    specs: dict[str, TensorSpec] = {}
    schemes: dict[str, QuantScheme] = {}
    for spec in src.specs():
        if selected(spec, opts):
            scheme = schemes[spec.name] = opts.scheme(spec.dtype)
            probe = QuantizedTensor(spec.name, (OUT, IN), np.zeros(spec.shape, scheme.code_dtype),
                                    np.ones(gm.param_shape(spec.shape, (OUT, IN)), scheme.scale_np_dtype),
                                    scheme, gm, zero_points=None if scheme.symmetric else
                                    np.zeros(gm.param_shape(spec.shape, (OUT, IN)), scheme.code_dtype),
                                    global_scale=np.float32(1) if scheme.global_scale else None)
            specs[spec.name] = spec_of(probe)
        else:
            specs[spec.name] = spec
    fused = ({m: group for group in fused_sets(schemes) for m in group}
             if opts.fp4 == "nvfp4" and opts.fp4_rule == "ct" else {})  # (MLX nvfp4: no global scale)
    amax_cache: dict[str, float] = {}

    def set_amax(name: str) -> float | None:
        """The absmax the NVFP4 global scale of ``name`` comes from: its fused set's, else None (its own)."""
        if name not in fused:
            return None
        for m in fused[name]:
            if m not in amax_cache:
                amax_cache[m] = tensor_amax(Rows(src[m]), tensor=m)
        return max(amax_cache[m] for m in fused[name])

    def load(name: str):
        t = src[name]
        if specs[name].kind == "dense":
            return t
        if opts.fp4 is not None:
            q, degenerate, fig, _ = quantize_fp4(Rows(t), opts.fp4, rule=opts.fp4_rule,
                                                 arith_dtype=arith_dtype_of(src.spec(name).dtype),
                                                 global_amax=set_amax(name), name=name, figures=True)
            task_result(RESULT_KIND, name, _stats_row(q, fig, degenerate))
            return q
        if opts.element is not None:  # row blocks of the source, never its float values whole
            q, degenerate, fig = quantize_float(Rows(t), float_element(opts.element), gm,
                                                scale_dtype=schemes[name].scale_dtype,
                                                arith_dtype=arith_dtype_of(src.spec(name).dtype), name=name,
                                                axes=(OUT, IN), figures=True)
            task_result(RESULT_KIND, name, _stats_row(q, fig, degenerate))
            return q
        values = t.dequantize()
        q = quantize(values, schemes[name], gm, name=name, axes=(OUT, IN))
        task_result(RESULT_KIND, name, _tensor_stats(values, q))
        return q

    return Checkpoint(specs, load, format="memory", path=src.path, config=src.config,
                      metadata=dict(src.metadata), files=(), extra_files=src.extra_files,
                      side_files=src.side_files)


#: What a quantize target refused by ``--to`` can change.
QUANTIZE_HINT = "change the target (--bits, --per-tensor | --per-channel | --group-size G | --block OxI, " \
                "--fp8, --scale-dtype) or pick another --to format"


def check_quantize_target(view: Checkpoint, to: str, *, absmax_scales: bool = False,
                          hint: Callable[[NotRepresentableError], str] | None = None) -> None:
    """Ask format ``to``'s handler about every quantized spec of ``view`` before any data moves.

    ``hint``: the refusal's hint from the error (default :data:`QUANTIZE_HINT`).

    ``absmax_scales``: the FP8 scales will be absmax (``--fp8``), never powers of two; passed to the
    target's ``check_target`` as the write option of that name (a target whose FP8 mode stores E8M0
    scales, MLX mxfp8, refuses it here instead of after quantizing).

    Raises
    ------
    UnknownFormatError, UnsupportedError
        ``to`` is not a registered writable format.
    NotRepresentableError
        A quantized spec the target cannot store (the first one named, with how many more).
    """
    from converter.ops.convert import plan_exact  # (ops sibling: the convert's own pre-write check)
    if not view.quantized_names():  # nothing selected: the writer copies the dense tensors
        return
    try:
        plan_exact(view, to, {"absmax_scales": True} if absmax_scales else None)
    except NotRepresentableError as exc:
        exc.hint = hint(exc) if hint is not None else QUANTIZE_HINT
        exc.args = (exc.render(),)
        raise


def quantize_model(src: Checkpoint, dst: str | Path, opts: QuantizeOptions, *,
                   overwrite: bool = False, to: str = NATIVE, notes: dict | None = None,
                   write_options: dict[str, Any] | None = None) -> dict[str, dict]:
    """Quantize ``src`` and write it as format ``to`` (default native) at ``dst``; return the
    per-tensor statistics rows (under ``run_options(dry_run=True)``: the plan document, ``"dry_run": True``).
    ``notes``, when given, receives the writer's notes by tensor (the
    ``warning: `` ones name a loader that will refuse what was written: :func:`write_warnings`).

    Raises
    ------
    UnsupportedError
        ``src`` already holds quantized (or undecodable) tensors: quantize takes a float checkpoint.
    NotRepresentableError
        A quantized tensor format ``to`` cannot store, naming the source file: before writing (the
        scheme), or while writing when only the data decides (an NVFP4 global scale with no exact
        re-expression in the target's direction); nothing is left at ``dst``. The hint names the
        options (:data:`QUANTIZE_HINT`, :func:`fp4_hint`).

    Returns
    -------
    dict of tensor name -> statistics row
        As the write's tasks returned them (the input of :func:`summarize`).
    """
    handler = registry.check_writable(to)
    refuse_quantized_source(src)
    view = quantize_checkpoint(src, opts)
    hint = (lambda exc: fp4_hint(opts, exc.field, exc.hint)) if opts.fp4 is not None else None
    check_quantize_target(view, to, absmax_scales=opts.element is not None, hint=hint)
    try:
        with collect_results() as got:
            summary = handler.write(view, Path(dst), overwrite=overwrite, **(write_options or {}))
        if notes is not None and isinstance(summary, dict):
            notes.update(summary.get("notes") or {})
    except DryRunPlanned as planned:  # --dry-run: the plan (schemas/plan.schema.json), nothing quantized or written
        why = f"quantized to {opts.scheme().describe()}"
        rows = tensor_rows(view, {s.name: ("lossy", why) for s in view.specs() if s.kind == "quantized"},
                           dense_why="kept dense (--exclude / not a 2-D weight)")
        return plan_document("quantize", source=str(src.path), source_format=src.format, destination=str(dst),
                             target_format=to, rows=rows, outputs=planned.outputs)
    except NotRepresentableError as exc:
        # a refusal only the data decides (an FP4 global scale the target cannot hold): the target's reason
        # stays the message, with the source named and the quantize way out
        if hint is not None:
            exc.hint = hint(exc)
        exc.with_context(file=src.path)
        raise
    except QuantizationError as exc:  # the source's values cannot be quantized (NaN / inf): name the source file
        exc.with_context(file=src.path)
        raise
    return {name: row for (kind, name), row in got.items() if kind == RESULT_KIND}


def quantize_report(src: str | Path, dst: str | Path, opts: QuantizeOptions, *, overwrite: bool = False,
                    source_format: str | None = None, to: str = NATIVE,
                    write_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """``qckpt quantize`` from a path: :func:`quantize_model` of ``registry.load(src)``, then its report
    (:func:`summarize`), or under ``run_options(dry_run=True)`` the plan. A module-level command of paths
    and options, so a distributed engine's worker can run it again (:mod:`converter.distributed`)."""
    notes: dict = {}
    stats = quantize_model(registry.load(src, format=source_format), dst, opts, overwrite=overwrite, notes=notes,
                           write_options=write_options, to=to)
    if stats.get("dry_run") is True:
        return stats
    return summarize(stats, opts, str(src), Path(dst), notes=notes, to=to)


def fp4_hint(opts: QuantizeOptions, field: str | None, hint: str | None = None) -> str:
    """What ``qckpt quantize --fp4`` can change when the ``--to`` target refuses its tensors (``hint``: the
    target's own, kept where it applies to a float source)."""
    if field == "global_scale":
        return (f"--fp4 {opts.fp4} (rule {opts.fp4_rule}) writes each global scale as the divisor 2688 / amax "
                "(compressed-tensors' rule), which a target whose global scale multiplies or is an amax holds "
                "exactly only when it is a power of two: write --to native or a format whose global scale "
                "divides, or use --fp4-rule mlx (MLX's nvfp4: no global scale), or the target's own quantizer "
                "(qckpt convert SRC DST --to FORMAT --quant-type ...)")
    if field == "input_scale":
        return ("qckpt quantize computes weights only (no activation calibration)"
                + (f": {hint}" if hint else ": write a weight-only format, or native"))
    return "change --fp4 (mxfp4 | nvfp4) or pick another --to format (native holds every FP4 tensor)"


def refuse_quantized_source(src: Checkpoint) -> None:
    """``qckpt quantize`` reads float weights: a source with quantized (or opaque) tensors is refused,
    pointing at ``convert`` (requantize, with the error against the source's own decode) and ``dequantize``.

    Raises
    ------
    UnsupportedError
        Naming the source, its format and the first quantized tensor.
    """
    quantized = [n for n in src.names() if src.spec(n).kind != "dense"]
    if quantized:
        raise UnsupportedError(
            f"the source is already quantized ({len(quantized)} quantized tensors, format {src.format}): "
            "quantize takes a float checkpoint", file=src.path, tensor=quantized[0], field="kind",
            expected="dense float tensors", found=src.spec(quantized[0]).kind,
            hint="requantize it with `qckpt convert SRC DST --to FORMAT` and layout options (the error is "
                 "reported against its own decode), or `qckpt dequantize` it first")


def _tensor_stats(values: np.ndarray, q: QuantizedTensor) -> dict[str, Any]:
    err = error_stats(values, q.dequantize())
    return _stats_row(q, err)


def _stats_row(q: QuantizedTensor, err, degenerate: int | None = None) -> dict[str, Any]:
    """A report row from the error figures ``err`` (:class:`~converter.kernels.metrics.ErrorStats`)."""
    s32 = with_effective_scales(q).scales.astype(np.float32)  # NVFP4: the global scale applied
    spec = spec_of(q)
    theo = theoretical_bytes(q.shape, q.axes, q.scheme.bits, q.group_map, SCALE_BYTES[q.scheme.scale_dtype],
                             zero_point_bytes(spec))
    if q.global_scale is not None:  # one F32 global scale per tensor, counted
        theo = dict(theo, total_bytes=theo["total_bytes"] + 4, metadata_bytes=theo["metadata_bytes"] + 4,
                    bits_per_weight=8 * (theo["total_bytes"] + 4) / q.numel)
    return {"name": q.name, "shape": list(q.shape), "bits": q.scheme.bits, "scheme": q.scheme.describe(),
            "groups": q.group_map.describe(), "n_groups": theo["groups"],
            "mse": err.mse, "max_abs_error": err.max_abs, "sqnr_db": err.sqnr_db, "exact": err.exact,
            "scale_min": float(np.abs(s32).min()), "scale_max": float(np.abs(s32).max()),
            "ideal_compression_vs_fp32": 32 / q.scheme.bits,
            "compression_vs_fp32_with_metadata": (4 * q.numel) / theo["total_bytes"] if theo["total_bytes"] else None,
            "theoretical_bytes": theo["total_bytes"], "bits_per_weight": theo["bits_per_weight"],
            **({"scale_dtype": q.scheme.scale_dtype, "partial_blocks": q.group_map.partial_blocks(q.shape, q.axes),
                "degenerate_groups": int(degenerate)} if degenerate is not None else {})}


def write_warnings(notes: dict[str, list[str]]) -> list[str]:
    """The writer's ``warning: `` notes, once each, with how many tensors they concern."""
    warned: dict[str, list[str]] = {}
    for name, ns in notes.items():
        for note in ns:
            if note.startswith("warning: "):
                warned.setdefault(note[len("warning: "):], []).append(name)
    return [f"{note} ({len(names)} tensors, e.g. {names[0]})" for note, names in warned.items()]


def summarize(stats: dict[str, dict], opts: QuantizeOptions, src_path: str | None, dst: Path,
              to: str = NATIVE, notes: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """The quantize report (``schemas/quantize-report.schema.json``), worst SQNR first; ``warnings``
    (when there are any): :func:`write_warnings` of the writer's ``notes``."""
    rows = sorted(stats.values(), key=lambda r: (r["sqnr_db"] is None, r["sqnr_db"] if r["sqnr_db"] is not None else 0))
    numel = sum(int(np.prod(r["shape"])) for r in rows)
    sse = sum(r["mse"] * int(np.prod(r["shape"])) for r in rows)
    theo = sum(r["theoretical_bytes"] for r in rows)
    return {"source": src_path, "destination": str(dst), "format": to, "target": opts.target_json(),
            "tensors": rows, **({"warnings": warned} if (warned := write_warnings(notes or {})) else {}),
            "overall": {"quantized_tensors": len(rows), "quantized_weights": numel,
                        "mse": sse / numel if numel else 0.0,
                        "max_abs_error": max((r["max_abs_error"] for r in rows), default=0.0),
                        "ideal_compression_vs_fp32": 32 / opts.bits,
                        "theoretical_bytes": theo,
                        "compression_vs_fp32_with_metadata": (4 * numel / theo) if theo else None}}
