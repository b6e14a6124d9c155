"""The ``--dry-run`` document of ``convert`` / ``quantize`` / ``dequantize``: what would be written, and how.

Per tensor: the mode (``exact``: codes and scales carried; ``lossy``: requantized or quantized, with why;
``dequantized``: written as float; ``passthrough``: dense, stored as is; ``dropped``), the target scheme
and groups (or the dense dtype); the output files with their tensor bytes (the writer's own shard plan;
headers not counted) and the ``config.json`` changes (the ``quantization_config`` written, dtypes).
Nothing is read beyond headers and nothing is written (:mod:`converter.write.dry_run`). The document
conforms to ``schemas/plan.schema.json``.
"""

from __future__ import annotations

from typing import Any, Mapping

from converter.tensor import Checkpoint

__all__ = ["SCHEMA", "tensor_rows", "plan_document"]

SCHEMA = "qckpt.plan/1"


def _target(spec) -> str:
    if spec.kind == "quantized" and spec.scheme is not None:
        return f"{spec.scheme.describe()}, {spec.group_map.describe()}" if spec.group_map is not None \
            else spec.scheme.describe()
    return str(spec.dtype)


def tensor_rows(view: Checkpoint, modes: Mapping[str, tuple[str, str]] | None = None, *,
                exact_why: str = "codes and scales carried (repack)", dense_mode: str = "passthrough",
                dense_why: str = "stored as is", skip: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One row per tensor of ``view`` (the checkpoint as the writer will see it).

    ``modes``: ``name -> (mode, why)`` where known (a requantize plan); others are ``exact`` when quantized
    and ``dense_mode`` when dense. ``skip``: ``name -> why`` for tensors that will not be written (``dropped``).
    """
    rows = []
    for spec in view.specs():
        if skip and spec.name in skip:
            rows.append({"name": spec.name, "mode": "dropped", "why": skip[spec.name], "target": "-"})
            continue
        if modes and spec.name in modes:
            mode, why = modes[spec.name]
        elif spec.kind == "quantized":
            mode, why = "exact", exact_why
        else:
            mode, why = dense_mode, dense_why
        rows.append({"name": spec.name, "mode": mode, "why": why, "target": _target(spec)})
    return rows


def plan_document(command: str, *, source: str, source_format: str, destination: str, target_format: str,
                  rows: list[dict[str, Any]], outputs: Mapping[str, Any],
                  modules: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The plan (``schemas/plan.schema.json``): ``outputs`` is the writer's
    :class:`~converter.write.dry_run.DryRunPlanned` payload (its optional ``dropped``: name -> why, for
    the tensors the writer leaves out)."""
    for r in rows:  # what the writer leaves out (activation scales, a tied head): dropped, with its reason
        if r["name"] in (outputs.get("dropped") or {}):
            r.update(mode="dropped", why=outputs["dropped"][r["name"]], target="-")
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["mode"]] = counts.get(r["mode"], 0) + 1
    config = outputs.get("config") or None
    changes = None
    if config is not None:
        changes = {k: config[k] for k in ("quantization_config", "dtype", "torch_dtype", "architectures",
                                          "model_type") if k in config}
    files = [dict(f) for f in outputs.get("files", [])]
    return {"schema": SCHEMA, "dry_run": True, "command": command, "source": source, "source_format": source_format,
            "destination": destination, "target_format": target_format, "tensors": rows,
            "summary": {"tensors": len(rows), **{k: counts.get(k, 0) for k in
                                                 ("exact", "lossy", "dequantized", "passthrough", "dropped")}},
            "files": files, "bytes": sum(f["bytes"] or 0 for f in files),
            "config": changes, **({"gguf": outputs["gguf"]} if "gguf" in outputs else {}),
            **({"modules": modules} if modules is not None else {})}
