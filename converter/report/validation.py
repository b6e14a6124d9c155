"""Human renderings of ``qckpt validate``: the validation report and the ``--self-test`` probe report.

Both take the JSON document (``schemas/validation-report.schema.json``,
``schemas/probe-report.schema.json``), never the validator's objects, so what a user reads is what
``--json`` prints.
"""

from __future__ import annotations

import math
from typing import Any

from converter.report.fit import print_table
from converter.report.render import console, fmt, table

#: Tensors shown one per row in the reference table; more: the worst ones by relative error.
REFERENCE_ROWS = 24


def render_validation(doc: dict[str, Any]) -> None:
    """Human rendering of a validation report (rich table of findings)."""
    c = console()
    s = doc["summary"]
    verdict = {"clean": "clean", "findings": "FINDINGS",
               "incomplete": f"no findings, but {s['tensors_unchecked']} tensors not checked "
                             "(not clean)"}[s["verdict"]]
    fmt = doc["format"] or "not detected (the files could not be read)"
    dense = f" (+ {s['dense_checked']} dense)" if s.get("dense_checked") else ""
    c.print(f"[bold]{doc['path']}[/bold]  format: [bold]{fmt}[/bold]  checks: {', '.join(doc['checks'])}  "
            f"tensors checked: {s['tensors_checked']}{dense}  -> {verdict} ({s['error']} errors, "
            f"{s['warning']} warnings, {s['info']} info)")
    if doc.get("checksums") is not None:
        sums = doc["checksums"]
        ok = sum(x["match"] is True for x in sums)
        bad = sum(x["match"] is False for x in sums)
        sources = sorted({x["source"] for x in sums if x["source"]})
        c.print(f"checksums: {ok} of {len(sums)} files verified, {bad} mismatched, "
                f"{len(sums) - ok - bad} without an expected hash"
                + (f" (expected from: {', '.join(sources)})" if sources else ""))
    _render_reference(c, doc)
    if not doc["findings"]:
        return
    t = table("severity", "code", "tensor", "message", "evidence")
    for f in doc["findings"]:
        ev = ", ".join(f"{k}={v}" for k, v in f["evidence"].items() if v is not None and k != "reader_error")
        t.add_row(f["severity"], f["code"], f["tensor"] or "-", f["message"], ev[:240])
    print_table(c, t, key=2)


def _sqnr_db(rel: float | None) -> str:
    """SQNR in dB of a relative RMS error ``||W - W_ref|| / ||W_ref||``: ``-20 log10(rel)`` (``inf``: exact)."""
    if rel is None:
        return "-"
    return "inf" if rel == 0 else ("-inf" if math.isinf(rel) else f"{-20 * math.log10(rel):.1f}")


def _render_reference(c, doc: dict[str, Any]) -> None:
    """``--reference``: per compared tensor the relative RMS error, SQNR, error in quantization steps, max
    |error|, ``dequant(W) @ x`` relative error and the closest alternative interpretation; a summary line."""
    rows = [(name, t["reference"]) for name, t in (doc.get("tensors") or {}).items()
            if isinstance(t, dict) and t.get("reference")]
    if not rows:
        return
    shown = sorted(rows, key=lambda r: -(r[1].get("rel_rms") or 0.0))[:REFERENCE_ROWS] \
        if len(rows) > REFERENCE_ROWS else rows
    title = (f"against the reference {doc.get('reference')}" if len(shown) == len(rows) else
             f"against the reference {doc.get('reference')}: the {len(shown)} largest errors of {len(rows)}")
    t = table("tensor", "rel. error", "SQNR dB", "RMS steps", "max |error|", "matmul rel. error",
              "closest alternative (rel. error)", title=title)
    declared_best = 0
    for _, r in rows:
        alts = r.get("alternatives_rel_rms") or {}
        if not alts or r["rel_rms"] <= min(alts.values()):
            declared_best += 1
    for name, r in shown:
        alts = r.get("alternatives_rel_rms") or {}
        best = min(alts.items(), key=lambda kv: kv[1]) if alts else None
        rel = r.get("rel_rms")
        t.add_row(name, "0 (exact)" if rel == 0 else fmt(rel), _sqnr_db(rel), fmt(r.get("rms_steps")),
                  fmt(r.get("max_abs_error")), fmt(r.get("matmul_rel_error")),
                  f"{best[0]} ({fmt(best[1])})" if best else "-")
    print_table(c, t)
    rels = sorted(r["rel_rms"] for _, r in rows)
    worst = max(rows, key=lambda r: r[1]["rel_rms"])
    c.print(f"reference: {len(rows)} quantized tensors compared; relative error median {fmt(rels[len(rels) // 2])}, "
            f"max {fmt(worst[1]['rel_rms'])} ({worst[0]}, SQNR {_sqnr_db(worst[1]['rel_rms'])} dB); the declared "
            f"decode is closer to the reference than every alternative interpretation for {declared_best} of "
            f"{len(rows)}")


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
    print_table(c, t)
    c.print("formats: " + ", ".join(f"{k}: {v}" for k, v in doc["formats"].items()))
