"""The commands as one-call Python functions, returning the report documents the CLI renders.

Each function does what its ``qckpt`` command does, with the same checks, and returns the same report:
a ``dict`` conforming to its JSON Schema in ``schemas/`` (``validate`` returns the
:class:`~converter.validate.report.ValidationReport`, whose ``to_json()`` is that document). Errors are
the typed :class:`~converter.errors.ConverterError` leaves the CLI prints in one line. Options are
keyword-only and named as in the CLI (``--group-size`` -> ``group_size``); run options (workers, memory
budget, shard size) come from :func:`converter.runtime.run_options`.

``converter.inspect``, ``audit``, ``validate``, ``convert``, ``quantize``, ``dequantize`` and ``diff``
are these functions (``quantize`` / ``dequantize`` given arrays instead of paths are the tensor
operations of :mod:`converter.quant.quantize`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["inspect", "audit", "validate", "convert", "quantize", "dequantize", "diff"]


def inspect(path: str | Path, *, format: str | None = None) -> dict[str, Any]:
    """``qckpt inspect``: the format and each tensor's logical shape, storage arrays, scheme and groups.

    Returns ``schemas/inspect.schema.json``. Raises ConverterError on unreadable input.
    """
    from converter.formats.registry import load
    from converter.ops.inspect import inspect as do_inspect
    return do_inspect(load(path, format=format))


def audit(path: str | Path, *, what_if: bool = False, format: str | None = None) -> dict[str, Any]:
    """``qckpt audit``: bytes by role per tensor and in total, measured vs theoretical bits per weight;
    ``what_if`` prices other layouts. Returns ``schemas/audit.schema.json``."""
    from converter.formats.registry import load
    from converter.ops.audit import audit as do_audit
    return do_audit(load(path, format=format), what_if=what_if)


def validate(path: str | Path, *, reference: str | Path | None = None, strict: bool = False,
             checksums: bool = False, format: str | None = None):
    """``qckpt validate``: findings before deployment (see :func:`converter.validate.run.validate`).

    Returns a :class:`~converter.validate.report.ValidationReport` (``.exit_code``, ``.verdict``,
    ``.findings``; ``.to_json()`` is ``schemas/validation-report.schema.json``).
    """
    from converter.validate.run import validate as do_validate
    return do_validate(path, reference=reference, strict=strict, checksums=checksums, fmt=format)


def dequantize(src: str | Path, dst: str | Path, *, dtype: str = "f32", overwrite: bool = False,
               format: str | None = None, match_tool: bool = False, tool_dtype: str | None = None,
               engine: str = "local", address: str | None = None) -> dict[str, Any]:
    """``qckpt dequantize``: plain float safetensors (a file when ``dst`` ends in ``.safetensors``, else a
    model directory), ``dtype`` ``"f32"`` / ``"f16"`` / ``"bf16"``; ``match_tool``: each tensor as its
    producing tool decodes it. Returns ``schemas/dequantize-report.schema.json``. ``engine`` /
    ``address``: as ``--engine`` / ``--address`` (a model directory written on a Ray or Dask cluster,
    :func:`converter.distributed.job.run_command`)."""
    from converter.distributed.job import run_command
    from converter.ops.dequantize import dequantize as do_dequantize
    return run_command(do_dequantize, src, dst, engine=engine, address=address, overwrite=overwrite, dtype=dtype,
                       source_format=format, match_tool=match_tool, tool_dtype=tool_dtype)


def quantize(src: str | Path, dst: str | Path, *, bits: int | None = None, granularity: str | None = None,
             group_size: int | None = None, symmetric: bool = True, scale_dtype: str | None = None,
             fp8: str | None = None, block: tuple[int | None, int | None] | None = None, fp4: str | None = None,
             fp4_rule: str | None = None, to: str | None = None, include: str | None = None,
             exclude: str | None = None, overwrite: bool = False, format: str | None = None,
             engine: str = "local", address: str | None = None, **writer_options: Any) -> dict[str, Any]:
    """``qckpt quantize``: a float checkpoint ``src`` quantized into ``dst`` (native, or format ``to``).

    Integer targets: ``bits`` with ``granularity`` ``"tensor"`` / ``"channel"`` / ``"group"`` (inferred as
    ``"group"`` when ``group_size`` is given), ``symmetric``, ``scale_dtype`` (default ``"F16"``; with ``fp8``: each
    weight's own dtype). FP8: ``fp8="e4m3"`` with
    ``granularity`` ``"tensor"`` / ``"channel"`` / ``"block"`` and ``block=(out, in)``. FP4:
    ``fp4="mxfp4" | "nvfp4"`` (``fp4_rule`` ``"ct"`` / ``"mlx"``; default the target's own). Other keyword
    options go to the writer (e.g. GPTQ ``checkpoint_format``). ``engine`` / ``address``: as ``--engine`` /
    ``--address``. Returns ``schemas/quantize-report.schema.json``.

    Raises
    ------
    ConverterError
        A conflicting or missing option (:class:`~converter.errors.FormatError`), a quantized source, a
        target that cannot hold the result.
    """
    from converter.errors import FormatError
    from converter.distributed.job import run_command
    from converter.formats.registry import check_writable
    from converter.ops.quantize_model import QuantizeOptions, default_selection, quantize_report
    from converter.vocabulary import float_dtype_name
    from converter.write.atomic import check_not_inside, refuse_existing
    if granularity is None and group_size is not None:
        granularity = "group"
    given = {k: v for k, v in (("bits", bits), ("granularity", granularity), ("group_size", group_size),
                               ("scale_dtype", scale_dtype), ("fp8", fp8), ("block", block)) if v is not None}
    if fp4 is not None and given:  # the CLI refuses these with --fp4 (the format fixes them)
        raise FormatError("fp4 fixes the bits, groups and scale dtype", field=", ".join(given),
                          expected="none of them with fp4=", found=given)
    _check_writer_options(writer_options, to or "native")
    if fp4 is not None:
        bits, granularity, group_size = 4, "group", 32 if fp4 == "mxfp4" else 16
        scale_dtype = "F8_E8M0" if fp4 == "mxfp4" else "F8_E4M3"
        fp4_rule = fp4_rule or ("mlx" if to == "mlx" else "ct")
    elif fp8 is not None:  # no scale_dtype: each weight's own dtype (the CLI's --fp8 default)
        bits = 8
        scale_dtype = float_dtype_name(scale_dtype) if scale_dtype is not None else None
    else:
        scale_dtype = float_dtype_name(scale_dtype or "F16")
    if bits is None or granularity is None:
        raise FormatError("quantize needs bits and a granularity (or fp8= / fp4=)", field="bits / granularity",
                          expected="e.g. bits=4, group_size=128", found=f"bits={bits}, granularity={granularity}")
    if to is not None:
        check_writable(to, dst)
    check_not_inside(src, dst)
    refuse_existing(dst, overwrite)
    # the target's own default selection, as the CLI (--to mlx: mlx-lm's predicate, the embedding quantized)
    selection = {"exclude": exclude} if exclude is not None else default_selection(to)
    opts = QuantizeOptions(bits=bits, granularity=granularity, group_size=group_size, symmetric=symmetric,
                           scale_dtype=scale_dtype, include=include, **selection, element=fp8, block=block,
                           fp4=fp4, fp4_rule=fp4_rule or "ct")
    kw = {"to": to} if to is not None else {}
    # the report, or under run_options(dry_run=True) the plan
    return run_command(quantize_report, src, dst, engine=engine, address=address, overwrite=overwrite, opts=opts,
                       source_format=format, write_options=writer_options, **kw)


def convert(src: str | Path, dst: str | Path, *, to: str | None = None, target: Any = None,
            reference: str | Path | None = None, overwrite: bool = False, format: str | None = None,
            engine: str = "local", address: str | None = None, **writer_options: Any) -> dict[str, Any]:
    """``qckpt convert``: ``src`` into format ``to`` (default: the source's own) at ``dst``.

    Without ``target``: an exact repack, proven by reading ``dst`` back; returns
    ``schemas/convert-report.schema.json``. With ``target`` (a :class:`converter.quant.requant.Target`, or a
    dict of its fields: ``bits``, ``granularity``, ``group_size``, ``symmetric``, ``scale_dtype``,
    ``quant_type``, ``types_from`` (a GGUF whose per-tensor types each tensor gets, ``--gguf-types-from``) ...;
    ``reference``: a float checkpoint to measure against): a requantization, returning
    the error report (``schemas/error-report.schema.json``). Other keyword options go to the writer (GPTQ
    ``checkpoint_format``, GGUF ``gguf_metadata``, ``split_max_size`` / ``split_max_tensors``: a split GGUF).
    ``engine`` / ``address``: as ``--engine`` / ``--address`` (a model directory written on a Ray or Dask
    cluster, :func:`converter.distributed.job.run_command`).

    Raises
    ------
    NotRepresentableError
        The target cannot hold the source exactly (the hint is a complete command line that requantizes).
    """
    from converter.formats.registry import check_writable, load
    from converter.write.atomic import check_not_inside, refuse_existing
    if to is not None:
        check_writable(to, dst)
    if writer_options:  # the source's format is the default target: its headers are read only when needed
        _check_writer_options(writer_options, to or load(src, format=format).format)
    check_not_inside(src, dst)
    refuse_existing(dst, overwrite)
    from converter.distributed.job import run_command
    if target is None and reference is None:
        from converter.ops.convert import convert_exact
        return run_command(convert_exact, src, dst, engine=engine, address=address, overwrite=overwrite,
                           to=to or load(src, format=format).format, source_format=format,
                           options=writer_options or None)
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    if target is None:
        target = Target()
    elif isinstance(target, dict):
        target = Target(**target)
    return run_command(requantize_model, src, dst, engine=engine, address=address, overwrite=overwrite,
                       target=target, to=to, reference=reference, source_format=format,
                       write_options=writer_options or None)


#: writer keyword options -> the one format whose writer takes them (the CLI's --gptq-format / --gguf-metadata)
_WRITER_OPTIONS = {"checkpoint_format": "gptq", "gguf_metadata": "gguf", "split_max_size": "gguf",
                   "split_max_tensors": "gguf"}


def _check_writer_options(options: dict[str, Any], to: str) -> None:
    """Refuse a writer option the target's writer does not take (it would be ignored silently)."""
    from converter.errors import FormatError
    for key in options:
        owner = _WRITER_OPTIONS.get(key)
        if owner != to:
            raise FormatError(f"{key!r} is not an option of the {to} writer", field=key,
                              expected=f"an option of the {to} writer" if owner is None else f"to={owner!r}", found=key)


def diff(a: str | Path, b: str | Path, *, tolerance: float = 0.0, format_a: str | None = None,
         format_b: str | None = None) -> dict[str, Any]:
    """``qckpt diff``: ``b`` against ``a`` tensor by tensor (see :func:`converter.ops.diff.diff`); returns
    ``schemas/diff-report.schema.json`` (``exit_code`` 0 when identical within ``tolerance``)."""
    from converter.ops.diff import diff as do_diff
    return do_diff(a, b, tolerance=tolerance, format_a=format_a, format_b=format_b)
