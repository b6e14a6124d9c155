"""The compiled requantize kernel (converter.kernels.compiled.requant) against the numpy path: both
run on the same inputs; codes, scales, zero points, the degenerate count and every error figure
bit-identical (the compiled path forms the reconstruction, the error, its maximum and changed count
in the kernel and hands the same float32 blocks to the reference's own sums)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from converter.kernels import compiled
from converter.kernels.dequant import byte_table
from converter.kernels.error_sums import ErrorSums
from converter.kernels.rtn import quantize_rows
from converter.runtime import run_options
from converter.scheme import QuantScheme, ZeroPoint
from converter.values import RowPlan

pytestmark = pytest.mark.skipif(not compiled.available(), reason="the fast extra (numba) is not installed")


class PlanRows:
    """A row source that also offers its decode plan (as :class:`converter.rows.Rows` of a packed
    tensor does): the numpy path reads ``[r0:r1]`` (the plan's numpy decode), the compiled path
    decodes the plan's bytes itself."""

    def __init__(self, plan: RowPlan, step: int = 7):
        self.plan, self.step = plan, step
        self.shape = (plan.codes.shape[0], plan.n_in)
        self.dtype = np.dtype(np.float32)

    def fork(self):
        return PlanRows(self.plan, self.step)

    def decode_plan(self, r0, r1):
        p = self.plan

        def cut(a):
            return None if a is None else (a[r0:r1] if a.shape[0] > 1 else a)
        return RowPlan(p.codes[r0:r1], cut(p.scales), cut(p.zero_points), p.n_in, p.zero_kind, p.group_size,
                       p.center, p.table, p.codebook)

    def __getitem__(self, idx):
        return self.decode_plan(idx.start, idx.stop).dequantize()


def both(values, s, group_size, *, errors=True):
    """quantize_rows on the numpy and the compiled path: (result, figures) each."""
    out = []
    for kernels in ("numpy", "numba"):
        sums = ErrorSums(values.shape[0], values.shape[1], group_size) if errors else None
        with run_options(kernels=kernels):
            got = quantize_rows(values, s, group_size=group_size, compare=sums)
        out.append((got, None if sums is None else sums.figures()))
    return out


def assert_same(pair):
    (a, fa), (b, fb) = pair
    assert (a is None) == (b is None)
    if a is None:
        return
    assert a.scales.dtype == b.scales.dtype and np.array_equal(a.scales.view(np.uint8), b.scales.view(np.uint8))
    assert (a.zero_points is None) == (b.zero_points is None)
    if a.zero_points is not None:
        assert a.zero_points.dtype == b.zero_points.dtype and np.array_equal(a.zero_points, b.zero_points)
    assert a.codes.dtype == b.codes.dtype and np.array_equal(a.codes, b.codes)
    assert a.degenerate_groups == b.degenerate_groups
    if fa is None:
        return
    assert fa.to_json() == fb.to_json()
    assert (fa.sse, fa.ssr, fa.out_sq_err, fa.out_sq_ref) == (fb.sse, fb.ssr, fb.out_sq_err, fb.out_sq_ref)


def grid(bits, signed, asym, scale_dtype="F16", rounding="half_even"):
    return QuantScheme(bits, signed, ZeroPoint.INTEGER if asym else ZeroPoint.NONE, scale_dtype, rounding=rounding)


@st.composite
def matrices(draw, bits, asym):
    """Float32 ``(out, in)`` matrices with rounding ties (``x / s`` exactly ``k + 1/2`` for the scale
    the grid of ``bits`` / ``asym`` derives), all-zero groups and rows, fp16-underflow rows, partial
    final groups and mixed magnitudes."""
    rows = draw(st.integers(1, 12))
    n = draw(st.integers(1, 300))
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, n)) * draw(st.sampled_from([1e-3, 0.05, 1.0, 300.0]))).astype(np.float32)
    for r in range(rows):
        kind = draw(st.sampled_from(["plain", "ties", "zero", "underflow", "zero_group", "few"]))
        if kind == "ties":  # scale p (a power of two): every other value (k + 1/2) p, a tie
            p = np.float32(2.0 ** rng.integers(-8, 4))
            if asym:  # range [0, levels p]: scale p, zero point 0
                levels = (1 << bits) - 1
                x[r] = (rng.integers(0, levels, n) + 0.5).astype(np.float32) * p
                x[r, ::32] = 0
                x[r, 1::32] = levels * p
            else:  # max |x| = qpos p: scale p
                qpos = (1 << (bits - 1)) - 1
                x[r] = (rng.integers(-qpos, qpos, n) + 0.5).astype(np.float32) * p
                x[r, ::32] = qpos * p
        elif kind == "zero":
            x[r] = 0
        elif kind == "underflow":  # scales below fp16's smallest subnormal
            x[r] *= np.float32(1e-9)
        elif kind == "zero_group":
            x[r, : min(n, 32)] = 0
        elif kind == "few":
            x[r] = np.where(rng.random(n) < 0.9, 0, x[r])
    return x


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), bits=st.integers(2, 8), signed=st.booleans(), asym=st.booleans(),
       scale_dtype=st.sampled_from(["F16", "BF16", "F32"]), rounding=st.sampled_from(["half_even", "half_away"]),
       group=st.sampled_from([None, 16, 32, 128, 100]), half=st.booleans(), errors=st.booleans())
