"""The compiled GGUF encoders (``fast`` extra) against the numpy reference, byte for byte.

Every test encodes the same rows with ``kernels="numpy"`` (the reference: gguf-py's and llama.cpp's
bytes, checked in test_gguf_blocks.py / test_gguf_kquant_encode.py) and ``kernels="numba"`` and
compares the bytes (or the error); the real-file tests compare the compiled output with llama.cpp's
own bytes directly. Skipped as a whole only when numba (the optional extra) is not installed.
"""

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

numba = pytest.importorskip("numba")

from converter.cli import main  # noqa: E402
from converter.errors import QuantizationError  # noqa: E402
from converter.formats.gguf.blocks import codec_for  # noqa: E402
from converter.formats.gguf.compiled_scalar import f16_bits, f16_value, nearest_int  # noqa: E402
from converter.formats.gguf.kquant_search import nearest_int as nearest_int_numpy  # noqa: E402
from converter.kernels import compiled  # noqa: E402
from converter.runtime import run_options  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints" / "gguf"
LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
KQUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _both(type_name, x):
    """(numpy bytes or error text, numba bytes or error text) of ``codec.encode(x)``."""
    out = []
    for kernels in ("numpy", "numba"):
        with run_options(kernels=kernels):
            try:
                out.append(codec_for(type_name).encode(x))
            except QuantizationError as e:
                out.append(f"{type(e).__name__}: {e}")
    return out


def _assert_same(type_name, x):
    ref, fast = _both(type_name, x)
    if isinstance(ref, str) or isinstance(fast, str):
        assert ref == fast
        return
    bad = np.nonzero((ref != fast).any(axis=1))[0]
    assert ref.shape == fast.shape and bad.size == 0, f"{type_name}: rows {bad[:8]} differ"


# ---- scalar helpers ---------------------------------------------------------------------

@numba.njit
def _f16_bits_all(v):
    out = np.empty(v.size, np.uint16)
    for i in range(v.size):
        out[i] = f16_bits(v[i])
    return out


@numba.njit
def _f16_values_all(h):
    out = np.empty(h.size, np.float32)
    for i in range(h.size):
        out[i] = f16_value(h[i])
    return out


@numba.njit
def _nearest_all(v):
    out = np.empty(v.size, np.int64)
    for i in range(v.size):
        out[i] = nearest_int(v[i])
    return out


def test_half_conversion_is_numpys_on_every_half_and_every_rounding_boundary():
    halves = np.arange(1 << 16, dtype=np.uint16)
    finite = halves[np.isfinite(halves.view(np.float16))]
    want = finite.view(np.float16).astype(np.float32)
    assert np.array_equal(_f16_values_all(finite).view(np.uint32), want.view(np.uint32))
    # float32 -> half: every half, every midpoint between neighbours (ties to even), one float32 ulp
    # either side of each midpoint, the overflow edge, and 2^20 random float32 bit patterns
    pos = np.arange(0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)  # exact in float32
    edge = np.array([65504, 65519.996, 65520, 65536, 1e30, 2.0**-25, 2.0**-24, 1e-45, 3e-8], np.float32)
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)
    random = random[np.isfinite(random)]
    v = np.concatenate([pos.astype(np.float32), mids, np.nextafter(mids, np.float32(0)),
                        np.nextafter(mids, np.float32(np.inf)), edge, random])
    v = np.concatenate([v, -v, np.array([np.inf, -np.inf], np.float32)])
    assert np.array_equal(_f16_bits_all(v), v.astype(np.float16).view(np.uint16))


def test_nearest_int_is_the_numpy_port_bits_everywhere():
    rng = np.random.default_rng(1)
    v = np.concatenate([np.arange(-40, 40, 0.25, dtype=np.float32), np.float32([4194303.5, 4194304, -4194305, 1e9,
                                                                                 -1e20, np.inf, -np.inf, np.nan]),
                        rng.standard_normal(10000).astype(np.float32) * 100])
    assert np.array_equal(_nearest_all(v), nearest_int_numpy(v).astype(np.int64))


# ---- encoders on the same rows ------------------------------------------------------------

def _sample_rows(row_len):
    rng = np.random.default_rng(7)
    rows = [rng.standard_normal(row_len) * s for s in (0.02, 1.0, 300.0)]
    x = np.stack(rows).astype(np.float32)
    ties = np.round(rng.standard_normal(row_len) * 4) / 4  # many equal magnitudes, +-0.5 steps
    zero = np.zeros(row_len)
    neg_zero = -np.zeros(row_len)
    mixed_zero = np.where(np.arange(row_len) % 2, 0.0, -0.0)
    relu = np.maximum(rng.standard_normal(row_len), 0)  # min exactly 0 in most blocks
    tiny = rng.standard_normal(row_len) * 1e-39  # float32 subnormals
    small = rng.standard_normal(row_len) * 1e-6  # scales underflow float16
    onehot = np.zeros(row_len)
    onehot[::37] = 3.0
    const = np.full(row_len, -1.25)
    return np.vstack([x, np.stack([ties, zero, neg_zero, mixed_zero, relu, tiny, small, onehot, const])
                      .astype(np.float32)])


