"""Audit of FP8 tensors: 2-D block metadata, the activation_scale role, bits per weight, what-if layouts.

Every figure is computed by hand in the test (bytes = elements x bytes per element, blocks =
ceil(rows / 128) x ceil(columns / 128)).
"""

from __future__ import annotations

import numpy as np
import pytest

from converter import codebooks
from converter.groups import GroupMap
from converter.ops.audit import ROLE_ORDER, audit, what_if_layouts
from converter.report.render import render_audit
from converter.scheme import QuantScheme
from converter.schemas import validate_document
from converter.sizes import theoretical_bytes
from converter.spec import StoredArray
from converter.tensor import Checkpoint, TensorSpec

AXES = ("out", "in")


def fp8_spec(name="model.layers.0.mlp.down_proj.weight", shape=(576, 1536), block=(128, 128), scale_dtype="F32",
             extra=(), axes=AXES) -> TensorSpec:
    gm = GroupMap.per_block(*block)
    grid = gm.param_shape(shape, axes)
    item = {"F32": 4, "BF16": 2, "F8_E8M0": 1}[scale_dtype]
    stored = (StoredArray(name, "codes", "F8_E4M3", shape, int(np.prod(shape))),
              StoredArray(name + "_scale_inv", "scales", scale_dtype, grid, item * int(np.prod(grid)))) + tuple(extra)
    return TensorSpec(name, "quantized", shape, stored, axes=axes,
                      scheme=QuantScheme(8, False, scale_dtype=scale_dtype, codebook=codebooks.E4M3), group_map=gm)


def ckpt_of(*specs) -> Checkpoint:
    return Checkpoint({s.name: s for s in specs}, lambda n: None, format="memory")


def test_theoretical_bytes_of_a_block_tensor_by_hand():
    # 576 x 1536 E4M3 with F32 128 x 128 block scales: ceil(576/128) x ceil(1536/128) = 5 x 12 = 60 scales
    t = theoretical_bytes((576, 1536), AXES, 8, GroupMap.per_block(128, 128), 4, 0)
    numel = 576 * 1536
    assert t["payload_bytes"] == numel and t["metadata_bytes"] == 5 * 12 * 4 and t["groups"] == 60
    assert t["bits_per_weight"] == pytest.approx((576 * 1536 * 8 + 5 * 12 * 32) / (576 * 1536))
    # per expert, partial edge blocks counted: 4 x ceil(192/128) x ceil(576/128) = 4 x 2 x 5
    e = theoretical_bytes((4, 192, 576), ("expert", "out", "in"), 8, GroupMap.per_block(128, 128), 2, 0)
    assert e["groups"] == 40 and e["metadata_bytes"] == 80 and e["payload_bytes"] == 4 * 192 * 576


def test_audit_of_a_block_fp8_tensor_with_an_input_scale():
    name = "model.layers.0.mlp.down_proj.weight"
    act = StoredArray("model.layers.0.mlp.down_proj.input_scale", "activation_scale", "F32", (), 4)
    doc = audit(ckpt_of(fp8_spec(extra=(act,))))
    validate_document(doc, "audit")
    row = doc["tensors"][0]
    assert row["name"] == name
    assert row["bytes"] == {"codes": 884736, "padding": 0, "scales": 240, "zero_points": 0, "g_idx": 0, "other": 0,
                            "dense": 0, "activation_scale": 4}
    assert row["stored_bytes"] == 884736 + 240 + 4
    # measured bits per weight: codes + scales (the input scale belongs to the activations)
    assert row["bits_per_weight"] == pytest.approx((576 * 1536 * 8 + 5 * 12 * 32) / (576 * 1536))
    assert row["theoretical"]["total_bytes"] == 884736 + 240
    # 5 x 12 = 60 blocks; whole ones floor(576/128) x 12 = 48, so 12 partial (the 64-row edge)
    assert row["blocks"] == {"extent": {"out": 128, "in": 128}, "grid": [5, 12], "blocks": 60, "partial_blocks": 12}
    assert row["scheme"] == "e4m3 float" and row["n_groups"] == 60
    tot = doc["totals"]
    assert tot["bytes_by_role"]["activation_scale"] == 4 and tot["accounted_bytes"] == 884736 + 240 + 4
    assert tot["quantized_bits_per_weight"] == pytest.approx(row["bits_per_weight"])


