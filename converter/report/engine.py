"""The ``engine`` section of a report written with ``--engine ray|dask`` (``schemas/engine.schema.json``),
as a few lines after the command's own rendering; reads only the JSON document."""

from __future__ import annotations

from converter.report.render import console

__all__ = ["render_engine"]


def render_engine(doc: dict) -> None:
    """Print where the tasks ran and what they cost; nothing when ``doc`` has no ``engine`` section."""
    e = doc.get("engine")
    if not e:
        return
    c = console()
    phases = ", ".join(f"{k} {v:.2f} s" for k, v in e["seconds"].items() if k != "total")
    c.print(f"engine: {e['name']} ({e['address']}), {e['nodes']} node(s): {e['tasks']} shard tasks, "
            f"{e['proof_tasks']} read-back, {e['rows_tasks']} proof-row tasks, {e['retries']} retried; "
            f"start-up {e['startup_seconds']:.2f} s, total {e['seconds']['total']:.2f} s ({phases})")
    for n in e["per_node"]:
        c.print(f"  {n['node']}: {n['write_tasks']} shard / {n['proof_tasks']} read-back / {n['rows_tasks']} "
                f"proof-row tasks, {n['seconds']:.2f} s, peak RSS {n['peak_rss_bytes'] / 2**20:.0f} MiB")
