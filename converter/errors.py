"""Typed errors for qckpt.

Every error raised on purpose derives from :class:`ConverterError`. Leaves also subclass the
builtin that best describes them (``ValueError``, ``FileNotFoundError`` ...), so callers may
catch either. Messages name the file, the tensor and the field, with expected vs found, so the
CLI can print one line and exit non-zero without a traceback.

An error may also carry a machine-readable :class:`ErrorKind` (``kind=``): what it is about, for
tools that act on it (the validator turns a reader error into a finding code by its kind, its
type and its field, never by its wording).
"""

from __future__ import annotations

import enum
from pathlib import Path

import converter.exit_codes as exit_codes


def exact_str(value: object) -> str:
    """A number for a message (``found=``): the shortest decimal that reads back as the same value in its
    own dtype. A numpy scalar prints that way (float32 ``124.00012``, never rounded to ``124``; a float16
    ``10.33``), a Python float as its ``repr``; so pass the stored element, not ``float(x):g``."""
    return str(value)


class ErrorKind(enum.Enum):
    """What an error is about, when its type and field do not say it.

    Members
    -------
    CONFIG_MISMATCH
        The config (``config.json``, ``quantization_config``, GGUF hyperparameters) contradicts
        the stored tensors, or is missing what the tensors need.
    SHAPE
        A stored array's shape (or byte size) contradicts the layout it must have.
    ZERO_POINT_RANGE
        Stored zero points lie outside the code range of the scheme.
    """

    CONFIG_MISMATCH = "config-mismatch"
    SHAPE = "shape"
    ZERO_POINT_RANGE = "zero-point-range"


class ConverterError(Exception):
    """Root of every error qckpt raises on purpose.

    Parameters
    ----------
    message : str
        What went wrong, in one sentence.
    file : str or Path, optional
        The file being read or written.
    tensor : str, optional
        The tensor name (as stored) involved.
    field : str, optional
        The header / config / array field involved (``"shape"``, ``"data_offsets"`` ...).
    expected, found : object, optional
        What the format requires and what was found.
    hint : str, optional
        What the user can do about it.
    kind : ErrorKind, optional
        What the error is about, machine-readable (see :class:`ErrorKind`); not rendered.
    """

    exit_code = exit_codes.UNREADABLE

    def __init__(self, message: str, *, file: str | Path | None = None, tensor: str | None = None,
                 field: str | None = None, expected: object = None, found: object = None,
                 hint: str | None = None, kind: ErrorKind | None = None) -> None:
        self.message = message
        self.kind = kind
        self.file = str(file) if file is not None else None
        self.tensor = tensor
        self.field = field
        self.expected = expected
        self.found = found
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        """One line: ``file: tensor 'x' field 'y': message (expected E, found F). hint``."""
        parts = []
        if self.file:
            parts.append(f"{self.file}:")
        if self.tensor:
            parts.append(f"tensor {self.tensor!r}")
        if self.field:
            parts.append(f"field {self.field!r}:")
        elif self.tensor:
            parts[-1] += ":"
        parts.append(self.message)
        text = " ".join(parts)
        if self.expected is not None and self.found is not None:
            text += f" (expected {self.expected}, found {self.found})"
        elif self.found is not None:  # nothing to compare with: say what was found, no "expected None"
            text += f" (found {self.found})"
        elif self.expected is not None:
            text += f" (expected {self.expected})"
        if self.hint:
            text += f". {self.hint}"
        return text

    def with_context(self, *, file: str | Path | None = None, tensor: str | None = None) -> "ConverterError":
        """Fill in file / tensor if not already set (context added at a boundary); returns self."""
        if file is not None and self.file is None:
            self.file = str(file)
        if tensor is not None and self.tensor is None:
            self.tensor = tensor
        self.args = (self.render(),)
        return self


class InputNotFoundError(ConverterError, FileNotFoundError):
    """A path given to qckpt, or a shard named by an index, does not exist."""


class CorruptFileError(ConverterError, ValueError):
    """A file's bytes do not follow its container format (safetensors header, GGUF, JSON)."""


class UnsafeFormatError(ConverterError, ValueError):
    """A pickle-based file (.bin, .pt, .pth, .ckpt) that qckpt refuses to read."""


class UnknownFormatError(ConverterError, ValueError):
    """No registered format recognises the input, or several do (the message lists candidates)."""


class FormatError(ConverterError, ValueError):
    """The container is fine, but tensors or config contradict the format's layout."""


class MalformedInputError(FormatError):
    """Safety net: a reader failed with a non-qckpt exception on input it did not validate.

    Raised only by :func:`converter.formats.registry.load` around a format's reader, so a CLI user
    still gets one line and exit status 3; the message names the internal exception, which is a
    bug to fix at the boundary where the input entered (the fuzzer counts these as failures).
    """


class MissingTensorError(FormatError, KeyError):
    """A partner tensor the format requires (``scales`` for ``qweight``, ...) is absent."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.render()


class LayoutError(ConverterError, ValueError):
    """An axis map, group map or scheme violates an invariant (checked at construction)."""


class QuantizationError(ConverterError, ValueError):
    """Arithmetic cannot be done safely (scale overflow in the scale dtype, codes out of range)."""


class UnsupportedError(ConverterError, NotImplementedError):
    """A valid request qckpt does not support (a quant type, a target that cannot hold the scheme)."""


class NotRepresentableError(UnsupportedError):
    """An exact repack was asked for but the target cannot hold the source scheme; says which option requantizes."""


class OutputWriteError(ConverterError, OSError):
    """Writing the output failed (disk full, I/O error ...): names the file and the OS error."""


class WorkerDiedError(ConverterError, RuntimeError):
    """A worker process ended without reporting (killed by a signal, e.g. by the kernel for memory)."""


class OptionValueError(ConverterError, ValueError):
    """An option's value is not one the command knows (``--quant-type Q4_K_Z``), found where the value is
    interpreted; a usage error (exit 2), the known values listed."""

    exit_code = exit_codes.USAGE


class MissingExtraError(UnsupportedError):
    """An option needs an optional extra that is not installed (``--plot``: ``plot``; compiled kernels:
    ``fast``); the message names the ``pip install`` line. A usage error: the same command without the
    option, or with the extra installed, works."""

    exit_code = exit_codes.USAGE


class EngineError(ConverterError, RuntimeError):
    """A distributed engine (``--engine ray|dask``) cannot run the job: the cluster cannot be reached, a node
    runs another qckpt version, or a task was lost more times than the retries allow (a missing extra is
    :class:`MissingExtraError`)."""


class ProofFailedError(ConverterError):
    """The staged output read back does not match what was written: nothing is committed."""


class OutputExistsError(ConverterError, FileExistsError):
    """The destination exists and ``overwrite=True`` (the CLI's ``--overwrite``) was not given, or DST
    is (inside) SRC."""

    exit_code = exit_codes.USAGE
    #: The CLI's wording of a library hint that names ``overwrite=True``.
    cli_hints = {"pass overwrite=True to replace it": "pass --overwrite to replace it"}
