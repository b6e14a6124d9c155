"""Tests for converter.formats.gguf.blocks against gguf-py 0.19.0 and real llama.cpp / gguf-py files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import gguf  # noqa: E402  (a declared runtime dependency)
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402

from converter.errors import CorruptFileError, QuantizationError, UnsupportedError  # noqa: E402
from converter.formats.gguf.blocks import (  # noqa: E402
    CODECS, SUPPORTED_READ, SUPPORTED_WRITE, BlockFields, codec_for,
)

LEGACY = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
KQUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
REAL_QUANT_FILES = (
    "minilm_gguf_Q8_0.gguf", "minilm_gguf_Q4_0.gguf", "minilm_gguf_Q4_1.gguf", "minilm_gguf_Q5_0.gguf",
    "minilm_llamacpp_Q4_K_M.gguf", "minilm_llamacpp_Q6_K.gguf",
)
REAL_PLAIN_FILES = ("minilm_gguf_F16.gguf",)  # no block types inside
REAL_FILES = REAL_QUANT_FILES + REAL_PLAIN_FILES
# Byte offsets of the float16 d / dmin fields inside each K-quant block (ggml-common.h).
KQUANT_F16_OFFSETS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
# Used only if the sample folder has no MANIFEST.json: the two tensors every reference file holds.
DEFAULT_HF_NAMES = {
    "blk.0.attn_q.weight": "encoder.layer.0.attention.self.query.weight",
    "blk.0.ffn_down.weight": "encoder.layer.0.output.dense.weight",
}
REPO_ROOT = Path(__file__).resolve().parents[2]



def _product_decode(codec, raw: np.ndarray) -> np.ndarray:
    """The product's decode of GGUF rows: block fields -> QuantizedTensor -> dequantize (what a read does)."""
    from converter.formats.gguf.schemes import tensor_from_fields
    fields = codec.decode(raw)
    return tensor_from_fields("t", fields, (fields.rows, fields.row_len)).dequantize()


def _bits(a: np.ndarray) -> np.ndarray:
    """float32 array as uint32 bit patterns, for bit-exact comparison (NaN-safe)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _gguf_type(name: str) -> GGMLQuantizationType:
    return GGMLQuantizationType[name]


# ------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def real_dir() -> Path:
    """``sample_checkpoints/gguf``: the real GGUF samples shipped with the repository."""
    d = REPO_ROOT / "sample_checkpoints" / "gguf"
    assert (d / REAL_FILES[0]).is_file(), f"real GGUF samples missing from {d}"
    return d


@pytest.fixture(scope="session")
def hf_names(real_dir: Path) -> dict[str, dict[str, str]]:
    """``{file: {gguf tensor name: HF name}}`` from the folder's MANIFEST.json (or a default map)."""
    manifest = real_dir / "MANIFEST.json"
    if not manifest.is_file():
        return {f: dict(DEFAULT_HF_NAMES) for f in REAL_FILES}
    entries = json.loads(manifest.read_text())["files"]
    return {e["file"]: {g: t["hf_name"] for g, t in e["tensors"].items() if "hf_name" in t}
            for e in entries if "tensors" in e}


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261130)


