"""The registry's safety net around format code that runs on foreign data: only
:class:`~converter.errors.ConverterError` escapes (:func:`guarded`), also from the row blocks a reader makes
(:func:`guarded_row_blocks`). Used by :func:`converter.formats.registry.read` and validation hooks."""

from __future__ import annotations

import functools
import struct
from pathlib import Path

from converter.errors import ConverterError, MalformedInputError

__all__ = ["guarded", "guarded_row_blocks"]

#: Exceptions a reader may raise on unvalidated foreign data (wrapped by :func:`guarded`).
_FOREIGN_DATA_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError,
                        ZeroDivisionError, struct.error, RecursionError)


def guarded(fn, path: Path, fmt: str):
    """``fn`` wrapped so only ConverterError escapes: fill in the file on ours, wrap foreign ones.

    Use it around any format code that runs on foreign data outside :func:`converter.formats.registry.read`
    (validation hooks).
    """
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConverterError as exc:
            exc.with_context(file=path)
            raise
        except _FOREIGN_DATA_ERRORS as exc:
            tensor = args[0] if args and isinstance(args[0], str) else None
            raise MalformedInputError(f"the {fmt} reader failed on input it did not validate "
                                      f"({type(exc).__name__}: {str(exc)[:200]})", file=path, tensor=tensor,
                                      hint="the file is malformed; please report this so the reader names the field"
                                      ) from exc
    return call


_END = object()


def guarded_row_blocks(fn, path: Path, fmt: str):
    """A reader's ``row_blocks`` function (:meth:`converter.tensor.Checkpoint.row_blocks`) under :func:`guarded`:
    the call and each block it yields (the reading happens while iterating), so only ConverterError escapes."""
    call = guarded(fn, path, fmt)

    def row_blocks(name: str, values_only: bool = False):
        blocks = call(name, values_only)
        if blocks is None:
            return None
        step = guarded(lambda _name: next(blocks, _END), path, fmt)  # (``_name``: the tensor the error names)

        def each():
            while (item := step(name)) is not _END:
                yield item
        return each()
    return row_blocks
