"""FP4 (E2M1) round-to-nearest: the real encoders' bytes, reproduced.

The fixture (tests/data/fp4/README.md) holds SmolLM2 layer-0 bf16 weights with what compressed-tensors
0.19.0 (llm-compressor 0.14.0.1 ``model_free_ptq`` MXFP4A16 / NVFP4A16) and MLX 0.32.4
(``mx.quantize(mode="mxfp4")``) wrote for them; the small cases are worked by hand.
"""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from converter.errors import QuantizationError
from converter.kernels.fp4_rtn import e2m1_codes, mx_exponents, nvfp4_global_scale, nvfp4_group_scales, \
    quantize_fp4_rows

HERE = Path(__file__).parent.parent / "data" / "fp4"
NAMES = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
         "model.layers.0.self_attn.v_proj.weight", "model.layers.0.mlp.down_proj.weight"]
QKV = NAMES[:3]
BF16 = ml_dtypes.bfloat16


def load_fixture() -> dict[str, np.ndarray]:
    return load_file(str(HERE / "smollm2_fp4_fixture.safetensors"))


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """float32 values of BF16 bit patterns."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def pack(codes: np.ndarray) -> np.ndarray:
    """Element 2j in the low nibble of byte j (compressed-tensors and MLX both)."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


@pytest.fixture(scope="module")
def fx():
    return load_fixture()


def test_mxfp4_ct_rule_is_compressed_tensors_byte_for_byte(fx):
    for n in NAMES:
        got = quantize_fp4_rows(bf16_values(fx[f"{n}.bf16"]), "mxfp4", rule="ct", arith=BF16, tensor=n)
        assert np.count_nonzero(got.scales != fx[f"{n}.mxfp4.scale"]) == 0, n
        assert np.count_nonzero(pack(got.codes) != fx[f"{n}.mxfp4.packed"]) == 0, n
        assert got.global_scale is None


def test_nvfp4_ct_rule_is_compressed_tensors_byte_for_byte(fx):
    w = {n: bf16_values(fx[f"{n}.bf16"]) for n in NAMES}
    qkv_amax = max(float(np.abs(w[n]).max()) for n in QKV)  # the fused set: one observer
    for n in NAMES:
        amax = qkv_amax if n in QKV else None  # down_proj: its own (the fixture keeps its absmax row)
        got = quantize_fp4_rows(w[n], "nvfp4", arith=BF16, global_amax=amax, tensor=n)
        assert got.global_scale == fx[f"{n}.nvfp4.global"][0], n
        assert np.count_nonzero(got.scales.view(np.uint8) != fx[f"{n}.nvfp4.scale"]) == 0, n
        assert np.count_nonzero(pack(got.codes) != fx[f"{n}.nvfp4.packed"]) == 0, n


def test_nvfp4_unfused_global_scales_differ_from_the_file(fx):
    # each of q/k/v on its own would get another global scale: the shared 512 is the fused rule
    own = [nvfp4_global_scale(float(np.abs(bf16_values(fx[f"{n}.bf16"])).max()), arith=BF16) for n in QKV]
    assert fx[f"{QKV[0]}.nvfp4.global"][0] == 512.0
    assert sum(g != 512.0 for g in own) >= 1


def test_mlx_rule_is_mx_quantize_byte_for_byte(fx):
    mlx = load_file(str(HERE / "smollm2_mlx_mxfp4.safetensors"))
    for n in NAMES[1:3]:
        x = bf16_values(fx[f"{n}.bf16"])
        got = quantize_fp4_rows(x, "mxfp4", rule="mlx", arith=BF16, tensor=n)
        assert np.count_nonzero(got.scales != mlx[f"{n}.mlx.scale"]) == 0, n
        assert np.count_nonzero(pack(got.codes) != mlx[f"{n}.mlx.packed"]) == 0, n
        ct = fx[f"{n}.mxfp4.scale"]
        diff = got.scales.astype(int) - ct.astype(int)
        assert set(np.unique(diff)) <= {0, 1} and 0.15 < np.mean(diff != 0) < 0.30  # ~22% (FP_MANIFEST)
        # and the other rule would not give MLX's bytes
        other = quantize_fp4_rows(x, "mxfp4", rule="ct", arith=BF16)
        assert np.count_nonzero(pack(other.codes) != mlx[f"{n}.mlx.packed"]) > 1000