def _tricky_values(rng: np.random.Generator, rows: int = 12, row_len: int = 256) -> np.ndarray:
    """float32 (rows, row_len) with zero blocks, tiny / huge values, exact ties, repeated maxima."""
    x = rng.standard_normal((rows, row_len)).astype(np.float32)
    x[0] = 0.0                                            # all-zero row
    x[1, 32:64] = 0.0                                     # one all-zero block
    x[2] *= np.float32(1e-6)                              # tiny (f16 d underflows to subnormal)
    x[3] *= np.float32(1e-30)                             # tinier (f16 d flushes to 0)
    x[4] *= np.float32(3000.0)                            # large, still fits f16 scales
    x[5, :32] = np.arange(-16, 16, dtype=np.float32)      # FORMATS.md hand check (Q4_0 d = 2)
    x[5, 32:64] = np.arange(32, dtype=np.float32) - 15.5  # half-integers: ties for Q4_1 / Q8_0
    x[6, :32] = np.linspace(-127, 127, 32).round() + 0.5  # Q8_0 ties (d = 1 after clipping below)
    x[6, :2] = (-127.0, 127.0)
    x[7, :32] = 7.25                                      # constant block: max == min, d == 0 for _1
    x[7, 32:64] = rng.choice(np.float32([-3.0, 3.0]), 32)  # +-max magnitude ties (argmax picks first)
    x[8] = -np.abs(x[8]) * np.float32(60000 / 4)          # large negative
    x[9, :32] = np.float32(-8.0) * (np.arange(32) % 17) / 16  # Q4_0 x/d + 8.5 lands on .5 exactly
    return x


# ------------------------------------------------------------------------------------------
# Registry
# ------------------------------------------------------------------------------------------

def test_registry_matches_ggml_sizes():
    assert set(SUPPORTED_READ) == set(LEGACY) | set(KQUANTS) | {"MXFP4", "NVFP4"}
    assert set(SUPPORTED_WRITE) == set(LEGACY)
    for name, codec in CODECS.items():
        assert (codec.block_size, codec.type_size) == GGML_QUANT_SIZES[_gguf_type(name)], name
        assert codec.bits * codec.block_size <= codec.type_size * 8


def test_codec_for_unknown_lists_supported():
    with pytest.raises(UnsupportedError) as err:
        codec_for("IQ2_XXS")
    msg = str(err.value)
    assert "IQ2_XXS" in msg and all(n in msg for n in SUPPORTED_READ)
    assert err.value.found == "IQ2_XXS"
    assert isinstance(err.value, NotImplementedError)


# ------------------------------------------------------------------------------------------
# Legacy types vs gguf-py
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", LEGACY)
def test_legacy_encode_bytes_match_gguf(name, rng):
    x = _tricky_values(rng)
    ours = codec_for(name).encode(x)
    ref = gguf.quants.quantize(x, _gguf_type(name))
    assert ours.dtype == np.uint8 and ours.shape == ref.shape
    assert np.array_equal(ours, ref)


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_decode_dequantize_pack_match_gguf(name, rng):
    codec = codec_for(name)
    raw = gguf.quants.quantize(_tricky_values(rng), _gguf_type(name))
    fields = codec.decode(raw)
    assert np.array_equal(_bits(_product_decode(codec, raw)), _bits(gguf.quants.dequantize(raw, _gguf_type(name))))
    assert np.array_equal(codec.pack(fields), raw)


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_many_rows_cross_chunk_boundaries(name, rng):
    """More rows than one processing chunk: results must not depend on chunking; input untouched."""
    x = (rng.standard_normal((2100, 64)) * rng.uniform(1e-3, 10, (2100, 1))).astype(np.float32)
    before = x.copy()
    codec, qtype = codec_for(name), _gguf_type(name)
    raw = codec.encode(x)
    assert np.array_equal(x, before)
    assert np.array_equal(raw, gguf.quants.quantize(x, qtype))
    assert np.array_equal(_bits(_product_decode(codec, raw)), _bits(gguf.quants.dequantize(raw, qtype)))


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_pack_decode_roundtrip_random_bytes(name, rng):
    """pack(decode(raw)) == raw for arbitrary bytes, including NaN / inf float16 scales."""
    codec = codec_for(name)
    raw = rng.integers(0, 256, size=(9, 5 * codec.type_size), dtype=np.uint8)
    fields = codec.decode(raw)
    assert np.array_equal(codec.pack(fields), raw)
    again = codec.decode(codec.pack(fields))
    for field in ("codes", "scales", "mins"):
        a, b = getattr(fields, field), getattr(again, field)
        assert (a is None and b is None) or (a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8)))


