"""Every real sample x every writable target: an exact repack, proven, or a refusal before writing.

For each pair the table below states the expected outcome and why (FORMATS.md section numbers):

- ``exact``: ``convert_exact`` succeeds; every quantized tensor read back from the target has the
  same codes (in the unsigned domain) and the same scale per element, and dequantizes bit-identically
  (float32) to the source. Dense tensors pass through byte-identical.
- ``bias_rounding``: as ``exact`` for codes and scales, but the target (MLX) stores an additive bias
  ``b = -z*s`` in the scale dtype: the stated rounding is exactly ONE cast of the float32 product
  ``-z*s`` to fp16; the read-back bias equals that cast and the values equal ``s*q + cast(-z*s)``.
- ``f32_product``: codes, scales and bias identical and the bias ``-128*s`` exact; with float32
  scales the decode ``s*q_u + b`` (unsigned codes) rounds ``s*q_u`` and the sum in float32 where
  the source rounds ``s*q_s`` once: the values agree within ``ulp(s*q_u) + ulp(value)``.
- ``dequantized``: target ``plain`` holds floats; the float32 values equal the source's
  dequantization bit-for-bit.
- ``refuse``: ``NotRepresentableError`` whose message contains the stated reason, and nothing is
  left at (or next to) the destination.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from converter.errors import FormatError, NotRepresentableError
from converter.formats import registry
from converter.formats.source import Source
from converter.ops.convert import convert_exact
from converter.quant.recode import as_unsigned
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor
from tests.conftest import SAMPLES

EXACT, ROUND, F32P, DEQ, REFUSE = "exact", "bias_rounding", "f32_product", "dequantized", "refuse"
PASS = "passthrough"
NO_ARCH = "no_architecture"

# reasons (substrings of the NotRepresentableError message)
AWQ_4BIT = "AWQ stores 4-bit codes only, not 8-bit"
CODEBOOK_AWQ = "a codebook (NF4/FP4) scheme is not representable"
CODEBOOK_CT = "compressed-tensors int formats have no codebook"
CODEBOOK_GPTQ = "GPTQ stores integer grids, not codebook indices"
CODEBOOK_MLX = "codebook schemes (nf4/fp4/mx/nv) cannot be written as MLX affine"
# FP8 E4M3 -> MLX mxfp8 is exact only when every scale is a power of two (E8M0)
FP8_MLX_POW2 = "scales are not all powers of two"
GPTQ_F32 = "GPTQ stores fp16 scales; F32 scales round"
MLX_BIAS = "float bias is not an integer zero point"
NO_QUANT = "the source is a float checkpoint"
GGUF_INT_ZERO = "integer zero points: Q4_1/Q5_1 store a float minimum m = -z*s in fp16"
MODELOPT_FP8 = "ModelOpt is written as FP8 (E4M3) only"
CODEBOOK_GGUF = "codebook schemes other than E2M1 (NF4, bitsandbytes FP4, FP8 elements) have no GGUF block type"
FP8_INTEGER = "fp8 stores FP8 E4M3 / E5M2 elements; an integer scheme needs requantizing"
GPT_OSS_EXPERTS = "gpt-oss MXFP4 quantizes only the GptOssExperts gate_up_proj / down_proj"
FP8_SAMPLES = ("ct_fp8_channel_smollm2", "modelopt_fp8_smollm2tiny", "modelopt_fp8_pc_pt_smollm2tiny",
               "modelopt_fp8_pb_wo_smollm2tiny", "deepseek_fp8_block_smollm2tiny")
FP4_SAMPLES = ("ct_mxfp4_smollm2", "ct_nvfp4_smollm2", "modelopt_nvfp4_smollm2tiny", "mlx_mxfp4_smollm2tiny",
               "mlx_nvfp4_smollm2tiny", "mlx_nvfp4_global_smollm2")
INT_SAMPLES = ("gptq_w4_g128_sym", "gptq_w4_gchan_sym", "awq_gemm_w4_g128_zp", "ct_pack_w4a16_channel_sym",
               "ct_pack_w4a16_group128_asym", "ct_pack_w4a16_group128_sym", "ct_pack_w8a16_channel_sym",
               "mlx_affine_g64_b4", "mlx_affine_g32_b8", "bnb_int8", "bnb_nf4_bs64")

EXPECTED = {
    # --- GPTQ 4-bit sym, G=128 along in, fp16 scales (FORMATS 1.1-1.4) ------------------------
    # AWQ GEMM (2.1): 4-bit, groups along in with I % G == 0 (384, 1536 % 128), O % 8 == 0, fp16
    # scales; symmetric centre 8 is written as explicit qzeros = 8: same grid.
    ("gptq_w4_g128_sym", "awq"): EXACT,
    # compressed-tensors pack-quantized (3.2-3.4): signed codes q-8, group strategy, fp16 scales.
    ("gptq_w4_g128_sym", "compressed-tensors"): EXACT,
    ("gptq_w4_g128_sym", "gptq"): EXACT,
    # MLX affine (4.1/4.2): G=128 is an MLX group size; bias = -8*s is a power-of-two multiple of
    # an fp16 scale, hence exact in fp16.
    ("gptq_w4_g128_sym", "mlx"): EXACT,
    ("gptq_w4_g128_sym", "native"): EXACT,
    ("gptq_w4_g128_sym", "plain"): DEQ,
    # --- GPTQ 4-bit sym, per channel (group_size -1, scales [1, O]) ----------------------------
    # AWQ has no per-channel flag: written as G = I (one group per row) (2.1, 2.4).
    ("gptq_w4_gchan_sym", "awq"): EXACT,
    ("gptq_w4_gchan_sym", "compressed-tensors"): EXACT,  # channel strategy, scales [O, 1] (3.2)
    ("gptq_w4_gchan_sym", "gptq"): EXACT,
    # MLX has only groups of 32/64/128 along in (4.2): a row's scale repeated over I/128 groups
    # gives every element its own scale back; bias -8*s exact.
    ("gptq_w4_gchan_sym", "mlx"): EXACT,
    ("gptq_w4_gchan_sym", "native"): EXACT,
    ("gptq_w4_gchan_sym", "plain"): DEQ,
    # --- AWQ GEMM 4-bit asym, G=128, integer zeros (2.1) ---------------------------------------
    ("awq_gemm_w4_g128_zp", "awq"): EXACT,
    # CT asym: zero points z-8 signed, packed along O (3.2); exact.
    ("awq_gemm_w4_g128_zp", "compressed-tensors"): EXACT,
    # GPTQ v2 (the default) stores z as is (1.3); v1 cannot (see test_gptq_v1_refuses_zero_0).
    ("awq_gemm_w4_g128_zp", "gptq"): EXACT,
    # MLX bias = -z*s (section 0, A -> B): z*s for z not a power of two needs more than fp16's 11
    # significant bits, so the fp16 bias is one rounding of -z*s.
    ("awq_gemm_w4_g128_zp", "mlx"): ROUND,
    ("awq_gemm_w4_g128_zp", "native"): EXACT,
    ("awq_gemm_w4_g128_zp", "plain"): DEQ,
    # --- compressed-tensors ---------------------------------------------------------------------
    ("ct_pack_w4a16_channel_sym", "awq"): EXACT,   # per channel -> G = I
    ("ct_pack_w4a16_channel_sym", "compressed-tensors"): EXACT,
    ("ct_pack_w4a16_channel_sym", "gptq"): EXACT,  # group_size -1
    ("ct_pack_w4a16_channel_sym", "mlx"): EXACT,   # row scale repeated over groups of 128
    ("ct_pack_w4a16_channel_sym", "native"): EXACT,
    ("ct_pack_w4a16_channel_sym", "plain"): DEQ,
    ("ct_pack_w4a16_group128_asym", "awq"): EXACT,
    ("ct_pack_w4a16_group128_asym", "compressed-tensors"): EXACT,
    ("ct_pack_w4a16_group128_asym", "gptq"): EXACT,
    ("ct_pack_w4a16_group128_asym", "mlx"): ROUND,  # bias -z*s rounded once to fp16
    ("ct_pack_w4a16_group128_asym", "native"): EXACT,
    ("ct_pack_w4a16_group128_asym", "plain"): DEQ,
    ("ct_pack_w4a16_group128_sym", "awq"): EXACT,
    ("ct_pack_w4a16_group128_sym", "compressed-tensors"): EXACT,
    ("ct_pack_w4a16_group128_sym", "gptq"): EXACT,
    ("ct_pack_w4a16_group128_sym", "mlx"): EXACT,
    ("ct_pack_w4a16_group128_sym", "native"): EXACT,
    ("ct_pack_w4a16_group128_sym", "plain"): DEQ,
    ("ct_pack_w8a16_channel_sym", "awq"): REFUSE,  # AWQ is 4-bit only (2.1 "Constraints")
    ("ct_pack_w8a16_channel_sym", "compressed-tensors"): EXACT,
    ("ct_pack_w8a16_channel_sym", "gptq"): EXACT,  # 8-bit, group_size -1, centre 128 (1.3)
    ("ct_pack_w8a16_channel_sym", "mlx"): EXACT,   # 8 bits allowed (4.2); bias -128*s exact
    ("ct_pack_w8a16_channel_sym", "native"): EXACT,
    ("ct_pack_w8a16_channel_sym", "plain"): DEQ,
    # --- MLX affine (float biases, 4.2) ----------------------------------------------------------
    # MLX makes bias/scale = -q0 an integer BEFORE the fp16 cast; after it -bias/scale is not an
    # integer (8.99774 in group [0, 1]), so integer-zero formats (GPTQ/AWQ/CT: family A) cannot
    # hold these values exactly (section 0: B -> A only when -beta/s is an integer in range).
    ("mlx_affine_g64_b4", "awq"): REFUSE,
    ("mlx_affine_g64_b4", "compressed-tensors"): REFUSE,
    ("mlx_affine_g64_b4", "gptq"): REFUSE,
    ("mlx_affine_g64_b4", "mlx"): EXACT,
    ("mlx_affine_g64_b4", "native"): EXACT,
    ("mlx_affine_g64_b4", "plain"): DEQ,
    ("mlx_affine_g32_b8", "awq"): REFUSE,  # 8-bit (checked before the data)
    ("mlx_affine_g32_b8", "compressed-tensors"): REFUSE,
    ("mlx_affine_g32_b8", "gptq"): REFUSE,
    ("mlx_affine_g32_b8", "mlx"): EXACT,
    ("mlx_affine_g32_b8", "native"): EXACT,
    ("mlx_affine_g32_b8", "plain"): DEQ,
    # --- bitsandbytes (read-only) ----------------------------------------------------------------
    # int8 (FORMATS 10: int8 [O, I], SCB f32 [O] / 127, no zero): a symmetric signed 8-bit grid with
    # one float32 scale per output row.
    ("bnb_int8", "awq"): REFUSE,                  # 8-bit
    ("bnb_int8", "compressed-tensors"): EXACT,    # int 8-bit channel strategy, F32 weight_scale
    ("bnb_int8", "gptq"): REFUSE,                 # GPTQ scales are fp16 (1.1); SCB/127 is not
    ("bnb_int8", "mlx"): F32P,                    # MLX scales may be F32 (4.1), G=128, bias -128*s
    ("bnb_int8", "native"): EXACT,
    ("bnb_int8", "plain"): DEQ,
    # NF4 (FORMATS 10): codebook indices over flat 64-blocks spanning rows: no integer grid, no
    # groups along in. Every quantized target refuses; only native and plain hold it.
    ("bnb_nf4_bs64", "awq"): REFUSE,
    ("bnb_nf4_bs64", "compressed-tensors"): REFUSE,
    ("bnb_nf4_bs64", "gptq"): REFUSE,
    ("bnb_nf4_bs64", "mlx"): REFUSE,
    ("bnb_nf4_bs64", "native"): EXACT,
    ("bnb_nf4_bs64", "plain"): DEQ,
    # --- GGUF legacy blocks (FORMATS 5.3): 32 consecutive elements along in, fp16 d (and m) ----------
    # A group of 32k (or a row / the tensor) is written as blocks that repeat its fp16 scale; the
    # symmetric centre 8 (128) is Q4_0's (Q8_0 stores signed codes): y = d*(q-8) is s*(q-z).
    ("gptq_w4_g128_sym", "gguf"): EXACT,
    ("gptq_w4_gchan_sym", "gguf"): EXACT,
    ("ct_pack_w4a16_group128_sym", "gguf"): EXACT,
    ("ct_pack_w4a16_channel_sym", "gguf"): EXACT,
    ("ct_pack_w8a16_channel_sym", "gguf"): EXACT,  # Q8_0: int8 codes, d = the row scale
    # Integer zeros: Q4_1 stores m = -z*s as fp16, which rounds (as for MLX); the GGUF writer
    # refuses rather than round (section 0, A -> B).
    ("awq_gemm_w4_g128_zp", "gguf"): REFUSE,
    ("ct_pack_w4a16_group128_asym", "gguf"): REFUSE,
    # MLX affine 4-bit: d = fp16 scale, m = fp16 bias: Q4_1 is exactly MLX's d*q + m (4.4 notes MLX's
    # own GGUF import maps Q4_1 to affine with bias = m).
    ("mlx_affine_g64_b4", "gguf"): EXACT,
    ("mlx_affine_g32_b8", "gguf"): REFUSE,  # no affine 8-bit legacy type (Q4_1, Q5_1 only)
    ("bnb_int8", "gguf"): REFUSE,  # Q8_0 d is fp16; SCB/127 float32 scales are not fp16 values
    ("bnb_nf4_bs64", "gguf"): REFUSE,  # codebook
    # GGUF takes float sources (convert_hf_to_gguf.py's F32 / F16 output) but needs an architecture: this bare
    # safetensors file has no config.json
    ("minilm_fp16.safetensors", "gguf"): NO_ARCH,
    # --- float reference: nothing to repack into a quantized format -------------------------------
    ("minilm_fp16.safetensors", "awq"): REFUSE,
    ("minilm_fp16.safetensors", "compressed-tensors"): REFUSE,
    ("minilm_fp16.safetensors", "gptq"): REFUSE,
    ("minilm_fp16.safetensors", "mlx"): REFUSE,
    ("minilm_fp16.safetensors", "native"): PASS,
    ("minilm_fp16.safetensors", "plain"): PASS,
    # --- FP8 E4M3 (issue 14): compressed-tensors float-quantized, ModelOpt FP8 / PC_PT / PB_WO, DeepSeek-style
    # block FP8 (BF16 weight_scale_inv per 128x128 block). E4M3 weights are a codebook scheme: the
    # integer-grid targets refuse them (MLX: mxfp8 holds E4M3 only under power-of-two scales, which these
    # are not); compressed-tensors float-quantized, ModelOpt, native and fp8 hold what their layouts can
    # exactly (codes = the element bytes, scales kept in their dtype).
    **{(s, t): REFUSE for s in FP8_SAMPLES for t in ("awq", "gptq", "mlx", "gguf")},
    **{(s, t): EXACT for s in FP8_SAMPLES for t in ("compressed-tensors", "modelopt", "native")},
    **{(s, "plain"): DEQ for s in FP8_SAMPLES},
    # fp8 (DeepSeek / FineGrainedFP8) holds 2-D blocks and one scale per tensor, not per-channel scales
    ("deepseek_fp8_block_smollm2tiny", "fp8"): EXACT,
    ("modelopt_fp8_pb_wo_smollm2tiny", "fp8"): EXACT,
    ("modelopt_fp8_smollm2tiny", "fp8"): EXACT,
    ("ct_fp8_channel_smollm2", "fp8"): REFUSE,
    ("modelopt_fp8_pc_pt_smollm2tiny", "fp8"): REFUSE,
    # ModelOpt and fp8 are written as FP8 only: every integer / NF4 sample is refused, the float one has
    # nothing to repack.
    **{(s, t): REFUSE for s in INT_SAMPLES for t in ("modelopt", "fp8")},
    ("minilm_fp16.safetensors", "modelopt"): REFUSE,
    ("minilm_fp16.safetensors", "fp8"): REFUSE,
    # FP4 (E2M1 codes): relaid exactly into the formats that hold E2M1 with the same scales (compressed-
    # tensors mxfp4/nvfp4, ModelOpt NVFP4, native), dequantized by plain; integer grids and FP8 refuse.
    **{(s, t): REFUSE for s in FP4_SAMPLES for t in ("awq", "fp8", "gguf", "gptq")},
    # MLX mxfp4 / nvfp4 hold the same E2M1 codes and E8M0 / E4M3 scale bytes (relaid into uint32 words); a
    # global scale is re-expressed as MLX's amax when proven exact (ModelOpt's multiplier w: g' = 2688 w),
    # else refused: compressed-tensors' down_proj divisor 936 (not a power of two)
    **{(s, "mlx"): EXACT for s in FP4_SAMPLES if s != "ct_nvfp4_smollm2"},
    ("ct_nvfp4_smollm2", "mlx"): REFUSE,
    ("mlx_mxfp4_smollm2tiny", "compressed-tensors"): EXACT,
    ("mlx_nvfp4_smollm2tiny", "compressed-tensors"): EXACT,
    ("mlx_mxfp4_smollm2tiny", "modelopt"): REFUSE,  # E8M0 scales
    ("mlx_nvfp4_smollm2tiny", "modelopt"): REFUSE,  # weight-only: ModelOpt NVFP4 is W4A4 (input_scale)
    ("mlx_nvfp4_global_smollm2", "modelopt"): REFUSE,
    # amax g: the multiplier fp32(g / 2688) is not 1 / (a float32 divisor) for these g
    ("mlx_nvfp4_global_smollm2", "compressed-tensors"): REFUSE,
    # GGUF MXFP4 (E8M0 per 32) / NVFP4 (E4M3 per 16, <name>.scale multiplies): the same codes and scale bytes;
    # a global scale as its exact multiplier (ModelOpt's as is, MLX's amax g: fp32(g / 2688)), else refused
    **{(s, "gguf"): EXACT for s in FP4_SAMPLES if s != "ct_nvfp4_smollm2"},
    **{(s, "native"): EXACT for s in FP4_SAMPLES},
    **{(s, "plain"): DEQ for s in FP4_SAMPLES},
    ("ct_mxfp4_smollm2", "compressed-tensors"): EXACT,
    ("ct_nvfp4_smollm2", "compressed-tensors"): EXACT,
    ("modelopt_nvfp4_smollm2tiny", "modelopt"): EXACT,
    ("ct_mxfp4_smollm2", "modelopt"): REFUSE,  # E8M0 scales: NVFP4 stores E4M3
    ("ct_nvfp4_smollm2", "modelopt"): REFUSE,  # W4A16: ModelOpt NVFP4 is W4A4 (input_scale)
    # weight_scale_2 = 0.00120907... has no float32 divisor giving the same effective scales (not 2^k)
    ("modelopt_nvfp4_smollm2tiny", "compressed-tensors"): REFUSE,
    # gpt-oss MXFP4 stores only GptOssExperts' 3-D gate_up_proj / down_proj quantized: no sample has them (the
    # 2-D Linear weights of every sample load BF16 in transformers' Mxfp4 integration), so every pair refuses.
    **{(s, "gpt-oss"): REFUSE for s in FP8_SAMPLES + FP4_SAMPLES + INT_SAMPLES + ("minilm_fp16.safetensors",)},
}

REASONS = {
    **{(s, "awq"): "AWQ codes are an affine integer grid" for s in FP4_SAMPLES},
    **{(s, "fp8"): "E2M1 weights" for s in FP4_SAMPLES},
    # weight_global_scale 936.0 divides: 1/936 is no float32 multiplier giving the same effective scales
    ("ct_nvfp4_smollm2", "gguf"): "has no float32 multiplier",
    **{(s, "gptq"): "GPTQ stores integer grids, not codebook indices" for s in FP4_SAMPLES},
    ("ct_nvfp4_smollm2", "mlx"): "has no float32 amax",
    ("mlx_mxfp4_smollm2tiny", "modelopt"): "MXFP4 uses E8M0",
    ("mlx_nvfp4_smollm2tiny", "modelopt"): "the source has none",
    ("mlx_nvfp4_global_smollm2", "modelopt"): "the source has none",
    ("mlx_nvfp4_global_smollm2", "compressed-tensors"): "has no float32 divisor",
    ("ct_mxfp4_smollm2", "modelopt"): "MXFP4 uses E8M0",
    ("ct_nvfp4_smollm2", "modelopt"): "the source has none",
    ("modelopt_nvfp4_smollm2tiny", "compressed-tensors"): "has no float32 divisor",
    **{(s, "gpt-oss"): GPT_OSS_EXPERTS for s in FP8_SAMPLES + FP4_SAMPLES + INT_SAMPLES},
    ("minilm_fp16.safetensors", "gpt-oss"): NO_QUANT,
    ("ct_pack_w8a16_channel_sym", "awq"): AWQ_4BIT,
    ("mlx_affine_g64_b4", "awq"): MLX_BIAS,
    ("mlx_affine_g64_b4", "compressed-tensors"): MLX_BIAS,
    ("mlx_affine_g64_b4", "gptq"): MLX_BIAS,
    ("mlx_affine_g32_b8", "awq"): AWQ_4BIT,
    ("mlx_affine_g32_b8", "compressed-tensors"): MLX_BIAS,
    ("mlx_affine_g32_b8", "gptq"): MLX_BIAS,
    ("bnb_int8", "awq"): AWQ_4BIT,
    ("bnb_int8", "gptq"): GPTQ_F32,
    ("bnb_nf4_bs64", "awq"): CODEBOOK_AWQ,
    ("bnb_nf4_bs64", "compressed-tensors"): CODEBOOK_CT,
    ("bnb_nf4_bs64", "gptq"): CODEBOOK_GPTQ,
    ("bnb_nf4_bs64", "mlx"): CODEBOOK_MLX,
    ("awq_gemm_w4_g128_zp", "gguf"): GGUF_INT_ZERO,
    ("ct_pack_w4a16_group128_asym", "gguf"): GGUF_INT_ZERO,
    ("mlx_affine_g32_b8", "gguf"): "no affine GGUF legacy type has 8-bit codes",
    ("bnb_int8", "gguf"): "scales are not exactly representable in fp16",
    ("bnb_nf4_bs64", "gguf"): CODEBOOK_GGUF,
    **{("minilm_fp16.safetensors", t): NO_QUANT for t in ("awq", "compressed-tensors", "gptq", "mlx",
                                                           "modelopt", "fp8")},
    **{(s, "awq"): CODEBOOK_AWQ for s in FP8_SAMPLES},
    **{(s, "gptq"): CODEBOOK_GPTQ for s in FP8_SAMPLES},
    **{(s, "mlx"): FP8_MLX_POW2 for s in FP8_SAMPLES},
    **{(s, "gguf"): CODEBOOK_GGUF for s in FP8_SAMPLES},
    **{(s, "modelopt"): MODELOPT_FP8 for s in INT_SAMPLES},
    **{(s, "fp8"): FP8_INTEGER for s in INT_SAMPLES if s != "bnb_nf4_bs64"},
    ("bnb_nf4_bs64", "fp8"): "fp8 stores FP8 E4M3 / E5M2 elements, not this codebook",
    ("ct_fp8_channel_smollm2", "fp8"): "fp8 scales are per 2-D block or per tensor",
    ("modelopt_fp8_pc_pt_smollm2tiny", "fp8"): "fp8 scales are per 2-D block or per tensor",
}

REAL = sorted({s for s, _ in EXPECTED})


def expected_reason_is_float(sample: str) -> bool:
    return REASONS.get((sample, "gptq")) == NO_QUANT


def test_table_covers_every_sample_and_writable_format():
    on_disk = sorted(p.name for p in SAMPLES.iterdir()
                     if p.name not in ("MANIFEST.json", "README.md", "SHA256SUMS", "gguf"))
    assert REAL == on_disk
    assert set(EXPECTED) == {(s, t) for s in on_disk for t in registry.writable()}
    assert {k for k, v in EXPECTED.items() if v == REFUSE} == set(REASONS)


@pytest.fixture(scope="module")
def sources():
    return {s: registry.load(SAMPLES / s) for s in REAL}


def _element_params(t: QuantizedTensor):
    """Scale and (unsigned-domain) offset of every element, float32, logical shape."""
    u = as_unsigned(t)
    s = u.group_map.expand(u.scales, u.shape, u.axes).astype(np.float32)
    if u.scheme.zero_point is ZeroPoint.FLOAT:
        return s, u.group_map.expand(u.zero_points, u.shape, u.axes).astype(np.float32), "bias"
    if u.scheme.zero_point is ZeroPoint.INTEGER:
        return s, u.group_map.expand(u.zero_points, u.shape, u.axes).astype(np.float32), "zero"
    return s, np.full(u.shape, u.scheme.center, np.float32), "zero"


@pytest.mark.parametrize("sample,target", sorted(EXPECTED), ids=lambda x: x)
def test_repack(sample, target, sources, tmp_path):
    expected = EXPECTED[(sample, target)]
    dst = tmp_path / "out"
    if expected == NO_ARCH:
        with pytest.raises(FormatError, match="no GGUF architecture: source has no general.architecture and "
                                              "config.json no model_type"):
            convert_exact(SAMPLES / sample, dst, target)
        assert not dst.exists() and list(tmp_path.iterdir()) == []
        return
    if expected == REFUSE:
        with pytest.raises(NotRepresentableError) as info:
            convert_exact(SAMPLES / sample, dst, target)
        msg = str(info.value)
        assert REASONS[(sample, target)] in msg, msg
        way_out = "qckpt quantize" if expected_reason_is_float(sample) else "requantize"
        if target == "gpt-oss" and REASONS[(sample, target)] == GPT_OSS_EXPERTS:
            # no module of these samples is a GptOssExperts projection: requantizing cannot help (issue 15 hints)
            way_out = "convert to another format"
        assert way_out in msg and str(SAMPLES / sample) in msg  # names the file and the way out
        assert not dst.exists() and list(tmp_path.iterdir()) == []  # nothing written, no temp left
        return
    report = convert_exact(SAMPLES / sample, dst, target)
    src = sources[sample]
    # the output is detected as the target, unambiguously (no stale quantization keys of the source)
    assert registry.detect(Source(dst)).format == target
    out = registry.load(dst, format=target)
    # activation scales are written in the target's spelling, each rename declared (summary, plan notes)
    renamed = report["written"].get("renamed", {})
    for old, new in renamed.items():
        assert any("renamed" in n for n in report["written"]["notes"][old])
        assert next(r for r in report["tensors"] if r["name"] == old)["renamed_to"] == new
    # activation scales a target has no place for (GGUF: llama.cpp quantizes activations itself) are
    # left out, each row says why
    dropped = report["written"].get("dropped", {})
    assert all(n.endswith("input_scale") and target in ("gguf", "plain") for n in dropped)  # no place for them
    assert all(next(r for r in report["tensors"] if r["name"] == n)["mode"] == "dropped" for n in dropped)
    assert sorted(out.names()) == sorted(renamed.get(n, n) for n in src.names() if n not in dropped)
    modes = {r["name"]: r["mode"] for r in report["tensors"]}
    for name in (n for n in src.names() if n not in dropped):
        a, b = src[name], out[renamed.get(name, name)]
        if not isinstance(a, QuantizedTensor):
            if target == "gguf" and a.data.ndim == 1 and a.data.dtype in (np.float16, ml_dtypes.bfloat16):
                # GGUF writes 1-D float tensors F32 (convert_hf_to_gguf.py): the same numbers, sign of zero kept
                assert modes[name] == "exact" and b.data.dtype == np.float32, name
                assert np.array_equal(b.data, a.data) and np.array_equal(np.signbit(b.data), np.signbit(a.data))
                continue
            assert modes[name] == PASS
            assert a.data.dtype == b.data.dtype and a.data.tobytes() == b.data.tobytes()
            continue
        if expected == DEQ or (target == "compressed-tensors" and name.endswith("embed_tokens.weight")):
            # compressed-tensors keeps embeddings dense (llm-compressor quantizes Linear layers only): an MLX
            # quantized embedding is written as its float32 decode
            assert modes[name] == "dequantized"
            assert b.data.dtype == np.float32 and np.array_equal(b.data, a.dequantize())
            continue
        assert isinstance(b, QuantizedTensor) and b.scheme.bits == a.scheme.bits
        assert np.array_equal(as_unsigned(a).codes, as_unsigned(b).codes), name  # codes identical
        sa, oa, kind_a = _element_params(a)
        sb, ob, kind_b = _element_params(b)
        assert np.array_equal(sa, sb), name  # the same scale for every element
        da, db = a.dequantize(), b.dequantize()
        if expected == EXACT:
            assert modes[name] == "exact"
            assert np.array_equal(da, db), name
            if kind_a == kind_b:
                assert np.array_equal(oa, ob)
            elif kind_b == "bias":  # -z*s exact in the scale dtype
                assert np.array_equal(ob, -(oa * sa))
            else:
                assert np.array_equal(oa, -(ob * sb))
        elif expected == ROUND:
            assert modes[name] == "exact_up_to_rounding" and kind_b == "bias"
            cast = (-(oa * sa)).astype(b.scales.dtype).astype(np.float32)
            assert np.array_equal(ob, cast), name  # exactly one rounding of -z*s
            assert not np.array_equal(ob, -(oa * sa))  # ... and it did round somewhere
            assert np.array_equal(db, as_unsigned(a).codes.astype(np.float32) * sa + cast)
            assert float(np.max(np.abs(da - db))) <= float(np.max(np.abs(cast - (-(oa * sa))))) * 1.0001
        elif expected == F32P:
            assert modes[name] in ("exact", "exact_up_to_rounding") and kind_b == "bias"
            assert b.scales.dtype == np.float32 and np.array_equal(ob, -(oa * sa))  # bias exact
            qu = as_unsigned(b).codes.astype(np.float32)
            assert np.array_equal(db, qu * sb + ob)  # the target's decode: fp32(fp32(s*q_u) + b)
            # the source rounds s*q_s once; the target rounds s*q_u and the sum: within those ulps
            bound = np.spacing(np.abs(qu * sb)) + np.spacing(np.abs(da))
            assert np.all(np.abs(da - db) <= bound), name
        assert report["summary"]["changed"] == 0


@pytest.mark.parametrize("sample", ["awq_gemm_w4_g128_zp", "ct_pack_w4a16_group128_asym"])
def test_gptq_v1_refuses_zero_0(sample, sources, tmp_path):
    """GPTQ v1 stores z-1 (FORMATS 1.3, CASES B03): a real zero point of 0 is refused; v2 is the default."""
    src = sources[sample]
    zmin = min(int(as_unsigned(src[n]).zero_points.min()) for n in src.quantized_names())
    assert zmin == 0  # the data really has a zero point 0
    with pytest.raises(NotRepresentableError, match="cannot hold a zero point of 0") as info:
        convert_exact(SAMPLES / sample, tmp_path / "v1", "gptq", options={"checkpoint_format": "gptq"})
    assert "gptq_v2" in str(info.value)
    assert list(tmp_path.iterdir()) == []
    rep = convert_exact(SAMPLES / sample, tmp_path / "v2", "gptq")
    assert rep["summary"]["all_exact"] and rep["written"]["quantization_config"]["checkpoint_format"] == "gptq_v2"


def test_mlx_refusal_reason_is_the_data(sources):
    """The MLX sample really has a non-integral -bias/scale after the fp16 cast (why the refusals hold)."""
    t = sources["mlx_affine_g64_b4"]["encoder.layer.0.attention.output.dense.weight"]
    z = -t.zero_points.astype(np.float32) / t.scales.astype(np.float32)
    assert not np.array_equal(z, np.rint(z))
    # ... though it is within half a code of an integer everywhere: MLX's q0 before rounding to fp16
    assert float(np.max(np.abs(z - np.rint(z)))) < 0.05


def test_bnb_int8_scales_are_not_fp16(sources):
    """bnb_int8 -> gptq refusal: SCB/127 float32 scales are not fp16-representable."""
    t = sources["bnb_int8"]["encoder.layer.0.attention.output.dense.weight"]
    s = t.scales.astype(np.float32)
    assert s.dtype == np.float32 and not np.array_equal(s.astype(np.float16).astype(np.float32), s)