def test_e2m1_ties_by_hand():
    q = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.75, -0.1, -0.0, 0.2], np.float32)
    #           0.25->0 0.75->1.0 1.25->1.0 1.75->2 2.5->2 3.5->4 5->4 7->6 -0.75->-1 -0.1->-0 -0.0->+0
    assert e2m1_codes(q, "ct").tolist() == [0x0, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0x7, 0xA, 0x8, 0x0, 0x0]
    # MLX: ties toward the smaller magnitude, zeros are +0
    assert e2m1_codes(q, "mlx").tolist() == [0x0, 0x1, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x9, 0x0, 0x0, 0x0]


def test_mx_exponent_rules_by_hand():
    # amax 6.0 = 1.5 * 2^2: ct rounds the bf16 power of two down (mantissa 1.5 < 1.75) -> 4 -> e = 127 + 2 - 2
    # = 127 (scale 1: 6 fits); mlx: ceil(log2(6/6)) = 0 -> 127.
    # amax 7.5 = 1.875 * 2^2: ct rounds up to 8 -> e = 128 (scale 2); mlx ceil(log2(1.25)) = 1 -> 128.
    # amax 5.0 = 1.25 * 2^2: ct -> 4 -> 127; mlx ceil(log2(5/6)) = 0 -> 127.
    # amax 3.5 = 1.75 * 2^1: ct rounds up to 4 -> 127; mlx ceil(log2(0.583)) = 0 -> 127.
    # amax 3.0 = 1.5 * 2^1: ct -> 2 -> 126 (scale 0.5: 3 / 0.5 = 6 fits); mlx ceil(log2(0.5)) = -1 -> 126.
    # amax 1.6 * 2^2 = 6.4: ct -> 4 -> 127 (6.4 clips to 6); mlx ceil(log2(1.0667)) = 1 -> 128.
    a = np.array([6.0, 7.5, 5.0, 3.5, 3.0, 6.4, 0.0], np.float32)
    assert mx_exponents(a, rule="ct", arith=BF16).tolist()[:6] == [127, 128, 127, 127, 126, 127]
    assert mx_exponents(a, rule="mlx").tolist()[:6] == [127, 128, 127, 127, 126, 128]
    assert mx_exponents(a, rule="ct", arith=BF16)[6] == 0  # all-zero group: log2(0) = -inf -> 0
    with pytest.raises(QuantizationError) as ei:
        mx_exponents(np.array([3.0e38], np.float32), rule="ct", arith=np.float32, tensor="w")
    assert ei.value.field == "scales" and "255" in ei.value.expected


def test_nvfp4_scales_by_hand():
    # down_proj: absmax 2.875 -> 2688 / 2.875 = 934.957 in float32, 936 in bf16 (FP_MANIFEST)
    assert nvfp4_global_scale(2.875, arith=BF16) == 936.0
    assert nvfp4_global_scale(2.875, arith=np.float32) == np.float32(2688 / 2.875)
    assert nvfp4_global_scale(0.0, arith=np.float32) == 1.0  # 2688 / tiny overflows -> 1
    # g = 512, group absmax 0.75: bf16(0.75/6) = 0.125 -> 512 * 0.125 = 64 (E4M3 exact)
    # absmax 6: 1 * 512 -> clamp 448; absmax 0: 0 -> eps 0.125
    s = nvfp4_group_scales(np.array([0.75, 6.0, 0.0], np.float32), np.float32(512), arith=BF16)
    assert s.astype(np.float32).tolist() == [64.0, 448.0, 0.125]


