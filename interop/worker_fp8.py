"""Worker actions of the FP8 rows (run in the interop venv by worker.py; see cases.FP8_SOURCES).

- ``fp8_reference``: the reference model of a loadable FP8 source: its config without
  ``quantization_config`` and its tensors with every quantized weight replaced by the producing tool's
  own decode (``reference_dequant.safetensors``), run by transformers in float32.
- ``layers_fp8``: a DeepSeek-style ``fp8`` folder decoded by transformers' FineGrainedFP8 dequantize
  (``transformers.integrations.finegrained_fp8._dequantize_fp8_weight``, the function its CPU loading
  path calls), compared like every layer check.
- ``layers_modelopt``: SKIP with the reason: no ModelOpt consumer runs on this CPU machine.
"""

from __future__ import annotations

import json
import os

import numpy as np


def _stage():
    from worker import stage  # the harness's stage wrapper (worker.py is the entry point)
    return stage


def act_fp8_reference(spec: dict) -> dict:
    """Build the float32 reference folder, save the logits of the id prompts and the greedy ids."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from worker import _hf_logits_and_greedy

    stage = _stage()
    src = spec["source"]
    dest = spec["dest"]
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    cfg["dtype"] = "float32"
    with open(os.path.join(dest, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    state = load_file(os.path.join(src, "model.safetensors"))
    ref = load_file(os.path.join(src, spec["reference"]))
    tensors = {}
    for name, t in state.items():
        if name.endswith(("_scale_inv", "_scale", "input_scale")) and name not in ref:
            continue  # quantization parameters of a weight the reference decodes
        tensors[name] = (ref[name] if name in ref else t).to(torch.float32).contiguous()
    save_file(tensors, os.path.join(dest, "model.safetensors"), metadata={"format": "pt"})
    model = stage("load", transformers.AutoModelForCausalLM.from_pretrained, dest, dtype=torch.float32)
    model.eval()
    logits, greedy = _hf_logits_and_greedy(model, spec)
    np.savez(spec["reference_npz"], **{f"p{i}": a.astype(np.float32) for i, a in enumerate(logits)})
    last = int(logits[spec["france_index"]][-1].argmax())
    return {"ok": True, "prompts": spec["prompts"], "greedy_ids": greedy, "greedy_text": None,
            "paris_ids": [last], "france_top1": last, "replaced": sorted(ref), "tensors": len(tensors)}


def act_layers_fp8(spec: dict) -> dict:
    """transformers' FineGrainedFP8 dequantize of every ``weight`` + ``weight_scale_inv`` pair."""
    import torch
    from safetensors.torch import load_file
    from transformers.integrations.finegrained_fp8 import _dequantize_fp8_weight

    from worker import Stage, _compare_layers, _read_json, _x_for

    stage = _stage()
    folder = spec["path"]
    qc = _read_json(os.path.join(folder, "config.json"))["quantization_config"]
    block = qc.get("weight_block_size")
    state = load_file(os.path.join(folder, "model.safetensors"))
    decoded = {}
    for name, w in state.items():
        if not name.endswith(".weight") or name[: -len("weight")] + "weight_scale_inv" not in state:
            continue
        s = state[name[: -len("weight")] + "weight_scale_inv"]
        try:
            deq = _dequantize_fp8_weight(w, s, block, torch.float32)
        except Exception as exc:  # noqa: BLE001
            raise Stage("decode", exc) from None
        x = torch.from_numpy(_x_for(deq.shape[1]))
        y = torch.nn.functional.linear(x, deq)
        decoded[name] = (deq.numpy(), y.numpy(), None)
    if not decoded:
        raise Stage("load", ValueError("no weight + weight_scale_inv pair in the folder"))
    del stage
    return _compare_layers(decoded, spec["source_f32"], orig_path=spec.get("orig_f32"),
                           loader="transformers finegrained_fp8._dequantize_fp8_weight")


def act_layers_modelopt(spec: dict) -> dict:
    """No consumer of ModelOpt checkpoints runs here: transformers 5.24 has no ModelOpt reader (it loads
    the raw FP8 codes as weights) and vLLM / TensorRT-LLM need a GPU. The row says so (SKIP); the
    ModelOpt decode is checked against ModelOpt 0.47's own exports in tests/formats/test_modelopt.py."""
    return {"ok": False, "skipped": True,
            "error": "no ModelOpt consumer on this CPU machine (transformers 5.24 does not read ModelOpt "
                     "quantization; vLLM / TensorRT-LLM need a GPU)"}


ACTIONS = {
    "fp8_reference": act_fp8_reference,
    "layers_fp8": act_layers_fp8,
    "layers_modelopt": act_layers_modelopt,
}
