"""Human rendering of a ``--dry-run`` plan (reads only the JSON document, like every renderer)."""

from __future__ import annotations

from typing import Any

from converter.report.fit import print_table
from converter.report.render import console, fmt_bytes, table

__all__ = ["render_plan"]


def render_plan(doc: dict[str, Any]) -> None:
    """The per-tensor table (mode, why, target), the output files with their sizes, the config changes,
    and a last line saying that nothing was written."""
    c = console()
    t = table("tensor", "mode", "target", "why",
              title=f"{doc['command']} --dry-run: {doc['source']} ({doc['source_format']}) -> {doc['destination']} "
                    f"({doc['target_format']})")
    for r in doc["tensors"]:
        t.add_row(r["name"], r["mode"], r["target"], r["why"])
    print_table(c, t)
    for f in doc["files"]:
        size = fmt_bytes(f["bytes"]) if f["bytes"] is not None else "(size known when written)"
        c.print(f"  would write {f['name']}: {size}" + (f", {f['tensors']} tensors" if f.get("tensors") else ""))
    if doc.get("config"):
        qc = doc["config"].get("quantization_config")
        other = {k: v for k, v in doc["config"].items() if k != "quantization_config"}
        if qc is not None:
            c.print(f"  config.json quantization_config: {qc}")
        if other:
            c.print(f"  config.json: {other}")
    if doc.get("gguf"):
        g = doc["gguf"]
        c.print(f"  GGUF architecture {g['architecture']}, file type {g['file_type']}")
    s = doc["summary"]
    c.print(f"{s['tensors']} tensors: {s['exact']} exact, {s['lossy']} lossy, {s['dequantized']} dequantized, "
            f"{s['passthrough']} passed through, {s['dropped']} dropped; {fmt_bytes(doc['bytes'])} of tensor data "
            f"-> dry run: nothing written")
