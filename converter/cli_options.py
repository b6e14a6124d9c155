"""The option groups and option parsing shared by ``qckpt``'s commands (click): run options (``--workers``,
``--max-memory``, ``--quiet``, ``--verbose``), output options (``--max-shard-size``, ``--dry-run``), writer options
(``--gptq-format``), the granularity words of a requantize / quantize target, and the per-tensor error tables
(``--csv`` / ``--sort`` / ``--top`` / ``--plot``). Kept apart from :mod:`converter.cli` (the commands) so each
stays one concept; like it, nothing here imports numpy at module level (start-up, tests/test_startup.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import warnings
from pathlib import Path
from typing import Any, Callable

import click

from converter.distributed.executor import ENGINES
from converter.cli_errors import usage_errors
from converter.errors import ConverterError
from converter.kernels import compiled
from converter.runtime import fixed_mmap_threshold, limit_blas_threads, parse_shard_size, parse_size, run_options
from converter.vocabulary import (FP8_GRANULARITY_OPTIONS, GRANULARITY_OPTIONS, granularity_of, granularity_options,
                                  parse_block)
from converter.write.atomic import atomic_output, check_not_inside, refuse_existing

_MEMORY_HELP = "Working-memory budget for all workers, e.g. 512M or 2G (default 320M); "
#: how each kind of command keeps to the budget, by the run_options_flags ``budget`` word
_BUDGET_HELP = {"rows": "larger tensors go in row blocks.",
                "tensors": "tensors are checked whole, as many side by side as fit (at least one)."}

__all__ = ["run_options_flags", "shard_size_flag", "engine_options", "run_on_engine", "gptq_options",
           "granularity_option", "fp8_granularity_option",
           "check_fp4_options", "table_options", "check_table_options", "export_tables"]


def run_options_flags(fn=None, *, budget: str = "rows"):
    """``--workers N``, ``--max-memory SIZE``, ``--quiet``, ``--verbose``: one place for every command that reads or
    writes tensor data (see :mod:`converter.write.engine`). ``budget`` says in ``--help`` how the command keeps
    to the memory budget: ``"rows"`` (writes: row blocks) or ``"tensors"`` (validate: workers that fit)."""
    if fn is None:
        return functools.partial(run_options_flags, budget=budget)

    @click.option("--workers", type=click.IntRange(1), default=None,
                  help="Worker processes (default: the number of cores); output is identical for any N.")
    @click.option("--max-memory", default=None, metavar="SIZE", help=_MEMORY_HELP + _BUDGET_HELP[budget])
    @click.option("--quiet", is_flag=True, help="No progress bar on stderr.")
    @click.option("--verbose", is_flag=True,
                  help="Diagnostics on stderr: compiled kernels' first-call compile / cache-load seconds "
                       "(pip install 'qckpt[fast]'; QCKPT_KERNELS=auto|numpy|numba).")
    @functools.wraps(fn)
    def wrapper(*args, workers=None, max_memory=None, quiet=False, verbose=False, **kwargs):
        # processes, not BLAS threads, share the cores (--workers). Set before numpy loads OpenBLAS (the commands
        # import it lazily), the variable keeps OpenBLAS from starting its idle threads at all: they spin ~0.1 s
        # of CPU after each start, in this process and again in every forked worker (measured: -0.2 s CPU of 1.6
        # on an exact repack of 4 7B layers); limit_blas_threads covers a numpy already loaded.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        limit_blas_threads(1)
        fixed_mmap_threshold()  # large buffers go back to the system when freed: flat RSS
        try:
            mem = parse_size(max_memory) if max_memory is not None else None
        except ConverterError as exc:
            raise click.BadParameter(exc.render(), param_hint="--max-memory") from None
        with usage_errors():  # QCKPT_KERNELS checked before any work (an unknown word, numba missing)
            kernels = compiled.mode()
        with run_options(workers=workers, max_memory=mem, quiet=quiet, verbose=verbose), quiet_float_warnings():
            out = fn(*args, **kwargs)
        if verbose:
            _kernel_summary(kernels)
        return out
    return wrapper


#: numpy's floating-point warnings (``RuntimeWarning: invalid value encountered in multiply`` ...): a checkpoint with
#: non-finite scales decodes to NaN / inf, which qckpt's own checks then name (validate's ``scale-nonfinite``, the
#: requantizer's "input values are not all finite" error): the CLI prints those, not numpy's two lines of source.
_FLOAT_WARNINGS = r"(invalid value|overflow|divide by zero|underflow) encountered in"


@contextlib.contextmanager
def quiet_float_warnings():
    """Within the block, numpy's floating-point ``RuntimeWarning`` s are not printed (:data:`_FLOAT_WARNINGS`; the
    filter is the process's, so the kernels' threads and forked workers obey it too); restored after."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_FLOAT_WARNINGS, category=RuntimeWarning)
        yield


