"""The ``qckpt`` command (click). Thin: parse options, call the library, render or print JSON.

Bad input prints one line naming file, tensor and field (expected vs found) and exits with the
status from :mod:`converter.exit_codes`, without a traceback (``--debug`` shows one).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

import converter.exit_codes as exit_codes
from converter.cli_errors import JsonErrorsGroup, check_format_option, handle_errors, usage_errors
from converter.cli_options import (check_fp4_options, check_table_options, engine_options, export_tables,
                                   fp8_granularity_option, gptq_options, granularity_option, run_on_engine,
                                   run_options_flags, shard_size_flag, table_options)
from converter.vocabulary import (DENSE_DTYPE_CHOICES, FORMAT_NAMES, FP8_ELEMENTS, QUANT_TYPE_OPTION,
                                  SCALE_DTYPE_CHOICES, WRITABLE_FORMATS, float_dtype_name)
from converter.write.atomic import atomic_output, check_not_inside, refuse_existing

# Start-up (issue 18): at module level this file imports only click and modules without numpy (exit codes,
# errors, run options, the vocabulary and its format names, atomic paths): `qckpt --help` took 2.38 s before and
# 0.21 s after, at load average 7 on the 2-core VM (ml_dtypes 0.7.0 alone took 0.5 s idle, 2.5 s at that load, to
# import; pyproject pins < 0.7: 0.08 s; benchmarks/bench_startup.py). tests/test_startup.py keeps numpy, ml_dtypes,
# rich, jsonschema and the formats layer out of `import converter.cli`. Each command imports what it uses inside its
# body: the formats layer, ops/, validate/, report/ (rich) and converter.schemas (jsonschema, only for --json).


class _LazyModule:
    """A module imported when one of its attributes is first read (``render.render_inspect`` ...)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str):
        return getattr(importlib.import_module(self._name), attr)


render = _LazyModule("converter.report.render")


class _Command(click.Command):
    """A command whose epilog may be a callable, called only when ``--help`` shows it (start-up)."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        if callable(self.epilog):
            self.epilog = self.epilog()
        super().format_epilog(ctx, formatter)


def _validate_epilog() -> str:
    from converter.validate.findings import codes_help  # lazy: numpy (start-up)
    return exit_codes.epilog() + "\n\n" + codes_help()



def _emit_or_plan(doc: dict, as_json: bool, renderer, schema: str) -> None:
    """The command's report, or under ``--dry-run`` its plan (``schemas/plan.schema.json``)."""
    if doc.get("dry_run"):
        from converter.report.plan import render_plan  # lazy: rich
        _emit(doc, as_json, render_plan, "plan")
    else:
        _emit(doc, as_json, renderer, schema)


def _emit(doc: dict, as_json: bool, renderer, schema: str | None = None) -> None:
    if as_json:
        if schema:
            from converter.schemas import validate_document  # lazy: jsonschema, only for --json
            validate_document(doc, schema)
        click.echo(render.dumps(doc))
    else:
        renderer(doc)
        if doc.get("engine"):  # --engine ray|dask: where the tasks ran
            from converter.report.engine import render_engine  # lazy: only after a distributed run
            render_engine(doc)


@click.group(cls=JsonErrorsGroup, epilog=exit_codes.epilog(), context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show a traceback on errors.")
@click.version_option(package_name="qckpt")
def main(debug: bool) -> None:
    """qckpt: read, convert, validate and audit quantized checkpoints through an explicit layout."""


@main.command(epilog=exit_codes.epilog())
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help=f"Read as this format instead of auto-detecting: {', '.join(FORMAT_NAMES)}.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schemas/inspect.schema.json).")
@handle_errors
def inspect(path: Path, fmt: str | None, as_json: bool) -> None:
    """Format, and each tensor's logical shape, storage, scheme and groups."""
    from converter.formats.registry import load  # lazy: the formats layer (see the top)
    check_format_option(fmt)
    from converter.ops.inspect import inspect as do_inspect
    _emit(do_inspect(load(path, format=fmt)), as_json, render.render_inspect, "inspect")


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
@click.option("--gptq-format", "gptq_format", type=click.Choice(["v1", "v2"]), default=None,
              help="GPTQ output: checkpoint_format 'gptq' (v1, stores z-1) or 'gptq_v2' [default: the source's own "
                   "when it is GPTQ, else v2].")
