"""Human renderings of reports (rich tables) and JSON output.

Every renderer takes the command's JSON document (the one ``--json`` prints), so the text and the
JSON never disagree. Validation and probe reports: :mod:`converter.report.validation`.
"""

from __future__ import annotations

import json
import math
import shutil
from typing import Any

from rich.console import Console
from rich.table import Table

from converter.report.fit import print_table


def _json_default(o: Any):
    import numpy as np
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def dumps(doc: Any) -> str:
    """Deterministic JSON (sorted keys; NaN/inf never emitted: callers use null)."""
    return json.dumps(doc, indent=2, sort_keys=True, default=_json_default, allow_nan=False)


#: Width when stdout is not a terminal and ``COLUMNS`` is unset (a pipe or a log file): wide enough
#: that a row of a report stays one line.
PIPE_WIDTH = 160


def terminal_width() -> int:
    """The terminal's columns (``COLUMNS`` first, then the terminal), else :data:`PIPE_WIDTH`."""
    return shutil.get_terminal_size((PIPE_WIDTH, 24)).columns


def console() -> Console:
    return Console(highlight=False, soft_wrap=False, width=terminal_width())


def table(*headers: str, **kwargs: Any) -> Table:
    """A rich Table for the terminal's width whose cells wrap (fold) instead of being cut to an
    ellipsis: a cut number or name is a wrong one (a ``.bias`` row and its ``.weight`` row would
    look alike)."""
    t = Table(*headers, **kwargs)
    for col in t.columns:
        col.overflow = "fold"
    return t


def fmt_bytes(x: Any) -> str:
    """A byte count in full with thousands separators (theoretical counts may have a fraction:
    N*b/8 for odd b), never in scientific notation."""
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.3f}".rstrip("0")
    return f"{int(x):,}"


def fmt(x: Any, digits: int = 4) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        if math.isinf(x):
            return "inf"
        return f"{x:.{digits}g}"
    return str(x)


def render_inspect(doc: dict) -> None:
    c = console()
    c.print(f"[bold]{doc['path']}[/bold]  format: [bold]{doc['format']}[/bold]  "
            f"tensors: {doc['n_tensors']} ({doc['n_quantized']} quantized)")
    meta = doc.get("metadata") or {}
    for key, label in (("input_activations", "input activations (metadata, not applied to weights)"),
                       ("unreadable_groups", "unreadable (opaque)")):
        if meta.get(key):
            c.print(f"{label}: {meta[key]}")
    t = table("tensor", "kind", "shape", "storage", "scheme", "groups")
    for r in doc["tensors"]:
        storage = ", ".join(f"{stored_label(s)}:{s['dtype']}{s['shape']}" for s in r["stored"])
        t.add_row(r["name"], r["kind"], "x".join(map(str, r["shape"])), storage,
                  r.get("scheme_label") or r.get("dtype", ""), r.get("groups_label", ""))
    print_table(c, t)


def stored_label(s: dict) -> str:
    """A stored array's label in inspect: its role, with the format's own name for it when it has one
    (``quant_map``, not an anonymous ``other``; ``scales(absmax)``)."""
    part = s.get("part")
    if not part or part == s["role"]:
        return s["role"]
    return part if s["role"] == "other" else f"{s['role']}({part})"


def render_quantize(doc: dict) -> None:
    c = console()
    t = table("tensor", "shape", "groups", "MSE", "max |err|", "SQNR dB", "scale range", "ideal x vs FP32",
              "x with metadata", title=f"quantize -> {doc['destination']} (worst SQNR first)")
    for r in doc["tensors"]:
        t.add_row(r["name"], "x".join(map(str, r["shape"])), r["groups"], fmt(r["mse"]), fmt(r["max_abs_error"]),
                  fmt(r["sqnr_db"]) if not r["exact"] else "exact", f"{fmt(r['scale_min'])}..{fmt(r['scale_max'])}",
                  fmt(r["ideal_compression_vs_fp32"]), fmt(r["compression_vs_fp32_with_metadata"]))
    print_table(c, t)
    o = doc["overall"]
    c.print(f"overall: {o['quantized_tensors']} tensors, {o['quantized_weights']} weights, MSE {fmt(o['mse'])}, "
            f"max |err| {fmt(o['max_abs_error'])}, ideal compression vs FP32 {fmt(o['ideal_compression_vs_fp32'])}x, "
            f"with metadata (theoretical) {fmt(o['compression_vs_fp32_with_metadata'])}x")
    for w in doc.get("warnings") or ():
        c.print(f"warning: {w}")


