"""Make the bitsandbytes NF4 double-quant fixture (issue 18 item 3) with bitsandbytes itself.

Run with an interpreter that has torch and bitsandbytes 0.50.2 (not qckpt's dependencies), from the
repository root:

    python tests/data/bnb_double_quant/make_fixture.py

For each Linear weight of the bitsandbytes NF4 sample (sample_checkpoints/bnb_nf4_bs64: the same five
modules), the float16 weight of sample_checkpoints/minilm_fp16.safetensors is quantized by
``bitsandbytes.functional.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")`` and
stored under the keys ``Linear4bit._save_to_state_dict`` writes (``weight`` + ``QuantState.as_dict(packed=True)``:
``absmax`` uint8, ``quant_map``, ``nested_absmax``, ``nested_quant_map``, ``quant_state.bitsandbytes__nf4``);
biases pass through. ``reference_dequant.safetensors`` holds ``dequantize_4bit`` of pooler.dense (float16, the
quant_state dtype). config.json is the NF4 sample's with ``bnb_4bit_use_double_quant: true``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import bitsandbytes
import bitsandbytes.functional as F
import torch
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
MODULES = ["encoder.layer.0.attention.self.query", "encoder.layer.0.attention.output.dense",
           "encoder.layer.0.intermediate.dense", "encoder.layer.0.output.dense", "pooler.dense"]
REFERENCE = "pooler.dense"


def main() -> None:
    src = load_file(str(ROOT / "sample_checkpoints" / "minilm_fp16.safetensors"))
    out, ref = {}, {}
    for m in MODULES:
        w = src[f"{m}.weight"].contiguous()
        q, state = F.quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4")
        out[f"{m}.weight"] = q
        for k, v in state.as_dict(packed=True).items():
            out[f"{m}.weight.{k}"] = v
        out[f"{m}.bias"] = src[f"{m}.bias"]
        if m == REFERENCE:
            ref[f"{m}.weight"] = F.dequantize_4bit(q, state)
    save_file(out, str(HERE / "model.safetensors"), metadata={"format": "pt"})
    save_file(ref, str(HERE / "reference_dequant.safetensors"))
    cfg = json.loads((ROOT / "sample_checkpoints" / "bnb_nf4_bs64" / "config.json").read_text())
    cfg["quantization_config"]["bnb_4bit_use_double_quant"] = True
    (HERE / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(HERE.iterdir()) if p.suffix in (".safetensors", ".json") and p.name != "PROVENANCE.json"}
    prov = {"made_by": "tests/data/bnb_double_quant/make_fixture.py",
            "tools": {"bitsandbytes": bitsandbytes.__version__, "torch": torch.__version__},
            "source_weights": "sample_checkpoints/minilm_fp16.safetensors",
            "call": "bitsandbytes.functional.quantize_4bit(w, blocksize=64, compress_statistics=True, "
                    "quant_type='nf4')",
            "reference": f"bitsandbytes.functional.dequantize_4bit of {REFERENCE}.weight (float16)",
            "sha256": files}
    (HERE / "PROVENANCE.json").write_text(json.dumps(prov, indent=2) + "\n")


if __name__ == "__main__":
    main()
