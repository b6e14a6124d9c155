"""The validator's one-pass scan of packed words (converter/validate/word_scan.py: compiled in
kernels/compiled/word_scan.py, or numpy block by block) gives the per-check numpy scans' numbers exactly:
saturation counts under the declared grouping and its alternative, the code-offset statistics, the degenerate
test and the float64 bits of the column magnitude profile, on hand-counted words, on hypothesis inputs (2/4/8-bit
fields, signed and domain-shifted, GPTQ and compressed-tensors orientation, zero points at and off the centre,
partial groups, zero / negative / subnormal scales, small row blocks and column strips) and on the shipped
samples' reports (tests/kernels/compiled/test_code_scans.py). The numpy scan (the default install's path) is tested
without numba too; the compiled halves run when the fast extra is installed."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from converter import rows as rows_module
from converter.groups import GroupMap
from converter.kernels import compiled
from converter.layout import IN, OUT, AxisMap, PackedCodes
from converter.runtime import run_options
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor
from converter.validate import data_checks, nibble_order, word_scan
from tests.conftest import SAMPLES

#: The word scan's kernel paths under test: numpy always, compiled with the fast extra.
KERNELS = ("numpy", "numba") if compiled.available() else ("numpy",)
needs_numba = pytest.mark.skipif(not compiled.available(), reason="numba (the fast extra) is not installed")


def _packed(fields, bits, stored, signed=False, flip=False, scheme=None, gm=None, scales=None, zeros=None):
    """A fresh tensor holding ``fields`` (uint8 ``(out, in)``, the stored field values) packed in int32 words."""
    out, n_in = fields.shape
    amap = AxisMap(stored, packed_axis=IN, bits=bits, container="I32")
    words = amap.to_stored(fields, (OUT, IN))
    words.flags.writeable = False  # as a file's memory map
    codes = PackedCodes(words, amap, (OUT, IN), {OUT: out, IN: n_in}, signed=signed, flip=flip)
    return QuantizedTensor("m.w", (OUT, IN), codes, scales, scheme, gm, zero_points=zeros, stored={"codes": amap})


def _alternatives(t):
    return {name: gm for name, (gm, _) in data_checks.alternative_maps(t).items()}


def _numbers(t, scan):
    prof = nibble_order.column_profile(t, scan)
    return (data_checks.saturation_profile(t, scan), data_checks.zero_offset(t, scan),
            data_checks.check_degenerate(t, scan), prof["profile"].view(np.uint64).tolist())


def _both(make):
    """(the checks' own numbers, the compiled scan's) of fresh copies of one tensor (``t.codes`` unpacks and keeps
    the codes, so each path gets its own); asserts that both scans covered it, that the numpy scan's numbers are the
    checks' own, and that the compiled scan never unpacked the words. Without numba the second item is the numpy
    scan's numbers (already asserted equal)."""
    with run_options(kernels="numpy"):
        expected = _numbers(make(), None)  # each check scans the unpacked codes itself
        t = make()
        scan = word_scan.scan(t, _alternatives(t))  # the numpy scan, block by block
        assert scan is not None
        got = _numbers(t, scan)
        assert got == expected
    if not compiled.available():
        return expected, got
    with run_options(kernels="numba"):
        t = make()
        scan = word_scan.scan(t, _alternatives(t))
        assert scan is not None
        got = _numbers(t, scan)
        assert t.packed is not None  # the words were never unpacked
    return expected, got


@pytest.mark.parametrize("kernels", ["numpy", pytest.param("numba", marks=needs_numba)])
def test_hand_counted_words(kernels):
    # 2 rows x 16 uint4 codes in GPTQ orientation (words (in/8, out)), symmetric (centre 8, saturated: q <= 1 or
    # q == 15), groups of 8 along in: row 0 holds a 15 in group 0, row 1 a 1 in group 1; every other code is 8
    fields = np.full((2, 16), 8, np.uint8)
    fields[0, 3] = 15
    fields[1, 12] = 1
    scales = np.full((2, 2), 0.5, np.float16)
    scheme = QuantScheme(4, False)
    with run_options(kernels=kernels):
        t = _packed(fields, 4, (IN, OUT), scheme=scheme, gm=GroupMap.per_group(8, IN), scales=scales)
        scan = word_scan.scan(t, {"groups along out": GroupMap.per_group(2, OUT)})
    assert scan.saturation == {"": (2, 4), "groups along out": (2, 16)}  # columns 3 and 12 of the one row pair
    assert scan.offset_sums == (7 - 7, 49 + 49)
    assert not scan.all_equal and scan.first_code == 8
    expected = np.zeros(16)
    expected[3], expected[12] = (0.5 * 7) ** 2, (0.5 * -7) ** 2
    assert scan.column_squares.tolist() == expected.tolist()
    with run_options(kernels=kernels):
        t = _packed(np.full((2, 16), 3, np.uint8), 4, (OUT, IN), scheme=scheme, gm=GroupMap.per_group(8, IN),
                    scales=scales)
        scan = word_scan.scan(t, {})
    assert scan.all_equal and scan.first_code == 3
    assert data_checks.check_degenerate(t, scan)[0].evidence["code_value"] == 3


