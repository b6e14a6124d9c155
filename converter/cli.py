"""The ``qckpt`` command (click). Thin: parse options, call the library, render or print JSON.

Bad input prints one line naming file, tensor and field (expected vs found) and exits with the
status from :mod:`converter.exit_codes`, without a traceback (``--debug`` shows one).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback
from pathlib import Path

import click

import converter.exit_codes as exit_codes
from converter.report import render
from converter.errors import ConverterError
from converter.ops.audit import audit as do_audit
from converter.ops.inspect import inspect as do_inspect
from converter.quant.requant import Target
from converter.report.validation import render_self_test, render_validation
from converter.runtime import fixed_mmap_threshold, limit_blas_threads, parse_size, run_options
from converter.validate import self_test as do_self_test, validate as do_validate
from converter.validate.findings import codes_help
from converter.vocabulary import (DENSE_DTYPE_CHOICES, FORMAT_NAMES, FP8_ELEMENTS, FP8_GRANULARITY_OPTIONS,
                                  GRANULARITY_OPTIONS, QUANT_TYPE_OPTION, SCALE_DTYPE_CHOICES, WRITABLE_FORMATS,
                                  float_dtype_name, granularity_of, granularity_options, parse_block)
from converter.write.atomic import atomic_output, check_not_inside, refuse_existing

# The commands import the formats layer (converter.formats.registry and what imports it: every format
# module, ops.convert / quantize_model / requantize_model, the validator) and converter.schemas
# (jsonschema) inside their bodies: `qckpt --help` and option errors then start without them
# (about 0.2 s of a 1.1-1.4 s start-up, measured: `python -c 'import converter.cli'` with and without them).


def _traceback_if_debug(ctx: click.Context) -> None:
    """``qckpt --debug``: the traceback on stderr, then the same one-line error and exit status."""
    if ctx.find_root().params.get("debug"):
        traceback.print_exc()


def _check_format_option(fmt: str | None) -> None:
    """``--format NAME`` names a registered format; an unknown name is a usage error (exit 2), like
    ``convert --to``."""
    if fmt is not None:
        from converter.formats.registry import get  # lazy: the formats layer (see the top)
        with _usage_errors():
            get(fmt)


def _json_value(v):
    return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)


def _fail(ctx: click.Context, code: int, message: str, *, error: str, exc: ConverterError | None = None) -> None:
    """Report one error and exit with ``code``: one line on stderr, or under ``--json`` one JSON object
    on stdout (``schemas/error.schema.json``), so a script reading stdout always gets JSON."""
    if ctx.params.get("as_json"):
        fields = ("file", "tensor", "field", "expected", "found", "hint")
        doc = {"schema": "qckpt.error/1", "error": error, "exit_code": code, "message": message,
               **{k: _json_value(getattr(exc, k, None)) for k in fields}}
        click.echo(render.dumps(doc))
    else:
        click.echo(f"qckpt: error: {message}", err=True)
    sys.exit(code)


def _handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        try:
            return fn(*args, **kwargs)
        except ConverterError as exc:
            _traceback_if_debug(ctx)
            exc.hint = getattr(exc, "cli_hints", {}).get(exc.hint, exc.hint)  # library words -> option names
            if ctx.params.get("as_json"):
                _fail(ctx, exc.exit_code, exc.message, error=type(exc).__name__, exc=exc)
            _fail(ctx, exc.exit_code, exc.render(), error=type(exc).__name__)
        except click.UsageError as exc:
            if not ctx.params.get("as_json"):
                raise
            _fail(ctx, exit_codes.USAGE, exc.format_message(), error="UsageError")
        except OSError as exc:  # the OS refused a read or write (permissions, disk full ...): one line
            _traceback_if_debug(ctx)
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(ctx, exit_codes.UNREADABLE, f"{where}{exc.strerror or exc}", error=type(exc).__name__)
        except KeyboardInterrupt:
            click.echo("qckpt: interrupted; no partial output left", err=True)
            sys.exit(exit_codes.INTERRUPTED)
    return wrapper


def run_options_flags(fn):
    """``--workers N``, ``--max-memory SIZE``, ``--quiet``: one place for every command that reads or
    writes tensor data (see :mod:`converter.write.engine`)."""
    @click.option("--workers", type=click.IntRange(1), default=None,
                  help="Worker processes (default: the number of cores); output is identical for any N.")
    @click.option("--max-memory", default=None, metavar="SIZE",
                  help="Working-memory budget for all workers, e.g. 512M or 2G (default 320M); "
                       "larger tensors go in row blocks.")
    @click.option("--quiet", is_flag=True, help="No progress bar on stderr.")
    @functools.wraps(fn)
    def wrapper(*args, workers=None, max_memory=None, quiet=False, **kwargs):
        limit_blas_threads(1)  # processes, not BLAS threads, share the cores (--workers)
        fixed_mmap_threshold()  # large buffers go back to the system when freed: flat RSS
        try:
            mem = parse_size(max_memory) if max_memory is not None else None
        except ConverterError as exc:
            raise click.BadParameter(exc.render(), param_hint="--max-memory") from None
        with run_options(workers=workers, max_memory=mem, quiet=quiet):
            return fn(*args, **kwargs)
    return wrapper


@contextlib.contextmanager
def _usage_errors():
    """The one place option errors become usage errors (exit 2): a ConverterError raised while
    checking the command line (an unknown or read-only ``--to`` format, a requantize Target
    conflict) is about the options, not the input."""
    try:
        yield
    except ConverterError as exc:
        raise click.UsageError(exc.render()) from None


def _emit(doc: dict, as_json: bool, renderer, schema: str | None = None) -> None:
    if as_json:
        if schema:
            from converter.schemas import validate_document  # lazy: jsonschema, only for --json
            validate_document(doc, schema)
        click.echo(render.dumps(doc))
    else:
        renderer(doc)


@click.group(epilog=exit_codes.epilog(), context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show a traceback on errors.")
@click.version_option(package_name="qckpt")
def main(debug: bool) -> None:
    """qckpt: read, convert, validate and audit quantized checkpoints through an explicit layout."""


@main.command(epilog=exit_codes.epilog())
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help=f"Read as this format instead of auto-detecting: {', '.join(FORMAT_NAMES)}.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schemas/inspect.schema.json).")
@_handle_errors
def inspect(path: Path, fmt: str | None, as_json: bool) -> None:
    """Format, and each tensor's logical shape, storage, scheme and groups."""
    from converter.formats.registry import load  # lazy: the formats layer (see the top)
    _check_format_option(fmt)
    _emit(do_inspect(load(path, format=fmt)), as_json, render.render_inspect, "inspect")


