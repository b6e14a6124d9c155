"""compressed-tensors (Neural Magic / vLLM, ``quant_method: "compressed-tensors"``): reader and writer.

- :mod:`.config`: parse / emit ``quantization_config`` (groups, targets, ignore, version).
- :mod:`.reader`: ``pack-quantized`` (dense >= 0.18 and padded <= 0.17 packing), ``int-quantized``,
  ``naive-quantized``; signed codes, ``s * (q - zp)``; ``float-quantized`` (FP8, :mod:`.float_layout`);
  mixed ``config_groups`` (each group with its own codec, an unreadable group's modules opaque).
- :mod:`.writer`: the same formats, config keys exactly as compressed-tensors 0.20.1 writes them.

FORMATS.md section 3; pitfalls 3, 4, 8; CASES.md B12, B13, B29.
"""

from __future__ import annotations

from converter.formats.modules import hf_linear_policy
from converter.formats.compressed_tensors.tool_decode import ct_tool_decode
from converter.formats.registry import FormatHandler, ValidationHooks, register
from converter.formats.gpt_oss import arrange as gpt_oss_arrange
from converter.formats.compressed_tensors.config import parse_config  # noqa: F401
from converter.formats.compressed_tensors.reader import detect_ct, e8m0_rule_evidence, read_ct
from converter.formats.compressed_tensors.writer import CTTargetOptions, check_target, write_ct

HANDLER = register(FormatHandler("compressed-tensors",
                                 "compressed-tensors pack-quantized / int-quantized (Neural Magic, vLLM)",
                                 detect_ct, read_ct, write_ct, check_target=check_target,
                                 target_options=CTTargetOptions,
                                 keep_dense=hf_linear_policy("compressed-tensors", quantized_head=True),
                                 partial_groups=False,
                                 # llm-compressor's per-expert Linear modules (LinearExperts) for gpt-oss experts
                                 arrange=gpt_oss_arrange.for_linear,
                                 float_bias="symmetric",
                                 tool_decode=ct_tool_decode,
                                 validation=ValidationHooks(e8m0_rule=e8m0_rule_evidence, words_along_in=True,
                                                            config_loaders="transformers and vLLM")))
