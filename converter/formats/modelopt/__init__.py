"""NVIDIA ModelOpt FP8 and NVFP4 (``export_hf_checkpoint``; ``quant_method: "modelopt"``): reader and writer.

- :mod:`.config`: ``hf_quant_config.json`` / ``config.json`` ``quantization_config`` (quant_algo,
  exclude_modules, MIXED_PRECISION quantized_layers), emitted as ModelOpt 0.47.0 writes them.
- :mod:`.reader`: FP8 (per tensor), FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO (128 x 128 blocks); static
  ``input_scale`` kept as activation metadata; NVFP4 (:mod:`.nvfp4`); every other quant_algo refused by name.
- :mod:`.writer`: the same four layouts (NVFP4 global scale re-expressed as a multiplier, exact or refused).
"""

from __future__ import annotations

from converter.formats.modules import hf_linear_policy
from converter.formats.tool_decode import in_model_dtype
from converter.formats.registry import FormatHandler, register
from converter.formats.modelopt.reader import detect_modelopt, read_modelopt
from converter.formats.modelopt.writer import check_target, probe_companions, write_modelopt

HANDLER = register(FormatHandler("modelopt", "NVIDIA ModelOpt export (FP8, FP8_PC_PT, FP8_PB_WO, NVFP4)",
                                 detect_modelopt, read_modelopt, write_modelopt, check_target=check_target,
                                 keep_dense=hf_linear_policy("modelopt"), partial_groups=True,
                                 probe_companions=probe_companions,
                                 # modelopt 0.47 FP8QTensor / NVFP4QTensor.dequantize(dtype=...): float32 arithmetic,
                                 # one cast to dtype (default: the original weight dtype, config.json's); NVFP4's
                                 # E2M1 code 0x8 decodes to +0 (measured on modelopt_nvfp4_smollm2tiny)
                                 tool_decode=in_model_dtype("modelopt QTensor.dequantize", "BF16",
                                                            unsigned_zero=True)))