@pytest.mark.parametrize("name", LEGACY)
def test_legacy_fields_dtypes_and_ranges(name, rng):
    codec = codec_for(name)
    raw = gguf.quants.quantize(_tricky_values(rng, row_len=96), _gguf_type(name))
    f = codec.decode(raw)
    assert f.codes.shape == (12, 96) and f.scales.shape == (12, 3) and f.scales.dtype == np.float16
    if name == "Q8_0":
        assert f.codes.dtype == np.int8
    else:
        assert f.codes.dtype == np.uint8 and int(f.codes.max()) < 2 ** codec.bits
    assert (f.mins is not None) == name.endswith("_1")
    assert codec.code_offset == {"Q4_0": 8, "Q5_0": 16}.get(name, 0)


def test_q4_0_hand_checked_block():
    """FORMATS.md 5.3: Q4_0 of [-16 .. 15] gives d = 2.0 and byte 0 = (lo 0, hi 8)."""
    raw = codec_for("Q4_0").encode(np.arange(-16, 16, dtype=np.float32)[None, :])
    assert raw.shape == (1, 18)
    assert raw[0, :2].view(np.float16)[0] == 2.0
    assert raw[0, 2] == 0x80
    f = codec_for("Q4_0").decode(raw)
    assert f.codes[0, 0] == 0 and f.codes[0, 16] == 8 and f.codes[0, 31] == 15


def test_q5_0_high_bit_is_bit_j_of_le_uint32():
    codes = np.zeros((1, 32), dtype=np.uint8)
    codes[0, 9] = 16                 # only the 5th bit of element 9
    raw = codec_for("Q5_0").pack(BlockFields("Q5_0", codes, scales=np.ones((1, 1), np.float16)))
    assert int(raw[0, 2:6].view("<u4")[0]) == 1 << 9
    assert not raw[0, 6:].any()


# ------------------------------------------------------------------------------------------
# Errors
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", LEGACY)
def test_encode_rejects_partial_block(name):
    with pytest.raises(QuantizationError) as err:
        codec_for(name).encode(np.zeros((2, 40), dtype=np.float32))
    assert err.value.expected == "multiple of 32" and err.value.found == 40


def test_encode_rejects_nonfinite_and_f16_overflow():
    x = np.zeros((1, 32), dtype=np.float32)
    x[0, 3] = np.nan
    with pytest.raises(QuantizationError, match="NaN"):
        codec_for("Q8_0").encode(x)
    with pytest.raises(QuantizationError, match="NaN"):
        codec_for("Q5_1").encode(x)
    x[0, 3] = -np.inf
    with pytest.raises(QuantizationError, match="not finite"):
        codec_for("Q4_0").encode(x)
    big = np.full((1, 32), 1e7, dtype=np.float32)
    big[0, 0] = -1e7
    with pytest.raises(QuantizationError, match="overflows float16"):
        codec_for("Q8_0").encode(big)
    with pytest.raises(QuantizationError, match="overflows float16"):
        codec_for("Q4_1").encode(np.full((1, 32), -7e4, dtype=np.float32))


def test_decode_rejects_bad_raw():
    with pytest.raises(CorruptFileError) as err:
        codec_for("Q4_0").decode(np.zeros((2, 19), dtype=np.uint8))
    assert err.value.found == 19
    with pytest.raises(CorruptFileError):
        codec_for("Q6_K").decode(np.zeros((2, 210), dtype=np.int8))
    with pytest.raises(CorruptFileError):
        codec_for("Q8_0").decode(np.zeros(34, dtype=np.uint8))


def test_pack_rejects_out_of_range_codes_and_bad_scales():
    codes = np.full((1, 32), 16, dtype=np.uint8)
    with pytest.raises(QuantizationError, match="out of range"):
        codec_for("Q4_0").pack(BlockFields("Q4_0", codes, scales=np.ones((1, 1), np.float16)))
    with pytest.raises(QuantizationError, match="wrong shape"):
        codec_for("Q4_1").pack(BlockFields("Q4_1", codes & 15, scales=np.ones((1, 1), np.float16)))