def _granularity(per_tensor: bool, per_channel: bool, group_size: int | None, *, required: bool) -> str | None:
    """The one granularity option given (``tensor`` / ``channel`` / ``group``); a usage error on conflicts."""
    given = granularity_options(per_tensor, per_channel, group_size)
    listed = ", ".join(option for option, _ in GRANULARITY_OPTIONS)
    if len(given) > 1:
        raise click.UsageError(f"conflicting options {' and '.join(given)}: give one of {listed}")
    if not given:
        if required:
            raise click.UsageError(f"missing option: give one of {listed}")
        return None
    return granularity_of(given[0])


def _fp8_granularity(per_tensor: bool, per_channel: bool, group_size: int | None, block: str | None
                     ) -> tuple[str, tuple[int | None, int | None] | None]:
    """The granularity of a ``--fp8`` target (``tensor`` / ``channel`` / ``block``) and its block extents."""
    listed = ", ".join(option for option, _ in FP8_GRANULARITY_OPTIONS)
    if group_size is not None:
        raise click.UsageError(f"--group-size does not apply to --fp8 (groups of FP8 scales are 2-D blocks): "
                               f"give one of {listed}")
    on = {"--per-tensor": per_tensor, "--per-channel": per_channel, "--block": block is not None}
    given = [option for option, _ in FP8_GRANULARITY_OPTIONS if on[option]]
    if len(given) > 1:
        raise click.UsageError(f"conflicting options {' and '.join(given)}: give one of {listed}")
    if not given:
        raise click.UsageError(f"missing option: give one of {listed}")
    if block is None:
        return dict(FP8_GRANULARITY_OPTIONS)[given[0]], None
    try:
        return "block", parse_block(block)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--block") from None


def _check_fp4_options(fp4, rule, fp8, bits, sym, scale_dtype, per_tensor, per_channel, group_size, block) -> None:
    """``--fp4`` fixes bits (4), groups (32 / 16 along in), scale dtype (E8M0 / E4M3) and symmetry."""
    if fp8 is not None:
        raise click.UsageError("conflicting options --fp4 and --fp8: give one")
    if bits is not None and bits != 4:
        raise click.UsageError(f"--fp4 codes have 4 bits: drop --bits {bits}")
    if not sym:
        raise click.UsageError("--fp4 is symmetric (E2M1 codes, no zero point): drop --asym")
    if scale_dtype is not None:
        raise click.UsageError(f"--fp4 {fp4} fixes its scale dtype ({'E8M0' if fp4 == 'mxfp4' else 'E4M3'}): "
                               "drop --scale-dtype")
    fixed = 32 if fp4 == "mxfp4" else 16
    if per_tensor or per_channel or block is not None or (group_size is not None and group_size != fixed):
        raise click.UsageError(f"--fp4 {fp4} has groups of {fixed} along the input axis: drop the granularity option")


