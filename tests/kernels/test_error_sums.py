"""The error figures requantize() sums inside its own row blocks (ErrorSums fed by
quantize_rows) against an independent whole-array computation from the two dequantized
tensors, for symmetric / asymmetric targets, per channel and per group with a partial tail,
small (float64 products) and large (float32 GEMMs) tensors."""

import math

import numpy as np
import pytest

from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.quant.error_report import tensor_report
from converter.quant.quantize import quantize
from converter.quant.requant import Target, classify, requantize
from converter.scheme import QuantScheme, ZeroPoint


def _independent(a, b, target_group):
    e = b - a
    x = np.random.default_rng(0).standard_normal((a.shape[1], 8))
    rows, n = e.shape
    G = target_group or n
    ng = -(-n // G)
    pad = np.zeros((rows, ng * G))
    pad[:, :n] = e ** 2
    cnt = np.full(ng, G)
    cnt[-1] = n - (ng - 1) * G
    per = pad.reshape(rows, ng, G).sum(axis=2) / cnt
    r, g = np.unravel_index(np.argmax(per), per.shape)
    return {"mse": np.mean(e ** 2), "max_abs": np.abs(e).max(), "changed_fraction": np.count_nonzero(e) / e.size,
            "rel_frobenius": np.linalg.norm(e) / np.linalg.norm(a),
            "worst_channel": [int(np.argmax(np.mean(e ** 2, axis=1)))], "worst_group": ([int(r), int(g)], per[r, g]),
            "output_rel_error": np.linalg.norm(b @ x - a @ x) / np.linalg.norm(a @ x)}


@pytest.mark.parametrize("rows,n,src_group,target,out_tol", [
    (24, 200, 32, Target(bits=8, granularity="channel"), 1e-9),            # per-channel, small
    (24, 200, 32, Target(bits=3, group_size=64, symmetric=False), 1e-9),  # asym, partial tail of 8
    (40, 136, 8, Target(bits=2, group_size=16), 1e-9),                    # 2-bit, tail of 8
    (1030, 1100, 100, Target(bits=8, granularity="channel"), 1e-5),       # > LARGE: float32 GEMMs
    (1030, 1100, 100, Target(bits=4, group_size=300, symmetric=False), 1e-5),  # tail of 200
])
def test_fused_figures_equal_independent(rows, n, src_group, target, out_tol):
    rng = np.random.default_rng(rows + n)
    w = (rng.standard_normal((rows, n)) * rng.uniform(0.01, 10, (rows, 1))).astype(np.float32)
    src = quantize(w, QuantScheme(4, False, zero_point=ZeroPoint.INTEGER), GroupMap.per_group(src_group))
    info = requantize(src, target)
    out = info.tensor
    assert info.vs_source is not None  # summed in requantize's own blocks, not recomputed by the report
    row = tensor_report(src, info, classify(src, target))
    v = row["vs_source"]
    a, b = src.dequantize().astype(np.float64), out.dequantize().astype(np.float64)
    ind = _independent(a, b, target.group_size)
    # squares summed in float32 per chunk (ErrorSums): ~1e-6; the maximum is exact
    for k in ("mse", "rel_frobenius"):
        assert math.isclose(getattr(v, k), ind[k], rel_tol=1e-6), k
    assert v.max_abs == ind["max_abs"]
    assert v.changed_fraction == ind["changed_fraction"]
    assert v.worst_channel["index"] == ind["worst_channel"]
    assert v.worst_group["index"] == ind["worst_group"][0]
    assert math.isclose(v.worst_group["mse"], ind["worst_group"][1], rel_tol=1e-6)
    assert math.isclose(v.output_rel_error, ind["output_rel_error"], rel_tol=out_tol)
    # the codes are the ones the whole-array quantizer gives the dequantized source
    ts = out.scheme
    ref = quantize(src.dequantize(), ts, out.group_map)
    assert np.array_equal(out.codes, ref.codes) and np.array_equal(out.scales, ref.scales)


@pytest.mark.parametrize("magnitude", [1e21, 1e-24])
def test_figures_survive_float32_overflow_and_underflow_of_squares(magnitude):
    """Values whose squares leave float32's range are summed again in float64: finite figures
    equal to the whole-array (float64) formulas, never inf / NaN / a false 'no error'."""
    from converter.quant.error_report import comparison
    from converter.kernels.metrics import error_stats
    rng = np.random.default_rng(2)
    a = (rng.standard_normal((64, 256)) * magnitude).astype(np.float32)
    b = (a * np.float32(1 + 1e-3)).astype(np.float32)
    got = comparison(a, b, GroupMap.per_group(128), ("out", "in"))
    st = error_stats(a, b)
    assert got.exact is False and st.exact is False
    for k in ("mse", "rel_frobenius", "sqnr_db"):
        assert math.isfinite(getattr(got, k)) and math.isclose(getattr(got, k), getattr(st, k), rel_tol=1e-6), k


def test_blocked_comparison_matches_whole_array_formulas():
    from converter.quant import error_report as er
    from converter.kernels.metrics import error_stats, output_error, worst_channel, worst_group
    rng = np.random.default_rng(5)
    a = rng.standard_normal((301, 200)).astype(np.float32)
    b = (a + rng.standard_normal(a.shape).astype(np.float32) * 1e-3).astype(np.float32)
    b[7] = a[7]
    for gm in (GroupMap.per_group(64), GroupMap.per_channel(), GroupMap.per_tensor()):
        got = er.comparison(a, b, gm, (OUT, IN)).to_json()  # row-local groups: compare_rows
        st = error_stats(a, b)
        # squares are summed in float32 per chunk (ErrorSums): relative precision ~1e-6
        for k in ("mse", "rmse", "rel_frobenius", "sqnr_db"):
            assert got[k] == pytest.approx(getattr(st, k), rel=1e-6), k
        for k in ("max_abs", "changed_fraction"):
            assert got[k] == getattr(st, k), k
        assert got["worst_channel"] == {"index": worst_channel(a, b, (OUT, IN))["index"],
                                        "mse": pytest.approx(worst_channel(a, b, (OUT, IN))["mse"], rel=1e-6)}
        wg = worst_group(a, b, gm, (OUT, IN))
        assert got["worst_group"]["index"] == wg["index"] and got["worst_group"]["elements"] == wg["elements"]
        assert got["worst_group"]["mse"] == pytest.approx(wg["mse"], rel=1e-6)
        assert got["output_rel_error"] == pytest.approx(
            output_error(a, b, (OUT, IN), n_inputs=er.N_INPUTS, seed=er.SEED)["rel_error"], rel=1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_worst_group_in_row_chunks_is_numpy_argmax_of_the_whole_quotient(seed, monkeypatch):
    # the worst group is found without a whole-size ``grp_se / counts``: the same (first) maximum as numpy's
    # argmax over the whole quotient, ties and NaN (argmax's first NaN) included
    from converter.kernels import error_sums
    rng = np.random.default_rng(seed)
    rows, ngr = int(rng.integers(1, 30)), int(rng.integers(1, 6))
    grp_se = rng.integers(0, 4, (rows, ngr)).astype(np.float64)  # small integers: many ties
    for _ in range(seed % 3):
        grp_se[rng.integers(0, rows), rng.integers(0, ngr)] = np.nan
    counts = np.full(ngr, 32.0)
    counts[-1] = float(rng.integers(1, 33))
    monkeypatch.setattr(error_sums, "WORST_ROWS", int(rng.integers(1, 7)))
    per = grp_se / counts
    r, c = divmod(int(np.argmax(per)), ngr)
    got = error_sums._worst_group(grp_se, counts)
    assert got[:2] == (r, c)
    assert got[2] == per[r, c] or (math.isnan(got[2]) and math.isnan(per[r, c]))