@pytest.mark.parametrize("name", KQUANTS)
def test_kquant_pack_inverts_decode(name):
    # K-quant encode is tested against llama.cpp's bytes in test_gguf_kquant_encode.py; here pack
    # must give back any raw super-blocks decode split (random bytes with finite fp16 fields)
    codec = codec_for(name)
    raw = _random_kquant_raw(name, np.random.default_rng(7))
    assert np.array_equal(codec.pack(codec.decode(raw)), raw)


# ------------------------------------------------------------------------------------------
# K-quants vs gguf-py on synthetic bytes
# ------------------------------------------------------------------------------------------

def _random_kquant_raw(name: str, rng: np.random.Generator, rows: int = 6, n_super: int = 4) -> np.ndarray:
    """Random super-blocks with every float16 d / dmin forced to a finite value."""
    ts = codec_for(name).type_size
    raw = rng.integers(0, 256, size=(rows, n_super * ts), dtype=np.uint8)
    blocks = raw.reshape(rows, n_super, ts)
    for off in KQUANT_F16_OFFSETS[name]:
        d = (rng.standard_normal((rows, n_super)) * 10.0 ** rng.integers(-6, 3, (rows, n_super)))
        blocks[..., off:off + 2] = d.astype(np.float16)[..., None].view(np.uint8).reshape(rows, n_super, 2)
    return raw


@pytest.mark.parametrize("name", KQUANTS)
def test_kquant_dequantize_matches_gguf_on_random_bytes(name, rng):
    codec = codec_for(name)
    raw = _random_kquant_raw(name, rng)
    ours = _product_decode(codec, raw)
    ref = gguf.quants.dequantize(raw, _gguf_type(name))
    assert ours.dtype == np.float32 and ours.shape == ref.shape == (6, 1024)
    assert np.array_equal(_bits(ours), _bits(ref))


@pytest.mark.parametrize("name", KQUANTS)
def test_kquant_many_rows_cross_chunk_boundaries(name, rng):
    codec = codec_for(name)
    raw = _random_kquant_raw(name, rng, rows=600, n_super=1)
    ours = _product_decode(codec, raw)
    assert np.array_equal(_bits(ours), _bits(gguf.quants.dequantize(raw, _gguf_type(name))))


@pytest.mark.parametrize("name", KQUANTS)
def test_kquant_fields_shapes_and_ranges(name, rng):
    codec = codec_for(name)
    f = codec.decode(_random_kquant_raw(name, rng, rows=3, n_super=2))
    n_sub = 2 * 256 // codec.sub_block_size
    assert f.codes.shape == (3, 512) and f.codes.dtype == np.uint8
    assert int(f.codes.max()) == 2 ** codec.bits - 1 and int(f.codes.min()) == 0
    assert f.super_scales.shape == (3, 2) and f.super_scales.dtype == np.float16
    assert f.sub_scales.shape == (3, n_sub) and f.sub_block_size == codec.sub_block_size
    assert (f.super_mins is not None) == (f.sub_mins is not None) == codec.has_mins
    lo, hi = {"Q2_K": (0, 15), "Q3_K": (-32, 31), "Q4_K": (0, 63), "Q5_K": (0, 63), "Q6_K": (-128, 127)}[name]
    assert lo <= int(f.sub_scales.min()) and int(f.sub_scales.max()) <= hi
    assert codec.code_offset == {"Q3_K": 4, "Q6_K": 32}.get(name, 0)