def _kernel_summary(kernels: str) -> None:
    """``--verbose``: which kernel path this process took (compiled kernels in worker processes print their own
    first-call lines)."""
    used = compiled.compile_seconds()
    workers = "; worker processes print their own first calls above"
    if used:
        what = f"{len(used)} compiled kernel(s) called in this process{workers}"
    elif kernels == "numpy":
        what = "numpy kernels (QCKPT_KERNELS=numpy)"
    elif not compiled.available():
        what = "numpy kernels (numba is not installed: pip install 'qckpt[fast]')"
    else:
        what = (f"no compiled kernel called in this process (auto: calls on fewer than {compiled.MIN_ELEMENTS:,} "
                f"values stay on numpy; QCKPT_KERNELS=numba compiles every call{workers})")
    click.echo(f"qckpt: kernels: {what}", err=True)


def gptq_options(gptq_format: str | None, to: str) -> dict:
    """Writer options from ``--gptq-format`` (a usage error for any other target)."""
    if gptq_format is None:
        return {}
    if to != "gptq":
        raise click.UsageError(f"--gptq-format is an option of the gptq writer, not of {to!r}: "
                               "drop it or use --to gptq")
    return {"checkpoint_format": {"v1": "gptq", "v2": "gptq_v2"}[gptq_format]}


def shard_size_flag(fn):
    """``--max-shard-size SIZE`` for every command that writes a model directory (the writers' default,
    through the run options: :data:`converter.runtime.DEFAULT_MAX_SHARD_SIZE`); with a GGUF target an explicit size
    (or ``--max-shard-tensors N``) splits the GGUF (run options ``gguf_split_size`` / ``gguf_split_tensors``)."""
    @click.option("--max-shard-size", "max_shard_size", default=None, metavar="SIZE",
                  help="Bytes of tensor data per output shard of a model directory, e.g. 500MB, 5GB, 2GiB "
                       "(GB = 10**9, as transformers and the Hub count); 0 writes one model.safetensors "
                       "[default: 5GB]. GGUF output is one file unless given: then the parts "
                       "NAME-00001-of-0000N.gguf of a split GGUF, as llama.cpp's converter --split-max-size writes "
                       "them.")
    @click.option("--max-shard-tensors", "max_shard_tensors", default=None, type=click.IntRange(min=1),
                  metavar="N", help="GGUF output: at most N tensors per part of a split GGUF (llama.cpp's "
                                    "--split-max-tensors).")
    @click.option("--dry-run", "dry_run", is_flag=True,
                  help="Print the plan (per tensor: exact or lossy and why, target scheme; output files and sizes; "
                       "config changes) and write nothing.")
    @functools.wraps(fn)
    def wrapper(*args, max_shard_size=None, max_shard_tensors=None, dry_run=False, **kwargs):
        gguf_out = kwargs.get("to") == "gguf" or str(kwargs.get("dst", "")).endswith(".gguf")
        if max_shard_tensors is not None and not gguf_out:
            raise click.UsageError("--max-shard-tensors splits GGUF output; give --to gguf (or drop it)")
        split = {}
        if gguf_out and (max_shard_size is not None or max_shard_tensors is not None):
            try:
                split = {"gguf_split_size": parse_shard_size(max_shard_size or 0),
                         "gguf_split_tensors": max_shard_tensors or 0}
            except ConverterError as exc:
                raise click.BadParameter(exc.render(), param_hint="--max-shard-size") from None
            max_shard_size = None
        if max_shard_size is not None and str(kwargs.get("dst", "")).endswith(".safetensors"):
            raise click.UsageError("--max-shard-size shards model directories; a DST ending in .safetensors is one "
                                   "file: give a directory DST to shard")
        try:
            size = parse_shard_size("5GB" if max_shard_size is None else max_shard_size)
        except ConverterError as exc:
            raise click.BadParameter(exc.render(), param_hint="--max-shard-size") from None
        if dry_run:
            for option in ("report", "csv_path", "plot"):
                if kwargs.get(option) is not None:
                    raise click.UsageError(f"--dry-run writes nothing: drop --{option.replace('_path', '')}")
        with run_options(max_shard_size=size, dry_run=dry_run or None, **split):
            return fn(*args, **kwargs)
    return wrapper


#: The command's ``--engine`` / ``--address`` (set by :func:`engine_options`).
_ENGINE: contextvars.ContextVar[tuple[str, str | None]] = contextvars.ContextVar("qckpt_engine",
                                                                                 default=("local", None))