@main.command(epilog=exit_codes.epilog())
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--bits", type=click.IntRange(2, 8), default=None, help="Bits per code (required without --fp8).")
@click.option("--fp8", "fp8", type=click.Choice(FP8_ELEMENTS), default=None,
              help="Quantize to an FP8 element (E4M3 or E5M2) with absmax scales, as compressed-tensors does.")
@click.option("--fp4", "fp4", type=click.Choice(["mxfp4", "nvfp4"]), default=None,
              help="Quantize to FP4 (E2M1): mxfp4 = groups of 32, E8M0 scales; nvfp4 = groups of 16, E4M3 "
                   "scales and an F32 global scale (shared by q/k/v and gate/up, as llm-compressor does).")
@click.option("--fp4-rule", type=click.Choice(["ct", "mlx"]), default=None,
              help="With --fp4: whose arithmetic, compressed-tensors (ct) or MLX mx.quantize (mlx; nvfp4 without a "
                   "global scale) [default: mlx with --to mlx (what mlx-lm loads), else ct].")
@click.option("--per-tensor", is_flag=True, help="One scale per tensor.")
@click.option("--per-channel", is_flag=True, help="One scale per output channel.")
@click.option("--group-size", type=click.IntRange(1), default=None, help="Groups of G along the input axis.")
@click.option("--block", default=None, metavar="OUTxIN",
              help="With --fp8: one scale per OUT x IN block, e.g. 128x128 (DeepSeek-V3 / FP8_BLOCK).")
@click.option("--sym/--asym", default=True, help="Symmetric (default) or asymmetric with integer zero points.")
@click.option("--scale-dtype", type=click.Choice(SCALE_DTYPE_CHOICES), default=None,
              help="Scale dtype [default: f16; with --fp8: each weight's own dtype].")
@click.option("--to", "to", default=None, metavar="FORMAT",
              help=f"Output format (default: native): {', '.join(WRITABLE_FORMATS)}.")
@click.option("--include", default=None, help="Regex of tensor names to quantize (default: 2-D *.weight).")
@click.option("--exclude", default=None,
              help="Regex of tensor names to keep dense (default: embeddings, norms, lm_head; --to mlx: norms "
                   "only, as mlx-lm, which quantizes the embedding and head too).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schemas/quantize-report.schema.json).")
@run_options_flags
@_handle_errors
def quantize(src, dst, bits, fp8, fp4, fp4_rule, per_tensor, per_channel, group_size, block, sym, scale_dtype, to,
             include, exclude, overwrite, as_json):
    """Quantize a float checkpoint SRC into DST (a native qckpt file, or --to FORMAT), with an error report."""
    from converter.formats.registry import check_writable, load  # lazy: the formats layer (see the top)
    from converter.ops.quantize_model import (QuantizeOptions, default_selection,  # lazy: imports the formats layer
                                              quantize_model, summarize)
    blocks = None
    if fp4 is not None:
        fp4_rule = fp4_rule or ("mlx" if to == "mlx" else "ct")  # the target's own quantizer by default
        _check_fp4_options(fp4, fp4_rule, fp8, bits, sym, scale_dtype, per_tensor, per_channel, group_size, block)
        bits, granularity, group_size = 4, "group", 32 if fp4 == "mxfp4" else 16
    elif fp4_rule is not None:
        raise click.UsageError("--fp4-rule needs --fp4")
    elif fp8 is not None:
        if bits is not None and bits != 8:
            raise click.UsageError(f"--fp8 codes have 8 bits: drop --bits {bits}")
        if not sym:
            raise click.UsageError("--fp8 is symmetric (absmax scales, no zero point): drop --asym")
        granularity, blocks = _fp8_granularity(per_tensor, per_channel, group_size, block)
        bits = 8
    else:
        if block is not None:
            raise click.UsageError("--block needs --fp8 (integer targets: --per-tensor, --per-channel, --group-size)")
        if bits is None:
            raise click.UsageError("Missing option '--bits' (or --fp8 e4m3|e5m2, --fp4 mxfp4|nvfp4).")
        granularity = _granularity(per_tensor, per_channel, group_size, required=True)
    if to is not None:
        with _usage_errors():
            check_writable(to)
    check_not_inside(src, dst)
    refuse_existing(dst, overwrite)
    sd = float_dtype_name(scale_dtype) if scale_dtype is not None else (None if fp8 is not None else "F16")
    if fp4 is not None:
        sd = "F8_E8M0" if fp4 == "mxfp4" else "F8_E4M3"
    selection = {"exclude": exclude} if exclude is not None else default_selection(to)  # mlx: mlx-lm's
    opts = QuantizeOptions(bits=bits, granularity=granularity, group_size=group_size, symmetric=sym,
                           scale_dtype=sd, include=include, **selection,
                           element=fp8, block=blocks, fp4=fp4, fp4_rule=fp4_rule)
    kw = {"to": to} if to is not None else {}
    notes: dict = {}
    stats = quantize_model(load(src), dst, opts, overwrite=overwrite, notes=notes, **kw)
    _emit(summarize(stats, opts, str(src), dst, notes=notes, **kw), as_json, render.render_quantize, "quantize-report")