def test_q4_k_scale_unpacking_by_hand():
    """get_scale_min_k4: j<4 -> low 6 bits of s[j], s[j+4]; j>=4 -> nibbles of s[j+4] + top bits."""
    block = np.zeros(144, dtype=np.uint8)
    block[0:2] = np.array([1.0], dtype=np.float16).view(np.uint8)
    block[4:16] = [0xC1, 0x02, 0x03, 0x04, 0x45, 0x06, 0x07, 0x08, 0x9A, 0x00, 0x00, 0x00]
    f = codec_for("Q4_K").decode(block[None, :])
    assert f.sub_scales[0].tolist() == [1, 2, 3, 4, 0xA | (3 << 4), 0, 0, 0]
    assert f.sub_mins[0].tolist() == [5, 6, 7, 8, 0x9 | (1 << 4), 0, 0, 0]


# ------------------------------------------------------------------------------------------
# Real files
# ------------------------------------------------------------------------------------------

def _supported_tensors(path: Path):
    reader = gguf.GGUFReader(path)
    return [t for t in reader.tensors if t.tensor_type.name in SUPPORTED_READ]


@pytest.mark.parametrize("file_name", REAL_QUANT_FILES)
def test_real_file_matches_gguf_and_reference(file_name, real_dir, hf_names):
    """Every block tensor decodes bit-exactly like gguf-py, and like the tool's recorded decode."""
    from safetensors.numpy import load_file

    path = real_dir / file_name
    tensors = _supported_tensors(path)
    assert tensors, f"{file_name}: expected block-quantized tensors"
    reference = load_file(str(path) + ".reference_dequant.safetensors")
    names = hf_names.get(file_name, DEFAULT_HF_NAMES)
    compared_ref = 0
    for t in tensors:
        codec = codec_for(t.tensor_type.name)
        raw = np.asarray(t.data).reshape(-1, t.data.shape[-1])
        ours = _product_decode(codec, raw)
        assert ours.shape[1] == int(t.shape[0]), t.name           # ne[0] is the row length
        ref = gguf.quants.dequantize(t.data, t.tensor_type).reshape(ours.shape)
        assert np.array_equal(_bits(ours), _bits(ref)), (file_name, t.name)
        hf = names.get(t.name)
        if hf in reference:
            expected = reference[hf]
            assert expected.dtype == np.float32
            assert np.array_equal(_bits(ours.reshape(expected.shape)), _bits(expected)), (file_name, t.name)
            compared_ref += 1
    assert compared_ref == 2, f"{file_name}: expected attn_q and ffn_down reference tensors compared"


@pytest.mark.parametrize("file_name", REAL_PLAIN_FILES)
def test_real_plain_files_hold_no_block_types(file_name, real_dir):
    """F16 / BF16 files are plain dtypes, not this module's business; guard that it stays so."""
    types = {t.tensor_type.name for t in gguf.GGUFReader(real_dir / file_name).tensors}
    assert types <= {"F32", "F16", "BF16"} and not types & set(SUPPORTED_READ)


def test_real_llamacpp_files_cover_kquants_and_fallbacks(real_dir):
    """The llama.cpp files hold Q6_K blocks plus legacy fallbacks for 384-wide rows."""
    seen = {t.tensor_type.name for f in ("minilm_llamacpp_Q4_K_M.gguf", "minilm_llamacpp_Q6_K.gguf")
            for t in _supported_tensors(real_dir / f)}
    assert {"Q6_K", "Q5_0", "Q8_0"} <= seen


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_legacy_encode_real_weights_match_gguf(name):
    """Real MiniLM fp16 weights (as float32), with a row of all-zero blocks appended: our bytes equal gguf-py's."""
    from safetensors.numpy import load_file

    from tests.conftest import SAMPLES
    w = load_file(str(SAMPLES / "minilm_fp16.safetensors"))["encoder.layer.0.output.dense.weight"].astype(np.float32)
    w = np.concatenate([w[:64], np.zeros((1, w.shape[1]), np.float32)])
    w[3, :32] = 0.0  # an all-zero block inside a non-zero row
    ours = codec_for(name).encode(w)
    theirs = gguf.quants.quantize(w, gguf.GGMLQuantizationType[name])
    assert ours.dtype == np.uint8 and np.array_equal(ours, theirs)
