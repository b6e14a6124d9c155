"""``--plot FILE.png|.svg``: error against layer index, one line per tensor role (q / k / v / o / gate / up / down).

Draws the rows of :func:`converter.report.tables.error_rows` (so the figure shows the report's numbers):
SQNR in dB (higher is better; a bit-exact tensor, infinite SQNR, is drawn as a hollow marker on a row of
its own at the top, labelled ``bit-exact``) when the report has one, else the max |error|. Tensors
outside the repeated blocks (embedding, head, pooler) have no layer index and are listed in the caption
instead. matplotlib is an optional extra (``pip install qckpt[plot]``), imported only here.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from converter.errors import MissingExtraError, UnsupportedError
from converter.formats.layer_roles import ROLES

SUFFIXES = (".png", ".svg")


def check_plot_path(path: Path) -> None:
    """Refuse a ``--plot`` path whose suffix names no supported image type, and a missing matplotlib,
    before any work is done.

    Raises
    ------
    UnsupportedError
        Suffix not ``.png`` / ``.svg``.
    MissingExtraError
        matplotlib not installed (the message names the extra; exit status 2, usage).
    """
    if Path(path).suffix.lower() not in SUFFIXES:
        raise UnsupportedError("--plot writes .png or .svg", file=path, field="plot", expected=list(SUFFIXES),
                               found=Path(path).suffix or "(no suffix)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtraError("--plot needs matplotlib: pip install 'qckpt[plot]'", file=path, field="plot",
                               hint="or leave --plot out") from None


def plot_errors(rows: list[dict[str, Any]], path: Path, title: str, kind: str | None = None) -> dict[str, Any]:
    """Draw ``rows`` into ``path`` as ``kind`` (``"png"`` / ``"svg"``; default: ``path``'s suffix).

    Returns ``{"metric", "points", "unplaced"}``: the figure plotted, how many points, and the tensors
    without a layer index."""
    import matplotlib
    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    finite = [r for r in rows if r.get("sqnr_db") is not None and not math.isinf(r["sqnr_db"])]
    metric, label = ("sqnr_db", "SQNR (dB, higher is better)") if finite or any(r.get("exact") for r in rows) \
        else ("max_error", "max |error|")
    placed = [r for r in rows if r.get("layer") is not None and r.get(metric) is not None]
    unplaced = sorted(r["name"] for r in rows if r.get("layer") is None)
    top = max((r["sqnr_db"] for r in finite), default=0.0) + 5.0 if metric == "sqnr_db" else None
    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    roles = [r for r in ROLES if any(p["role"] == r for p in placed)]
    if any(p["role"] is None for p in placed):
        roles.append(None)
    points = 0
    for role in roles:
        pts = sorted((p for p in placed if p["role"] == role), key=lambda p: p["layer"])
        xs = [p["layer"] for p in pts]
        ys = [top if metric == "sqnr_db" and math.isinf(p[metric]) else p[metric] for p in pts]
        color = f"C{ROLES.index(role) if role in ROLES else len(ROLES)}"  # one colour per role, in every plot
        line, = ax.plot(xs, ys, marker="o", label=role or "other", color=color)
        exact = [(x, y) for x, y, p in zip(xs, ys, pts) if metric == "sqnr_db" and math.isinf(p[metric])]
        if exact:
            ax.plot(*zip(*exact), linestyle="none", marker="o", markerfacecolor="white",
                    markeredgecolor=line.get_color(), markersize=9)
        points += len(pts)
    ax.set_xlabel("layer index")
    ax.set_ylabel(label)
    if metric == "sqnr_db" and any(math.isinf(p[metric]) for p in placed):  # bit-exact: a row of its own
        lo, _ = ax.get_ylim()
        ticks = [t for t in ax.get_yticks() if lo <= t < top - 2.5] if finite else []
        ax.set_yticks(ticks + [top], [f"{t:g}" for t in ticks] + ["bit-exact"])
        ax.set_ylim(min(ticks + [top]) - 2.5 if ticks else top - 1, top + (2.5 if ticks else 1))
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    layers = sorted({p["layer"] for p in placed})
    if layers and len(layers) <= 40:
        ax.set_xticks(layers)
    if roles:
        ax.legend(title="role", fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, never over
    if unplaced:
        fig.text(0.01, 0.01, "not in a layer: " + ", ".join(unplaced)[:150], fontsize=7)
    fig.tight_layout(rect=(0, 0.03 if unplaced else 0, 1, 1))
    fig.savefig(path, format=kind or Path(path).suffix.lower().lstrip("."))
    plt.close(fig)
    return {"metric": metric, "points": points, "unplaced": unplaced}
