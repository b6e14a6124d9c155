"""How compressed-tensors decompresses (``qckpt dequantize --match-tool``).

``compressed_tensors.quantization.lifecycle.forward.dequantize``: ``(x_q - zero_point) * scale`` (float
codes: ``x_q * scale``; NVFP4: the scale divided by ``global_scale`` first), cast ``.to(dtype)``, where
``dtype`` defaults to the scale's dtype (0.20.1: ``if dtype is None: dtype = scale.dtype``). For integer
codes with float16 / bfloat16 scales the product is exact in float32, so the result is the float32 decode
rounded once to the scale dtype: bit for bit on the four pack-quantized samples (float16), on the FP8
channel sample (bfloat16 scales) and, run in the interop venv, against compressed-tensors 0.20.1's
``dequantize`` on the group-128 asym sample's codes with its scales cast to float16 and to bfloat16 (0 of
3,833,856 elements differ). FP4 scales (E4M3, E8M0) are no output dtype: the decompressor returns the
model's dtype (config.json ``dtype``; bfloat16 on the NVFP4 and MXFP4 samples, bit for bit);
``--tool-dtype`` may name another.
"""

from __future__ import annotations

from typing import Optional

from converter.formats.tool_decode import (FLOAT_RESULT_DTYPES, ToolDecode, fixed_dtype, model_dtype, rounded_once,
                                           runtime_dtype)

TOOL = "compressed-tensors dequantize"


def ct_tool_decode(ckpt, spec, runtime: Optional[str]) -> ToolDecode:
    """The :class:`ToolDecode` of a compressed-tensors tensor (see the module docstring).

    Raises
    ------
    UnsupportedError
        ``--tool-dtype`` differs from a 16/32-bit float scale dtype (the decode's dtype is the scale's).
    """
    sd = spec.scheme.scale_dtype
    if sd in FLOAT_RESULT_DTYPES:
        dt = fixed_dtype(TOOL, sd, runtime, "the scale's dtype", spec.name)
        return rounded_once(f"{TOOL}: round({dt.lower()}, (q - zero) * scale)", dt)
    dt = runtime_dtype(TOOL, runtime, model_dtype(ckpt.config), "BF16")
    return rounded_once(f"{TOOL} ({sd} scales): round({dt.lower()}, q * scale)", dt)
