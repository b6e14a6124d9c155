"""Issue 3's chain: GPTQ -> compressed-tensors -> AWQ -> MLX -> GPTQ on the real GPTQModel sample.

Every hop must be exact (codes identical, scales identical, values bit-identical). The MLX hop is
the one that could lose bits: MLX stores a float bias ``b = -z*s`` instead of an integer zero. For
this symmetric 4-bit sample ``z = 8`` and ``s`` is fp16, so ``-8*s`` is ``s`` times a power of two:
exact in fp16 unless it overflows (|s| < 65504/8) or is subnormal-shifted (it is not: multiplying
by 8 only raises the exponent). The test asserts that premise on the data, then that GPTQ reads
the bias back as the integer zero ``-b/s = 8`` and the final files equal the original tensors
byte for byte.
"""

from __future__ import annotations

import json

import numpy as np
from safetensors.numpy import load_file

from converter.formats import registry
from converter.ops.convert import convert_exact
from converter.quant.recode import as_unsigned
from converter.scheme import ZeroPoint
from tests.conftest import SAMPLES

SRC = SAMPLES / "gptq_w4_g128_sym"
HOPS = ["compressed-tensors", "awq", "mlx", "gptq"]


def test_premise_minus_8s_is_exact_in_fp16():
    ck = registry.load(SRC)
    for n in ck.quantized_names():
        s = ck[n].scales
        assert s.dtype == np.float16 and np.all(np.isfinite(s)) and float(np.abs(s).max()) < 65504 / 8
        assert np.array_equal((np.float16(-8) * s).astype(np.float32), -8 * s.astype(np.float32))


def test_chain_reproduces_codes_scales_and_files(tmp_path):
    src = registry.load(SRC)
    prev = SRC
    for i, fmt in enumerate(HOPS):
        dst = tmp_path / f"{i}-{fmt}"
        opts = {"checkpoint_format": "gptq"} if fmt == "gptq" else None  # the sample is v1
        rep = convert_exact(prev, dst, fmt, options=opts)
        assert rep["summary"]["all_exact"] and rep["summary"]["exact_up_to_rounding"] == 0, (fmt, rep["summary"])
        assert rep["summary"]["changed"] == 0
        out = registry.load(dst, format=fmt)
        for n in src.quantized_names():
            a, b = src[n], out[n]
            assert np.array_equal(as_unsigned(a).codes, as_unsigned(b).codes), (fmt, n)
            assert np.array_equal(a.scales, b.scales) and a.scales.dtype == b.scales.dtype, (fmt, n)
            assert np.array_equal(a.dequantize(), b.dequantize()), (fmt, n)
            if fmt == "mlx":
                assert b.scheme.zero_point is ZeroPoint.FLOAT
                assert np.array_equal(b.zero_points, (np.float16(-8) * a.scales)), n
        prev = dst
    # the last hop is GPTQ again: symmetric, and the stored tensors are the original bytes
    final = registry.load(prev)
    assert final.format == "gptq"
    for n in src.quantized_names():
        assert final[n].scheme.zero_point is ZeroPoint.NONE and final[n].scheme == src[n].scheme
    a = load_file(str(SRC / "model.safetensors"))
    b = load_file(str(prev / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes(), k
    qc = json.loads((prev / "config.json").read_text())["quantization_config"]
    orig = json.loads((SRC / "config.json").read_text())["quantization_config"]
    for key in ("bits", "group_size", "desc_act", "sym", "checkpoint_format"):
        assert qc[key] == orig[key], key