@click.option("--include", default=None, help="Regex of tensor names to quantize (default: 2-D *.weight).")
@click.option("--exclude", default=None,
              help="Regex of tensor names to keep dense (default: embeddings, norms, lm_head; --to mlx: norms "
                   "only, as mlx-lm, which quantizes the embedding and head too).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help=f"Read SRC as this format instead of auto-detecting: {', '.join(FORMAT_NAMES)}.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (schemas/quantize-report.schema.json).")
@run_options_flags
@shard_size_flag
@engine_options
@handle_errors
def quantize(src, dst, bits, fp8, fp4, fp4_rule, per_tensor, per_channel, group_size, block, sym, scale_dtype, to,
             gptq_format, include, exclude, overwrite, fmt, as_json):
    """Quantize a float checkpoint SRC into DST (a native qckpt file, or --to FORMAT), with an error report."""
    from converter.formats.registry import check_writable  # lazy: the formats layer (see the top)
    from converter.ops.quantize_model import (QuantizeOptions, default_selection,  # lazy: imports the formats layer
                                              quantize_report)
    blocks = None
    if fp4 is not None:
        fp4_rule = fp4_rule or ("mlx" if to == "mlx" else "ct")  # the target's own quantizer by default
        check_fp4_options(fp4, fp4_rule, fp8, bits, sym, scale_dtype, per_tensor, per_channel, group_size, block)
        bits, granularity, group_size = 4, "group", 32 if fp4 == "mxfp4" else 16
    elif fp4_rule is not None:
        raise click.UsageError("--fp4-rule needs --fp4")
    elif fp8 is not None:
        if bits is not None and bits != 8:
            raise click.UsageError(f"--fp8 codes have 8 bits: drop --bits {bits}")
        if not sym:
            raise click.UsageError("--fp8 is symmetric (absmax scales, no zero point): drop --asym")
        granularity, blocks = fp8_granularity_option(per_tensor, per_channel, group_size, block)
        bits = 8
    else:
        if block is not None:
            raise click.UsageError("--block needs --fp8 (integer targets: --per-tensor, --per-channel, --group-size)")
        if bits is None:
            raise click.UsageError("Missing option '--bits' (or --fp8 e4m3|e5m2, --fp4 mxfp4|nvfp4).")
        granularity = granularity_option(per_tensor, per_channel, group_size, required=True)
    if to is not None:
        with usage_errors():
            check_writable(to, dst)
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
    check_format_option(fmt)
    doc = run_on_engine(quantize_report, src, dst, opts=opts, overwrite=overwrite, source_format=fmt,
                        write_options=gptq_options(gptq_format, to or "native"), **kw)
    _emit_or_plan(doc, as_json, render.render_quantize, "quantize-report")


@main.command(epilog=exit_codes.epilog())
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--what-if", is_flag=True, help="Add the same tensors under other layouts (theoretical).")
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help=f"Read as this format instead of auto-detecting: {', '.join(FORMAT_NAMES)}.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schemas/audit.schema.json).")
@handle_errors
def audit(path: Path, what_if: bool, fmt: str | None, as_json: bool) -> None:
    """Bytes by role, bits per weight, theoretical vs measured size."""
    from converter.formats.registry import load  # lazy: the formats layer (see the top)
    check_format_option(fmt)
    from converter.ops.audit import audit as do_audit
    _emit(do_audit(load(path, format=fmt), what_if=what_if), as_json, render.render_audit, "audit")


@main.command(epilog=exit_codes.epilog())
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@click.option("--dtype", type=click.Choice(DENSE_DTYPE_CHOICES), default=None,
              help="Output dtype (default f32): the exact float32 values, rounded once to f16 / bf16.")
@click.option("--match-tool", is_flag=True,
              help="Decode as the producing tool does (mx.dequantize, dequantize_4bit, gguf-py ...): its "
                   "arithmetic and its dtype, byte for byte.")
@click.option("--tool-dtype", type=click.Choice(DENSE_DTYPE_CHOICES), default=None,
              help="With --match-tool: the tool's run-time dtype where it has one (bitsandbytes 4-bit, ModelOpt, "
                   "FP8/FP4 decompressors; default: the file's record).")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help=f"Read SRC as this format instead of auto-detecting: {', '.join(FORMAT_NAMES)}.")
@click.option("--json", "as_json", is_flag=True,
              help="Print a summary as JSON (schemas/dequantize-report.schema.json).")