def test_not_covered_is_none():
    scheme = QuantScheme(4, False)
    fields = np.zeros((4, 16), np.uint8)
    with run_options(kernels=KERNELS[-1]):  # (decided before either path runs)
        gidx = GroupMap.per_group(8, IN, g_idx=np.arange(16, dtype=np.int32) // 8)
        assert word_scan.scan(_packed(fields, 4, (IN, OUT), scheme=scheme, gm=gidx,
                                      scales=np.ones((4, 2), np.float16)), {}) is None
        nan = np.ones((4, 2), np.float16)
        nan[1, 1] = np.nan  # non-finite scales: the float32 rows' path
        assert word_scan.scan(_packed(fields, 4, (IN, OUT), scheme=scheme, gm=GroupMap.per_group(8, IN),
                                      scales=nan), {}) is None
        odd = GroupMap.per_group(4, IN)  # groups of 4 split the 8-code words
        assert word_scan.scan(_packed(fields, 4, (IN, OUT), scheme=scheme, gm=odd,
                                      scales=np.ones((4, 4), np.float16)), {}) is None
        unpacked = QuantizedTensor("m.w", (OUT, IN), fields, np.ones((4, 2), np.float16), scheme,
                                   GroupMap.per_group(8, IN))
        assert word_scan.scan(unpacked, {}) is None
        amap = AxisMap((IN, OUT), packed_axis=IN, bits=4, container="I32")
        wide = np.zeros((2, 8), np.int32)  # words of a 4-row tensor as columns 0-3 of a wider array: not contiguous
        strided = PackedCodes(wide[:, :4], amap, (OUT, IN), {OUT: 4, IN: 16}, signed=False)
        assert word_scan.scan(QuantizedTensor("m.w", (OUT, IN), strided, np.ones((4, 2), np.float16), scheme,
                                              GroupMap.per_group(8, IN)), {}) is None


@settings(max_examples=80, deadline=None)
@given(data=st.data(), rows=st.integers(1, 40), n_words=st.integers(1, 5), bits=st.sampled_from([2, 4, 8]),
       signed=st.booleans(), flip=st.booleans(), stored=st.sampled_from([(IN, OUT), (OUT, IN)]),
       integer=st.booleans(), grouping=st.sampled_from(["group", "channel", "tensor"]),
       block_rows=st.integers(1, 9), strip=st.integers(1, 200), scale_dtype=st.sampled_from(["F16", "BF16", "F32"]))
def test_scan_equals_numpy(data, rows, n_words, bits, signed, flip, stored, integer, grouping, block_rows, strip,
                           scale_dtype):
    per_word = 32 // bits
    n_in = n_words * per_word
    scheme = QuantScheme(bits, signed, ZeroPoint.INTEGER if integer else ZeroPoint.NONE, scale_dtype=scale_dtype)
    if grouping == "group":
        gm = GroupMap.per_group(per_word * data.draw(st.integers(1, n_words + 1)), IN)  # (partial groups too)
    else:
        gm = GroupMap.per_channel(OUT) if grouping == "channel" else GroupMap.per_tensor()
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    alphabet = data.draw(st.lists(st.integers(0, (1 << bits) - 1), min_size=1, max_size=6, unique=True))
    fields = rng.choice(np.array(alphabet, np.uint8), size=(rows, n_in))
    pshape = gm.param_shape((rows, n_in), (OUT, IN))
    # scales over six decades: float64 sums of squares that round (a changed order of additions shows)
    scales = (rng.random(pshape) * 10.0 ** rng.uniform(-4, 2, pshape)).astype(scheme.scale_np_dtype)
    special = [0.0, -0.0, 6e-8, -1.5e-3]  # (6e-8: a float16 subnormal)
    for i in data.draw(st.lists(st.integers(0, scales.size - 1), max_size=3)):
        scales.flat[i] = special[i % len(special)]
    zeros = None
    if integer:  # zero points at the centre (saturation at |q - z| >= 2^(b-1) - 1) and off it
        zeros = rng.choice([scheme.center, scheme.center, scheme.qmin, scheme.qmax, scheme.qmin + 1],
                           size=pshape).astype(np.int32)

    def make():
        return _packed(fields, bits, stored, signed, flip, scheme, gm, scales, zeros)

    old = rows_module.SUPER_ELEMENTS, word_scan.STRIP_CODES
    rows_module.SUPER_ELEMENTS = block_rows * n_in  # row blocks of block_rows rows: their order matters
    word_scan.STRIP_CODES = strip  # the numpy scan's column strips (whole groups, at least one)
    try:
        expected, got = _both(make)
    finally:
        rows_module.SUPER_ELEMENTS, word_scan.STRIP_CODES = old
    assert got == expected


def test_random_words_large_groups_both_orientations():
    """Full-range random words (every code value), groups of 128 along in and the alternative along out (rows
    >= 128), the 7B benchmark's tensor kind; v1-style integer zero points at the centre and one off it."""
    rng = np.random.default_rng(3)
    fields = rng.integers(0, 16, (300, 512), dtype=np.uint8)
    scales = (rng.random((300, 4)) * 1e-2 + 1e-3).astype(np.float16)
    zeros = np.full((300, 4), 8, np.int32)
    zeros[7, 2] = 5
    for stored in ((IN, OUT), (OUT, IN)):
        for scheme, z in ((QuantScheme(4, False), None), (QuantScheme(4, False, ZeroPoint.INTEGER), zeros)):
            def make(stored=stored, scheme=scheme, z=z):
                return _packed(fields, 4, stored, scheme=scheme, gm=GroupMap.per_group(128, IN), scales=scales,
                               zeros=z)
            expected, got = _both(make)
            assert got == expected
            assert set(expected[0]["alternatives"]) == {"groups along out"}


@pytest.mark.parametrize("fault", ["transposed", "nibble order", "all zero", "v1 read as v2"])
def test_fault_reports_identical(tmp_path, fault):
    """Reports with findings (axis-swap, nibble-order, degenerate, zero-offset) from the word scan on both paths
    equal the per-check scans' (the compiled word scan never runs under QCKPT_KERNELS=numpy; the numpy word scan
    is swapped for the checks' own scans to get the reference)."""
    from dataclasses import replace

    import converter
    from converter.formats.gptq import format as gptq
    from converter.validate import validate
    from tests.conftest import SAMPLES
    from tests.validate.helpers import QUERY, copy_sample, edit_config, edit_tensors
    d = copy_sample("gptq_w4_g128_sym", tmp_path)
    stored = f"{QUERY[:-len('.weight')]}.qweight"
    codes = converter.load(SAMPLES / "gptq_w4_g128_sym")[QUERY].codes
    if fault == "transposed":
        edit_tensors(d, lambda s: s.__setitem__(stored, gptq.codes_map(4).to_stored(codes.T.copy(), (OUT, IN))))
    elif fault == "nibble order":
        flipped = replace(gptq.codes_map(4), order=(7, 6, 5, 4, 3, 2, 1, 0))
        edit_tensors(d, lambda s: s.__setitem__(stored, flipped.to_stored(codes, (OUT, IN))))
    elif fault == "all zero":
        edit_tensors(d, lambda s: s.__setitem__(stored, np.zeros_like(s[stored])))
    else:
        edit_config(d, lambda qc: qc.update(checkpoint_format="gptq_v2", format="gptq_v2"))
    reports = []
    for kernels in KERNELS:
        with run_options(kernels=kernels):
            reports.append(validate(d).to_json())
    original = word_scan.scan
    word_scan.scan = lambda t, alternatives: None  # every check scans the codes itself
    try:
        with run_options(kernels="numpy"):
            reference = validate(d).to_json()
    finally:
        word_scan.scan = original
    assert reference["findings"]  # the fault is reported
    assert reports == [reference] * len(KERNELS)


def test_one_column_tail_strip_sums_row_by_row():
    """A per-channel tensor whose last column strip would hold one column: numpy sums a ``(rows, 1)`` array pairwise
    (8 partial sums from 8 rows on), ``column_profile`` row by row, so that strip must not be one column. Hand-built
    column 7 over 8 rows: row 0's value -128 * 2^15 (square 2^44, one ulp 2^-8), rows 1-7 one step of 0.0375 (square
    0.0014067 = 0.36 ulp). Row by row each small square rounds away (< half an ulp): the sum is exactly 2^44;
    pairwise, two of them (0.72 ulp) round up to one ulp: 2^44 + 2 ulp or more."""
    fields = np.full((8, 8), 128, np.uint8)  # uint8 per channel: centre 128, every other column decodes to 0
    fields[0, 7], fields[1:, 7] = 0, 129
    scales = np.full((8, 1), 0.0375, np.float16)
    scales[0, 0] = 2.0 ** 15

    def make():
        return _packed(fields, 8, (OUT, IN), scheme=QuantScheme(8, False), gm=GroupMap.per_channel(OUT),
                       scales=scales)

    old = rows_module.SUPER_ELEMENTS, word_scan.STRIP_CODES
    rows_module.SUPER_ELEMENTS = 64  # one row block of the 8 rows
    word_scan.STRIP_CODES = 56  # strips of 56 // 8 = 7 columns: [0, 7) and the lone column 7
    try:
        expected, got = _both(make)
    finally:
        rows_module.SUPER_ELEMENTS, word_scan.STRIP_CODES = old
    profile = np.array(expected[3], dtype=np.uint64).view(np.float64)  # sqrt(column sum / out)
    assert profile[7] == np.sqrt(2.0 ** 44 / 8) and not profile[:7].any()
    assert got == expected


def _sample_paths():
    skip = (".json", ".md", "SHA256SUMS", "reference_dequant.safetensors", "kquant_expected", "minilm_fp16.safetensors")
    paths = [p for p in sorted(SAMPLES.iterdir()) if not p.name.endswith(skip) and p.name != "gguf"]
    return paths + [p for p in sorted((SAMPLES / "gguf").iterdir()) if p.suffix == ".gguf"]


@pytest.mark.parametrize("path", _sample_paths(), ids=lambda p: p.name)
def test_likely_covered_is_the_scan_on_every_sample(path):
    """The header-only guess (which sets the validator's per-tensor working set under --max-memory) is what the scan
    then does on every shipped sample: GPTQ and compressed-tensors pack-quantized covered, AWQ (words along out,
    interleaved), MLX (float bias), GGUF, bitsandbytes, FP8 and FP4 not."""
    import converter
    from converter.formats import registry
    from converter.formats.source import Source
    ckpt = converter.load(path)
    hooks = registry.validation_hooks(ckpt.format)
    read = Source(path).read
    seen = set()
    for spec in ckpt.specs():
        if spec.kind != "quantized":
            continue
        t = ckpt[spec.name]
        actual = isinstance(t, QuantizedTensor) and word_scan._plan(t, _alternatives(t)) is not None
        assert word_scan.likely_covered(spec, hooks.words_along_in, read) == actual, spec.name
        seen.add(actual)
    covered = path.name.startswith(("gptq_", "ct_pack_w4"))  # (w8a16 is 8-bit codes in int32 words too)
    covered = covered or path.name == "ct_pack_w8a16_channel_sym"
    assert seen == ({True} if covered else {False} if seen else set())


@pytest.mark.parametrize("g_idx", ["permuted", "trivial"])
def test_likely_covered_reads_a_stored_g_idx(tmp_path, g_idx):
    """A GPTQ checkpoint whose config says no act-order (desc_act false: spec.act_order False) but whose stored g_idx
    is a permutation loads with that g_idx, which the word scan does not cover (the per-check scans' 8 bytes per weight
    then run): the header-only guess said covered and the validator budgeted 2. The guess reads the stored g_idx
    (``I`` integers) when given a reader; without one a stored g_idx under a group map that has none is not
    covered. A trivial g_idx (``i // G``, what the reader drops) stays covered."""
    import converter
    from safetensors.numpy import load_file, save_file

    from converter.formats import registry
    from converter.formats.source import Source
    from tests.synthetic import Shape, build_gptq

    d = tmp_path / "gptq"
    build_gptq(d, Shape(1, 256, 512, 8))  # desc_act false, every g_idx arange(I) // 128
    name = "model.layers.0.self_attn.q_proj.g_idx"
    if g_idx == "permuted":
        arrays = load_file(str(d / "model.safetensors"))
        arrays[name] = np.random.default_rng(0).permutation(arrays[name]).astype(np.int32)
        save_file(arrays, str(d / "model.safetensors"), {"format": "pt"})
    ckpt = converter.load(d)
    read = Source(d).read
    hooks = registry.validation_hooks(ckpt.format)
    spec = ckpt.spec("model.layers.0.self_attn.q_proj.weight")
    assert not spec.act_order and spec.group_map.g_idx is None
    t = ckpt[spec.name]
    covered = word_scan._plan(t, _alternatives(t)) is not None
    assert covered == (g_idx == "trivial") and (t.group_map.g_idx is None) == covered
    assert word_scan.likely_covered(spec, hooks.words_along_in, read) == covered
    assert word_scan.scan(t, _alternatives(t)) is None or covered
    assert not word_scan.likely_covered(spec, hooks.words_along_in)  # no reader: the stored g_idx unseen
