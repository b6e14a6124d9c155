"""gpt-oss MXFP4 (``quant_method: "mxfp4"``, openai/gpt-oss-20b / 120b as transformers loads them): reader and writer.

- :mod:`.layout`: ``<p>.{gate_up,down}_proj_blocks`` U8 ``[E, O, in/32, 16]`` + ``_scales`` U8 ``[E, O, in/32]``
  (E2M1 low nibble first, E8M0 bias 127) <-> the logical ``(expert, out, in)`` tensor.
- :mod:`.interleave`: gate / up rows interleaved along ``out``; exact split and fuse.
- :mod:`.linears`: the experts as separate per-expert ``gate_proj`` / ``up_proj`` / ``down_proj`` Linear weights
  (llm-compressor's ``LinearExperts`` names), for 2-D targets such as compressed-tensors, and back.
- :mod:`.config`: ``quantization_config`` and ``modules_to_not_convert`` as transformers matches them.
- :mod:`.writer`: the target rules (only the two expert projections quantized) and the arrays.
"""

from __future__ import annotations

from converter.formats.base import define_format
from converter.formats.gpt_oss import arrange, reader, writer
from converter.formats.gpt_oss.layout import load_expert

HANDLER = define_format(
    reader.FORMAT, "gpt-oss MXFP4 experts (transformers quant_method mxfp4; openai/gpt-oss)",
    detect=reader.detect, layers=reader.layers, decode=lambda src, spec, m: load_expert(src, m),
    encode=writer.encode, config=writer.config, check_target=writer.check_target, metadata=reader.metadata,
    dense=writer.dense, keep_dense=writer.keep_dense, partial_groups=False, float_bias="symmetric",
    arrange=arrange.for_gpt_oss)