def test_nvfp4_codes_by_hand():
    # one group of 16, g from absmax 3: bf16(2688/3) = 896 -> s = E4M3(896 * 0.5) = 448, eff = 0.5
    x = np.zeros((1, 16), np.float32)
    x[0, :5] = [3.0, -1.0, 0.25, 0.3, -0.2]
    got = quantize_fp4_rows(x, "nvfp4", arith=BF16)
    assert float(got.global_scale) == 896.0 and float(got.scales[0, 0].astype(np.float32)) == 448.0
    # quotients 6, -2, 0.5, 0.6, -0.4 -> codes 7, 0xC, 1, 1, 0x9
    assert got.codes[0, :5].tolist() == [0x7, 0xC, 0x1, 0x1, 0x9]
    assert got.degenerate_groups == 0 and got.clipped == 0


def test_row_length_and_non_finite_refused():
    with pytest.raises(QuantizationError) as ei:
        quantize_fp4_rows(np.zeros((2, 48), np.float32), "mxfp4", tensor="w")
    assert ei.value.field == "shape" and ei.value.tensor == "w"
    x = np.zeros((2, 32), np.float32)
    x[1, 3] = np.nan
    with pytest.raises(QuantizationError):
        quantize_fp4_rows(x, "mxfp4")
    with pytest.raises(QuantizationError):
        quantize_fp4_rows(np.zeros((2, 32), np.float32), "nvfp4", rule="none")
    # MLX nvfp4 without a global scale: amax / 6 above E4M3's 448 is refused (MLX's overflow not reproduced)
    big = np.zeros((1, 16), np.float32)
    big[0, 0] = 6 * 448 * 1.5
    with pytest.raises(QuantizationError, match="exceeds E4M3's 448"):
        quantize_fp4_rows(big, "nvfp4", rule="mlx")


def test_mlx_nvfp4_by_hand():
    """s = E4M3(amax / 6) rounded to nearest even, q = w / s, E2M1 ties toward the smaller magnitude."""
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [3.0, -0.75, 1.75, 0.0]   # amax 3: s = 0.5 (exact in E4M3), q = 6, -1.5, 3.5, 0
    x[0, 16:18] = [0.13, -0.01]          # amax 0.13: 0.13 / 6 = 0.0216667 -> E4M3 11 * 2^-9 = 0.021484375
    got = quantize_fp4_rows(x, "nvfp4", rule="mlx")
    assert got.global_scale is None
    s = got.scales.view(np.uint8)
    assert s[0, 0] == 0x30  # 0.5 = 2^-1: exponent field 6, mantissa 0
    assert s[0, 1] == 0x0B  # 1.375 * 2^-6: exponent field 1, mantissa 3
    # 6 -> 0x7, -0.75 / 0.5 = -1.5 -> 0xB, 1.75 / 0.5 = 3.5 -> 3 (tie toward the smaller: 0x5), 0 -> 0x0
    assert got.codes[0, :4].tolist() == [0x7, 0xB, 0x5, 0x0]
    # 0.13 / 0.021484375 = 6.05 -> 6 (0x7); -0.01 / 0.021484375 = -0.465 -> -0.5 (0x9)
    assert got.codes[0, 16:18].tolist() == [0x7, 0x9]


def test_row_blocks_do_not_change_the_result(fx, monkeypatch):
    import converter.kernels.fp4_rtn as k
    x = bf16_values(fx[f"{NAMES[1]}.bf16"])
    whole = quantize_fp4_rows(x, "nvfp4", arith=BF16)
    monkeypatch.setattr(k, "FP4_BLOCK_ELEMENTS", 576 * 7)
    blocked = quantize_fp4_rows(x, "nvfp4", arith=BF16)
    assert np.array_equal(whole.codes, blocked.codes) and np.array_equal(whole.scales.view(np.uint8),
                                                                         blocked.scales.view(np.uint8))
