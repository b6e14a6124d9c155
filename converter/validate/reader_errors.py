"""Reader errors -> findings: which errors mean unreadable (exit 3) and which finding code the others
become, by the error's type, its :class:`~converter.errors.ErrorKind` and its field (see
:mod:`converter.validate.structural` for what counts as unreadable).
"""

from __future__ import annotations



from converter.errors import (ConverterError, CorruptFileError, ErrorKind, InputNotFoundError, LayoutError,
                              MissingTensorError, UnsupportedError)
from converter.validate.findings import Finding, finding

# -- reader errors -> findings ---------------------------------------------------------------------
def unreadable(exc: ConverterError) -> bool:
    """True for errors that mean the input cannot be read at all (exit 3, see module docstring)."""
    if isinstance(exc, (UnsupportedError, InputNotFoundError)):
        return True
    return isinstance(exc, CorruptFileError) and not isinstance(exc, MissingTensorError)


#: Finding code of each reader error kind (:class:`~converter.errors.ErrorKind`).
KIND_CODES = {ErrorKind.CONFIG_MISMATCH: "config-mismatch", ErrorKind.SHAPE: "shape",
              ErrorKind.ZERO_POINT_RANGE: "zero-range"}


def classify(exc: ConverterError) -> str:
    """Finding code for a reader error: by its type, its :class:`~converter.errors.ErrorKind`, else
    its field (never its wording)."""
    if isinstance(exc, MissingTensorError):
        return "missing-tensor"
    if exc.kind is not None:
        return KIND_CODES[exc.kind]
    f = (exc.field or "").lower()
    if "actorder" in f:
        return "config-mismatch"
    if "g_idx" in f:
        return "g-idx"
    if "padding" in f:
        return "padding"
    if isinstance(exc, LayoutError) and f == "codes":
        return "code-range"
    if f.startswith("dtype") or f.endswith("dtype"):
        return "dtype"
    if "quantization" in f or "config" in f or "checkpoint_format" in f or f in ("sym", "bits", "group_size"):
        return "config-mismatch"
    if f.startswith("shape"):
        return "shape"
    return "format"


def error_finding(exc: ConverterError, tensor: str | None = None) -> Finding:
    """A finding from a reader error, with the reader's message as evidence."""
    code = classify(exc)
    return finding(code, tensor or exc.tensor, exc.message, reader_error=exc.render(), file=exc.file,
                   stored_tensor=exc.tensor, field=exc.field, expected=exc.expected, found=exc.found, hint=exc.hint)
