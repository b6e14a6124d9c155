"""``qckpt inspect``: what a checkpoint holds, from headers alone."""

from __future__ import annotations

from typing import Any

from converter.tensor import Checkpoint, TensorSpec


def describe_spec(spec: TensorSpec) -> dict[str, Any]:
    """One tensor's row of the inspect report (``schemas/inspect.schema.json``)."""
    row: dict[str, Any] = {
        "name": spec.name, "kind": spec.kind, "shape": list(spec.shape),
        "axes": list(spec.axes) if spec.axes else None,
        "stored": [{"name": s.name, "role": s.role, "dtype": s.dtype, "shape": list(s.shape), "bytes": s.nbytes,
                    "file": s.file, **({"part": s.part} if s.part else {})} for s in spec.stored],
    }
    if spec.kind in ("dense", "opaque"):  # opaque: the storage type qckpt cannot decode (GGUF IQ4_NL ...)
        row["dtype"] = spec.dtype
    else:
        gm = spec.group_map
        row["scheme"] = spec.scheme.to_json()
        row["scheme_label"] = spec.scheme.describe()
        row["group_map"] = {**gm.to_json(spec.shape, spec.axes), "g_idx": spec.act_order}
        row["groups_label"] = gm.describe() + ("+g_idx" if spec.act_order and "+g_idx" not in gm.describe() else "")
        if spec.double_quant:
            row["double_quant"] = spec.double_quant
    if spec.notes:
        row["notes"] = list(spec.notes)
    return row


def inspect(ckpt: Checkpoint) -> dict[str, Any]:
    """Inspect report for ``ckpt``."""
    rows = [describe_spec(s) for s in ckpt.specs()]
    return {"path": ckpt.path, "format": ckpt.format, "files": [str(f) for f in ckpt.files],
            "n_tensors": len(rows), "n_quantized": sum(r["kind"] == "quantized" for r in rows), "tensors": rows,
            "metadata": {k: v for k, v in ckpt.metadata.items() if isinstance(v, (str, int, float, bool)) or v is None}}