@main.command(epilog=exit_codes.epilog())
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--what-if", is_flag=True, help="Add the same tensors under other layouts (theoretical).")
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help=f"Read as this format instead of auto-detecting: {', '.join(FORMAT_NAMES)}.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schemas/audit.schema.json).")
@_handle_errors
def audit(path: Path, what_if: bool, fmt: str | None, as_json: bool) -> None:
    """Bytes by role, bits per weight, theoretical vs measured size."""
    from converter.formats.registry import load  # lazy: the formats layer (see the top)
    _check_format_option(fmt)
    _emit(do_audit(load(path, format=fmt), what_if=what_if), as_json, render.render_audit, "audit")


@main.command(epilog=exit_codes.epilog())
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--dtype", type=click.Choice(DENSE_DTYPE_CHOICES), default="f32", show_default=True)
@click.option("--max-shard-size", type=click.IntRange(1), default=None, help="Shard the output (bytes per shard).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a summary as JSON (schemas/dequantize-report.schema.json).")
@run_options_flags
@_handle_errors
def dequantize(src, dst, dtype, max_shard_size, overwrite, as_json):
    """Any supported checkpoint SRC -> plain float safetensors DST (file if it ends in .safetensors, else a directory).
    """
    from converter.formats.plain import write_plain  # lazy: a format module (see the top)
    from converter.formats.registry import load  # lazy: the formats layer (see the top)
    check_not_inside(src, dst)
    refuse_existing(dst, overwrite)
    ckpt = load(src)
    res = write_plain(ckpt, dst, dtype=dtype, overwrite=overwrite, max_shard_bytes=max_shard_size)
    doc = {"source": str(src), "source_format": ckpt.format, "destination": str(dst), "dtype": dtype, **res}
    _emit(doc, as_json, render.render_dequantize, "dequantize-report")


@main.command(epilog=exit_codes.epilog())
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--to", "to", default=None, metavar="FORMAT",
              help=f"Target format (default: the source's): {', '.join(WRITABLE_FORMATS)}.")
@click.option("--per-tensor", is_flag=True, help="Requantize: one scale per tensor.")
@click.option("--per-channel", is_flag=True, help="Requantize: one scale per output channel.")
@click.option("--group-size", type=click.IntRange(1), default=None,
              help="Requantize: groups of G along the input axis.")
@click.option("--bits", type=click.IntRange(2, 8), default=None, help="Requantize: bits per code.")
@click.option("--fp8", "fp8", type=click.Choice(FP8_ELEMENTS), default=None,
              help="Requantize to an FP8 element (E4M3 or E5M2) with absmax scales; with --per-tensor | "
                   "--per-channel | --block OUTxIN.")
@click.option("--block", default=None, metavar="OUTxIN",
              help="With --fp8: one scale per OUT x IN block, e.g. 128x128 (DeepSeek-V3 / FP8_BLOCK).")
@click.option("--sym/--asym", "sym", default=None, help="Requantize: symmetric, or asymmetric with zero points.")
@click.option("--scale-dtype", type=click.Choice(SCALE_DTYPE_CHOICES), default=None, help="Requantize: scale dtype.")
@click.option("--scale-search", type=click.Choice(["none", "mse"]), default=None,
              help="Requantize: per-group clipping search minimising squared error.")
@click.option("--reference", type=click.Path(path_type=Path), default=None,
              help="Float checkpoint to measure the error against (requantize only).")
