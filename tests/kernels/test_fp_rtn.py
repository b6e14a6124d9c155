"""FP8 round-to-nearest: bit for bit what compressed-tensors / auto-round wrote for real SmolLM2
weights (tests/data/fp8), and hand-computed cases for the rules (scale, saturation, all-zero
tiles, partial edge tiles, bf16 intermediate rounding, E5M2, streaming)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from converter.codebooks import ELEMENTS
from converter.errors import QuantizationError
from converter.groups import GroupMap
from converter.kernels.fp_rtn import fp_codes, quantize_fp_rows
from converter.quant.float_quant import quantize_float
from converter.rows import Rows
from converter.tensor import DenseTensor

FIXTURE = Path(__file__).parent.parent / "data" / "fp8" / "smollm2_fp8_fixture.safetensors"
NAMES = ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.down_proj.weight")
BF16, E4M3, E5M2 = ml_dtypes.bfloat16, ELEMENTS["e4m3"], ELEMENTS["e5m2"]


def load_fixture() -> dict[str, np.ndarray]:
    """The fixture's arrays read with a hand parser (8-byte header length, JSON header, raw data)."""
    raw = FIXTURE.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, v in head.items():
        if name != "__metadata__":
            a, b = v["data_offsets"]
            dt = {"U8": np.uint8, "U16": np.uint16}[v["dtype"]]
            out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=dt).reshape(v["shape"])
    return out


@pytest.fixture(scope="module")
def fx():
    return load_fixture()


@pytest.mark.parametrize("name", NAMES)
def test_per_channel_e4m3_matches_compressed_tensors(fx, name):
    w = fx[f"{name}.bf16"].view(BF16)
    q, deg, _ = quantize_float(w, E4M3, GroupMap.per_channel("out"), scale_dtype="BF16", arith_dtype="BF16",
                               name=name)
    assert deg == 0
    assert q.scales.shape == (w.shape[0], 1)
    np.testing.assert_array_equal(q.scales.view(np.uint16), fx[f"{name}.ct_channel.scale"])
    np.testing.assert_array_equal(q.codes, fx[f"{name}.ct_channel.codes"])


