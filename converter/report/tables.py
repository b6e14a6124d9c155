"""Per-layer error tables from a report document: rows, sorting, cutting, CSV (``--csv`` / ``--sort`` / ``--top``).

Reads only the JSON document of ``convert`` (an ``error-report`` when requantizing, a ``convert-report``
for an exact repack) or ``validate --reference`` (a ``validation-report``), so the CSV says what the
report says. One row per quantized tensor:

``name, layer, role``
    The block index and the role in the block (:mod:`converter.formats.layer_roles`); empty outside the
    repeated blocks / without a role.
``sqnr_db, rel_error, max_error``
    error-report: ``vs_source`` ``sqnr_db``, ``rel_frobenius``, ``max_abs`` (the requantized weights against
    the source's dequantized ones). validation-report: the reference check's ``rel_rms`` and
    ``max_abs_error`` (dequantized weights against the float reference), ``sqnr_db = -20 log10(rel_rms)``
    (the same identity the error report's figures satisfy: SQNR = -20 log10 of the relative RMS error).
    convert-report: ``max_abs_diff`` of the read-back values; an exact repack's ``rel_error`` is 0 and its
    ``sqnr_db`` ``inf`` when bit-exact, else empty.
``exact``
    The tensor's values are bit-identical (``inf`` SQNR).
plus the document's other per-tensor figures where it has them (``output_rel_error``,
``ref_rel_error_source`` / ``ref_rel_error_target`` against ``--reference``; ``rms_steps``,
``matmul_rel_error`` of validate).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Iterable

from converter.formats.layer_roles import layer_index, linear_role

#: ``--sort`` keys -> (row field, worst first when descending).
SORT_KEYS = {"sqnr": ("sqnr_db", False), "rel_error": ("rel_error", True), "max_error": ("max_error", True),
             "name": ("name", False)}

COLUMNS = ("name", "layer", "role", "sqnr_db", "rel_error", "max_error", "exact", "output_rel_error",
           "ref_rel_error_source", "ref_rel_error_target", "rms_steps", "matmul_rel_error")


def _sqnr(rel: float | None) -> float | None:
    if rel is None:
        return None
    return math.inf if rel == 0 else -20.0 * math.log10(rel)


def error_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per quantized tensor of ``doc`` (see the module docstring), in the document's order."""
    rows = []
    tensors = doc.get("tensors")
    if isinstance(tensors, dict):  # validation-report
        for name, t in tensors.items():
            ref = t.get("reference")
            if not isinstance(ref, dict) or ref.get("rel_rms") is None:
                continue
            rel = ref["rel_rms"]
            rows.append({"name": name, "sqnr_db": _sqnr(rel), "rel_error": rel, "max_error": ref.get("max_abs_error"),
                         "exact": rel == 0, "rms_steps": ref.get("rms_steps"),
                         "matmul_rel_error": ref.get("matmul_rel_error")})
    else:
        for t in tensors or []:
            v = t.get("vs_source")
            if isinstance(v, dict):  # error-report
                row = {"name": t["name"], "sqnr_db": math.inf if v["exact"] else v.get("sqnr_db"),
                       "rel_error": v.get("rel_frobenius"), "max_error": v.get("max_abs"), "exact": v["exact"],
                       "output_rel_error": v.get("output_rel_error")}
                vr = t.get("vs_reference")
                if isinstance(vr, dict):
                    row["ref_rel_error_source"] = (vr.get("source") or {}).get("rel_frobenius")
                    row["ref_rel_error_target"] = (vr.get("target") or {}).get("rel_frobenius")
                rows.append(row)
            elif t.get("kind") == "quantized" or "max_abs_diff" in t:  # convert-report
                exact = bool(t.get("bit_exact"))
                rows.append({"name": t["name"], "sqnr_db": math.inf if exact else None,
                             "rel_error": 0.0 if exact else None, "max_error": t.get("max_abs_diff"), "exact": exact})
    for row in rows:
        row["layer"], row["role"] = layer_index(row["name"]), linear_role(row["name"])
    return rows


def sort_rows(rows: list[dict[str, Any]], key: str = "sqnr", top: int | None = None) -> list[dict[str, Any]]:
    """``rows`` worst first by ``key`` (``sqnr`` ascending; ``rel_error`` / ``max_error`` descending;
    ``name`` alphabetical), rows without the figure last, ties by name; the first ``top`` when given."""
    field, descending = SORT_KEYS[key]
    if field == "name":
        out = sorted(rows, key=lambda r: r["name"])
    else:
        have = [r for r in rows if r.get(field) is not None]
        out = sorted(sorted(have, key=lambda r: r["name"]), key=lambda r: r[field], reverse=descending)
        out += sorted((r for r in rows if r.get(field) is None), key=lambda r: r["name"])
    return out if top is None else out[:top]


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else repr(v)  # repr: the float exactly as the JSON holds it
    return str(v)


def write_csv(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """``rows`` as CSV with a header (:data:`COLUMNS`; empty cells where a figure is absent)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in COLUMNS])
