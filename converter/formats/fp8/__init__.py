"""DeepSeek-V3-style block FP8 (transformers ``FineGrainedFP8``, ``quant_method: "fp8"``), and bare FP8 files.

The layout of DeepSeek V3 / R1 / V3.1, Kimi K2, Qwen3-FP8, GLM-4.5-FP8, MiniMax-M2 (and auto-round's
``format="fp8"`` export). For a Linear module ``<p>`` with logical weight ``(out, in)``:

- ``<p>.weight``  ``F8_E4M3`` (``fmt: "e4m3"``; ``F8_E5M2`` for ``"e5m2"``) ``[out, in]``: one element
  per weight; the codes are its bytes.
- ``<p>.weight_scale_inv``  ``[ceil(out/bo), ceil(in/bi)]`` for ``weight_block_size: [bo, bi]``
  (one value per tensor, ``[]``, without a block size), in F32 (DeepSeek-V3), BF16 (auto-round),
  F16, or F8_E8M0 (power-of-two, DeepSeek-V3.1 ``scale_fmt: "ue8m0"``; its 0xFF is NaN: read as
  such, for the validator to flag). The last block along each axis is partial when the extent does
  not divide it (576 = 4 x 128 + 64): ceil grids, as DeepSeek's and vLLM's kernels read them.
- Despite its name, ``weight_scale_inv`` is a **multiplier**: ``w = fp8 * weight_scale_inv`` per
  block (DeepSeek-V3 ``inference/kernel.py`` ``weight_dequant`` and ``inference/fp8_cast_bf16.py``;
  transformers 5.24 ``integrations/finegrained_fp8.py`` ``Fp8Dequantize._dequantize_one``: ``q * s``).
  The "inverse" is of the quantizer's scale (``fp8 = w / s``).
- Expert stacks (transformers ``FP8Experts``): ``<x>`` = ``...mlp.experts.gate_up_proj`` /
  ``down_proj``, ``[expert, out, in]`` with ``<x>_scale_inv`` ``[expert, ceil(out/bo), ceil(in/bi)]``;
  per tensor ``[expert, 1, 1]``, and ``[expert, 2, 1]`` for ``gate_up_proj`` (transformers
  ``_alloc_expert_proj(min_sf_out=2)``: the gate and up halves each have a scale).
- No ``weight_block_size`` key: inferred from the scale shapes (:func:`converter.formats.fp8.reader.infer_block`;
  transformers defaults it to 128 x 128, vLLM to per tensor).
- Activation scales (``activation_scheme: "static"``): ``<p>.activation_scale`` / ``input_scale`` /
  Mistral ``qscale_act`` (``<x>_activation_scale`` for experts) are dense tensors with stored role
  ``activation_scale``: kept as stored, never applied to the weight; written as ``<p>.activation_scale``
  (0-dim) / ``<x>_activation_scale`` whatever the source called them (:mod:`converter.formats.activations`).
- Other spellings of the weight scale (:mod:`converter.formats.fp8.names`): Mistral's
  ``<p>.qscale_weight`` (transformers renames it to ``weight_scale_inv``: the same per-tensor
  multiplier) and vLLM / AutoFP8's per-tensor ``<p>.weight_scale``.

A **bare** FP8 file (no quantization config, e.g. a model cast with ``.to(torch.float8_e4m3fn)``,
or ComfyUI's ``scaled_fp8`` with a per-tensor ``<p>.scale_weight`` multiplier and ``scale_input``)
is detected here with low confidence: each rank-2/3 F8_E4M3 / F8_E5M2 / F8_E4M3FNUZ / F8_E5M2FNUZ
tensor reads as that element with scale 1 (or its ``scale_weight``). ``plain`` detection is
unchanged (it claims float-only files).

The config rules are :mod:`converter.formats.fp8.config`, the decode
:mod:`converter.formats.fp8.reader`, the encode :mod:`converter.formats.fp8.writer`. transformers 5.24
dequantizes on CPU only when the scale grid divides the weight shape (``Fp8Dequantize`` derives the
block as ``rows // scale_rows``); a partial edge block is legitimate for the DeepSeek / vLLM kernels
and is written, with a warning note naming that limitation.
"""

from __future__ import annotations

from converter.formats.base import define_format
from converter.formats.tool_decode import in_model_dtype
from converter.formats.fp8.config import FORMAT
from converter.formats.fp8.reader import decode, detect, layers, metadata
from converter.formats.fp8.writer import check_target, dense_plan_of, encode, fp8_config, keep_dense

HANDLER = define_format(FORMAT, "DeepSeek-V3 / transformers FineGrainedFP8 block FP8 (and bare FP8 safetensors)",
                        detect=detect, layers=layers, decode=decode, encode=encode, config=fp8_config,
                        check_target=check_target, keep_dense=keep_dense, metadata=metadata, dense=dense_plan_of,
                        # auto-round 0.15 _dequant_fp8_linear_weight / transformers FineGrainedFP8: fp8 * scale_inv in
                        # float32, one cast to the model's dtype (config.json's)
                        tool_decode=in_model_dtype("FP8 block dequant (weight * weight_scale_inv)", "BF16"))

__all__ = ["HANDLER", "FORMAT"]
