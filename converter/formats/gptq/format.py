"""GPTQ checkpoints (AutoGPTQ, GPTQModel): ``checkpoint_format`` ``"gptq"`` (v1) and ``"gptq_v2"``.

Storage of one linear layer ``<p>`` (FORMATS.md section 1.1; AutoGPTQ
``qlinear_cuda_old.QuantLinear.__init__``, GPTQModel ``GPTQQuantLinear._register_gptq_buffers``):

============== ===== ================================ ===================================================
name           dtype stored shape                     meaning
============== ===== ================================ ===================================================
``<p>.qweight`` I32  ``[ceil(I*b/32), O]`` (in, out)  codes packed along ``in``, LSB-first stream
``<p>.qzeros``  I32  ``[nG, ceil(O*b/32)]`` (grp, out) zero points packed along ``out``; v1 stores ``z - 1``
``<p>.scales``  F16  ``[nG, O]`` (group, out)         one scale per (group, output) — transposed vs ``[O, nG]``
``<p>.g_idx``   I32  ``[I]``                          group of each input column (act-order map)
============== ===== ================================ ===================================================

``b`` in {2, 3, 4, 8}; 3-bit is a 96-bit stream per 3 words (AutoGPTQ ``QuantLinear.pack``'s
10/1/10/1/10 loop). Dequantization ``W[o, i] = scales[g_idx[i], o] * (q[i, o] - z[g_idx[i], o])``
(AutoGPTQ ``qlinear_cuda.QuantLinear.forward``; GPTQModel ``_dequantize_from_codes``).

Logical model produced by the reader: ``(out, in)`` unsigned codes; group map ``group(in, G)``
(with ``g_idx`` only when it is not the trivial ``i // G``) or ``channel(out)`` for
``group_size = -1`` (one scale per output channel, ``nG = 1``); scheme ``ZeroPoint.NONE`` when the
config says ``sym`` and every zero point equals ``2^(b-1)``, else ``ZeroPoint.INTEGER`` with the
zero points kept (a validator flags ``sym`` configs with other zeros).

v1 zero points
--------------
GPTQModel 7.x writes v1 by packing true zeros and then subtracting the packed constant
``0x55555555`` / ``0x11111111`` / ``0x01010101`` (2/4/8-bit) from each *word*
(``gptqmodel/utils/model.py`` ``convert_gptq_v2_to_v1_format_module``), and reads v1 by adding it
back to each word (``convert_gptq_v1_to_v2_format_module``); 3-bit uses a per-field ``(z - 1) & 7``
shift (``_correct_gptq_v1_qzeros``). This reader decodes v1 the same way (word-level, modulo 2^32),
which is the exact inverse of GPTQModel's writer even when a zero point of 0 borrowed from its
neighbour: the real samples were written by GPTQModel and need this rule
(sample_checkpoints/MANIFEST.json notes). AutoGPTQ's torch kernels instead add 1 per field and mask
(``zeros = (field + 1) & (2^b - 1)``); the two rules agree whenever no stored field is all ones.
:func:`decode_qzeros` with ``v1_rule="field"`` gives AutoGPTQ's reading, for comparisons. A word
from AutoGPTQ's *unmasked* packer (``0xFFF65432`` for zeros ``[3,4,5,6,7,0,2,9]``, CASES.md B03)
lost columns 6 and 7 at write time; no rule recovers them.

The writer refuses to write a zero point 0 as v1 (:class:`NotRepresentableError`, CASES.md B03);
``gptq_v2`` stores every zero as is.
"""

from __future__ import annotations

from converter.formats.gptq.config import checkpoint_format_of
from converter.formats.gptq.layout import V1, V2, codes_map, decode_qzeros, encode_qzeros, zeros_map
from converter.formats.gptq.reader import detect_gptq, read_gptq, zero_convention_evidence
from converter.formats.gptq.writer import check_model, check_target, gptq_plan, write_gptq
from converter.formats.modules import hf_linear_policy
from converter.formats.tool_decode import in_scale_dtype
from converter.formats.registry import FormatHandler, ValidationHooks, register

__all__ = ["read_gptq", "write_gptq", "detect_gptq", "check_target", "codes_map", "zeros_map", "decode_qzeros",
           "encode_qzeros", "checkpoint_format_of", "zero_convention_evidence", "gptq_plan", "V1", "V2"]

HANDLER = register(FormatHandler("gptq", "GPTQ (AutoGPTQ / GPTQModel), checkpoint_format gptq (v1) or gptq_v2",
                                 detect_gptq, read_gptq, write_gptq, check_target=check_target, check_model=check_model,
                                 keep_dense=hf_linear_policy("gptq"), partial_groups=False,
                                 float_bias="integer", scale_dtype="F16",
                                 # gptqmodel 7.7 TorchLinear.dequantize_weight: scales[g_idx] * (weight - zeros[g_idx])
                                 tool_decode=in_scale_dtype("gptqmodel TorchLinear.dequantize_weight"),
                                 validation=ValidationHooks(zero_convention=zero_convention_evidence,
                                                            always_stored=("g_idx",), words_along_in=True,
                                                            config_loaders="transformers, vLLM and GPTQModel")))
