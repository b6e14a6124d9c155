"""Human renderings of ``qckpt validate``: the validation report and the ``--self-test`` probe report.

Both take the JSON document (``schemas/validation-report.schema.json``,
``schemas/probe-report.schema.json``), never the validator's objects, so what a user reads is what
``--json`` prints.
"""

from __future__ import annotations

from typing import Any

from converter.report.render import console, table


def render_validation(doc: dict[str, Any]) -> None:
    """Human rendering of a validation report (rich table of findings)."""
    c = console()
    s = doc["summary"]
    verdict = {"clean": "clean", "findings": "FINDINGS",
               "incomplete": f"no findings, but {s['tensors_unchecked']} quantized tensors not checked "
                             "(not clean)"}[s["verdict"]]
    fmt = doc["format"] or "not detected (the files could not be read)"
    c.print(f"[bold]{doc['path']}[/bold]  format: [bold]{fmt}[/bold]  checks: {', '.join(doc['checks'])}  "
            f"tensors checked: {s['tensors_checked']}  -> {verdict} ({s['error']} errors, {s['warning']} warnings, "
            f"{s['info']} info)")
    if doc.get("checksums") is not None:
        sums = doc["checksums"]
        ok = sum(x["match"] is True for x in sums)
        bad = sum(x["match"] is False for x in sums)
        sources = sorted({x["source"] for x in sums if x["source"]})
        c.print(f"checksums: {ok} of {len(sums)} files verified, {bad} mismatched, "
                f"{len(sums) - ok - bad} without an expected hash"
                + (f" (expected from: {', '.join(sources)})" if sources else ""))
    if not doc["findings"]:
        return
    t = table("severity", "code", "tensor", "message", "evidence")
    for f in doc["findings"]:
        ev = ", ".join(f"{k}={v}" for k, v in f["evidence"].items() if v is not None and k != "reader_error")
        t.add_row(f["severity"], f["code"], f["tensor"] or "-", f["message"], ev[:240])
    c.print(t)


def render_self_test(doc: dict[str, Any]) -> None:
    """Table: one row per probe, alternatives rejected n/n, and the verdict per format."""
    c = console()
    t = table("format", "scheme", "shape", "groups", "declared exact", "alternatives rejected", "result",
              title="qckpt validate --self-test: axis probes")
    for r in doc["probes"]:
        alts = r["alternatives"]
        missed = [k for k, v in alts.items() if not v]
        t.add_row(r["format"], r["scheme"], "x".join(map(str, r["shape"])), r["groups"],
                  "yes" if r["declared_exact"] else "NO", f"{sum(alts.values())}/{len(alts)}"
                  + (f" (matched: {', '.join(missed)})" if missed else ""),
                  "pass" if r["passed"] else ("error: " + r["error"][:60] if r["error"] else "FAIL"))
    c.print(t)
    c.print("formats: " + ", ".join(f"{k}: {v}" for k, v in doc["formats"].items()))
