"""NVIDIA ModelOpt FP8 (``export_hf_checkpoint``; ``quant_method: "modelopt"``): reader and writer.

- :mod:`.config`: ``hf_quant_config.json`` / ``config.json`` ``quantization_config`` (quant_algo,
  exclude_modules, MIXED_PRECISION quantized_layers), emitted as ModelOpt 0.47.0 writes them.
- :mod:`.reader`: FP8 (per tensor), FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO (128 x 128 blocks); static
  ``input_scale`` kept as activation metadata; every other quant_algo refused by name (NVFP4: issue 15).
- :mod:`.writer`: the same three layouts.
"""

from __future__ import annotations

from converter.formats.modules import hf_linear_policy
from converter.formats.registry import FormatHandler, register
from converter.formats.modelopt.reader import detect_modelopt, read_modelopt
from converter.formats.modelopt.writer import check_target, probe_companions, write_modelopt

HANDLER = register(FormatHandler("modelopt", "NVIDIA ModelOpt FP8 export (FP8, FP8_PER_CHANNEL_PER_TOKEN, FP8_PB_WO)",
                                 detect_modelopt, read_modelopt, write_modelopt, check_target=check_target,
                                 keep_dense=hf_linear_policy("modelopt"), partial_groups=True,
                                 probe_companions=probe_companions))