@pytest.mark.parametrize("name", NAMES)
def test_block_128_e4m3_matches_auto_round(fx, name):
    w = fx[f"{name}.bf16"].view(BF16)
    q, _, _ = quantize_float(Rows(DenseTensor(name, w)), E4M3, GroupMap.per_block(128, 128), scale_dtype="BF16",
                             arith_dtype="BF16", name=name)
    expect = fx[f"{name}.autoround_block.scale_inv"]
    assert q.scales.shape == expect.shape == (-(-w.shape[0] // 128), -(-w.shape[1] // 128))
    np.testing.assert_array_equal(q.scales.view(np.uint16), expect)
    np.testing.assert_array_equal(q.codes, fx[f"{name}.autoround_block.codes"])


def test_single_rounding_would_differ_on_real_data(fx):
    """The bf16 intermediate matters: computing in float32 (arith F32) changes 2-4% of the codes."""
    name = NAMES[0]
    w = fx[f"{name}.bf16"].view(BF16)
    q, _, _ = quantize_float(w.astype(np.float32), E4M3, GroupMap.per_channel("out"), scale_dtype="BF16",
                             arith_dtype="F32", name=name)
    np.testing.assert_array_equal(q.scales.view(np.uint16), fx[f"{name}.ct_channel.scale"])  # same scales
    differ = float(np.mean(q.codes != fx[f"{name}.ct_channel.codes"]))
    assert 0.02 < differ < 0.04


def _q(x, bo, bi, el=E4M3, arith=np.float32, sd=np.float32):
    return quantize_fp_rows(np.asarray(x, np.float32), el.numpy, el.max_finite, block_out=bo, block_in=bi,
                            arith=np.dtype(arith), scale_dtype=np.dtype(sd))


def _values(codes, el=E4M3):
    return codes.view(el.numpy).astype(np.float32)


def test_hand_computed_per_tensor():
    # absmax 896 -> scale 2; 1/2 = 0.5, -3/2 = -1.5, 896/2 = 448, 10/2 = 5, 0
    got = _q([[1.0, -3.0], [896.0, 10.0], [0.0, 0.0]], None, None)
    assert got.scales.tolist() == [[2.0]]
    assert _values(got.codes).tolist() == [[0.5, -1.5], [448.0, 5.0], [0.0, 0.0]]
    assert got.codes[1, 0] == 0x7E  # 448 = 0 1111 110
    assert got.degenerate_groups == 0


def test_e4m3_round_to_nearest_even_between_codes():
    # scale 1 (absmax 448): 17 lies halfway between E4M3 16 and 18 -> 16 (even mantissa); 19 -> 20
    got = _q([[448.0, 17.0, 19.0, 0.3]], None, None)
    assert _values(got.codes).tolist()[0][:3] == [448.0, 16.0, 20.0]
    assert _values(got.codes)[0, 3] == np.float32(0.3).astype(E4M3.numpy).astype(np.float32)


def test_saturation_to_max_finite():
    """A BF16 scale rounded down makes ``w / s`` exceed 448: the code saturates at 0x7E, never NaN."""
    # float32 values, BF16 scale dtype: bf16(449.5 / 448) = 1.0, so 449.5 / 1.0 exceeds 448
    x = np.array([[449.5, -449.5, 1.0]], np.float32)
    got = quantize_fp_rows(x, E4M3.numpy, 448.0, block_out=None, block_in=None, arith=np.dtype(np.float32),
                           scale_dtype=np.dtype(BF16))
    s = float(got.scales[0, 0])
    assert s == 1.0  # bf16(449.5 / 448 = 1.00335) = 1.0
    assert got.codes[0, 0] == 0x7E and got.codes[0, 1] == 0xFE  # +-448, saturated
    assert not np.isnan(_values(got.codes)).any()


def test_all_zero_tiles_get_scale_one_and_reconstruct_exactly():
    x = np.zeros((3, 6), np.float32)
    x[0, 4] = 448.0 * 3  # only the tile (rows 0-1, cols 4-5) is non-zero
    got = _q(x, 2, 4)
    assert got.scales.tolist() == [[1.0, 3.0], [1.0, 1.0]]
    assert got.degenerate_groups == 3
    assert (_values(got.codes)[:, :4] == 0).all()


def test_partial_edge_tiles_use_their_own_absmax():
    # 3 x 5 matrix, 2 x 2 tiles: tile grid 2 x 3, the last row / column partial
    x = np.arange(1, 16, dtype=np.float32).reshape(3, 5)
    got = _q(x, 2, 2)
    amax = np.array([[7, 9, 10], [12, 14, 15]], np.float32)
    np.testing.assert_array_equal(got.scales, amax / np.float32(448))


def test_negative_zero_becomes_positive_zero_as_compressed_tensors():
    """compressed-tensors adds the (zero) zero point before the cast: a -0.0 weight -> 0x00; a negative
    value that rounds to zero only in the E4M3 cast keeps its sign (0x80)."""
    got = _q([[-0.0, 0.0, 448.0, -1e-4]], None, None)
    assert got.codes[0].tolist() == [0x00, 0x00, 0x7E, 0x80]


CT_EDGES = Path(__file__).parent.parent / "data" / "fp8" / "ct_edges.json"


@pytest.mark.parametrize("dtype", ["BF16", "F16"])
def test_scale_underflow_and_zero_signs_match_compressed_tensors(dtype):
    """Bytes compressed-tensors 0.20.1 wrote for crafted rows (tests/data/fp8/make_ct_edges.py): an F16
    scale that underflows to 0 becomes finfo(F16).eps = 2^-10, -0.0 weights give 0x00. The all-zero row
    keeps qckpt's scale 1 (contract 2; compressed-tensors writes eps there) with the same zero codes."""
    ref = json.loads(CT_EDGES.read_text())
    assert ref["compressed_tensors"] == "0.20.1"
    npdt = {"BF16": BF16, "F16": np.float16}[dtype]
    w = np.array(ref[dtype]["weight_bits"], np.uint16).view(npdt)
    q, deg, _ = quantize_float(w, E4M3, GroupMap.per_channel("out"), scale_dtype=dtype, arith_dtype=dtype)
    np.testing.assert_array_equal(q.codes, np.array(ref[dtype]["codes"], np.uint8))
    ct_scale = np.array(ref[dtype]["scale_bits"], np.uint16)
    np.testing.assert_array_equal(q.scales.view(np.uint16)[:3, 0], ct_scale[:3])
    assert deg == 1 and float(q.scales[3, 0]) == 1.0
    assert float(ct_scale[3:].view(npdt)[0]) == float(ml_dtypes.finfo(npdt).eps)
    if dtype == "F16":
        assert float(q.scales[1, 0]) == 2.0 ** -10


def test_bf16_intermediate_rounding_by_hand():
    """``q = bf16(w / s)`` before the E4M3 cast: a case where the two roundings differ."""
    # s = 1 (absmax 448); w = 8.5 + 2^-10. E4M3 spacing in [8, 16) is 1, bf16's is 1/16.
    # F32 arith: w lies above the tie 8.5 between 8 and 9 -> 9. BF16 arith: bf16(w) = 8.5 exactly
    # (the 2^-10 is below half a bf16 ulp), a tie -> 8 (even mantissa).
    w = np.float32(8.5 + 2.0 ** -10)
    x = np.array([[448.0, w]], np.float32)
    f32 = quantize_fp_rows(x, E4M3.numpy, 448.0, block_out=None, block_in=None, arith=np.dtype(np.float32),
                           scale_dtype=np.dtype(np.float32))
    b16 = quantize_fp_rows(x, E4M3.numpy, 448.0, block_out=None, block_in=None, arith=np.dtype(BF16),
                           scale_dtype=np.dtype(BF16))
    assert _values(f32.codes)[0, 1] == 9.0
    assert _values(b16.codes)[0, 1] == 8.0


def test_e5m2_scale_and_saturation():
    x = np.array([[57344.0 * 2, -1.0, 3.0]], np.float32)
    got = quantize_fp_rows(x, E5M2.numpy, E5M2.max_finite, block_out=1, block_in=None, arith=np.dtype(np.float32),
                           scale_dtype=np.dtype(np.float32))
    assert got.scales.tolist() == [[2.0]]
    assert _values(got.codes, E5M2).tolist() == [[57344.0, -0.5, 1.5]]


def test_streaming_rows_equal_whole_array(monkeypatch):
    """Row blocks (a Rows source read in small steps) give the same bytes as one block."""
    import converter.kernels.fp_rtn as k
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((300, 200)) * 0.02).astype(BF16)
    for gm in (GroupMap.per_tensor(), GroupMap.per_channel("out"), GroupMap.per_block(128, 128),
               GroupMap.per_block(64, None), GroupMap.per_block(None, 32)):
        whole, _, _ = quantize_float(x, E4M3, gm, scale_dtype="BF16", arith_dtype="BF16")
        monkeypatch.setattr(k, "FP_BLOCK_ELEMENTS", 1000)
        part, _, _ = quantize_float(Rows(DenseTensor("w", x)), E4M3, gm, scale_dtype="BF16", arith_dtype="BF16")
        monkeypatch.undo()
        np.testing.assert_array_equal(whole.codes, part.codes)
        np.testing.assert_array_equal(whole.scales.view(np.uint16), part.scales.view(np.uint16))
        assert whole.scales.shape == gm.param_shape(x.shape, ("out", "in"))


def test_figures_match_dequantize():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((70, 300)).astype(np.float32)
    q, _, fig = quantize_float(x, E4M3, GroupMap.per_block(32, 128), scale_dtype="F32", figures=True)
    e = (q.dequantize() - x).astype(np.float64)
    assert fig.max_abs == float(np.abs(e).max())
    assert fig.mse == pytest.approx(float(np.mean(e * e)), rel=1e-5)
    assert fig.numel == x.size and not fig.exact


def test_non_finite_input_names_the_tile():
    x = np.ones((4, 8), np.float32)
    x[3, 6] = np.nan
    with pytest.raises(QuantizationError, match="rows from 2, columns from 4"):
        _q(x, 2, 4)
    with pytest.raises(QuantizationError, match="not all finite"):
        _q(x, None, None)


def test_scale_overflow_in_f16_is_refused():
    x = np.array([[1e9, 1.0]], np.float32)
    with pytest.raises(QuantizationError, match="overflows"):
        quantize_fp_rows(x, E4M3.numpy, 448.0, block_out=1, block_in=None, arith=np.dtype(np.float32),
                         scale_dtype=np.dtype(np.float16))


def test_codes_saturate_far_beyond_max_finite():
    """Without the clamp, 500 / 1 would cast to NaN (E4M3 has no inf): it must be 448 (0x7E)."""

    x = np.array([[500.0, -1e6, np.float32(3e38)]], np.float32)
    got = fp_codes(x, np.ones((1, 1), np.float32), None, E4M3.numpy, 448.0, arith=np.dtype(BF16))
    assert got.tolist() == [[0x7E, 0xFE, 0x7E]]
