"""Audit: what a checkpoint's bytes are spent on, from headers alone.

Bytes by role per tensor (codes, packing padding, scales, zero points, ``g_idx``, other
quantization arrays, dense tensors; ``activation_scale``, static input scales stored beside a weight,
listed only when a checkpoint has them) and per file (headers), effective bits per weight, and the
*theoretical* figure (payload ``N * b / 8`` + ``groups * bytes per group``, partial final groups and
partial edge blocks counted; no padding, alignment or headers; labelled as such) next to the measured
file sizes. A 2-D block tensor (FP8 ``weight_block_size``) also gets its block grid. ``what_if`` prices
the same tensors under other layouts before converting (float-element tensors: other block sizes,
per-channel and per-tensor scales too, the current layout marked; every tensor: the two FP4 targets,
MXFP4 = 4 + 8/32 = 4.25 bits per weight, NVFP4 = 4 + 8/16 = 4.5 plus its 4-byte F32 global scale).

An NVFP4 tensor's global scale (role ``global_scale``, listed only when present) is counted in its
measured bits per weight and, 4 bytes per tensor, in the theoretical figure.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converter.codebooks import element_of
from converter.groups import Granularity, GroupMap
from converter.sizes import SCALE_BYTES, theoretical_bytes, zero_point_bytes  # (re-exported for callers)
from converter.tensor import Checkpoint, TensorSpec
from converter.formats.safetensors_io import read_header

ROLE_ORDER = ("codes", "padding", "scales", "zero_points", "g_idx", "other", "dense")
#: Roles listed only when non-zero (a checkpoint without them audits as before).
OPTIONAL_ROLES = ("activation_scale", "global_scale", "codes+scales")
#: Bytes of one stored global scale (F32, per tensor).
GLOBAL_SCALE_BYTES = 4
#: What the theoretical figure counts (contract 3).
THEORETICAL_NOTE = ("theoretical: N*b/8 payload + groups x bytes per group; excludes packing padding, alignment "
                    "and headers")
#: Added when a tensor's scales are stored quantized.
DOUBLE_QUANT_NOTE = ("; double-quantized scales at their coded size (scale codes + second-level scales + "
                     "constants; code tables not counted)")
#: Roles that are not part of a weight's representation (left out of its bits per weight).
NOT_WEIGHT_BYTES = ("dense", "activation_scale")


def tensor_roles(spec: TensorSpec) -> dict[str, int]:
    """Stored bytes of one tensor by role (codes split into payload and packing padding); the
    :data:`OPTIONAL_ROLES` appear only when the tensor stores them."""
    roles = {r: 0 for r in ROLE_ORDER}
    for st in spec.stored:
        if st.role == "codes" and spec.scheme is not None:
            ideal = -(-spec.numel * spec.scheme.bits // 8)
            roles["codes"] += min(ideal, st.nbytes)
            roles["padding"] += max(0, st.nbytes - ideal)
        else:
            roles[st.role] = roles.get(st.role, 0) + st.nbytes
    return roles


def tensor_parts(spec: TensorSpec) -> dict[str, int]:
    """Stored bytes of the arrays a format names itself (``StoredArray.part``: bitsandbytes ``quant_map``,
    ``quant_state``, ``nested_absmax`` ...), by that name; empty when none is named."""
    parts: dict[str, int] = {}
    for st in spec.stored:
        if st.part:
            parts[st.part] = parts.get(st.part, 0) + st.nbytes
    return parts


def block_grid(spec: TensorSpec) -> dict[str, Any] | None:
    """A ``block`` map's grid: extents, scale grid ``ceil(n / extent)``, blocks in all (per expert
    too) and how many are partial edge blocks; None for other granularities."""
    gm = spec.group_map
    if gm is None or gm.granularity is not Granularity.BLOCK:
        return None
    per_matrix = gm.n_groups(spec.shape, spec.axes)
    count = gm.group_count(spec.shape, spec.axes)
    matrices = count // per_matrix if per_matrix else 0
    return {"extent": dict(gm.block), "grid": list(gm.param_shape(spec.shape, spec.axes)), "blocks": count,
            "partial_blocks": matrices * gm.partial_blocks(spec.shape, spec.axes)}


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
    optional = {r: 0 for r in OPTIONAL_ROLES}
    claimed: dict[str, int] = {}
    q_numel = 0
    q_bytes = 0
    theo_total = 0.0
    part_totals: dict[str, int] = {}
    for spec in ckpt.specs():
        roles = tensor_roles(spec)
        for r, v in roles.items():
            (totals if r in totals else optional)[r] += v
        for st in spec.stored:
            if st.file:
                claimed[st.file] = claimed.get(st.file, 0) + st.nbytes
        row: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "shape": list(spec.shape),
                               "numel": spec.numel, "bytes": roles, "stored_bytes": sum(roles.values())}
        parts = tensor_parts(spec)
        if parts:
            row["parts"] = parts
            for k, v in parts.items():
                part_totals[k] = part_totals.get(k, 0) + v
        if spec.kind == "opaque" and spec.numel:  # measured only: no scheme to price in theory
            row["bits_per_weight"] = 8 * sum(roles.values()) / spec.numel
        if spec.kind == "quantized":
            theo = theoretical_bytes(spec.shape, spec.axes, spec.scheme.bits, spec.group_map,
                                     SCALE_BYTES[spec.scheme.scale_dtype], zero_point_bytes(spec), spec.act_order,
                                     spec.scale_coding)
            theo = with_global_scale(theo, spec.numel, spec.scheme.global_scale is not None)
            quant = sum(v for r, v in roles.items() if r not in NOT_WEIGHT_BYTES)
            row.update(bits=spec.scheme.bits, scheme=spec.scheme.describe(), groups=spec.group_map.describe(),
                       n_groups=theo["groups"], bits_per_weight=8 * quant / spec.numel if spec.numel else 0.0,
                       theoretical=theo)
            grid = block_grid(spec)
            if grid is not None:
                row["blocks"] = grid
            q_numel += spec.numel
            q_bytes += quant
            theo_total += theo["total_bytes"]
            if what_if:
                row["what_if"] = what_if_layouts(spec)
        tensors.append(row)
    coded = any(s.kind == "quantized" and s.scale_coding is not None for s in ckpt.specs())
    files = _file_overheads(ckpt, claimed)
    header = sum(f["header_bytes"] for f in files)
    unlisted = sum(f["unlisted_tensor_bytes"] for f in files)
    file_total = sum(f["bytes"] for f in files)
    roles_total = dict(totals, **{r: v for r, v in optional.items() if v}, header=header, unlisted=unlisted)
    return {
        "path": ckpt.path, "format": ckpt.format, "tensors": tensors, "files": files,
        "totals": {"bytes_by_role": roles_total, "accounted_bytes": sum(roles_total.values()),
                   "file_bytes": file_total,
                   "quantized_weights": q_numel,
                   "quantized_bits_per_weight": 8 * q_bytes / q_numel if q_numel else None,
                   "theoretical_quantized_bytes": theo_total,
                   "theoretical_bits_per_weight": 8 * theo_total / q_numel if q_numel else None,
                   "theoretical_note": THEORETICAL_NOTE + (DOUBLE_QUANT_NOTE if coded else ""),
                   **({"bytes_by_part": part_totals} if part_totals else {})},
    }


def with_global_scale(theo: dict[str, Any], numel: int, has_global: bool) -> dict[str, Any]:
    """``theo`` (:func:`converter.sizes.theoretical_bytes`) plus one F32 global scale when ``has_global``."""
    if not has_global:
        return theo
    total = theo["total_bytes"] + GLOBAL_SCALE_BYTES
    return dict(theo, metadata_bytes=theo["metadata_bytes"] + GLOBAL_SCALE_BYTES, total_bytes=total,
                bits_per_weight=8 * total / numel if numel else 0.0)


#: The FP4 targets priced for every tensor: label, group size along ``in``, scale dtype, global scale.
FP4_LAYOUTS = (("mxfp4: E2M1, group 32, F8_E8M0 scales", 32, "F8_E8M0", False),
               ("nvfp4: E2M1, group 16, F8_E4M3 scales + F32 global scale", 16, "F8_E4M3", True))


def _fp4_rows(spec: TensorSpec) -> list[dict[str, Any]]:
    """What-if rows of the FP4 targets (4 bits); a float-element tensor's rows carry ``current`` (true
    when the tensor is that layout), as its other rows do (integer tensors' rows carry none)."""
    from converter.codebooks import E2M1_VALUES
    rows = []
    for label, g, sd, glob in FP4_LAYOUTS:
        gm = GroupMap.per_group(g)
        t = with_global_scale(theoretical_bytes(spec.shape, spec.axes, 4, gm, SCALE_BYTES[sd], 0.0), spec.numel, glob)
        cur = (spec.scheme.codebook == E2M1_VALUES and spec.group_map.granularity is Granularity.GROUP
               and spec.group_map.axis == "in" and spec.group_map.group_size == g and spec.scheme.scale_dtype == sd)
        rows.append({"layout": label, "granularity": gm.describe(), "scale_dtype": sd, "zero_point": "none",
                     "bits": 4, "bytes": t["total_bytes"], "bits_per_weight": t["bits_per_weight"],
                     "partial_tail": gm.partial_tail(spec.shape, spec.axes)})
        if element_of(spec.scheme.codebook) is not None:
            rows[-1]["current"] = bool(cur)
    return rows


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


def _float_layouts(spec: TensorSpec, element: str) -> list[Layout]:
    """Float-element (FP8 / FP4) layouts: square blocks, the MX (1 x 32, E8M0) and NVFP4-style (1 x 16,
    E4M3) micro-blocks, per-channel and per-tensor scales; symmetric (no zero point)."""
    out = [Layout(f"{element} block {b}x{b}, {sd} scales", GroupMap.per_block(b, b), sd, "none")
           for b in FLOAT_BLOCKS for sd in ("F32", "BF16")]
    out += [Layout(f"{element} block 1x32, F8_E8M0 scales (MX)", GroupMap.per_block(1, 32), "F8_E8M0", "none"),
            Layout(f"{element} block 1x16, F8_E4M3 scales", GroupMap.per_block(1, 16), "F8_E4M3", "none")]
    out += [Layout(f"{element} per-channel, {sd} scales", GroupMap.per_channel("out"), sd, "none")
            for sd in ("F32", "BF16")]
    out.append(Layout(f"{element} per-tensor, F32 scales", GroupMap.per_tensor(), "F32", "none"))
    return out


def _same_layout(lay: Layout, spec: TensorSpec) -> bool:
    gm, cur = lay.group_map, spec.group_map
    return (gm.granularity is cur.granularity and gm.axis == cur.axis and gm.group_size == cur.group_size
            and gm.block == cur.block and lay.scale_dtype == spec.scheme.scale_dtype
            and lay.zero == spec.scheme.zero_point.value and not spec.act_order)


#: Square block extents priced for float-element tensors (``weight_block_size`` [b, b]).
FLOAT_BLOCKS = (64, 128, 256)


def what_if_layouts(spec: TensorSpec) -> list[dict[str, Any]]:
    """Theoretical bytes of ``spec``'s weights under other layouts (same bits).

    Integer layouts for every tensor; a float-element tensor (FP8 / FP4) also gets
    :func:`_float_layouts` and its own layout (added when none of those is it), each row with
    ``current`` (true for the tensor's layout).
    """
    el = element_of(spec.scheme.codebook)
    layouts = _layouts(spec)
    fp4 = _fp4_rows(spec)
    if el is not None:
        layouts += _float_layouts(spec, el.name)
        if not any(_same_layout(lay, spec) for lay in layouts) and not any(r.get("current") for r in fp4):
            layouts.append(Layout(f"{el.name} {spec.group_map.describe()}, {spec.scheme.scale_dtype} scales",
                                  spec.group_map, spec.scheme.scale_dtype, spec.scheme.zero_point.value))
    rows = []
    for lay in layouts:
        zb = {"none": 0.0, "integer": spec.scheme.bits / 8, "float": SCALE_BYTES[lay.scale_dtype]}[lay.zero]
        t = theoretical_bytes(spec.shape, spec.axes, spec.scheme.bits, lay.group_map, SCALE_BYTES[lay.scale_dtype], zb)
        row = {"layout": lay.label, "granularity": lay.group_map.describe(), "scale_dtype": lay.scale_dtype,
               "zero_point": lay.zero, "bytes": t["total_bytes"], "bits_per_weight": t["bits_per_weight"],
               "partial_tail": lay.group_map.partial_tail(spec.shape, spec.axes)}
        if el is not None:
            row["current"] = _same_layout(lay, spec)
        if lay.group_map.granularity is Granularity.BLOCK:  # partial_tail is the in remainder only
            row["partial_blocks"] = lay.group_map.partial_blocks(spec.shape, spec.axes)
        rows.append(row)
    return dedupe_layouts(rows + fp4)


def _identity(row: dict[str, Any]) -> tuple:
    """What a priced layout stores: the groups (a ``block 1xN`` is ``group N`` along ``in``), the bytes of one
    scale and of one zero point, the global scale (in the label) and the bytes this prices. F16 and BF16
    scales, or MX's ``block 1x32`` and ``mxfp4: ... group 32``, are one layout priced twice."""
    gran = str(row.get("granularity"))
    if gran.startswith("block(out 1 x in "):  # block(out 1 x in N) stores what group(in, N) stores
        gran = f"group(in, {gran.removeprefix('block(out 1 x in ').rstrip(')')})"
    return (gran, SCALE_BYTES.get(row.get("scale_dtype"), row.get("scale_dtype")), row.get("zero_point"),
            "global" in row["layout"], row["bytes"])


def _rank(label: str) -> int:
    """Which label names a merged row: a named FP4 target (``mxfp4: ...``) 2, a float-element layout
    (``e4m3 per-channel ...``) 1, an integer layout (``per-channel, ...`` / ``group N, ...``) 0."""
    if ": " in label:
        return 2
    return 0 if label.startswith(("per-channel,", "group ")) else 1


def dedupe_layouts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per layout identity (:func:`_identity`), in first-seen order: a later row of the same
    identity is merged into the first (its label in ``same_as``; ``current`` if either is; F16 / BF16
    alternatives named in the label as ``F16/BF16 scales``; a named FP4 target, else a float-element
    layout, names the merged row: :func:`_rank`)."""
    kept: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        key = _identity(row)
        first = kept.get(key)
        if first is None:
            kept[key] = dict(row)
            continue
        sd1, sd2 = first.get("scale_dtype"), row.get("scale_dtype")
        if sd1 != sd2 and row["layout"] == first["layout"].replace(f"{sd1} scales", f"{sd2} scales"):
            first["layout"] = first["layout"].replace(f"{sd1} scales", f"{sd1}/{sd2} scales")
        elif _rank(row["layout"]) > _rank(first["layout"]):
            first.setdefault("same_as", []).append(first["layout"])
            first["layout"], first["scale_dtype"] = row["layout"], row.get("scale_dtype")
        else:
            first.setdefault("same_as", []).append(row["layout"])
        if row.get("current"):
            first["current"] = True
    return list(kept.values())
