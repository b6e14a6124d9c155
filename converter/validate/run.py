"""``validate(path)``: files, then the reader, then each quantized tensor, one at a time.

Order: file-level checks of a model directory (an error there stops before the reader, which
could not open the shards anyway); format detection (unknown -> exit 3); the reader (an error
about tensors vs config becomes a finding, see :mod:`converter.validate.structural`);
checkpoint-level checks (widths vs config, tied embeddings, skipped layers, activation scales); then
per quantized tensor: header checks (block grid), load (errors -> findings), config vs loaded arrays,
padding bits, scales, saturation, zero offset, float-element checks (NaN codes, per-block saturation,
magnitudes: :mod:`converter.validate.float_checks`), the format's zero-convention hook and, with a
reference, the reference comparison; last, the scale direction across the float-element tensors
(:mod:`converter.validate.scale_direction`) and the FP4 global-scale direction, the format's E8M0
rule evidence and NaN scale bytes (:mod:`converter.validate.fp4_checks`).

A packed integer tensor's codes are read once, in their stored words, by :func:`converter.validate.word_scan.scan`
(compiled, or numpy block by block), whose counts and sums the saturation, zero-offset, degenerate and nibble-profile
checks take instead of each scanning the unpacked codes; any other tensor is scanned by each check.

The per-tensor checks run as tasks (:func:`converter.write.engine.run_tasks`): inline, or in forked worker
processes (``--workers``) as many side by side as fit the memory budget (``--max-memory``, :func:`_workers`),
each materialising one tensor at a time; their results are merged in the checkpoint's order, so the report is
the same for any worker count. A progress bar on stderr counts the tensors (``--quiet``; never on stdout).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import ConverterError, InputNotFoundError
from converter.formats import hub, registry
from converter.formats.source import Source
from converter.runtime import auto_workers, current
from converter.tensor import QuantizedTensor
from converter.validate import checksums as checksum_checks
from converter.validate import (code_scans, data_checks, decoded_checks, dense_checks, files, float_checks, fp4_checks,
                                nibble_order, reader_errors, scale_direction, structural, word_scan)
from converter.validate.findings import finding
from converter.validate.report import ValidationReport
from converter.validate.reference import compare
from converter.write.engine import run_tasks
from converter.write.progress import Progress


def _zero_convention(hook, source: Source, spec, report: ValidationReport) -> None:
    try:
        ev = registry.guarded(hook, source.path, f"{report.format} zero-convention hook")(source, spec)
    except ConverterError:
        return
    if ev and ev.get("inferred") and ev.get("claimed") and ev["inferred"] != ev["claimed"]:
        report.add(finding("zero-convention", spec.name,
                           f"stored zero points follow the {ev['inferred']!r} convention but the config claims "
                           f"{ev['claimed']!r}: every weight decodes one step off", **ev))


def _load_reference(reference: str | Path):
    return registry.load(reference)


def validate(path: str | Path, reference: str | Path | None = None, strict: bool = False,
             checksums: bool = False, fmt: str | None = None) -> ValidationReport:
    """Validate the checkpoint at ``path`` (optionally against a float ``reference`` checkpoint), read as
    format ``fmt`` (auto-detected when None; it also picks the model of a folder holding two formats).

    ``checksums``: also hash every data file against its Hugging Face cache blob name, a
    ``SHA256SUMS`` entry or its git-LFS pointer (:mod:`converter.validate.checksums`).

    Returns
    -------
    ValidationReport
        ``.exit_code`` is 0 when clean and 1 with findings.

    Raises
    ------
    ConverterError
        When the input (or the reference) cannot be read at all: exit status 3 (see
        :mod:`converter.validate.structural` for what counts as unreadable).
    """
    report = ValidationReport(path=str(path), reference=str(reference) if reference else None, strict=strict)
    p = Path(path)
    if not p.exists():
        p = hub.resolve_repo_id(str(path))  # org/name[@rev]: a snapshot of the local Hugging Face cache
        if p is None:
            raise InputNotFoundError("no such file or directory", file=path)
    report.checks.append("files")
    report.add(*files.check_files(p))
    if checksums:
        report.checks.append("checksums")
        found, sums = checksum_checks.check_checksums(p, workers=current().workers or 2)
        report.add(*found)
        report.checksums = [c.to_json() for c in sums]
    if any(f.severity == "error" and f.code not in files.READABLE_DESPITE for f in report.findings):
        return report
    # a file that fails its checksum may well not parse: then the mismatch, already reported, says why
    mismatched = any(f.code == "checksum-mismatch" for f in report.findings)
    try:
        source = Source(p, prefer=fmt, tolerate_duplicates=True)  # duplicate-tensor reported above; checking goes on
        report.format = fmt or registry.detect(source).format
    except ConverterError as exc:
        if not mismatched:
            raise
        report.add(reader_errors.error_finding(exc))
        return report
    report.checks.append("structure")
    try:
        ckpt = registry.read(source, report.format)
    except ConverterError as exc:
        if reader_errors.unreadable(exc) and not mismatched:
            raise
        report.add(reader_errors.error_finding(exc))
        return report
    ref_ckpt = _load_reference(reference) if reference else None
    hooks = registry.validation_hooks(ckpt.format)
    # a directory only: a bare file has no config by design (a shard, or one file of a model directory the loaders
    # read whole), so its absence says nothing about the checkpoint
    if hooks.config_loaders and source.kind == "directory" and not source.quantization_config:
        report.add(finding("config-missing", None, f"no quantization config (config.json quantization_config or "
                           f"quantize_config.json): qckpt inferred the layout from the shapes, but "
                           f"{hooks.config_loaders} will not load this checkpoint as {ckpt.format}",
                           format=ckpt.format, loaders=hooks.config_loaders))
    report.add(*structural.check_shape_config(ckpt), *structural.check_group_skip(ckpt),
               *float_checks.check_activation_scales(ckpt))
    try:
        report.add(*structural.check_tied(ckpt))
    except ConverterError as exc:
        report.add(reader_errors.error_finding(exc))
    report.checks.append("data")
    if ref_ckpt is not None:
        report.checks.append("reference")
    if hooks.e8m0_rule is not None:
        try:
            rule_ev = registry.guarded(hooks.e8m0_rule, source.path, f"{report.format} E8M0-rule hook")(source)
        except ConverterError as exc:  # reported, not swallowed: the decode below meets the same fault
            report.add(reader_errors.error_finding(exc))
            rule_ev = None
        report.add(*fp4_checks.check_e8m0_rule(rule_ev))
    profiles: dict[str, dict[str, Any]] = {}
    magnitudes: dict[str, dict[str, Any]] = {}
    global_scales: dict[str, dict[str, Any]] = {}
    specs = ckpt.specs()
    quantized = [spec for spec in specs if spec.kind == "quantized"]
    results: dict[str, TensorResult] = {}
    template = ValidationReport(path=report.path, format=report.format, reference=report.reference, strict=strict)
    # the compiled kernels loaded before any worker forks (the workers inherit them): the word scan for the tensors
    # it will likely cover, the per-check scans for the others
    covered = [word_scan.likely_covered(spec, hooks.words_along_in, source.read) for spec in quantized]
    word_scan.warm(max((spec.numel for spec, c in zip(quantized, covered) if c), default=0))
    if not all(covered):
        code_scans.warm(max(spec.numel for spec, c in zip(quantized, covered) if not c))
    with Progress("validating", len(quantized), sum(_stored_bytes(spec) for spec in quantized)) as progress:
        def done(i: int, res: TensorResult) -> None:
            results[quantized[i].name] = res
            progress.advance(1, _stored_bytes(quantized[i]))
        run_tasks(len(quantized), lambda i: _check_one(template, source, quantized[i], ckpt, hooks, ref_ckpt),
                  workers=_workers(quantized, ref_ckpt is not None, covered), on_result=done)
    for spec in specs:  # merged in the checkpoint's order: the same report for any worker count
        if spec.kind == "opaque" and spec.decoded_by:
            found, stats = decoded_checks.check_decoded(ckpt, source, spec, hooks)
            report.add(*found)
            if stats is None:
                report.unchecked.append(spec.name)
            else:
                report.tensors[spec.name] = stats
            continue
        if spec.kind == "opaque":
            report.add(finding("opaque", spec.name, f"stored as {spec.dtype}, a type qckpt cannot decode: not checked",
                               dtype=spec.dtype, stored=[s.name for s in spec.stored]))
            report.unchecked.append(spec.name)
        if spec.kind == "dense":  # every value finite (a bias, norm or embedding is passed through by converters)
            try:
                dense = ckpt[spec.name]
            except ConverterError as exc:
                report.add(reader_errors.error_finding(exc, tensor=spec.name))
                report.unchecked.append(spec.name)
                continue
            report.add(*dense_checks.check_dense(spec.name, dense.data))
            report.dense_checked += 1
            continue
        if spec.kind != "quantized":
            continue
        res = results[spec.name]
        report.add(*res.findings)
        if res.stats is None:
            report.unchecked.append(spec.name)
            continue
        report.tensors[spec.name] = res.stats
        if "float" in res.stats and res.stats["float"]["magnitude"]:
            magnitudes[spec.name] = res.stats["float"]["magnitude"]
        if res.global_scale is not None:
            global_scales[spec.name] = res.global_scale
        if res.profile is not None:
            profiles[spec.name] = res.profile
    report.add(*nibble_order.check_nibble_order(profiles))
    direction = fp4_checks.check_global_scale_direction(global_scales, magnitudes)
    flipped = {f.tensor for f in direction}  # the one fault, named once (the global scale's direction)
    report.add(*direction, *(f for f in scale_direction.check_scale_direction(magnitudes) if f.tensor not in flipped))
    return report


@dataclass
class TensorResult:
    """What checking one quantized tensor found (a worker's picklable return value).

    ``stats`` is None when the tensor could not be checked (a reader error, or not a quantized tensor once
    loaded); ``global_scale`` and ``profile`` are the cross-tensor evidence (FP4 global scale, nibble
    column profile) the parent combines after every tensor is in."""

    findings: list
    stats: dict[str, Any] | None = None
    global_scale: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None


def _check_one(template: ValidationReport, source: Source, spec, ckpt, hooks: registry.ValidationHooks,
               ref_ckpt) -> TensorResult:
    """Every per-tensor check of one quantized tensor (a task: inline, or in a forked worker process)."""
    local = replace(template, findings=[], checks=[], tensors={}, unchecked=[])
    local.add(*structural.check_spec(spec, always_stored=hooks.always_stored), *float_checks.check_block_grid(spec))
    try:
        t = ckpt[spec.name]
    except ConverterError as exc:
        local.add(reader_errors.error_finding(exc, tensor=spec.name))
        return TensorResult(local.findings)
    if not isinstance(t, QuantizedTensor):
        return TensorResult(local.findings)
    dense_axes = (ckpt.metadata or {}).get("dense_axes", {}).get(spec.name)
    # the one-pass scan of the stored words (compiled or numpy) when it covers the tensor, else None (each check
    # scans the codes)
    scan = word_scan.scan(t, {name: gm for name, (gm, _) in data_checks.alternative_maps(t).items()})
    stats = _check_tensor(local, source, spec, t, hooks, ref_ckpt, dense_axes, scan)
    return TensorResult(local.findings, stats, fp4_checks.global_scale_evidence(t),
                        nibble_order.column_profile(t, scan))


#: Working memory of checking one tensor, in bytes per logical element, without and with a reference: measured
#: 5.8 and 87.6 (peak RSS of ``validate --workers 1`` on one 11008 x 4096 GPTQ 4-bit tensor minus that on the
#: ``tiny`` shape, 2026-12-06; the reference check decodes the alternative interpretations whole), rounded up.
BYTES_PER_ELEMENT = (8, 96)
#: The same without a reference for a tensor the one-pass word scan reads (:func:`word_scan.likely_covered`): measured
#: the same way (one-layer checkpoints of 4-, 8- and 2-bit codes, numpy scan / compiled), 2026-12-06: 4-bit 0.50 / 0.56
#: (0.59 / 0.60 with integer zero points), 8-bit 1.09 / 1.14, 2-bit 0.32 / 0.33, most of it the populated words
#: (bits / 8), rounded up. (Before the padding check stopped mapping every tensor's words a second time: 4-bit 0.99 /
#: 1.05, 8-bit 2.08 / 2.12.)
WORD_SCAN_BYTES_PER_ELEMENT = 2


def _stored_bytes(spec) -> int:
    return sum(int(a.nbytes) for a in spec.stored)


def _workers(quantized: list, with_reference: bool, covered: list[bool] | None = None) -> int:
    """Worker processes for the per-tensor checks: :func:`converter.runtime.auto_workers` (``--workers``, or
    every core once the work repays forking), then at most as many as the largest working set fits into the
    memory budget (``--max-memory``) side by side; at least one (a tensor larger than the budget is still checked,
    alone). A tensor's working set is its element count times :data:`BYTES_PER_ELEMENT`, or
    :data:`WORD_SCAN_BYTES_PER_ELEMENT` without a reference when ``covered`` (per tensor: the word scan reads it)."""
    if not quantized:
        return 1
    workers = auto_workers(sum(_stored_bytes(spec) for spec in quantized), len(quantized))
    covered = covered or [False] * len(quantized)
    largest = max(spec.numel * (WORD_SCAN_BYTES_PER_ELEMENT if c and not with_reference
                                else BYTES_PER_ELEMENT[with_reference]) for spec, c in zip(quantized, covered))
    return max(1, min(workers, current().memory // max(1, largest)))


def _reference_in_logical_order(ref_shape: tuple[int, ...], t: QuantizedTensor,
                                dense_axes: list[str] | None) -> list[int] | None:
    """The permutation that brings a reference stored in the source's declared float orientation
    (``metadata["dense_axes"]``, e.g. gpt-oss experts ``[expert, in, out]``) back to ``t``'s logical axes;
    the identity when the reference has the logical shape and no orientation is declared; None when neither fits."""
    ident = list(range(len(t.shape)))
    if dense_axes and sorted(dense_axes) == sorted(t.axes):
        perm = [t.axes.index(a) for a in dense_axes]
        if tuple(ref_shape) == tuple(t.shape[i] for i in perm):
            return [int(i) for i in np.argsort(perm)]
    return ident if tuple(ref_shape) == tuple(t.shape) else None


def _check_tensor(report: ValidationReport, source: Source, spec, t: QuantizedTensor, hooks: registry.ValidationHooks,
                  ref_ckpt, dense_axes: list[str] | None = None,
                  scan: word_scan.WordScan | None = None) -> dict[str, Any]:
    stats: dict[str, Any] = {"shape": list(t.shape), "scheme": t.scheme.describe(), "groups": t.group_map.describe()}
    report.add(*structural.check_loaded(spec, t))
    report.add(*structural.check_padding(source, spec, t))
    nan_bytes = fp4_checks.check_nan_scale_bytes(t)  # FP4: the NaN bytes and their group indices
    report.add(*nan_bytes, *(f for f in data_checks.check_scales(t, negative_ok=hooks.negative_scales)
                             if not (nan_bytes and f.code == "scale-nonfinite")))
    report.add(*data_checks.check_degenerate(t, scan))
    sat_findings, stats["saturation"] = data_checks.check_saturation(t, scan)
    report.add(*sat_findings)
    zo_findings, stats["zero_offset"] = data_checks.check_zero_offset(t, scan)
    report.add(*zo_findings)
    if float_checks.float_element(t) is not None:  # FP8 / FP4 weights
        report.add(*float_checks.check_nonfinite_codes(t))
        unsat_findings, sat = float_checks.check_unsaturated(t)
        report.add(*unsat_findings)
        stats["float"] = {"element": t.scheme.describe().split()[0], "saturation": sat,
                          "magnitude": scale_direction.magnitude(t)}
    zp_findings, pairing = nibble_order.check_zero_pairing(t)
    report.add(*zp_findings)
    if pairing is not None:
        stats["zero_pairing"] = pairing
    if hooks.zero_convention is not None:
        _zero_convention(hooks.zero_convention, source, spec, report)
    if ref_ckpt is not None:
        back = (_reference_in_logical_order(tuple(ref_ckpt.spec(spec.name).shape), t, dense_axes)
                if spec.name in ref_ckpt else None)
        if back is None:
            found = list(ref_ckpt.spec(spec.name).shape) if spec.name in ref_ckpt else "absent"
            # a partial reference (a tool's decode of some tensors) leaves the rest uncompared: info; a
            # tensor of the same name in another shape points at a layout fault: a warning
            report.add(finding("reference-missing", t.name,
                               "no tensor of the same name and shape in the reference" if found != "absent" else
                               "not in the reference (a partial reference): not compared with it",
                               severity="info" if found == "absent" else None, expected=list(t.shape), found=found))
        else:
            ref = np.asarray(ref_ckpt[spec.name].dequantize(), dtype=np.float32)
            if back != list(range(len(back))):  # a float export's orientation (declared by the source)
                ref = np.ascontiguousarray(np.transpose(ref, back))
            ref_findings, stats["reference"] = compare(t, ref)
            report.add(*ref_findings)
    return stats
