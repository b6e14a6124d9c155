"""The validation report: findings, per-tensor statistics, JSON (``schemas/validation-report.schema.json``),
exit status.

Its human rendering is :func:`converter.report.validation.render_validation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from converter.exit_codes import FINDINGS, OK
from converter.validate.findings import CODES, SEVERITIES, Finding, jsonable

SCHEMA = "qckpt.validation-report/1"


@dataclass
class ValidationReport:
    """What ``validate`` found.

    Attributes
    ----------
    path : str
    format : str or None
        Detected format (None when the files could not be opened as a checkpoint).
    reference : str or None
    strict : bool
        Warnings count as findings for the exit status.
    findings : list of Finding
    checks : list of str
        Check families that ran: ``files``, ``structure``, ``data``, ``reference``.
    tensors : dict
        Per quantized tensor: saturation, zero offset and reference statistics.
    """

    path: str
    format: str | None = None
    reference: str | None = None
    strict: bool = False
    findings: list[Finding] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: tensors that could not be checked (quantized, opaque or dense): an undecodable type, a reader error
    unchecked: list[str] = field(default_factory=list)
    #: dense (unquantized) tensors whose values were checked (:mod:`converter.validate.dense_checks`)
    dense_checked: int = 0
    #: ``validate --checksums``: one entry per file hashed (see :mod:`converter.validate.checksums`)
    checksums: list[dict[str, Any]] | None = None

    def add(self, *findings: Finding) -> None:
        self.findings.extend(findings)

    def counts(self) -> dict[str, int]:
        return {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}

    @property
    def exit_code(self) -> int:
        """0 clean; 1 with an error finding (or, under ``strict``, a warning or a tensor
        left unchecked). Info never fails."""
        c = self.counts()
        if c["error"] or (self.strict and (c["warning"] or self.unchecked)):
            return FINDINGS
        return OK

    @property
    def verdict(self) -> str:
        """``clean`` only when nothing was found and every tensor was checked (quantized and dense);
        ``incomplete`` when nothing was found in the tensors that could be checked."""
        if self.exit_code:
            return "findings"
        return "incomplete" if self.unchecked else "clean"

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_json(self) -> dict[str, Any]:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        fs = sorted(self.findings, key=lambda f: (order[f.severity], list(CODES).index(f.code), f.tensor or ""))
        return jsonable({"schema": SCHEMA, "path": self.path, "format": self.format, "reference": self.reference,
                         "strict": self.strict, "checks": list(self.checks), "findings": [f.to_json() for f in fs],
                         "summary": {**self.counts(), "tensors_checked": len(self.tensors),
                                     "dense_checked": self.dense_checked,
                                     "tensors_unchecked": len(self.unchecked), "unchecked": list(self.unchecked),
                                     "verdict": self.verdict},
                         "tensors": self.tensors, "exit_code": self.exit_code,
                         **({"checksums": self.checksums} if self.checksums is not None else {})})