@click.option(QUANT_TYPE_OPTION, "quant_type", default=None,
              help="Requantize to a type the target format defines by name, with its own quantizer "
                   "(GGUF: Q4_K_M, Q5_K_S, Q6_K ... per-tensor mixes as llama-quantize, or one type: Q4_K, Q8_0, "
                   "MXFP4, NVFP4 ... "
                   "for every weight llama.cpp quantizes, as llama-quantize --pure).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--report", type=click.Path(path_type=Path), default=None, help="Also write the JSON report here.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON (convert-report, or error-report when requantizing).")
@run_options_flags
@_handle_errors
def convert(src, dst, to, per_tensor, per_channel, group_size, bits, fp8, block, sym, scale_dtype, scale_search,
            reference, quant_type, overwrite, report, as_json):
    """Convert SRC into format --to at DST: an exact repack, or a requantization with an error report."""
    from converter.formats.registry import check_writable, load  # lazy: the formats layer (see the top)
    blocks = None
    if fp8 is not None:
        if bits is not None and bits != 8:
            raise click.UsageError(f"--fp8 codes have 8 bits: drop --bits {bits}")
        if sym is False:
            raise click.UsageError("--fp8 is symmetric (absmax scales, no zero point): drop --asym")
        if quant_type is not None or scale_search is not None:
            raise click.UsageError(f"--fp8 takes no {'--quant-type' if quant_type is not None else '--scale-search'}")
        granularity, blocks = _fp8_granularity(per_tensor, per_channel, group_size, block)
    elif block is not None:
        raise click.UsageError("--block needs --fp8 (integer targets: --per-tensor, --per-channel, --group-size)")
    else:
        granularity = _granularity(per_tensor, per_channel, group_size, required=False)
    if to is not None:
        with _usage_errors():
            check_writable(to)
    if report:  # checked before any data moves, so a refused report leaves no DST behind
        check_not_inside(src, report)
        if Path(report).resolve() == Path(dst).resolve() or Path(dst).resolve() in Path(report).resolve().parents:
            raise click.UsageError("--report must not be DST or inside it")
        refuse_existing(report, overwrite)
    check_not_inside(src, dst)
    refuse_existing(dst, overwrite)
    requant = granularity is not None or any(v is not None for v in (bits, sym, scale_dtype, scale_search, reference,
                                                                     quant_type, fp8))
    if requant:
        from converter.ops.requantize_model import requantize_model  # lazy: imports the formats layer
        with _usage_errors():
            target = Target(bits=bits, granularity=granularity,
                            group_size=group_size, symmetric=sym, scale_dtype=scale_dtype,
                            scale_search=scale_search or "none", quant_type=quant_type, element=fp8, block=blocks)
        doc, schema, renderer = (requantize_model(src, dst, target, to=to, reference=reference, overwrite=overwrite),
                                 "error-report", render.render_error_report)
    else:
        from converter.ops.convert import convert_exact  # lazy: imports the formats layer
        to = to or load(src).format
        doc = convert_exact(src, dst, to, overwrite=overwrite)
        schema, renderer = "convert-report", render.render_convert
    if report:
        from converter.schemas import validate_document  # lazy: jsonschema, only for --report
        validate_document(doc, schema)
        with atomic_output(report, overwrite=overwrite) as tmp:
            Path(tmp).write_text(render.dumps(doc) + "\n")
    _emit(doc, as_json, renderer, schema)


@main.command(epilog=exit_codes.epilog() + "\n\n" + codes_help())
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--reference", type=click.Path(exists=True, path_type=Path), default=None,
              help="Float checkpoint to compare dequantized weights and dequant(W) @ x against.")
@click.option("--strict", is_flag=True, help="Warnings also give exit status 1.")
@click.option("--self-test", "self_test", is_flag=True, help="Run the axis probes on every writable format instead.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schemas/validation-report.schema.json).")
@_handle_errors
def validate(path, reference, strict, self_test, as_json):
    """Check PATH before deployment: structure, axis/zero/nibble layout from the data, optional reference."""
    if self_test:
        doc = do_self_test()
        _emit(doc, as_json, render_self_test, "probe-report")
        sys.exit(doc["exit_code"])
    if path is None:
        raise click.UsageError("give PATH (or --self-test)")
    rep = do_validate(path, reference=reference, strict=strict)
    _emit(rep.to_json(), as_json, render_validation, "validation-report")
    sys.exit(rep.exit_code)


if __name__ == "__main__":  # pragma: no cover
    main()