def test_float_rows_give_identical_codes_and_equal_sums(data, bits, signed, asym, scale_dtype, rounding, group, half,
                                                        errors):
    x = data.draw(matrices(bits, asym))
    if half:  # a float16 matrix (quantize from an fp16 checkpoint): widened to float32 by both paths
        x = x.astype(np.float16)
    assert_same(both(x, grid(bits, signed, asym, scale_dtype, rounding), group, errors=errors))


def test_ties_round_half_to_even_on_both_paths():
    """x / s = k + 0.5 exactly: half-even codes (0.5 -> 0, 1.5 -> 2, 2.5 -> 2); both paths agree
    with the hand-computed codes."""
    x = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 127.0]], dtype=np.float32)  # max 127: scale exactly 1
    for kernels in ("numpy", "numba"):
        with run_options(kernels=kernels):
            got = quantize_rows(x, grid(8, True, False, "F32"), group_size=None)
        assert got.scales[0, 0] == 1.0
        assert got.codes.tolist() == [[0, 2, 2, 0, -2, -2, 127]]


def test_non_finite_values_leave_both_paths_to_the_whole_array_quantizer():
    x = np.ones((4, 64), dtype=np.float32)
    x[2, 5] = np.nan
    assert_same(both(x, grid(8, True, False), 32))
    x[2, 5] = np.inf
    assert_same(both(x, grid(4, False, True), 32))


def test_overflowing_scale_leaves_both_paths_to_the_whole_array_quantizer():
    x = np.full((2, 8), 3e38, dtype=np.float32)
    pair = both(x, grid(8, True, False, "F16"), None)
    assert pair[0][0] is None and pair[1][0] is None


