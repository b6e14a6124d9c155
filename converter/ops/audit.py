"""Audit: what a checkpoint's bytes are spent on, from headers alone.

Bytes by role per tensor (codes, packing padding, scales, zero points, ``g_idx``, other
quantization arrays, dense tensors) and per file (headers), effective bits per weight, and the
*theoretical* figure (payload ``N * b / 8`` + ``groups * bytes per group``, partial final groups
counted; no padding, alignment or headers; labelled as such) next to the measured file sizes.
``what_if`` prices the same tensors under other layouts before converting.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converter.groups import GroupMap
from converter.sizes import SCALE_BYTES, theoretical_bytes, zero_point_bytes  # (re-exported for callers)
from converter.tensor import Checkpoint, TensorSpec
from converter.formats.safetensors_io import read_header

ROLE_ORDER = ("codes", "padding", "scales", "zero_points", "g_idx", "other", "dense")


def tensor_roles(spec: TensorSpec) -> dict[str, int]:
    """Stored bytes of one tensor by role (codes split into payload and packing padding)."""
    roles = {r: 0 for r in ROLE_ORDER}
    for st in spec.stored:
        if st.role == "codes" and spec.scheme is not None:
            ideal = -(-spec.numel * spec.scheme.bits // 8)
            roles["codes"] += min(ideal, st.nbytes)
            roles["padding"] += max(0, st.nbytes - ideal)
        else:
            roles[st.role] += st.nbytes
    return roles


def _file_overheads(ckpt: Checkpoint, claimed: dict[str, int]) -> list[dict[str, Any]]:
    files = []
    for f in ckpt.files:
        p = Path(f)
        size = os.path.getsize(p)
        entry: dict[str, Any] = {"file": p.name, "bytes": size}
        if p.suffix == ".safetensors":
            h = read_header(p)
            tensors = sum(i.nbytes for i in h.tensors.values())
            entry["header_bytes"] = h.data_start
            entry["unlisted_tensor_bytes"] = max(0, tensors - claimed.get(p.name, 0))
        else:
            entry["header_bytes"] = max(0, size - claimed.get(p.name, 0))
            entry["unlisted_tensor_bytes"] = 0
        files.append(entry)
    return files


def audit(ckpt: Checkpoint, *, what_if: bool = False) -> dict[str, Any]:
    """Audit report (``schemas/audit.schema.json``)."""
    tensors = []
    totals = {r: 0 for r in ROLE_ORDER}
    claimed: dict[str, int] = {}
    q_numel = 0
    q_bytes = 0
    theo_total = 0.0
    for spec in ckpt.specs():
        roles = tensor_roles(spec)
        for r, v in roles.items():
            totals[r] += v
        for st in spec.stored:
            if st.file:
                claimed[st.file] = claimed.get(st.file, 0) + st.nbytes
        row: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "shape": list(spec.shape),
                               "numel": spec.numel, "bytes": roles, "stored_bytes": sum(roles.values())}
        if spec.kind == "quantized":
            theo = theoretical_bytes(spec.shape, spec.axes, spec.scheme.bits, spec.group_map,
                                     SCALE_BYTES[spec.scheme.scale_dtype], zero_point_bytes(spec), spec.act_order)
            quant = sum(v for r, v in roles.items() if r != "dense")
            row.update(bits=spec.scheme.bits, scheme=spec.scheme.describe(), groups=spec.group_map.describe(),
                       n_groups=theo["groups"], bits_per_weight=8 * quant / spec.numel if spec.numel else 0.0,
                       theoretical=theo)
            q_numel += spec.numel
            q_bytes += quant
            theo_total += theo["total_bytes"]
            if what_if:
                row["what_if"] = what_if_layouts(spec)
        tensors.append(row)
    files = _file_overheads(ckpt, claimed)
    header = sum(f["header_bytes"] for f in files)
    unlisted = sum(f["unlisted_tensor_bytes"] for f in files)
    file_total = sum(f["bytes"] for f in files)
    roles_total = dict(totals, header=header, unlisted=unlisted)
    return {
        "path": ckpt.path, "format": ckpt.format, "tensors": tensors, "files": files,
        "totals": {"bytes_by_role": roles_total, "accounted_bytes": sum(roles_total.values()),
                   "file_bytes": file_total,
                   "quantized_weights": q_numel,
                   "quantized_bits_per_weight": 8 * q_bytes / q_numel if q_numel else None,
                   "theoretical_quantized_bytes": theo_total,
                   "theoretical_note": "theoretical: N*b/8 payload + groups x bytes per group; "
                                       "excludes packing padding, alignment and headers"},
    }


@dataclass(frozen=True)
class Layout:
    label: str
    group_map: GroupMap
    scale_dtype: str
    zero: str  # "none" | "integer" | "float"


def _layouts(spec: TensorSpec) -> list[Layout]:
    gms = ([("per-channel", GroupMap.per_channel("out"))]
           + [(f"group {g}", GroupMap.per_group(g)) for g in (32, 64, 128)])
    out = []
    for gl, gm in gms:
        for sd in ("F16", "BF16", "F32"):
            for z in ("none", "integer", "float"):
                out.append(Layout(f"{gl}, {sd} scales, zero point {z}", gm, sd, z))
    return out


def what_if_layouts(spec: TensorSpec) -> list[dict[str, Any]]:
    """Theoretical bytes of ``spec``'s weights under other layouts (same bits)."""
    rows = []
    for lay in _layouts(spec):
        zb = {"none": 0.0, "integer": spec.scheme.bits / 8, "float": SCALE_BYTES[lay.scale_dtype]}[lay.zero]
        t = theoretical_bytes(spec.shape, spec.axes, spec.scheme.bits, lay.group_map, SCALE_BYTES[lay.scale_dtype], zb)
        rows.append({"layout": lay.label, "granularity": lay.group_map.describe(), "scale_dtype": lay.scale_dtype,
                     "zero_point": lay.zero, "bytes": t["total_bytes"], "bits_per_weight": t["bits_per_weight"],
                     "partial_tail": lay.group_map.partial_tail(spec.shape, spec.axes)})
    return rows
