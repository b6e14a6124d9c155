"""Worker action of the FP4 rows (run in the interop venv by worker.py; see cases.FP4_SOURCES).

- ``fp4_reference``: the reference model of an FP4 source: the bf16 source's config without
  ``quantization_config``, its tensors overlaid with the FP4 file's dense tensors and then with the
  producing tool's own decode of every quantized weight (``reference_dequant.safetensors``); every
  quantization parameter of a decoded weight is dropped (``weight_packed``, ``weight_scale``,
  ``weight_global_scale`` (compressed-tensors NVFP4), ``weight_scale_2`` and ``input_scale`` (ModelOpt),
  ...), so neither a packed U8 tensor nor a global scale reaches the model. Without a reference
  file (the bf16 source itself) the source's tensors are used as they are. Run by transformers in
  ``spec["dtype"]`` (float32 or bfloat16); the logits of the id prompts and the greedy ids are saved.
"""

from __future__ import annotations

import json
import os

import numpy as np

# The tensors a quantized Linear stores beside (or instead of) its weight, by suffix after the module
# name: compressed-tensors (weight_packed, weight_scale, weight_global_scale, weight_zero_point,
# input_global_scale, weight_shape), ModelOpt (weight_scale, weight_scale_2, input_scale), FP8
# (weight_scale_inv).
QPARAM_SUFFIXES = ("weight_packed", "weight_scale", "weight_global_scale", "weight_zero_point", "weight_shape",
                   "weight_scale_2", "weight_scale_inv", "input_scale", "input_global_scale")


def reference_tensors(dense: dict, quantized: dict, decoded: dict) -> dict:
    """name -> tensor of the reference model: ``dense`` (the bf16 source) overlaid with ``quantized``'s
    own tensors, then with ``decoded`` (the tool's decode, ``<module>.weight``); a quantization
    parameter of a decoded module is dropped."""
    decoded_modules = {n[: -len(".weight")] for n in decoded}
    out = dict(dense)
    for name, t in quantized.items():
        module, _, leaf = name.rpartition(".")
        if module in decoded_modules and (leaf in QPARAM_SUFFIXES or leaf == "weight"):
            continue
        out[name] = t
    out.update(decoded)
    return out


def act_fp4_reference(spec: dict) -> dict:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from worker import _hf_logits_and_greedy, stage

    dest = spec["dest"]
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(spec["bf16_source"], "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    dtype = spec.get("dtype", "float32")
    cfg["dtype"] = dtype
    with open(os.path.join(dest, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    dense = load_file(os.path.join(spec["bf16_source"], "model.safetensors"))
    quantized = load_file(os.path.join(spec["source"], "model.safetensors")) if spec.get("source") else {}
    decoded = load_file(spec["reference"]) if spec.get("reference") else {}
    tensors = reference_tensors(dense, quantized, decoded)
    bad = sorted(n for n, t in tensors.items() if not t.is_floating_point())
    if bad:  # a packed code or a scale left in: the reference would be wrong
        raise ValueError(f"non-float tensors left in the reference: {bad[:3]}")
    tensors = {n: t.to(getattr(torch, dtype)).contiguous() for n, t in tensors.items()}
    save_file(tensors, os.path.join(dest, "model.safetensors"), metadata={"format": "pt"})
    model = stage("load", transformers.AutoModelForCausalLM.from_pretrained, dest, dtype=getattr(torch, dtype))
    model.eval()
    logits, greedy = _hf_logits_and_greedy(model, spec)
    np.savez(spec["reference_npz"], **{f"p{i}": a.astype(np.float32) for i, a in enumerate(logits)})
    last = int(logits[spec["france_index"]][-1].argmax())
    return {"ok": True, "prompts": spec["prompts"], "greedy_ids": greedy, "greedy_text": None, "dtype": dtype,
            "paris_ids": [last], "france_top1": last, "decoded": sorted(decoded), "tensors": len(tensors),
            "from_fp4_file": sorted(n for n in quantized if n in tensors and n not in decoded)}


ACTIONS = {"fp4_reference": act_fp4_reference}
