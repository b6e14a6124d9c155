"""Row-parallel kernels: the same codes, scales, values and error figures on 1 or 3 threads,
ranges split on block boundaries, and single-threaded inside pool workers."""

import numpy as np
import pytest

from converter.groups import GroupMap
from converter.runtime import run_options
from converter import runtime
from converter.kernels import threads
from converter.quant.error_report import tensor_report
from converter.quant.quantize import quantize
from converter.quant.requant import Target, classify, requantize
from converter.scheme import QuantScheme, ZeroPoint


def test_split_rows_covers_on_block_boundaries():
    assert threads.split_rows(100, 16, 3) == [(0, 32), (32, 64), (64, 100)]
    assert threads.split_rows(10, 16, 4) == [(0, 10)]
    assert threads.split_rows(0, 16, 2) == []


def test_errors_in_any_range_are_raised():
    def fn(a, b):
        if a > 0:
            raise ValueError("range %d" % a)
        return a
    with pytest.raises(ValueError, match="range"):
        threads.run_rows(fn, 64, 16, 4)


@pytest.mark.parametrize("scheme,target", [
    (QuantScheme(4, False, zero_point=ZeroPoint.INTEGER), Target(bits=8, granularity="channel")),
    (QuantScheme(4, True), Target(bits=3, group_size=64, symmetric=False)),
])
def test_same_results_on_one_or_three_threads(monkeypatch, scheme, target):
    from converter.kernels import dequant, rtn
    monkeypatch.setattr(threads, "_POOL", None)  # a fresh pool: no help from an earlier test's threads
    monkeypatch.setattr(threads, "MIN_ELEMENTS_PER_THREAD", 1000)
    monkeypatch.setattr(dequant, "BLOCK_ELEMENTS", 2000)  # blocks of 10 rows: ranges of several blocks
    monkeypatch.setattr(rtn, "QUANT_BLOCK_ELEMENTS", 2000)
    used = []
    real = threads.split_rows
    monkeypatch.setattr(threads, "split_rows", lambda *a: used.append(real(*a)) or used[-1])
    rng = np.random.default_rng(11)
    w = (rng.standard_normal((203, 200)) * rng.uniform(0.01, 5, (203, 1))).astype(np.float32)
    src = quantize(w, scheme, GroupMap.per_group(32))
    got = {}
    for n in (1, 3):
        with run_options(workers=n):
            assert threads.kernel_threads(203 * 200) == n
            deq = src.dequantize()
            info = requantize(src, target)
            out = info.tensor
            row = tensor_report(src, info, classify(src, target))
        got[n] = (deq, out, row["vs_source"])
    (d1, o1, v1), (d3, o3, v3) = got[1], got[3]
    assert max(len(r) for r in used) == 3  # the kernels did run on three row ranges
    assert np.array_equal(d1.view(np.uint32), d3.view(np.uint32))
    assert np.array_equal(o1.codes, o3.codes) and np.array_equal(o1.scales, o3.scales)
    assert (o1.zero_points is None) == (o3.zero_points is None)
    if o1.zero_points is not None:
        assert np.array_equal(o1.zero_points, o3.zero_points)
    # per-row sums added in row order: the same figures to the last bit
    for k in ("mse", "rel_frobenius", "sqnr_db", "output_rel_error", "max_abs", "changed_fraction",
              "worst_channel", "worst_group"):
        assert getattr(v1, k) == getattr(v3, k), k


def test_pool_workers_keep_kernels_single_threaded(monkeypatch):
    monkeypatch.setattr(runtime, "_IN_WORKER", True)
    with run_options(workers=4):
        assert threads.kernel_threads(1 << 30) == 1


def test_nested_run_rows_inside_a_range_runs_inline(monkeypatch):
    """A range that calls run_rows again (a value cache dequantizing its rows) must not wait on
    the pool it occupies: with a one-thread pool this deadlocked."""
    monkeypatch.setattr(threads, "_POOL", None)
    seen = []

    def inner(a, b):
        seen.append((a, b))
        return b - a

    def outer(a, b):
        return sum(threads.run_rows(inner, 64, 16, 4))
    assert threads.run_rows(outer, 64, 16, 2) == [64, 64]
    assert len(seen) == 2  # each nested call ran as one inline range
