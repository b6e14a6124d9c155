"""MLX quantized checkpoints (``mlx.core.quantize`` / mlx-lm): reader and affine writer.

Storage (FORMATS.md section 4; ``mlx/ops.cpp`` ``affine_quantize`` / ``fp_quantize``,
``python/mlx/nn/layers/quantized.py`` ``QuantizedLinear``, ``mlx_lm/utils.py`` ``load_model`` /
``save_model``), for a module ``<p>`` with logical weight ``<p>.weight`` of shape ``(out, in)``
(``(expert, out, in)`` for ``SwitchLinear``):

- ``<p>.weight``  uint32 ``[..., out, in*b/32]``: codes packed along ``in``, LSB-first, one
  continuous bit stream (3/5/6-bit codes straddle words).
- ``<p>.scales``  ``[..., out, in/G]``: model dtype (F16/BF16/F32) in ``affine`` mode, may be
  **negative**; uint8 in ``mxfp4`` / ``mxfp8`` (E8M0) and ``nvfp4`` (FP8 E4M3 bits).
- ``<p>.biases``  ``[..., out, in/G]``: affine only, an additive offset: ``w = s*q + b``.
- ``<p>.bias``    the ordinary Linear bias (a dense tensor; coexists with ``.biases``).

``config.json["quantization"]`` (mirrored as ``quantization_config``) holds the defaults
``group_size``, ``bits``, ``mode`` (absent -> ``"affine"``) and per-module entries keyed by module
path: a params dict or ``false``. Layers without ``.scales`` are dense (mlx-lm leaves layers with
``in % G != 0`` in float, CASES.md B15).

Logical model: affine -> unsigned codes, ``ZeroPoint.FLOAT`` (biases in the scale dtype);
``mxfp4`` / ``nvfp4`` -> codebook E2M1 with E8M0 / E4M3 scales; ``mxfp8`` -> a 256-entry codebook
of the FP8 E4M3 values with E8M0 scales. The mode therefore lives in the scheme itself (codebook
and scale dtype), so fp codes can never be read as affine integers (CASES.md B31).
"""

from __future__ import annotations

from converter.formats.mlx.config import E2M1, E4M3, FORMAT, layer_params, quant_config
from converter.formats.mlx.reader import codes_map, dequantize_like_mlx, detect_mlx, read_mlx
from converter.formats.mlx.writer import (MLXTargetOptions, as_affine, check_target, mlx_config, target_group_size,
                                          write_mlx)
from converter.formats.registry import FormatHandler, ValidationHooks, register
from converter.formats.gpt_oss import arrange as gpt_oss_arrange
from converter.formats.mlx.tool_decode import mlx_tool_decode

def mlx_lm_leaves_dense(spec, group_size: int | None) -> bool:
    """mlx-lm 0.32.2 ``utils.quantize_model``: ``nn.quantize`` with a predicate that quantizes every module with
    ``to_quantized`` (``nn.Linear``, ``nn.Embedding``: the token embedding and an untied head too) unless
    ``weight.shape[-1] % group_size != 0``; norms have no ``to_quantized``."""
    return "norm" in spec.name or bool(group_size and spec.shape[-1] % group_size)


__all__ = ["FORMAT", "E2M1", "E4M3", "quant_config", "layer_params", "codes_map", "dequantize_like_mlx", "detect_mlx",
           "read_mlx", "as_affine", "check_target", "mlx_config", "target_group_size", "write_mlx"]

HANDLER = register(FormatHandler(FORMAT, "MLX / mlx-lm quantized (affine, mxfp8, mxfp4, nvfp4)",
                                 detect_mlx, read_mlx, write_mlx, check_target=check_target,
                                 target_options=MLXTargetOptions,
                                 # mlx-lm gpt_oss: SwitchGLU gate_proj / up_proj / down_proj (Model.sanitize)
                                 arrange=gpt_oss_arrange.for_stacked,
                                 tool_decode=mlx_tool_decode,
                                 quantize_exclude=mlx_lm_leaves_dense,
                                 # MLX affine scales may be negative (FORMATS.md section 11, pitfall 9).
                                 validation=ValidationHooks(negative_scales=True)))