@run_options_flags
@shard_size_flag
@engine_options
@handle_errors
def dequantize(src, dst, dtype, match_tool, tool_dtype, overwrite, fmt, as_json):
    """Any supported checkpoint SRC -> plain float safetensors DST (file if it ends in .safetensors, else a directory).
    """
    from converter.ops.dequantize import check_destination, dequantize as do_dequantize  # lazy: the formats layer
    with usage_errors():
        check_destination(dst)
    if match_tool and dtype is not None:
        raise click.UsageError("--match-tool writes each tensor in its tool's dtype: leave --dtype out "
                               "(--tool-dtype sets a tool's run-time dtype)")
    if tool_dtype is not None and not match_tool:
        raise click.UsageError("--tool-dtype needs --match-tool")
    check_format_option(fmt)
    doc = run_on_engine(do_dequantize, src, dst, dtype=dtype or "f32", overwrite=overwrite, source_format=fmt,
                        match_tool=match_tool, tool_dtype=tool_dtype)
    _emit_or_plan(doc, as_json, render.render_dequantize, "dequantize-report")


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
@click.option("--gptq-format", "gptq_format", type=click.Choice(["v1", "v2"]), default=None,
              help="GPTQ output: checkpoint_format 'gptq' (v1, stores z-1) or 'gptq_v2' [default: the source's own "
                   "when it is GPTQ, else v2].")
@click.option("--gguf-metadata", "gguf_metadata", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, metavar="FILE.gguf",
              help="--to gguf: take the key/values (tokenizer, hyperparameters) from this GGUF "
                   "(e.g. a vocab-only file).")
@click.option("--gguf-types-from", "gguf_types_from",
              type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None, metavar="FILE.gguf",
              help="--to gguf: give every tensor the ggml type its namesake has in this GGUF (e.g. the one SRC was "
                   "dequantized from: its own Q4_1 / Q8_0 ... mix); a requantization, no other target option.")
@click.option("--overwrite", is_flag=True, help="Replace DST if it exists.")
@click.option("--report", type=click.Path(path_type=Path), default=None, help="Also write the JSON report here.")
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help=f"Read SRC as this format instead of auto-detecting: {', '.join(FORMAT_NAMES)}.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as JSON (convert-report, or error-report when requantizing).")
@table_options
@run_options_flags
@shard_size_flag
@engine_options
@handle_errors
def convert(src, dst, to, per_tensor, per_channel, group_size, bits, fp8, block, sym, scale_dtype, scale_search,
            reference, quant_type, gptq_format, gguf_metadata, gguf_types_from, overwrite, report, fmt, as_json,
            csv_path, top, sort_key, plot):
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
        granularity, blocks = fp8_granularity_option(per_tensor, per_channel, group_size, block)
    elif block is not None:
        raise click.UsageError("--block needs --fp8 (integer targets: --per-tensor, --per-channel, --group-size)")
    else:
        granularity = granularity_option(per_tensor, per_channel, group_size, required=False)
    if to is not None:
        with usage_errors():
            check_writable(to, dst)
    check_format_option(fmt)
    if gguf_metadata is not None and to != "gguf":
        raise click.UsageError("--gguf-metadata is for --to gguf")
    if gguf_types_from is not None:
        if to != "gguf":
            raise click.UsageError("--gguf-types-from is for --to gguf")
        given = [o for o, v in (("--quant-type", quant_type), ("--fp8", fp8), ("--bits", bits), ("--sym/--asym", sym),
                                ("--scale-dtype", scale_dtype), ("--scale-search", scale_search),
                                ("--per-tensor / --per-channel / --group-size", granularity)) if v is not None]
        if given:
            raise click.UsageError(f"--gguf-types-from takes each tensor's type from the file: drop {given[0]}")
    if report:  # checked before any data moves, so a refused report leaves no DST behind
        check_not_inside(src, report)
        if Path(report).resolve() == Path(dst).resolve() or Path(dst).resolve() in Path(report).resolve().parents:
            raise click.UsageError("--report must not be DST or inside it")
        refuse_existing(report, overwrite)
    check_table_options(src, csv_path, top, sort_key, plot, overwrite)
    check_not_inside(src, dst)
    refuse_existing(dst, overwrite)
    requant = granularity is not None or any(v is not None for v in (bits, sym, scale_dtype, scale_search, reference,
                                                                     quant_type, fp8, gguf_types_from))
    if requant:
        from converter.ops.requantize_model import requantize_model  # lazy: imports the formats layer
        from converter.quant.requant import Target
        with usage_errors():
            target = Target(bits=bits, granularity=granularity,
                            group_size=group_size, symmetric=sym, scale_dtype=scale_dtype,
                            scale_search=scale_search or "none", quant_type=quant_type, element=fp8, block=blocks,
                            types_from=str(gguf_types_from) if gguf_types_from is not None else None)
        options = {**gptq_options(gptq_format, to or load(src, format=fmt).format),
                   **({"gguf_metadata": gguf_metadata} if gguf_metadata is not None else {})}
        doc, schema, renderer = (run_on_engine(requantize_model, src, dst, target=target, to=to, reference=reference,
                                               overwrite=overwrite, source_format=fmt, write_options=options),
                                 "error-report", render.render_error_report)
    else:
        from converter.ops.convert import convert_exact  # lazy: imports the formats layer
        to = to or load(src, format=fmt).format
        options = {**gptq_options(gptq_format, to),
                   **({"gguf_metadata": gguf_metadata} if gguf_metadata is not None else {})}
        doc = run_on_engine(convert_exact, src, dst, to=to, overwrite=overwrite, source_format=fmt,
                            options=options or None)
        schema, renderer = "convert-report", render.render_convert
    if report:
        from converter.schemas import validate_document  # lazy: jsonschema, only for --report
        validate_document(doc, schema)
        with atomic_output(report, overwrite=overwrite) as tmp:
            Path(tmp).write_text(render.dumps(doc) + "\n")
    export_tables(doc, csv_path, top, sort_key, plot, overwrite,
                   f"{doc['source_format']} -> {doc['target_format']}: {Path(dst).name}")
    _emit_or_plan(doc, as_json, renderer, schema)