@st.composite
def packed_plans(draw):
    """Row plans of packed codes decoded bytewise (GPTQ / compressed-tensors style) or of 8-bit code
    arrays (MLX codes as read): random
    bytes, 2/4/8-bit fields, signed / unsigned / flipped, symmetric centre, integer zero points
    (v1-style asymmetric: any zero in range) or float biases, per-group or per-row parameters."""
    bits = draw(st.sampled_from([2, 4, 8]))
    rows = draw(st.integers(1, 20))
    n = (8 // bits) * draw(st.integers(1, 80))
    signed, flip = draw(st.booleans()), draw(st.booleans())
    kind = draw(st.sampled_from(["none", "integer", "float"]))
    group = draw(st.sampled_from([None, 8, 32, 128]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    data = rng.integers(0, 256, (rows, n * bits // 8), dtype=np.uint8)
    ng = 1 if group is None else -(-n // group)
    scales = (rng.random((rows, ng)) * draw(st.sampled_from([1e-6, 1e-3, 1.0]))).astype(np.float16).astype(np.float32)
    scales[rng.random((rows, ng)) < 0.1] = 0  # all-zero groups
    center = 0.0 if signed or kind != "none" else float(1 << (bits - 1))
    zp = None
    if kind == "integer":
        zp = rng.integers(0, 1 << bits, (rows, ng)).astype(np.float32)
    elif kind == "float":
        zp = (rng.standard_normal((rows, ng)) * 0.01).astype(np.float16).astype(np.float32)
    if group is None and draw(st.booleans()) and zp is None:
        scales = scales[:1]  # one scale for the whole matrix
    if draw(st.booleans()):  # codes as read, one per byte (MLX, 8-bit arrays): the plan's centre applies
        codes = rng.integers(-128 if signed else 0, 128 if signed else 256, (rows, n)).astype(
            np.int8 if signed else np.uint8)
        return RowPlan(codes, scales, zp, n, kind, group, center, None, None)
    table = byte_table(bits, signed=signed, flip=flip, center=center)
    return RowPlan(data, scales, zp, n, kind, group, 0.0, table, None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=packed_plans(), bits=st.integers(2, 8), signed=st.booleans(), asym=st.booleans(),
       group=st.sampled_from([None, 16, 128]), step=st.sampled_from([1, 3, 64]))
def test_packed_sources_decode_in_the_kernel_identically(plan, bits, signed, asym, group, step):
    src = PlanRows(plan, step)
    assert_same(both(src, grid(bits, signed, asym), group))


def test_packed_source_is_decoded_by_the_kernel_not_by_numpy(monkeypatch):
    """The fused path reads the plan's bytes: the numpy decode ([r0:r1]) is never called."""
    rng = np.random.default_rng(0)
    plan = RowPlan(rng.integers(0, 256, (16, 64), dtype=np.uint8), rng.random((16, 1)).astype(np.float32),
                   None, 128, "none", None, 0.0, byte_table(4, signed=False, flip=False, center=8.0), None)
    src = PlanRows(plan)
    want = both(src, grid(8, True, False), None)
    monkeypatch.setattr(PlanRows, "__getitem__", lambda self, idx: pytest.fail("numpy decode called"))
    sums = ErrorSums(16, 128, None)
    with run_options(kernels="numba"):
        got = quantize_rows(src, grid(8, True, False), group_size=None, compare=sums)
    assert_same([want[0], (got, sums.figures())])


def test_kernel_logic_without_compiling_matches():
    """The kernels' Python bodies (``py_func``) give the compiled results too (the logic, not numba's
    typing, is what the tests above check)."""
    from converter.kernels.compiled import requant

    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    amax = np.empty((3, 3), np.float32)
    for fn in (requant._decode_extrema.py_func, requant._decode_extrema):
        assert fn(x, requant._NO_BYTES, requant._NO_TABLE, requant._NO_PARAMS, requant._NO_PARAMS, 0, 1, False, 16,
                  True, amax, amax, amax)
        want = [np.abs(x[:, g:g + 16]).max(axis=1) for g in (0, 16, 32)]
        assert np.array_equal(amax, np.stack(want, axis=1))


def test_row_ranges_on_two_threads_give_the_single_thread_results(monkeypatch):
    """A 2M-value matrix on two kernel threads (``workers=2``: two row ranges, each with its own reader,
    buffers and error-sum part) and on one: the same codes, scales and figures on both paths."""
    rng = np.random.default_rng(7)
    rows, n = 512, 4096
    plan = RowPlan(rng.integers(0, 256, (rows, n // 2), dtype=np.uint8),
                   (rng.random((rows, n // 128)) * 0.01).astype(np.float32), None, n, "none", 128, 0.0,
                   byte_table(4, signed=False, flip=False, center=8.0), None)
    from converter.kernels import threads as kernel_threads_module
    from converter.kernels.compiled import rtn_rows

    threads = []
    real = kernel_threads_module.run_rows

    def spy(fn, r, step, t):  # the compiled path's row ranges (its work closure lives in rtn_rows)
        if fn.__module__ == rtn_rows.__name__:
            threads.append(t)
        return real(fn, r, step, t)
    monkeypatch.setattr(kernel_threads_module, "run_rows", spy)
    results = []
    for workers in (1, 2):
        with run_options(workers=workers):
            pair = both(PlanRows(plan, step=64), grid(8, True, False), None)
        assert_same(pair)
        results.append(pair[1])
    assert threads == [1, 2]  # the compiled path ran on one, then two threads
    assert_same(results)


@pytest.mark.parametrize("asym", [False, True])
def test_a_group_of_float32_subnormals_gets_a_nonzero_scale_on_both_paths(asym):
    """max |x| = 3 * 2**-149 (d, float32's smallest subnormal): 3d / 7 (or 6d / 15) rounds to 0 in float32, a scale
    that made NaN codes (and NaN figures on the numpy path only). By hand: the scale is raised to d, so x / s is
    3, -3, 0, 2 exactly: codes 3, -3, 0, 2 (symmetric, signed 4-bit) or, zero point 3, 6, 0, 3, 5 (asymmetric,
    unsigned), the reconstruction exact."""
    d = np.float32(np.finfo(np.float32).smallest_subnormal)
    x = np.array([[3, -3, 0, 2] * 8], dtype=np.float32) * d
    pair = both(x, grid(4, not asym, asym, "F32"), None)
    assert_same(pair)
    (got, fig), _ = pair
    assert got.scales.tolist() == [[d]]
    if asym:
        assert got.zero_points.tolist() == [[3]] and got.codes[0, :4].tolist() == [6, 0, 3, 5]
    else:
        assert got.codes[0, :4].tolist() == [3, -3, 0, 2]
    assert fig.to_json()["exact"] is True and fig.max_abs == 0.0