def test_roles_of_a_checkpoint_without_activation_scales_are_unchanged():
    doc = audit(ckpt_of(fp8_spec()))
    assert list(doc["tensors"][0]["bytes"]) == list(ROLE_ORDER)
    assert "activation_scale" not in doc["totals"]["bytes_by_role"]


def test_per_expert_block_grid():
    spec = fp8_spec(name="model.layers.0.mlp.experts.down_proj", shape=(4, 192, 576), scale_dtype="BF16",
                    axes=("expert", "out", "in"))
    row = audit(ckpt_of(spec))["tensors"][0]
    assert row["blocks"] == {"extent": {"out": 128, "in": 128}, "grid": [4, 2, 5], "blocks": 40,
                             "partial_blocks": 24}  # 6 of 10 per expert
    assert row["bytes"]["scales"] == 80 and row["bytes"]["codes"] == 4 * 192 * 576


def test_what_if_prices_fp8_layouts_and_marks_the_current_one():
    rows = {r["layout"]: r for r in what_if_layouts(fp8_spec(scale_dtype="BF16"))}
    n = 576 * 1536
    want = {"e4m3 block 64x64, F32 scales": n + 9 * 24 * 4,     # ceil(576/64) x ceil(1536/64)
            "e4m3 block 128x128, F32 scales": n + 5 * 12 * 4,
            "e4m3 block 128x128, BF16 scales": n + 5 * 12 * 2,
            "e4m3 block 256x256, BF16 scales": n + 3 * 6 * 2,    # ceil(576/256) = 3
            "e4m3 block 1x32, F8_E8M0 scales (MX)": n + 576 * 48,
            "e4m3 per-channel, F32 scales": n + 576 * 4,
            "e4m3 per-tensor, F32 scales": n + 4}
    for label, nbytes in want.items():
        assert rows[label]["bytes"] == nbytes, label
        assert rows[label]["bits_per_weight"] == pytest.approx(8 * nbytes / n)
    assert [k for k, r in rows.items() if r["current"]] == ["e4m3 block 128x128, BF16 scales"]
    assert rows["e4m3 block 256x256, BF16 scales"]["partial_blocks"] == 3 * 6 - 2 * 6  # 576 = 2 x 256 + 64
    assert "group 128, F16/BF16 scales, zero point none" in rows  # the integer rows stay beside them
    # ... priced once: the integer per-channel layout with 2-byte scales stores what e4m3 per-channel BF16 stores
    assert rows["e4m3 per-channel, BF16 scales"]["same_as"] == ["per-channel, F16/BF16 scales, zero point none"]


def test_what_if_adds_the_current_layout_when_unlisted():
    rows = what_if_layouts(fp8_spec(block=(128, 64)))
    cur = [r for r in rows if r["current"]]
    assert len(cur) == 1 and cur[0]["layout"] == "e4m3 block(out 128 x in 64), F32 scales"
    assert cur[0]["bytes"] == 576 * 1536 + 5 * 24 * 4


def test_integer_what_if_rows_carry_no_current_key():
    spec = TensorSpec("w", "quantized", (64, 256), (StoredArray("w", "codes", "I32", (64, 32), 8192),),
                      axes=AXES, scheme=QuantScheme(4, False), group_map=GroupMap.per_group(128))
    assert all("current" not in r for r in what_if_layouts(spec))


def test_render_shows_blocks_activation_scales_and_current(capsys):
    act = StoredArray("model.layers.0.mlp.down_proj.input_scale", "activation_scale", "F32", (), 4)
    doc = audit(ckpt_of(fp8_spec(extra=(act,))), what_if=True)
    validate_document(doc, "audit")
    render_audit(doc)
    out = capsys.readouterr().out
    assert "activation_scale" in out
    assert "scale grid 5x12 (60 blocks, 12 partial edge blocks counted)" in out
    assert "1 of 1 tensors" in out
