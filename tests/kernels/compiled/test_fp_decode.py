"""Compiled FP8 / FP4 decode (converter/kernels/compiled/fp_decode.py) gives numpy's bytes exactly: float32
``codebook[q] * s`` for every code byte (NaN, inf, -0, subnormal codes), scales with NaN / inf / subnormal
values, per-group (partial last group), per-channel, per-tensor, per-element and 2-D block scales, FP4 codes
packed two per byte, NVFP4 global scales; and the per-block table decode to bfloat16 / float16."""

import ml_dtypes
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
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor
from tests.conftest import SAMPLES

pytestmark = pytest.mark.skipif(not compiled.available(), reason="numba (the fast extra) is not installed")


def _both(fn):
    with run_options(kernels="numpy"):
        a = fn()
    with run_options(kernels="numba"):
        b = fn()
    return a, b


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_hand_computed_e4m3_values():
    # E4M3 byte 0x38 = 1.0, 0x01 = 2^-9 (smallest subnormal), 0x80 = -0.0, 0x7F = NaN; scale 2 per row
    codes = np.array([[0x38, 0x01, 0x80, 0x7F]], np.uint8)
    t = QuantizedTensor("w", (OUT, IN), codes, np.full((1, 1), 2.0, np.float32),
                        QuantScheme(8, False, codebook=ELEMENTS["e4m3"].values, scale_dtype="F32"),
                        GroupMap.per_channel(OUT))
    with run_options(kernels="numba"):
        x = t.dequantize()
    assert x[0, :3].tolist() == [2.0, 2.0 ** -8, 0.0] and np.signbit(x[0, 2]) and np.isnan(x[0, 3])
    assert "converter.kernels.compiled.fp_decode.codebook_rows" in compiled.compile_seconds()


FLOAT8 = {"e4m3": "F8_E4M3", "e5m2": "F8_E5M2"}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), rows=st.integers(1, 37), cols=st.integers(1, 45),
       element=st.sampled_from(["e4m3", "e5m2", "e2m1"]),
       grouping=st.sampled_from(["group", "channel", "tensor", "block", "block-stack"]))
def test_compiled_decode_equals_numpy(data, rows, cols, element, grouping):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    levels = 16 if element == "e2m1" else 256
    scheme = QuantScheme(4 if levels == 16 else 8, False, codebook=ELEMENTS[element].values, scale_dtype="F32")
    if grouping == "group":
        gm = GroupMap.per_group(data.draw(st.integers(1, cols)), IN)
    elif grouping == "channel":
        gm = GroupMap.per_channel(OUT)
    elif grouping == "tensor":
        gm = GroupMap.per_tensor()
    else:
        gm = GroupMap.per_block(data.draw(st.integers(1, rows)), data.draw(st.integers(1, cols)))
    axes = (OUT, IN)
    shape = (rows, cols)
    if grouping == "block-stack":
        axes, shape = (EXPERT, OUT, IN), (2, rows, cols)
    codes = rng.integers(0, levels, size=shape, dtype=np.uint8)
    pshape = gm.param_shape(shape, axes)
    scales = (rng.standard_normal(pshape) * 2.0 ** rng.integers(-140, 20, size=pshape)).astype(np.float32)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, 3.4e38], np.float32)
    pick = rng.random(pshape) < 0.15
    scales[pick] = rng.choice(special, size=int(pick.sum()))
    t = QuantizedTensor("w", axes, codes, scales, scheme, gm)
    a, b = _both(t.dequantize)
    assert _same_bytes(a, b)
    if levels == 256 and grouping.startswith("block"):
        for dtype in (ml_dtypes.bfloat16, np.float16):
            a, b = _both(lambda dtype=dtype: t.dequantize(dtype))
            assert _same_bytes(a, b)


FP_SAMPLES = ["ct_fp8_channel_smollm2", "ct_mxfp4_smollm2", "ct_nvfp4_smollm2", "deepseek_fp8_block_smollm2tiny",
              "mlx_mxfp4_smollm2tiny", "mlx_nvfp4_global_smollm2", "mlx_nvfp4_smollm2tiny",
              "modelopt_fp8_pb_wo_smollm2tiny", "modelopt_fp8_pc_pt_smollm2tiny", "modelopt_fp8_smollm2tiny",
              "modelopt_nvfp4_smollm2tiny"]


@pytest.mark.parametrize("name", FP_SAMPLES)
def test_samples_decode_identically(name):
    ckpt = converter.load(SAMPLES / name)
    checked = 0
    for key in ckpt:
        t = ckpt[key]
        if not isinstance(t, QuantizedTensor) or t.scheme.codebook is None:
            continue
        a, b = _both(lambda key=key: ckpt[key].dequantize())
        assert _same_bytes(a, b), key
        a, b = _both(lambda key=key: ckpt[key].dequantize(ml_dtypes.bfloat16))
        assert _same_bytes(a, b), key
        checked += 1
    assert checked


@settings(max_examples=60, deadline=None)
@given(data=st.data(), rows=st.integers(1, 9), half_cols=st.integers(1, 24), nvfp4=st.booleans())
def test_packed_e2m1_nibbles_equal_numpy(data, rows, half_cols, nvfp4):
    """E2M1 codes still in their two-per-byte words (compressed-tensors layout): any group size (groups starting
    or ending mid-byte), NaN / inf / subnormal E4M3 scales, an NVFP4 global scale; decoded straight from the
    bytes on the compiled path."""
    from converter.codebooks import E2M1
    from converter.formats.compressed_tensors.fp4_layout import CODES_MAP
    from converter.layout import PackedCodes
    cols = 2 * half_cols
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    words = rng.integers(0, 256, size=(rows, half_cols), dtype=np.uint8)
    gm = GroupMap.per_group(data.draw(st.integers(1, cols)), IN)
    pshape = gm.param_shape((rows, cols), (OUT, IN))
    sbytes = rng.integers(0, 256, size=pshape, dtype=np.uint8)  # every E4M3 byte: NaN 0x7F / 0xFF, subnormals
    scheme = QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=E2M1, global_scale="divisor" if nvfp4 else None)
    codes = PackedCodes(words, CODES_MAP, (OUT, IN), {OUT: rows, IN: cols}, signed=False)
    t = QuantizedTensor("w", (OUT, IN), codes, sbytes.view(ml_dtypes.float8_e4m3fn), scheme, gm,
                        stored={"codes": CODES_MAP}, global_scale=np.array(936.0, np.float32) if nvfp4 else None)
    a, b = _both(t.dequantize)
    assert _same_bytes(a, b)
    assert "converter.kernels.compiled.fp_decode.codebook_nibbles" in compiled.compile_seconds()
