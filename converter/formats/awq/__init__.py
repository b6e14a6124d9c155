"""AWQ (AutoAWQ) checkpoints: GEMM and GEMV read, GEMM write (FORMATS.md section 2).

Storage facts, translated once at this boundary through :class:`~converter.layout.AxisMap`
(symbols: ``O`` out_features, ``I`` in_features, ``G`` group size, ``nG = I / G``):

GEMM (``version: "gemm"``; AutoAWQ ``awq/modules/linear/gemm.py`` ``WQLinear_GEMM``)
    ``<p>.qweight`` int32 ``[I, O/8]``: stored axes ``(in, out)``, 4-bit codes packed along
    **out**, nibble ``k`` of word ``c`` holds column ``8c + ORDER[k]``,
    ``ORDER = (0, 2, 4, 6, 1, 3, 5, 7)`` (``awq/utils/packing_utils.py`` ``AWQ_ORDER``).
    ``<p>.qzeros`` int32 ``[nG, O/8]``: same packing and interleave, *raw* zero (no ``-1``
    offset, unlike GPTQ v1). ``<p>.scales`` float16 ``[nG, O]``: stored axes ``(group, out)``.
    ``<p>.bias`` float16 ``[O]`` is the Linear's own bias, a dense pass-through tensor.
    Dequant ``W[o, i] = s[i//G, o] * (q[i, o] - z[i//G, o])`` (``packing_utils.dequantize_gemm``).
GEMV (``version: "gemv"``; ``awq/modules/linear/gemv.py`` ``WQLinear_GEMV``)
    ``qweight`` int32 ``[O, I/8]`` packed along **in**, sequential LSB-first. ``qzeros`` int32
    ``[O, Zw]`` packed sequentially along the group axis; ``scales`` float16 ``[O, Zw*8]``.
    ``Zw = calculate_zeros_width(I, G)`` pads ``ceil(nG/8)`` up to a multiple of 1 (G >= 128),
    2 (G = 64) or 4 (G = 32); the padding is zero and is dropped (after checking it is zero).
GEMV_FAST / llm-awq
    int16 ``qweight`` with a kernel-specific reshuffle: refused with :class:`UnsupportedError`.

Zero points. ``zero_point: true`` gives :attr:`ZeroPoint.INTEGER` unsigned 4-bit codes.
``zero_point: false`` (written by GPTQModel; AutoAWQ's own packer asserts zeros exist) is read
as :attr:`ZeroPoint.NONE` with the implicit unsigned centre 8, provided ``qzeros`` is absent
or holds 8 everywhere; anything else contradicts the config and raises :class:`FormatError`.

Writing produces GEMM only, because it is the layout every AWQ loader (AutoAWQ, transformers,
vLLM, exllama/ipex repackers) accepts. Symmetric and signed schemes are re-expressed exactly
with explicit integer zeros (``qzeros = 8`` and ``zero_point: true``), since AutoAWQ cannot
load a GEMM layer without zeros.
"""

from __future__ import annotations

from converter.formats.modules import hf_linear_policy
from converter.formats.tool_decode import in_scale_dtype
from converter.formats.registry import FormatHandler, ValidationHooks, register
from converter.formats.awq.layout import (FORMAT, GEMM_QWEIGHT, GEMM_QZEROS, GEMM_SCALES, GEMV_QWEIGHT,  # noqa: F401
                                          GEMV_QZEROS, GEMV_SCALES, ORDER, gemv_zeros_width)
from converter.formats.awq.reader import detect_awq, read_awq  # noqa: F401
from converter.formats.awq.writer import awq_config, check_model, check_target, encode_gemm, write_awq  # noqa: F401

HANDLER = register(FormatHandler(FORMAT, "AWQ (AutoAWQ) GEMM/GEMV; writes GEMM", detect_awq, read_awq, write_awq,
                                 check_target=check_target, check_model=check_model, keep_dense=hf_linear_policy("awq"),
                                 partial_groups=False,
                                 float_bias="integer", scale_dtype="F16",
                                 word_orders={"AWQ interleave": ORDER},
                                 # autoawq 0.2.9 packing_utils.dequantize_gemm: (iweight - izeros) * scales
                                 tool_decode=in_scale_dtype("autoawq dequantize_gemm"),
                                 validation=ValidationHooks(config_loaders="transformers, vLLM and AutoAWQ")))