def engine_options(fn):
    """``--engine local|ray|dask`` and ``--address auto|HOST:PORT`` for the commands that write a model
    directory; the command body runs its work through :func:`run_on_engine`."""
    @click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True,
                  help="Where the shards are written: this machine's process pool, or a Ray / Dask cluster, one "
                       "output shard per task, committed atomically (needs pip install 'qckpt[ray]' / "
                       "'qckpt[dask]' and a filesystem every node shares).")
    @click.option("--address", default=None, metavar="auto|HOST:PORT",
                  help="With --engine ray|dask: the cluster to join (Ray: auto finds a running one) [default: start "
                       "a local cluster of --workers slots on 127.0.0.1].")
    @functools.wraps(fn)
    def wrapper(*args, engine="local", address=None, **kwargs):
        if address is not None and engine == "local":
            raise click.UsageError("--address names a Ray or Dask cluster: give --engine ray or --engine dask")
        if engine != "local":
            dst = str(kwargs.get("dst", ""))
            if kwargs.get("to") == "gguf" or dst.endswith((".gguf", ".safetensors")):
                raise click.UsageError(f"--engine {engine} writes a model directory, one output shard per task; "
                                       f"{Path(dst).name} is one file: give a directory DST or drop --engine")
        token = _ENGINE.set((engine, address))
        try:
            return fn(*args, **kwargs)
        finally:
            _ENGINE.reset(token)
    return wrapper


def run_on_engine(fn: Callable[..., Any], src, dst, *, overwrite: bool, **kwargs: Any) -> Any:
    """``fn(src, dst, overwrite=overwrite, **kwargs)`` here, or under ``--engine ray|dask`` through
    :func:`converter.distributed.job.run_command` (``fn`` must then be a module-level function)."""
    engine, address = _ENGINE.get()
    if engine == "local":
        return fn(src, dst, overwrite=overwrite, **kwargs)
    from converter.distributed.job import run_command  # lazy: numpy and the write engine
    return run_command(fn, src, dst, engine=engine, address=address, overwrite=overwrite, **kwargs)


def granularity_option(per_tensor: bool, per_channel: bool, group_size: int | None, *, required: bool) -> str | None:
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


def fp8_granularity_option(per_tensor: bool, per_channel: bool, group_size: int | None, block: str | None
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


def check_fp4_options(fp4, rule, fp8, bits, sym, scale_dtype, per_tensor, per_channel, group_size, block) -> None:
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


def table_options(f):
    """``--csv`` / ``--top`` / ``--sort`` / ``--plot``: the per-layer error table of a report (report/tables.py)."""
    f = click.option("--plot", "plot", type=click.Path(path_type=Path), default=None, metavar="FILE.png|.svg",
                     help="Draw error against layer index per tensor role (needs: pip install 'qckpt[plot]').")(f)
    f = click.option("--sort", "sort_key", type=click.Choice(["sqnr", "rel_error", "max_error", "name"]),
                     default=None, help="Order of the --csv rows, worst first (default sqnr).")(f)
    f = click.option("--top", type=click.IntRange(1), default=None, help="Keep the first N --csv rows.")(f)
    return click.option("--csv", "csv_path", type=click.Path(path_type=Path), default=None, metavar="FILE",
                        help="Write the per-tensor error table as CSV (name, layer, role, sqnr_db, rel_error, "
                             "max_error ...).")(f)


def check_table_options(src, csv_path, top, sort_key, plot, overwrite) -> None:
    """Before any work: --top / --sort need --csv; the outputs are new (or --overwrite) and outside SRC;
    --plot has a .png / .svg name and matplotlib."""
    if (top is not None or sort_key is not None) and csv_path is None:
        raise click.UsageError("--top and --sort order the --csv rows: give --csv FILE")
    for out in (p for p in (csv_path, plot) if p is not None):
        check_not_inside(src, out)
        refuse_existing(out, overwrite)
    if plot is not None:
        if Path(plot).suffix.lower() not in (".png", ".svg"):
            raise click.UsageError(f"--plot writes FILE.png or FILE.svg, not {Path(plot).name}")
        from converter.report.plot import check_plot_path  # lazy: matplotlib, only for --plot
        check_plot_path(plot)


def export_tables(doc, csv_path, top, sort_key, plot, overwrite, title) -> None:
    from converter.report import tables  # lazy: only for --csv / --plot
    rows = tables.error_rows(doc)
    if csv_path is not None:
        with atomic_output(csv_path, overwrite=overwrite) as tmp:
            tables.write_csv(tables.sort_rows(rows, sort_key or "sqnr", top), tmp)
    if plot is not None:
        from converter.report.plot import plot_errors  # lazy: matplotlib
        with atomic_output(plot, overwrite=overwrite) as tmp:
            plot_errors(rows, tmp, title, Path(plot).suffix.lower().lstrip("."))
