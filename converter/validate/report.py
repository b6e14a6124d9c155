"""The validation report: findings, per-tensor statistics, JSON (``schemas/validation-report.schema.json``), exit status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from converter import exit_codes
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

    def add(self, *findings: Finding) -> None:
        self.findings.extend(findings)

    def counts(self) -> dict[str, int]:
        return {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES}

    @property
    def exit_code(self) -> int:
        """0 clean; 1 with an error finding (or a warning under ``strict``). Info never fails."""
        c = self.counts()
        if c["error"] or (self.strict and c["warning"]):
            return exit_codes.FINDINGS
        return exit_codes.OK

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_json(self) -> dict[str, Any]:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        fs = sorted(self.findings, key=lambda f: (order[f.severity], list(CODES).index(f.code), f.tensor or ""))
        return jsonable({"schema": SCHEMA, "path": self.path, "format": self.format, "reference": self.reference,
                         "strict": self.strict, "checks": list(self.checks), "findings": [f.to_json() for f in fs],
                         "summary": {**self.counts(), "tensors_checked": len(self.tensors)},
                         "tensors": self.tensors, "exit_code": self.exit_code})


def render_report(doc: dict[str, Any]) -> None:
    """Human rendering of a validation report (rich table of findings)."""
    from rich.table import Table

    from converter.report.render import console
    c = console()
    s = doc["summary"]
    verdict = "clean" if doc["exit_code"] == 0 else "FINDINGS"
    c.print(f"[bold]{doc['path']}[/bold]  format: [bold]{doc['format']}[/bold]  checks: {', '.join(doc['checks'])}  "
            f"tensors checked: {s['tensors_checked']}  -> {verdict} ({s['error']} errors, {s['warning']} warnings, "
            f"{s['info']} info)")
    if not doc["findings"]:
        return
    t = Table("severity", "code", "tensor", "message", "evidence")
    for f in doc["findings"]:
        ev = ", ".join(f"{k}={v}" for k, v in f["evidence"].items() if v is not None and k != "reader_error")
        t.add_row(f["severity"], f["code"], f["tensor"] or "-", f["message"], ev[:240])
    c.print(t)
