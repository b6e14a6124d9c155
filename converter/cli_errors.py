"""How the ``qckpt`` command reports an error: one line on stderr (or one JSON object on stdout under
``--json``, ``schemas/error.schema.json``), the exit status of :mod:`converter.exit_codes`, and a
traceback only under ``qckpt --debug``.

Used by :mod:`converter.cli` only; imports nothing heavy at module level (start-up time, issue 18).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import traceback

import click

import converter.exit_codes as exit_codes
from converter.errors import ConverterError


def traceback_if_debug(ctx: click.Context) -> None:
    """``qckpt --debug``: the traceback on stderr, then the same one-line error and exit status."""
    if ctx.find_root().params.get("debug"):
        traceback.print_exc()


def _json_value(v):
    return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)


def fail(ctx: click.Context, code: int, message: str, *, error: str, exc: ConverterError | None = None) -> None:
    """Report one error and exit with ``code``: one line on stderr, or under ``--json`` one JSON object
    on stdout (``schemas/error.schema.json``), so a script reading stdout always gets JSON."""
    if ctx.params.get("as_json"):
        from converter.report.render import dumps  # lazy: rich (start-up)
        fields = ("file", "tensor", "field", "expected", "found", "hint")
        doc = {"schema": "qckpt.error/1", "error": error, "exit_code": code, "message": message,
               **{k: _json_value(getattr(exc, k, None)) for k in fields}}
        click.echo(dumps(doc))
    else:
        click.echo(f"qckpt: error: {message}", err=True)
    sys.exit(code)


class JsonErrorsGroup(click.Group):
    """The command group: under ``--json``, click's own usage errors (a missing argument, an unknown option, a
    bad option value: found while parsing, before a command's :func:`handle_errors` runs) are one JSON object on
    stdout too (``schemas/error.schema.json``, exit status 2), as every other error is."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        argv = list(sys.argv[1:] if args is None else args)
        if not standalone_mode or "--json" not in argv:
            return super().main(argv, prog_name, complete_var, standalone_mode, **extra)
        try:
            return super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            from converter.report.render import dumps  # lazy: rich (start-up)
            click.echo(dumps({"schema": "qckpt.error/1", "error": "UsageError", "exit_code": exit_codes.USAGE,
                              "message": exc.format_message(), "file": None, "tensor": None,
                              "field": getattr(exc, "param_hint", None) if isinstance(
                                  getattr(exc, "param_hint", None), str) else None,
                              "expected": None, "found": None, "hint": None}))
            sys.exit(exit_codes.USAGE)
        except click.exceptions.Exit as exc:
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("qckpt: aborted", err=True)
            sys.exit(exit_codes.INTERRUPTED)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)


def handle_errors(fn):
    """Decorate a command: a ConverterError, an OS error or Ctrl-C becomes one line (or one JSON
    object) and its exit status; a usage error under ``--json`` becomes a JSON object too."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        ctx = click.get_current_context()
        try:
            return fn(*args, **kwargs)
        except ConverterError as exc:
            traceback_if_debug(ctx)
            exc.hint = getattr(exc, "cli_hints", {}).get(exc.hint, exc.hint)  # library words -> option names
            if ctx.params.get("as_json"):
                fail(ctx, exc.exit_code, exc.message, error=type(exc).__name__, exc=exc)
            fail(ctx, exc.exit_code, exc.render(), error=type(exc).__name__)
        except click.UsageError as exc:
            if not ctx.params.get("as_json"):
                raise
            fail(ctx, exit_codes.USAGE, exc.format_message(), error="UsageError")
        except OSError as exc:  # the OS refused a read or write (permissions, disk full ...): one line
            traceback_if_debug(ctx)
            where = f"{exc.filename}: " if exc.filename else ""
            fail(ctx, exit_codes.UNREADABLE, f"{where}{exc.strerror or exc}", error=type(exc).__name__)
        except KeyboardInterrupt:
            click.echo("qckpt: interrupted; no partial output left", err=True)
            sys.exit(exit_codes.INTERRUPTED)
    return wrapper


@contextlib.contextmanager
def usage_errors():
    """The one place option errors become usage errors (exit 2): a ConverterError raised while
    checking the command line (an unknown or read-only ``--to`` format, a requantize Target
    conflict) is about the options, not the input."""
    try:
        yield
    except ConverterError as exc:
        raise click.UsageError(exc.render()) from None


def check_format_option(fmt: str | None) -> None:
    """``--format NAME`` names a registered format; an unknown name is a usage error (exit 2), like
    ``convert --to``."""
    if fmt is not None:
        from converter.formats.registry import get  # lazy: the formats layer (start-up)
        with usage_errors():
            get(fmt)
