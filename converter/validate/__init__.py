"""Validation of quantized checkpoints: structure, axis probes, data-driven checks, reference checks.

``validate(path, reference=None, strict=False) -> ValidationReport`` (see :mod:`.run`);
``self_test()`` runs the axis probes on every writable format (see :mod:`.probes`). Finding codes
are defined once in :data:`converter.validate.findings.CODES`.

A format's quirks the validator needs are fields of its handler
(:class:`converter.formats.registry.ValidationHooks`); validate/ reads them from there and never
tests a format's name.
"""

from __future__ import annotations

import sys
import types

from converter.validate.findings import CODES, Finding
from converter.validate.report import ValidationReport

__all__ = ["validate", "self_test", "ValidationReport", "Finding", "CODES"]


def validate(path, reference=None, strict: bool = False, checksums: bool = False, fmt: str | None = None):
    """Validate a checkpoint; see :func:`converter.validate.run.validate`."""
    # lazy: the CLI imports this package at start-up (validate.findings, for --help); run pulls in every format
    from converter.validate.run import validate as _validate
    return _validate(path, reference=reference, strict=strict, checksums=checksums, fmt=fmt)


def self_test(**kwargs):
    """Run the axis probes on every registered format with a writer; see :func:`converter.validate.probes.self_test`."""
    from converter.validate.probes import self_test as _self_test  # lazy: pulls in every format (as above)
    return _self_test(**kwargs)



class _CallableValidate(types.ModuleType):
    """``converter.validate(path, ...)``: this package is also the ``qckpt validate`` one-call function
    (``converter.validate`` names the package once any of its modules is imported, so the package itself
    is the callable; see :func:`converter.api.validate`)."""

    def __call__(self, path, *, reference=None, strict: bool = False, checksums: bool = False,
                 format: str | None = None):
        return validate(path, reference=reference, strict=strict, checksums=checksums, fmt=format)


sys.modules[__name__].__class__ = _CallableValidate
