"""A table printed whole when it fits the terminal, else one record per row (names never folded).

A rich table narrower than its cells folds every cell into pieces: at 80 columns a tensor name such
as ``model.layers.0.self_attn.q_proj.weight`` becomes four lines of fragments beside the fragments of
its storage list, hard to read and easy to misread. When the table's natural width (every cell on
one line) exceeds the console, :func:`print_table` prints each row as a record instead: the first
cell (the tensor name) whole on its own line, then the other cells as ``header: value`` pairs,
indented and wrapped at the console's width. Same cells, same order; nothing is cut.
"""

from __future__ import annotations

import textwrap

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["natural_width", "print_table"]

#: Separator between a record's ``header: value`` pairs.
SEP = "; "
#: Indent of a record's pairs under its name.
INDENT = 2


def _plain(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def natural_width(t: Table) -> int:
    """Columns the table needs with every cell and header on one line (rich's box: 3 per column + 1)."""
    widths = []
    for col in t.columns:
        cells = [_plain(c) for c in col._cells]
        widths.append(max([len(_plain(col.header))] + [max(map(len, c.splitlines() or [""])) for c in cells]))
    return sum(widths) + 3 * len(widths) + 1


def print_table(c: Console, t: Table, key: int = 0) -> None:
    """``c.print(t)`` when the table fits ``c.width``; else each row as a record (see the module) headed
    by column ``key`` (the tensor name's column)."""
    if natural_width(t) <= c.width or not t.columns:
        c.print(t)
        return
    if t.title:
        c.print(Text(_plain(t.title), style="italic"))
    cols = t.columns
    for i in range(t.row_count):
        c.print(Text(_plain(cols[key]._cells[i]), style="bold"), overflow="fold")
        pairs = [f"{_plain(col.header)}: {_plain(col._cells[i])}" for j, col in enumerate(cols)
                 if j != key and _plain(col._cells[i]).strip()]
        for line in _pack(pairs, c.width - INDENT):
            # a pair longer than a line by itself wraps at its spaces, its continuation indented further
            for piece in textwrap.wrap(line, c.width, initial_indent=" " * INDENT, subsequent_indent=" " * 2 * INDENT,
                                       break_on_hyphens=False):
                c.print(Text(piece), overflow="fold")


def _pack(pairs: list[str], width: int) -> list[str]:
    """The pairs joined by :data:`SEP` into lines of at most ``width`` columns, a pair never split
    across lines unless it is longer than a line by itself."""
    lines: list[str] = []
    for p in pairs:
        if lines and len(lines[-1]) + len(SEP) + len(p) <= width:
            lines[-1] += SEP + p
        else:
            lines.append(p)
    return lines
