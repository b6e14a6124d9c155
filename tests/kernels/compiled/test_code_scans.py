"""The validator's compiled code scans (converter/validate/code_scans.py, kernels/compiled/code_scans.py and
column_sums.py) give the numpy path's numbers exactly: saturation fractions, code-offset statistics, the
degenerate test and the column magnitude profile, on hand-made tensors, hypothesis inputs and the samples."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import converter
from converter.codebooks import ELEMENTS
from converter.groups import GroupMap
from converter.kernels import compiled
from converter.layout import EXPERT, IN, OUT
from converter.runtime import run_options
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor
from converter.validate import code_scans, data_checks, float_checks, nibble_order
from tests.conftest import SAMPLES

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba (the fast extra) is not installed")


def _both(fn, t):
    """(numpy result, compiled result) of ``fn(t)``."""
    with run_options(kernels="numpy"):
        a = fn(t)
    with run_options(kernels="numba"):
        b = fn(t)
    return a, b


def _results(t):
    out = (data_checks.saturation_profile(t), data_checks.zero_offset(t), data_checks.check_degenerate(t))
    if float_checks.float_element(t) is not None:
        out += (float_checks.block_saturation(t), float_checks.check_nonfinite_codes(t),
                float_checks.check_unsaturated(t))
    return out


def _tensor(codes, scheme, gm, zeros=None):
    shape = codes.shape
    scales = np.full(gm.param_shape(shape, (OUT, IN)), 0.5, scheme.scale_np_dtype)
    return QuantizedTensor("m.w", (OUT, IN), codes, scales, scheme, gm, zero_points=zeros)


def test_hand_counted_saturation_and_offsets():
    # 4 x 8 uint4 codes, symmetric (centre 8), groups of 4 along in: group (row 0, cols 0-3) holds a 15 and
    # (row 1, cols 4-7) a 1 (|1 - 8| = 7 >= 7); the other six groups hold only 8s and 9s
    codes = np.full((4, 8), 8, np.uint8)
    codes[0, 2] = 15
    codes[1, 5] = 1
    codes[2, :4] = 9
    t = _tensor(codes, QuantScheme(4, False), GroupMap.per_group(4, IN))
    with run_options(kernels="numba"):
        counts = code_scans.saturation_counts(t, {"": t.group_map, "rows": GroupMap.per_group(4, OUT)})
        mean, _ = data_checks.zero_offset(t)
        degenerate = data_checks.check_degenerate(t)
    assert counts == {"": (2, 8), "rows": (2, 8)}  # along out: columns 2 and 5 only
    assert mean == (7 - 7 + 4) / 32
    assert degenerate == []
    with run_options(kernels="numba"):
        assert data_checks.check_degenerate(_tensor(np.full((4, 8), 3, np.uint8), QuantScheme(4, False),
                                                    GroupMap.per_group(4, IN)))[0].code == "degenerate"


def test_integer_zero_points_hand_counted():
    # asymmetric uint4, one zero per row (channel): row 0's zero is the centre 8 and holds |2 - 8| >= 7? no
    # (6): unsaturated; row 1's zero 8 with a 1: saturated; row 2's zero 3 (not the centre) with a 14: not
    # an end, not centred: unsaturated; row 3 holds a 0 (a range end)
    codes = np.array([[2, 8], [1, 8], [14, 3], [0, 5]], np.uint8)
    zeros = np.array([[8], [8], [3], [5]], np.int32)
    t = _tensor(codes, QuantScheme(4, False, ZeroPoint.INTEGER), GroupMap.per_channel(OUT), zeros)
    with run_options(kernels="numba"):
        counts = code_scans.saturation_counts(t, {"": t.group_map})
        s1, s2 = code_scans.offset_sums(t)
    assert counts == {"": (2, 4)}
    r = [2 - 8, 0, 1 - 8, 0, 14 - 3, 0, 0 - 5, 0]
    assert (s1, s2) == (sum(r), sum(x * x for x in r))
    assert _both(_results, t)[0] == _both(_results, t)[1]


SCHEMES = [QuantScheme(4, False), QuantScheme(4, True), QuantScheme(8, True), QuantScheme(3, False),
           QuantScheme(4, False, ZeroPoint.INTEGER), QuantScheme(8, False, ZeroPoint.INTEGER),
           QuantScheme(4, True, ZeroPoint.INTEGER), QuantScheme(4, False, ZeroPoint.FLOAT),
           QuantScheme(4, False, codebook=ELEMENTS["e2m1"].values, scale_dtype="F8_E4M3"),
           QuantScheme(8, False, codebook=ELEMENTS["e4m3"].values, scale_dtype="F32"),
           QuantScheme(8, False, codebook=ELEMENTS["e5m2"].values, scale_dtype="F32")]


def _group_maps(rows, cols, data):
    maps = [GroupMap.per_tensor(), GroupMap.per_channel(OUT), GroupMap.per_channel(IN),
            GroupMap.per_group(data.draw(st.integers(1, max(1, cols))), IN),
            GroupMap.per_group(data.draw(st.integers(1, max(1, rows))), OUT),
            GroupMap.per_block(data.draw(st.integers(1, rows + 2)), data.draw(st.integers(1, cols + 2))),
            GroupMap.per_block(None, data.draw(st.integers(1, cols + 2)))]
    size = data.draw(st.integers(1, cols))
    n = -(-cols // size)
    # act-order: a shuffled group index per column (some draws leave a group empty: both paths refuse it)
    g_idx = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=cols, max_size=cols)), np.int32)
    maps.append(GroupMap.per_group(size, IN, g_idx=g_idx))
    return maps


@settings(max_examples=60, deadline=None)
@given(data=st.data(), rows=st.integers(1, 40), cols=st.integers(1, 40), scheme=st.sampled_from(SCHEMES))
def test_compiled_scans_equal_numpy(data, rows, cols, scheme):
    lo, hi = scheme.qmin, scheme.qmax
    alphabet = data.draw(st.lists(st.integers(lo, hi), min_size=1, max_size=6, unique=True))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    codes = rng.choice(np.array(alphabet), size=(rows, cols)).astype(scheme.code_dtype)
    for gm in _group_maps(rows, cols, data):
        zeros = None
        if scheme.zero_point is not ZeroPoint.NONE:
            shape = gm.param_shape((rows, cols), (OUT, IN))
            zeros = (rng.choice([scheme.center, scheme.center, lo, hi, 1], size=shape).astype(np.int32)
                     if scheme.zero_point is ZeroPoint.INTEGER else rng.random(shape).astype(np.float16))
        t = _tensor(codes, scheme, gm, zeros)
        try:
            with run_options(kernels="numpy"):
                expected = _results(t)
        except converter.errors.ConverterError as exc:  # an empty act-order group: both paths refuse alike
            with run_options(kernels="numba"), pytest.raises(type(exc)):
                _results(t)
            continue
        with run_options(kernels="numba"):
            assert _results(t) == expected, gm


@pytest.mark.parametrize("scheme,grouping", [(QuantScheme(4, False), "group"), (QuantScheme(4, True), "group"),
                                             (QuantScheme(4, False, ZeroPoint.INTEGER), "group"),
                                             (QuantScheme(8, False, ZeroPoint.INTEGER), "channel"),
                                             (QuantScheme(8, True), "tensor"), (QuantScheme(4, False), "g_idx"),
                                             (QuantScheme(4, False, ZeroPoint.INTEGER), "group nonfinite")])
def test_column_profile_bits_equal_numpy(scheme, grouping):
    """The nibble profile's float64 column sums, from the codes (integer schemes) or from float32 rows."""
    from converter import rows as rows_module
    from converter.layout import AxisMap
    rng = np.random.default_rng(1)
    n_rows, n_in = 300, 64
    codes = rng.integers(scheme.qmin, scheme.qmax + 1, (n_rows, n_in)).astype(scheme.code_dtype)
    nonfinite = grouping.endswith("nonfinite")
    grouping = grouping.split()[0]
    gm = {"group": GroupMap.per_group(8, IN), "channel": GroupMap.per_channel(OUT), "tensor": GroupMap.per_tensor(),
          "g_idx": GroupMap.per_group(8, IN, g_idx=rng.permutation(np.arange(n_in) // 8).astype(np.int32))}[grouping]
    pshape = gm.param_shape((n_rows, n_in), (OUT, IN))
    scales = (rng.random(pshape) * np.float32(1e-3)).astype(np.float16)
    scales.flat[0] = np.float16(6e-8)  # a subnormal float16 scale
    if scales.size > 7:
        scales.flat[7] = -0.0
        if nonfinite:  # infinite and NaN scales: the float32 rows' path (NaN payloads)
            scales.flat[5], scales.flat[6] = np.inf, np.nan
    zeros = rng.integers(0, 2 ** scheme.bits, pshape).astype(np.int32) if scheme.zero_point is ZeroPoint.INTEGER \
        else None
    t = QuantizedTensor("m.w", (OUT, IN), codes, scales, scheme, gm, zero_points=zeros,
                        stored={"codes": AxisMap((IN, OUT), packed_axis=IN, bits=scheme.bits, container="I32")})
    old = rows_module.SUPER_ELEMENTS
    rows_module.SUPER_ELEMENTS = 64 * 7  # blocks of 7 rows: the block sums' order matters
    try:
        a, b = _both(nibble_order.column_profile, t)
    finally:
        rows_module.SUPER_ELEMENTS = old
    assert a["profile"].view(np.uint64).tolist() == b["profile"].view(np.uint64).tolist()
    from_rows = grouping == "g_idx" or nonfinite
    assert "converter.kernels.compiled.column_sums.add_column_squares" + ("" if from_rows else "_codes") \
        in compiled.compile_seconds()


def test_column_squares_kernel_bits():
    from converter.kernels.compiled.column_sums import add_column_squares
    rng = np.random.default_rng(2)
    block = (rng.standard_normal((257, 33)) * 1e3).astype(np.float32)
    block[0, 0], block[1, 1], block[2, 2], block[3, 3] = np.float32(1e-45), -0.0, np.inf, np.nan
    block[5:7, 4] = [np.inf, np.nan]  # inf then NaN
    block[8, 5] = -np.float32(np.nan)
    acc = rng.standard_normal(33)
    acc[6] = np.inf
    expected = acc + (block.astype(np.float64) ** 2).sum(axis=0)
    assert add_column_squares(block, acc) == 0  # (one NaN operand per addition: IEEE-defined payloads)
    assert acc.view(np.uint64).tolist() == expected.view(np.uint64).tolist()
    # two NaNs in one addition (a second NaN in a column, or a NaN accumulator): counted, left to numpy
    block[9, 5] = np.float32(np.nan)
    assert add_column_squares(block, np.zeros(33)) > 0
    nan_acc = np.zeros(33)
    nan_acc[3] = np.nan
    assert add_column_squares(block[:5], nan_acc) > 0


def test_nan_code_times_nan_scale_is_left_to_numpy():
    from converter.kernels.compiled.fp_decode import decode_codebook
    cb = np.asarray(ELEMENTS["e4m3"].values, np.float32)
    codes = np.array([[0x38, 0x7F], [0x7F, 0x38]], np.uint8)  # 1.0 and NaN
    scales = np.array([[2.0], [np.nan]], np.float32)
    assert decode_codebook(codes, cb, scales, n_in=2, group_size=None) is None  # row 1: NaN code x NaN scale
    scales[1, 0] = 3.0
    out = decode_codebook(codes, cb, scales, n_in=2, group_size=None)
    assert out[0, 0] == 2.0 and out[1, 1] == 3.0 and np.isnan(out[0, 1]) and np.isnan(out[1, 0])


SAMPLE_DIRS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and p.name != "gguf")


@pytest.mark.parametrize("name", SAMPLE_DIRS)
def test_samples_same_numbers(name):
    ckpt = converter.load(SAMPLES / name)
    for key in ckpt:
        t = ckpt[key]
        if isinstance(t, QuantizedTensor):
            a, b = _both(_results, t)
            assert a == b, key


@pytest.mark.parametrize("name", SAMPLE_DIRS + ["gguf"])
def test_validate_report_identical_on_samples(name):
    """The whole validate document of each shipped sample, numpy vs compiled kernels."""
    from converter.validate import validate
    path = SAMPLES / name
    targets = sorted(path.glob("*.gguf")) if name == "gguf" else [path]
    for target in targets:
        with run_options(kernels="numpy"):
            a = validate(target).to_json()
        with run_options(kernels="numba"):
            b = validate(target).to_json()
        assert a == b, target


@pytest.mark.parametrize("scheme", SCHEMES, ids=lambda s: s.describe())
def test_byte_tables_match_the_range_rules(scheme):
    """The per-byte tables both paths use, against the saturation rules written out per code value."""
    t = _tensor(np.zeros((1, 1), scheme.code_dtype), scheme, GroupMap.per_tensor(),
                np.zeros((1, 1), np.int32) if scheme.zero_point is ZeroPoint.INTEGER else
                np.zeros((1, 1), np.float16) if scheme.zero_point is ZeroPoint.FLOAT else None)
    ends, values, use_zero = code_scans.byte_tables(t)
    assert use_zero == (scheme.zero_point is ZeroPoint.INTEGER)
    for byte in range(256):
        v = byte - 256 if scheme.signed and byte >= 128 else byte
        assert values[byte] == v
        if scheme.codebook is not None:
            mags = [abs(x) for x in scheme.codebook if np.isfinite(x)]
            expected = byte < len(scheme.codebook) and abs(scheme.codebook[byte]) == max(mags)
        else:
            expected = v in (scheme.qmin, scheme.qmax) or (
                scheme.zero_point is ZeroPoint.NONE and abs(v - scheme.center) >= 2 ** (scheme.bits - 1) - 1)
        assert bool(ends[byte]) == expected, byte


@settings(max_examples=30, deadline=None)
@given(data=st.data(), experts=st.integers(1, 3), rows=st.integers(1, 20), cols=st.integers(1, 20),
       element=st.sampled_from(["e4m3", "e5m2"]))
def test_float_scans_on_expert_stacks(data, experts, rows, cols, element):
    """Block maxima and non-finite counts of (expert, out, in) FP8 stacks, NaN / inf codes included."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    block = GroupMap.per_block(data.draw(st.integers(1, rows)), data.draw(st.integers(1, cols)))
    gm = data.draw(st.sampled_from([block, GroupMap.per_channel(OUT), GroupMap.per_tensor(),
                                    GroupMap.per_group(data.draw(st.integers(1, cols)), IN)]))
    shape, axes = (experts, rows, cols), (EXPERT, OUT, IN)
    codes = rng.integers(0, 256, size=shape, dtype=np.uint8)
    if data.draw(st.booleans()):  # mostly small codes: unsaturated groups
        codes &= np.uint8(0x9F)
    scheme = QuantScheme(8, False, codebook=ELEMENTS[element].values, scale_dtype="F32")
    t = QuantizedTensor("m.w", axes, codes, np.ones(gm.param_shape(shape, axes), np.float32), scheme, gm)
    with run_options(kernels="numpy"):
        expected = (float_checks.block_saturation(t), float_checks.check_nonfinite_codes(t),
                    float_checks.check_unsaturated(t))
    with run_options(kernels="numba"):
        got = (float_checks.block_saturation(t), float_checks.check_nonfinite_codes(t),
               float_checks.check_unsaturated(t))
        assert code_scans.group_max_table(t, float_checks._rank_table(float_checks.float_element(t))[0]) is not None
    assert got == expected
