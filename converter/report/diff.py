"""Human rendering of ``qckpt diff A B`` (reads only the JSON document, like every renderer)."""

from __future__ import annotations

from typing import Any

from converter.report.fit import print_table
from converter.report.render import console, fmt, table

__all__ = ["render_diff"]

_ORDER = {"shape-mismatch": 0, "not-compared": 0, "different": 1, "within-tolerance": 2, "identical": 3}


def render_diff(doc: dict[str, Any]) -> None:
    """A table of the tensors that differ (worst first; identical ones counted, not listed), the tensors
    found on one side only, and the verdict line."""
    c = console()
    s = doc["summary"]
    rows = sorted((r for r in doc["tensors"] if r["status"] != "identical"),
                  key=lambda r: (_ORDER[r["status"]], -(r.get("rel_frobenius") or 0.0)))
    if rows:
        t = table("tensor", "status", "rel. Frobenius", "SQNR dB", "max |B-A|", "worst channel", "output rel.",
                  title=f"B = {doc['b']} ({doc['format_b']}) against A = {doc['a']} ({doc['format_a']})")
        for r in rows:
            if r["status"] == "shape-mismatch":
                t.add_row(r["name"], r["status"], f"A {r['shape']} vs B {r['shape_b']}", "", "", "", "")
                continue
            if r["status"] == "not-compared":
                t.add_row(r["name"], r["status"], r["why"], "", "", "", "")
                continue
            wc = r.get("worst_channel")
            t.add_row(r["name"], r["status"], fmt(r["rel_frobenius"]), fmt(r["sqnr_db"]), fmt(r["max_abs"]),
                      "-" if not wc else f"out {wc['index'][0]} (mse {fmt(wc['mse'])})", fmt(r["output_rel_error"]))
        print_table(c, t)
    for side in ("a", "b"):
        names = doc[f"only_in_{side}"]
        if names:
            c.print(f"only in {side.upper()} ({len(names)}): {', '.join(names[:12])}"
                    + (f" ... and {len(names) - 12} more" if len(names) > 12 else ""))
    verdict = {"identical": "IDENTICAL", "within-tolerance": f"identical within tolerance {doc['tolerance']}",
               "different": "DIFFERENT"}[s["verdict"]]
    c.print(f"{s['compared']} tensors compared: {s['identical']} identical, {s['within_tolerance']} within "
            f"tolerance, {s['different']} different, {s['shape_mismatch']} of another shape"
            + (f", {s['not_compared']} not compared" if s.get("not_compared") else "") + "; overall rel. "
            f"Frobenius {fmt(s['rel_frobenius'])}, SQNR {fmt(s['sqnr_db'])} dB -> {verdict}")