@main.command(epilog="Exit status: 0 identical within --tolerance, 1 not, 2 usage error, 3 unreadable input.")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@click.option("--tolerance", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Largest relative Frobenius error per tensor counted as the same (0: bit-identical values).")
@click.option("--format-a", "format_a", default=None, metavar="FORMAT", help="Format of A (default: detected).")
@click.option("--format-b", "format_b", default=None, metavar="FORMAT", help="Format of B (default: detected).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schemas/diff-report.schema.json).")
@handle_errors
def diff(a, b, tolerance, format_a, format_b, as_json):
    """Compare checkpoint B against A (the reference), tensor by tensor in the logical model, in any formats:
    relative Frobenius error, SQNR, max error, worst channel, output-space error on a seeded batch."""
    from converter.ops.diff import diff as do_diff  # lazy: imports the formats layer
    from converter.report.diff import render_diff
    check_format_option(format_a)  # an unknown name is a usage error (exit 2), as --format elsewhere
    check_format_option(format_b)
    doc = do_diff(a, b, tolerance=tolerance, format_a=format_a, format_b=format_b)
    _emit(doc, as_json, render_diff, "diff-report")
    sys.exit(doc["exit_code"])


@main.command(cls=_Command, epilog=_validate_epilog)
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--reference", type=click.Path(exists=True, path_type=Path), default=None,
              help="Float checkpoint to compare dequantized weights and dequant(W) @ x against.")
@click.option("--strict", is_flag=True, help="Warnings also give exit status 1.")
@click.option("--checksums", is_flag=True, help="Also hash every data file (SHA-256) against its Hugging Face cache "
              "blob name, a SHA256SUMS entry or its git-LFS pointer.")
@click.option("--self-test", "self_test", is_flag=True, help="Run the axis probes on every writable format instead.")
@click.option("--format", "fmt", default=None, metavar="FORMAT",
              help=f"Read PATH as this format instead of auto-detecting: {', '.join(FORMAT_NAMES)}.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (schemas/validation-report.schema.json).")
@table_options
@click.option("--overwrite", is_flag=True, help="Replace an existing --csv / --plot file.")
@run_options_flags(budget="tensors")
@handle_errors
def validate(path, reference, strict, checksums, self_test, fmt, as_json, csv_path, top, sort_key, plot, overwrite):
    """Check PATH before deployment: structure, axis/zero/nibble layout from the data, optional reference."""
    from converter.report.validation import render_self_test, render_validation
    from converter.validate import self_test as do_self_test, validate as do_validate
    if self_test:
        doc = do_self_test()
        _emit(doc, as_json, render_self_test, "probe-report")
        sys.exit(doc["exit_code"])
    if path is None:
        raise click.UsageError("give PATH (or --self-test)")
    check_format_option(fmt)
    if (csv_path is not None or plot is not None) and reference is None:
        raise click.UsageError("--csv and --plot tabulate the --reference check: give --reference FLOAT_CKPT")
    check_table_options(path, csv_path, top, sort_key, plot, overwrite)
    rep = do_validate(path, reference=reference, strict=strict, checksums=checksums, fmt=fmt)
    doc = rep.to_json()
    title = f"validate {Path(path).name} vs {Path(reference).name}" if reference is not None else ""
    export_tables(doc, csv_path, top, sort_key, plot, overwrite, title)
    _emit(doc, as_json, render_validation, "validation-report")
    sys.exit(rep.exit_code)


if __name__ == "__main__":  # pragma: no cover
    main()