def render_audit(doc: dict) -> None:
    c = console()
    roles = ("codes", "padding", "scales", "zero_points", "g_idx", "other", "dense")
    roles += tuple(r for r in ("activation_scale", "codes+scales") if any(r in t["bytes"] for t in doc["tensors"]))
    c.print(audit_table(doc, roles, terminal_width()))
    for r in doc["tensors"]:
        b = r.get("blocks")
        if b:
            c.print(f"{r['name']}: blocks {' x '.join(f'{a} {n}' for a, n in b['extent'].items())}, scale grid "
                    f"{'x'.join(map(str, b['grid']))} ({b['blocks']} blocks, {b['partial_blocks']} partial edge "
                    f"blocks counted)")
    tot = doc["totals"]
    br = tot["bytes_by_role"]
    c.print("bytes by role: " + ", ".join(f"{k} {v}" for k, v in br.items()))
    if tot.get("bytes_by_part"):
        c.print("named arrays: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in tot["bytes_by_part"].items()))
    theo_bpw = tot.get("theoretical_bits_per_weight")
    c.print(f"accounted {tot['accounted_bytes']} bytes = file sizes {tot['file_bytes']} bytes; "
            f"quantized weights {tot['quantized_weights']}, "
            f"measured {fmt(tot['quantized_bits_per_weight'])} bits/weight; "
            f"theoretical {fmt_bytes(tot['theoretical_quantized_bytes'])} bytes"
            + (f", {fmt(theo_bpw)} bits/weight" if theo_bpw is not None else "") + f" ({tot['theoretical_note']})")
    wi = [r for r in doc["tensors"] if "what_if" in r]
    if wi:
        render_what_if(c, wi)


def audit_table(doc: dict, roles: tuple[str, ...], width: int) -> Table:
    """The per-tensor audit table for ``width`` columns, names kept whole where they can be: while the
    table does not fit beside the longest name, first the roles that are 0 in every row go, then the
    remaining roles fold into one ``stored bytes`` column (their sum), then the ``theoretical bytes``
    column goes (the bytes by role and the theoretical total stay in the totals lines and ``--json``).
    Names fold only when even that does not fit."""
    rows = doc["tensors"]
    name_w = max([len("tensor")] + [len(r["name"]) for r in rows])
    nonzero = tuple(k for k in roles if any(r["bytes"].get(k, 0) for r in rows))

    def cell_w(values: list[str], header: str) -> int:
        return max([len(max(header.split(), key=len))] + [len(v) for v in values]) + 3
    shape_w = cell_w(["x".join(map(str, r["shape"])) for r in rows], "shape")
    bpw_head = ("bits/weight", "bits per weight")  # the second wraps into words at narrow widths
    bpw = [fmt(r.get("bits_per_weight")) for r in rows]
    th_w = cell_w([fmt_bytes(r["theoretical"]["total_bytes"]) + " (theoretical)" if r.get("theoretical") else "-"
                   for r in rows], "theoretical")
    sums = [fmt_bytes(sum(r["bytes"].get(k, 0) for k in roles)) for r in rows]
    levels = [(roles, False, True), (nonzero, False, True), ((), True, True), ((), True, False)]

    def need(level) -> int:
        shown, merged, theo = level
        roles_w = cell_w(sums, "stored") if merged else sum(cell_w([str(r["bytes"].get(k, 0)) for r in rows], k)
                                                            for k in shown)
        return name_w + 3 + shape_w + roles_w + cell_w(bpw, bpw_head[merged]) + (th_w if theo else 0) + 1
    fits = [lv for lv in levels if need(lv) <= width]
    shown, merged, theo = fits[0] if fits else levels[-1]
    cols = ("stored bytes",) if merged else shown
    t = table("tensor", "shape", *cols, bpw_head[merged], *(["theoretical bytes"] if theo else []),
              title=f"audit of {doc['path']} ({doc['format']})")
    if fits:
        t.columns[0].no_wrap, t.columns[0].min_width = True, name_w
    for r, total in zip(rows, sums):
        th = r.get("theoretical")
        cells = [total] if merged else [str(r["bytes"].get(k, 0)) for k in shown]
        theo_cell = [fmt_bytes(th["total_bytes"]) + " (theoretical)" if th else "-"] if theo else []
        t.add_row(r["name"], "x".join(map(str, r["shape"])), *cells, fmt(r.get("bits_per_weight")), *theo_cell)
    return t


def render_what_if(c: Console, tensors: list[dict]) -> None:
    """The what-if layouts summed over the tensors that have each (float-element layouts are priced
    for float-element tensors only), with how many tensors use each now when the rows say so."""
    agg: dict[str, float] = {}
    numel: dict[str, int] = {}
    current: dict[str, int] = {}
    marked = any("current" in w for r in tensors for w in r["what_if"])
    also: dict[str, list[str]] = {}
    for r in tensors:
        for w in r["what_if"]:
            also.setdefault(w["layout"], [])
            also[w["layout"]] += [a for a in w.get("same_as", []) if a not in also[w["layout"]]]
            agg[w["layout"]] = agg.get(w["layout"], 0.0) + w["bytes"]
            numel[w["layout"]] = numel.get(w["layout"], 0) + r["numel"]
            current[w["layout"]] = current.get(w["layout"], 0) + bool(w.get("current"))
    narrow = terminal_width() < 120  # short headers and counts: the layout names get the width
    # integer layouts keep each tensor's bits; the FP8 / FP4 rows are their element's 8 / 4 bits
    t2 = table("what-if layout (integer: same bits)", "bytes" if narrow else "theoretical bytes",
               "bits per weight" if narrow else "bits/weight",
               *([("current tensors" if narrow else "current")] if marked else []), title="what-if (theoretical)")
    if narrow:  # numbers need no more than their digits; headers wrap into words
        widest = max(len(fmt_bytes(v)) for v in agg.values()) if agg else 5
        for col, w in zip(t2.columns[1:], (max(widest, 5), 7, 7)):
            col.max_width = w
    for k, v in sorted(agg.items(), key=lambda kv: kv[1]):
        count = f"{current[k]}/{len(tensors)}" if narrow else f"{current[k]} of {len(tensors)} tensors"
        extra = [count if current[k] else ""] if marked else []
        label = k + "".join(f"\n= {a}" for a in also[k])  # the same layout under another name: priced once
        t2.add_row(label, fmt_bytes(v), fmt(8 * v / numel[k]), *extra)
    c.print(t2)


def render_dequantize(doc: dict) -> None:
    """One line naming the output files, then the side files not written, grouped by reason."""
    import click
    dtype = "each tool's dtype" if doc["dtype"] == "tool" else doc["dtype"]
    click.echo(f"dequantized {doc['tensors']} tensors from {doc['source_format']} to {dtype}: "
               f"{doc['destination']} ({', '.join(doc['files'])})")
    tools: dict[str, int] = {}
    for tool in doc.get("match_tool", {}).values():
        tools[tool] = tools.get(tool, 0) + 1
    for tool, n in tools.items():
        click.echo(f"  {n} quantized tensor(s) decoded as {tool}")
    bad = doc.get("non_finite") or {}
    if bad:
        first = next(iter(bad))
        click.echo(f"  warning: {len(bad)} quantized tensor(s) dequantized to NaN / inf values "
                   f"({sum(bad.values())} values; first {first}: {bad[first]}): "
                   f"`qckpt validate {doc['source']}` names non-finite scales")
    by_reason: dict[str, list[str]] = {}
    for name, reason in doc.get("side_files_skipped", {}).items():
        by_reason.setdefault(reason, []).append(name)
    for reason, names in by_reason.items():
        partly = reason.startswith("written without")  # a config.json written without some hyperparameters
        click.echo(f"  {'incomplete' if partly else 'not written'}: {', '.join(names)}: {reason}")
    dropped: dict[str, list[str]] = {}
    for name, reason in doc.get("dropped", {}).items():
        dropped.setdefault(reason, []).append(name)
    for reason, names in dropped.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        click.echo(f"  dropped {len(names)} tensor{'s' if len(names) != 1 else ''} ({shown}): {reason}")


def render_convert(doc: dict) -> None:
    c = console()
    files = (doc.get("written") or {}).get("files") or []
    if len(files) > 1 and str(files[0]).endswith(".gguf"):
        c.print(f"written as {len(files)} parts (a split GGUF; open the first): {', '.join(map(str, files))}")
    t = table("tensor", "mode", "codes identical", "scales identical", "max |diff|",
              title=f"{doc['source_format']} -> {doc['target_format']}: {doc['destination']}")
    for r in doc["tensors"]:
        mode = r["mode"] + (" (reshaped {} -> {})".format(*r["reshaped"]) if r.get("reshaped") else "")
        t.add_row(r["name"], mode, fmt(r.get("codes_identical")), fmt(r.get("scales_identical")),
                  fmt(r.get("max_abs_diff")))
    print_table(c, t)
    s = doc["summary"]
    for kind in ("quantized", "dense"):
        k = s.get(kind)
        if not k or not k["tensors"]:
            continue
        stated = "; ".join(f"{g['rounding']}: {g['tensors']}, max |diff| {fmt(g['max_abs_diff'])}"
                           for g in k.get("roundings") or ())
        rounding = (f", {k['exact_up_to_rounding']} exact up to rounding "
                    f"({stated or 'max |diff| ' + fmt(k['max_rounding_diff'])})" if k["exact_up_to_rounding"] else "")
        dropped = f", {k['dropped']} not written (see below)" if k.get("dropped") else ""
        c.print(f"{k['tensors']} {kind} tensors: {k['exact']} bit-exact{rounding}, {k['changed']} changed (lossy)"
                f"{dropped}")
    n_dropped = s.get("dropped", 0)
    c.print("all tensors bit-exact" if s["all_exact"] else
            "CHANGED: the output does not reproduce the source" if not s["within_rounding"] else
            "every tensor written bit-exact" if not s["exact_up_to_rounding"] else
            f"NOT bit-exact: codes identical, values exact up to the stated rounding "
            f"(max |diff| {fmt(s['max_rounding_diff'])})")
    if n_dropped:
        why: dict[str, list[str]] = {}
        for r in doc["tensors"]:
            if r["mode"] == "dropped":
                why.setdefault(r["reason"], []).append(r["name"])
        for reason, names in why.items():
            c.print(f"not written: {len(names)} tensors ({reason}), e.g. {names[0]}")
    render_modules(doc, c)
    render_side_files(doc, c)
    render_write_warnings(doc, c)


def render_write_warnings(doc: dict, c: Console | None = None) -> None:
    """The writer's notes marked ``warning: `` (a loader that will refuse what was written ...), once each,
    with how many tensors they concern."""
    warned: dict[str, list[str]] = {}
    for name, notes in ((doc.get("written") or {}).get("notes") or {}).items():
        for note in notes:
            if note.startswith("warning: "):
                warned.setdefault(note[len("warning: "):], []).append(name)
    for note, names in warned.items():
        (c or console()).print(f"warning: {note} ({len(names)} tensors, e.g. {names[0]})")


def render_side_files(doc: dict, c: Console | None = None) -> None:
    """Side files (config.json, tokenizer ...) the output lacks, and why."""
    for name, reason in (doc.get("side_files_skipped") or {}).items():
        (c or console()).print(f"not written: {name}: {reason}")


def render_modules(doc: dict, c: Console | None = None) -> None:
    """The target's module decisions: counts, then each module written dense and why."""
    mods, counts = doc.get("modules"), doc.get("module_summary")
    if not mods or not counts:
        return
    c = c or console()
    c.print(f"modules: {counts['quantized']} quantized, {counts['dequantized']} dequantized (the target keeps them "
            f"dense), {counts['kept dense']} kept dense")
    for d in mods:
        if d["decision"] == "dequantized":
            c.print(f"  {d['module']}: dequantized exactly to float32 ({d['reason']})")


def render_error_report(doc: dict) -> None:
    """Requantize report: one row per tensor, worst first; overall figures and metadata cost."""
    c = console()
    ref = doc.get("reference") is not None
    search = any("scale_search" in r for r in doc["tensors"])
    t = table(title=f"{doc['source_format']} -> {doc['target_format']}: {doc['destination']} (worst first)")
    t.add_column("tensor", overflow="fold")
    for col in ("plan/result", "target", "rel.Frob", "SQNR dB", "max|err|", "changed", "out err",
                *(["float err src->dst"] if ref else []), *(["mse gain dB"] if search else []),
                "worst ch/group", "bits/w"):
        t.add_column(col, overflow="fold")
    for r in doc["tensors"]:
        v = r["vs_source"]
        wc, wg = v.get("worst_channel"), v.get("worst_group")
        worst = "-" if v["exact"] or not wc else f"{','.join(map(str, wc['index']))}/{','.join(map(str, wg['index']))}"
        row = [r["name"], f"{r['planned']}/{r['result']}" + ("" if r.get("readback_bit_exact", True) else "!"),
               f"{r['target']['scheme']} {r['target']['groups']}".replace("channel", "ch").replace("group", "g"),
               "0" if v["exact"] else fmt(v["rel_frobenius"], 3), "exact" if v["exact"] else fmt(v["sqnr_db"], 3),
               fmt(v["max_abs"], 3), f"{100 * v['changed_fraction']:.1f}%", fmt(v["output_rel_error"], 3)]
        if ref:
            vr = r.get("vs_reference")
            row.append(f"{fmt(vr['source']['rel_frobenius'], 3)}->{fmt(vr['target']['rel_frobenius'], 3)}"
                       if vr else "-")
        if search:
            row.append(fmt(r["scale_search"]["gain_db"], 3) if "scale_search" in r else "-")
        bits = r["metadata"]
        row += [worst, f"{fmt(bits['before']['bits_per_weight'], 3)}->{fmt(bits['after']['bits_per_weight'], 3)}"]
        t.add_row(*row)
    print_table(c, t)
    o = doc["overall"]
    v = o["vs_source"] or {}
    c.print(f"{o['tensors']} quantized tensors: planned {o['planned_exact']} exact / {o['planned_lossy']} lossy; "
            f"result {o['exact']} exact / {o['lossy']} lossy; degenerate groups {o['degenerate_groups']}, "
            f"partial groups {o['partial_groups']}; {len(doc['passthrough'])} dense tensors passed through")
    if v:
        sqnr = "exact (no error)" if v["sqnr_db"] is None else f"{fmt(v['sqnr_db'])} dB"
        c.print(f"overall vs source: rel. Frobenius {fmt(v['rel_frobenius'])}, SQNR {sqnr}, "
                f"max |err| {fmt(v['max_abs'])}, output error {fmt(v['output_rel_error'])}")
    vr = o.get("vs_reference")
    if vr and vr.get("source"):
        c.print(f"overall vs float reference: rel. Frobenius {fmt(vr['source']['rel_frobenius'])} (source) -> "
                f"{fmt(vr['target']['rel_frobenius'])} (target), "
                f"output error {fmt(vr['source']['output_rel_error'])} -> "
                f"{fmt(vr['target']['output_rel_error'])}")
    m = o["metadata"]
    c.print(f"metadata cost (theoretical): {fmt_bytes(m['before']['metadata_bytes'])} -> "
            f"{fmt_bytes(m['after']['metadata_bytes'])} bytes, "
            f"{fmt(m['before']['bits_per_weight'])} -> {fmt(m['after']['bits_per_weight'])} bits/weight in total")
    if doc.get("parts"):
        c.print(f"written as {len(doc['parts'])} parts (a split GGUF; open the first): {', '.join(doc['parts'])}")
    render_filled_in(doc, c)
    render_modules(doc, c)
    render_side_files(doc, c)


def render_filled_in(doc: dict, c=None) -> None:
    """The requantize options filled in because the target needs them (``filled_in``), one line each."""
    filled = doc.get("filled_in") or []
    if not filled:
        return
    c = c or console()
    c.print(f"options filled in for {doc['target_format']} (not given, needed by the target): "
            + " ".join(f["option"] for f in filled))
    for f in filled:
        c.print(f"  {f['option']}: {f['reason']}")