@pytest.mark.parametrize("type_name", LEGACY + KQUANTS)
def test_compiled_bytes_equal_numpy_on_sample_rows(type_name):
    _assert_same(type_name, _sample_rows(512))


@pytest.mark.parametrize("type_name", LEGACY + KQUANTS)
def test_compiled_errors_equal_numpy(type_name):
    row_len = 256
    x = np.random.default_rng(3).standard_normal((4, row_len)).astype(np.float32)
    for bad in (np.nan, np.inf, -np.inf, 1e38):
        y = x.copy()
        y[2, 17] = bad
        ref, fast = _both(type_name, y)
        if isinstance(ref, str):
            assert ref == fast
        else:
            assert isinstance(fast, np.ndarray) and np.array_equal(ref, fast)
    big = x * np.float32(1e6)  # scales beyond float16: both refuse (legacy) or both give the same bytes
    _assert_same(type_name, big)


@pytest.mark.parametrize("type_name", LEGACY + KQUANTS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_compiled_bytes_equal_numpy_on_generated_rows(type_name, data):
    row_len = 256
    rows = data.draw(st.integers(1, 3))
    grid = data.draw(st.sampled_from([None, 0.5, 1.0 / 64]))
    elements = st.floats(-70000, 70000, allow_nan=False, allow_infinity=False, width=32)
    x = data.draw(hnp.arrays(np.float32, (rows, row_len), elements=elements))
    if grid is not None:  # quantized values: ties in scales, codes and block maxima
        x = (np.round(x / 1000 / grid) * grid).astype(np.float32)
    scale = data.draw(st.sampled_from([1.0, 1e-3, 1e-30, 1e-41]))
    _assert_same(type_name, (x * np.float32(scale)).astype(np.float32))


def test_compiled_kquants_are_llama_cpp_bytes():
    x = np.load(SAMPLES / "kquant_expected" / "inputs.npz")["x"]
    expected = np.load(SAMPLES / "kquant_expected" / "expected.npz")
    with run_options(kernels="numba"):
        for type_name in KQUANTS:
            raw = codec_for(type_name).encode(x)
            bad = np.nonzero((raw != expected[type_name]).any(axis=1))[0]
            assert bad.size == 0, f"{type_name}: blocks {bad[:8]} differ from llama.cpp"


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q6_K"])
def test_compiled_convert_matches_llama_quantize_file(tmp_path, monkeypatch, file_type):
    import gguf

    monkeypatch.setenv(compiled.KERNELS_ENV, "numba")
    dst = tmp_path / "out.gguf"
    res = CliRunner().invoke(main, ["convert", str(SAMPLES / "minilm_gguf_F16.gguf"), str(dst), "--to", "gguf",
                                    "--quant-type", file_type, "--quiet"])
    assert res.exit_code == 0, res.output
    mine = {t.name: (t.tensor_type.name, np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(str(dst)).tensors}
    ref = gguf.GGUFReader(str(SAMPLES / f"minilm_llamacpp_{file_type}.gguf"))
    assert len(mine) == len(ref.tensors)
    for t in ref.tensors:
        assert mine[t.name] == (t.tensor_type.name, np.asarray(t.data).tobytes()), t.name


@pytest.mark.parametrize("type_name, module, entry", [("Q8_0", "compiled_legacy", "encode_legacy_blocks"),
                                                      ("Q4_K", "compiled_encode", "encode_kquant_blocks")])
def test_auto_mode_takes_the_kernel_for_a_requantize_row_block_not_for_a_tiny_call(monkeypatch, type_name, module,
                                                                                   entry):
    import importlib

    from converter.kernels.rtn import QUANT_BLOCK_ELEMENTS

    kernels = importlib.import_module(f"converter.formats.gguf.{module}")
    calls = []
    real = getattr(kernels, entry)
    monkeypatch.setattr(kernels, entry, lambda *a: calls.append(1) or real(*a))
    monkeypatch.delenv(compiled.KERNELS_ENV, raising=False)
    codec = codec_for(type_name)
    codec.encode(np.ones((4, 256), np.float32))
    assert calls == []
    # the requantize path (quant/format_quant.py) hands the encoder row blocks of 2^17 values
    block = np.random.default_rng(0).standard_normal((QUANT_BLOCK_ELEMENTS // 4096, 4096)).astype(np.float32)
    codec.encode(block)
    assert calls
