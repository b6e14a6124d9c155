"""The error report's figures against an independent computation from the two dequantized tensors,
hand-computed values, metadata cost, worst-first order, and the JSON schema."""

import math

import numpy as np

from converter.groups import GroupMap
from converter.quant.error_report import summarize, tensor_report
from converter.quant.quantize import quantize
from converter.quant.requant import Target, classify, requantize
from converter.schemas import validate_document
from converter.scheme import QuantScheme

AX = ("out", "in")


def _doc(rows, reference=None):
    return summarize(rows, source="src", source_format="memory", destination="dst", target_format="native",
                     target=Target(bits=3).to_json(), reference=reference)


def test_hand_computed_rows():
    w = np.array([[0.1, -0.1], [10, -10]], np.float32)
    pc = quantize(w, QuantScheme(8, True, scale_dtype="F32"), GroupMap.per_channel("out"))
    tgt = Target(granularity="tensor")
    info = requantize(pc, tgt)
    row = tensor_report(pc, info, classify(pc, tgt))
    v = row["vs_source"]
    e = np.float32(0.1) - np.float32(10) / np.float32(127)  # small row: 0.1 -> code 1 * 10/127
    assert math.isclose(v.max_abs, float(e), rel_tol=1e-6)
    assert math.isclose(v.mse, 2 * float(e) ** 2 / 4, rel_tol=1e-5)
    assert v.changed_fraction == 0.5 and v.worst_channel["index"] == [0]
    assert v.worst_group["index"] == [0, 0] and v.worst_group["elements"] == 4
    assert row["planned"] == "lossy" and row["result"] == "lossy"
    # metadata: 4 weights x 8 bits = 4 bytes payload; 2 F32 scales -> 1 F32 scale
    assert row["metadata"]["before"]["metadata_bytes"] == 8 and row["metadata"]["after"]["metadata_bytes"] == 4
    assert row["metadata"]["before"]["bits_per_weight"] == 24 and row["metadata"]["after"]["bits_per_weight"] == 16


def test_figures_equal_independent_computation():
    rng = np.random.default_rng(7)
    w = rng.normal(size=(12, 80)).astype(np.float32)
    src = quantize(w, QuantScheme(8, True), GroupMap.per_group(16))
    tgt = Target(bits=3, group_size=32)
    info = requantize(src, tgt)
    out = info.tensor
    row = tensor_report(src, info, classify(src, tgt), reference=w)
    a, b = src.dequantize().astype(np.float64), out.dequantize().astype(np.float64)
    e = b - a
    v = row["vs_source"]
    # squares are summed in float32 per group (ErrorSums): relative precision ~1e-6
    assert math.isclose(v.mse, np.mean(e ** 2), rel_tol=1e-6)
    assert math.isclose(v.rmse, np.sqrt(np.mean(e ** 2)), rel_tol=1e-6)
    assert v.max_abs == np.abs(e).max()
    assert math.isclose(v.rel_frobenius, np.linalg.norm(e) / np.linalg.norm(a), rel_tol=1e-6)
    assert math.isclose(v.sqnr_db, 10 * np.log10(np.sum(a ** 2) / np.sum(e ** 2)), rel_tol=1e-6)
    assert v.changed_fraction == np.count_nonzero(e) / e.size
    assert v.worst_channel["index"] == [int(np.argmax(np.mean(e ** 2, axis=1)))]
    # worst group of the target (group 32 along in, partial tail of 16): (row, group)
    pad = np.zeros((12, 96))
    pad[:, :80] = e ** 2
    cnt = np.array([32, 32, 16])
    per = pad.reshape(12, 3, 32).sum(axis=2) / cnt
    r, g = np.unravel_index(np.argmax(per), per.shape)
    assert v.worst_group["index"] == [r, g] and math.isclose(v.worst_group["mse"], per[r, g], rel_tol=1e-6)
    x = np.random.default_rng(0).standard_normal((80, 8))
    assert math.isclose(v.output_rel_error, np.linalg.norm(b @ x - a @ x) / np.linalg.norm(a @ x), rel_tol=1e-9)
    # against the float reference
    er = b - w.astype(np.float64)
    assert math.isclose(row["vs_reference"]["target"].rel_frobenius, np.linalg.norm(er) / np.linalg.norm(w),
                        rel_tol=1e-6)
    # partial groups: every row has a 16-wide tail group
    assert row["partial_tail"] == 16 and row["partial_groups"] == 12
    # metadata: group 16 -> 12 x 5 F16 scales before, group 32 -> 12 x 3 after
    assert row["metadata"]["before"]["n_groups"] == 60 and row["metadata"]["after"]["n_groups"] == 36
    assert row["metadata"]["after"]["total_bytes"] == 12 * 80 * 3 / 8 + 36 * 2
    doc = _doc([row], reference="ref")
    validate_document(doc, "error-report")
    o = doc["overall"]["vs_source"]
    assert math.isclose(o["mse"], v.mse, rel_tol=1e-12) and o["exact"] is False


def test_exact_rows_worst_first_and_schema():
    rng = np.random.default_rng(8)
    t1 = quantize(rng.normal(size=(4, 64)).astype(np.float32), QuantScheme(4, True), GroupMap.per_channel("out"),
                  name="a")
    t2 = quantize(rng.normal(size=(4, 64)).astype(np.float32) * 3, QuantScheme(4, True), GroupMap.per_group(32),
                  name="b")
    rows = []
    for t, tgt in ((t1, Target(group_size=32)), (t2, Target(bits=2)), (t1, Target(bits=3, scale_search="mse"))):
        info = requantize(t, tgt)
        rows.append(tensor_report(t, info, classify(t, tgt)))
    rows[2]["name"] = "c"
    doc = _doc(rows)
    validate_document(doc, "error-report")
    names = [r["name"] for r in doc["tensors"]]
    assert names[-1] == "a" and doc["tensors"][-1]["result"] == "exact"
    assert doc["tensors"][-1]["vs_source"]["sqnr_db"] is None  # exact: no infinity in JSON
    assert doc["overall"]["exact"] == 1 and doc["overall"]["planned_exact"] == 1
    rels = [r["vs_source"]["rel_frobenius"] for r in doc["tensors"][:-1]]
    assert rels == sorted(rels, reverse=True)
    ss = next(r for r in doc["tensors"] if r["name"] == "c")["scale_search"]
    assert ss["search_mse"] <= ss["absmax_mse"] and ss["gain_db"] >= 0


def test_degenerate_groups_counted():
    x = np.zeros((2, 8), np.float32)
    x[1] = 1.0
    t = quantize(x, QuantScheme(8, True), GroupMap.per_group(4))
    # groups of 4 along in that hold only zeros, counted by hand: both groups of row 0
    zero_groups = sum(not x[r, c:c + 4].any() for r in range(2) for c in (0, 4))
    assert zero_groups == 2
    info = requantize(t, Target(bits=4))
    row = tensor_report(t, info, classify(t, Target(bits=4)))
    # code 127 (row 1) does not fit 4 bits, so the codes cannot be carried: requantized
    assert row["route"] == "requantized" and row["degenerate_groups"] == zero_groups
    info2 = requantize(t, Target(bits=2))
    row2 = tensor_report(t, info2, classify(t, Target(bits=2)))
    assert row2["degenerate_groups"] == 2
    assert np.isfinite(row2["vs_source"].mse)
