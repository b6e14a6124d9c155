"""How MLX dequantizes (``mx.dequantize``, mlx 0.32.4), for ``qckpt dequantize --match-tool``.

affine
    ``w = scale * q + bias`` evaluated in the scales' dtype: the product is rounded to that dtype before
    the bias is added and the sum is rounded again (mlx ``backend/metal/kernels/quantized.h``
    ``affine_dequantize``: ``out = scale * d + bias`` with ``T scale, bias`` and ``T`` the scales' type;
    the CPU backend computes the same). The output dtype is the scales' dtype: the file fixes it.
    Bit for bit on both real affine samples (g32 b8, g64 b4; float16), and against mlx 0.32.4's
    ``mx.dequantize`` run on the g64 b4 sample with its scales and biases cast to bfloat16 (0 of 1,916,928
    elements differ).
mxfp4 / mxfp8 / nvfp4
    ``codebook[q] * scale`` in float32, rounded once to the output dtype: ``bfloat16`` from uint8 scales
    by default (``mx.dequantize``'s ``dtype`` argument may ask for another), ``float32`` when a float32
    ``global_scale`` takes part (type promotion). Bit for bit on the mxfp4, nvfp4 and nvfp4-with-global-scale
    samples (sample_checkpoints/mlx_*fp4*/PROVENANCE.json: the sha256 of every quantized weight's decode),
    and with ``dtype=mx.float16`` (``--tool-dtype f16``) on the mxfp4 sample (0 of 3,686,400 differ).
"""

from __future__ import annotations

from typing import Optional

from converter.formats.mlx.reader import dequantize_like_mlx
from converter.formats.tool_decode import ToolDecode, fixed_dtype, rounded_once, runtime_dtype
from converter.scheme import ZeroPoint

TOOL = "mlx.core.dequantize"


def mlx_tool_decode(ckpt, spec, runtime: Optional[str]) -> ToolDecode:
    """The :class:`ToolDecode` of an MLX tensor (see the module docstring); ``runtime``: ``--tool-dtype``.

    Raises
    ------
    UnsupportedError
        ``--tool-dtype`` on an affine tensor names another dtype than its scales' (MLX has no such choice).
    """
    s = spec.scheme
    if s.codebook is None and s.zero_point is ZeroPoint.FLOAT:
        dt = fixed_dtype(TOOL, s.scale_dtype, runtime, "affine decodes in the scales' dtype", spec.name)
        return ToolDecode(f"{TOOL} (affine): {dt.lower()}({dt.lower()}(scale * q) + bias)", dt, dequantize_like_mlx)
    default = "F32" if s.global_scale is not None else "BF16"
    dt = runtime_dtype(TOOL, runtime, None, default)
    return rounded_once(f"{TOOL} ({'global-scaled ' if s.global_scale else ''}float codes): "
                        f"round({dt.lower()}, codebook[q] * scale)", dt)
