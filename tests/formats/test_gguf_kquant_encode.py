"""K-quant encoders and llama-quantize's type mixes against llama.cpp's own output.

Expected bytes: llama.cpp's ``quantize_row_q*_K_ref`` (libggml-base of llama-cpp-python 0.3.36) on the
matrices of ``sample_checkpoints/gguf/kquant_expected`` (``make_expected.py``); expected types per tensor:
``llama_model_quantize`` of that build on synthetic LLaMA / BERT layouts (``make_mixes.py``).
"""

from pathlib import Path
import json

import numpy as np
import pytest

from converter.errors import QuantizationError
from converter.formats.gguf.blocks import codec_for
from converter.formats.gguf.kquant_search import nearest_int
from converter.formats.gguf.mix import FILE_TYPES, ModelInfo, TensorInfo, choose_types, use_more_bits

DATA = Path(__file__).resolve().parents[2] / "sample_checkpoints" / "gguf" / "kquant_expected"
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


@pytest.fixture(scope="module")
def matrices():
    return np.load(DATA / "inputs.npz")["x"], np.load(DATA / "expected.npz")


@pytest.mark.parametrize("type_name", K_TYPES)
def test_encode_is_llama_cpp_bytes(matrices, type_name):
    x, expected = matrices
    raw = codec_for(type_name).encode(x)  # one super-block per row
    want = expected[type_name]
    bad = np.nonzero((raw != want).any(axis=1))[0]
    assert raw.shape == want.shape and bad.size == 0, f"{type_name}: blocks {bad[:8]} differ"


@pytest.mark.parametrize("type_name", K_TYPES)
def test_rows_of_several_super_blocks_and_pack_round_trip(matrices, type_name):
    x, expected = matrices
    rows = x[:96].reshape(24, 4 * 256)  # 4 super-blocks per row: same bytes, row by row
    codec = codec_for(type_name)
    raw = codec.encode(rows)
    assert np.array_equal(raw.reshape(96, -1), expected[type_name][:96])
    assert np.array_equal(codec.pack(codec.decode(raw)), raw)


def test_nearest_int_is_round_half_even_with_c_bits():
    v = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3.49999, -7.5, 4194303.0], dtype=np.float32)
    assert nearest_int(v).tolist() == [0, 2, 2, 0, -2, 3, -8, 4194303]


def test_encode_refuses_bad_rows_and_non_finite():
    codec = codec_for("Q4_K")
    with pytest.raises(QuantizationError, match="256"):
        codec.encode(np.zeros((2, 384), np.float32))
    x = np.zeros((1, 256), np.float32)
    x[0, 3] = np.nan
    with pytest.raises(QuantizationError, match="finite"):
        codec.encode(x)


def test_use_more_bits_by_hand():
    # n = 8: first eighth (0), last eighth (7), and (i - 1) % 3 == 2 -> 3, 6
    assert [i for i in range(8) if use_more_bits(i, 8)] == [0, 3, 6, 7]
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def _layout(case):
    w = case["width"]
    ts = [TensorInfo("token_embd.weight", w, 2), TensorInfo("output_norm.weight", w, 1)]
    if not case["tied"]:
        ts.append(TensorInfo("output.weight", w, 2))
    for i in range(case["n_layer"]):
        for n, rl in (("attn_q", w), ("attn_k", w), ("attn_v", w), ("attn_output", w), ("ffn_gate", w),
                      ("ffn_up", w), ("ffn_down", 2 * w)):
            ts.append(TensorInfo(f"blk.{i}.{n}.weight", rl, 2))
        ts.append(TensorInfo(f"blk.{i}.attn_norm.weight", w, 1))
    return ts, ModelInfo(case["arch"], case["n_layer"], case["heads"], case["heads_kv"])


MIXES = json.loads((DATA / "mixes.json").read_text())


@pytest.mark.parametrize("case_id", sorted(MIXES))
def test_types_are_llama_quantize_types(case_id):
    case = MIXES[case_id]
    tensors, model = _layout(case["case"])
    for ft, exp in case["mixes"].items():
        assert FILE_TYPES[ft][0] == exp["file_type"]
        got = choose_types(ft, tensors, model)
        for name, want in exp["types"].items():
            assert (got[name] or "F32") == want, (case_id, ft, name)
