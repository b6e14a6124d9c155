"""Write the MLX FP4 samples (sample_checkpoints/mlx_*fp4*) with mlx / mlx-lm themselves.

Run with a venv holding ``mlx[cpu]==0.32.4 mlx-lm==0.32.2 numpy safetensors`` (not qckpt's
dependencies; qckpt's tests only read the committed output):

    /work/venvs/mlx/bin/python scripts/make_mlx_fp4_samples.py SRC_DIR OUT_DIR

``SRC_DIR``: the bf16 SmolLM2 tiny model (``fp_sources/smollm2_tiny1L``). Writes, under OUT_DIR:

- ``mlx_mxfp4_smollm2tiny`` / ``mlx_nvfp4_smollm2tiny``: the whole tiny model through mlx-lm's
  own convert path without a tokenizer (``mlx_lm.utils.load_model`` -> ``quantize_model(mode=...)``
  -> ``save_model`` / ``save_config``; ``mlx_lm.convert`` itself needs a tokenizer the source lacks).
- ``mlx_nvfp4_global_smollm2``: q/k/v/down of layer 0 quantized by ``mx.quantize(w, mode="nvfp4",
  global_scale=amax)`` with ``amax = max|w|`` in float32, the rule of mlx-lm's
  ``switch_layers._quantize_experts`` (mlx-lm 0.32.2 gives a global scale only to switch layers),
  saved by ``mx.save_safetensors`` with mlx-lm's names (``<p>.weight``, ``<p>.scales``,
  ``<p>.global_scale``) and its per-layer config entry (``"global_scale": true``).

Each folder gets ``reference_dequant.safetensors`` (``mx.dequantize`` of k_proj and v_proj, in the
dtype mx.dequantize returns) and ``PROVENANCE.json`` with the sha256 of mx.dequantize's output bytes
for every quantized weight (the references not stored, to keep the samples small).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

STORED_REFS = ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight")
SUBSET = ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
          "model.layers.0.self_attn.v_proj", "model.layers.0.mlp.down_proj")


def _sha(a: mx.array) -> str:
    return hashlib.sha256(np.asarray(a.view(mx.uint16) if a.dtype == mx.bfloat16 else a).tobytes()).hexdigest()


def _refs(weights: dict, qcfg: dict) -> tuple[dict, dict]:
    """mx.dequantize of every quantized module in ``weights`` -> (stored refs, sha256 of each)."""
    stored, hashes = {}, {}
    for name in sorted(weights):
        if not name.endswith(".scales"):
            continue
        p = name[: -len(".scales")]
        entry = qcfg.get(p) if isinstance(qcfg.get(p), dict) else qcfg
        gs = weights.get(f"{p}.global_scale")
        d = mx.dequantize(weights[f"{p}.weight"], weights[name], group_size=entry["group_size"],
                          bits=entry["bits"], mode=entry["mode"], global_scale=gs)
        mx.eval(d)
        hashes[f"{p}.weight"] = {"dtype": str(d.dtype).split(".")[-1], "shape": list(d.shape), "sha256": _sha(d)}
        if f"{p}.weight" in STORED_REFS:
            stored[f"{p}.weight"] = d
    return stored, hashes


def _files(d: Path) -> dict:
    return {f.name: {"bytes": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
            for f in sorted(d.iterdir()) if f.name != "PROVENANCE.json"}


def _provenance(d: Path, name: str, command: list[str], src: Path, what: str, hashes: dict, extra: dict) -> None:
    prov = {
        "name": name,
        "tool": "mlx / mlx-lm (CPU build, mlx[cpu])",
        "versions": {"mlx": mx.__version__, "mlx-lm": mlx_lm.__version__, "numpy": np.__version__},
        "script": "scripts/make_mlx_fp4_samples.py",
        "command": command,
        "source": f"{src} (bf16 SmolLM2-135M-Instruct tiny model: real layer 0, embed rows 0..255; "
                  "shared/real FP_MANIFEST.json sources.tiny_model)",
        "verifies": what,
        "reference": {
            "file": "reference_dequant.safetensors",
            "tensors": list(STORED_REFS),
            "decoded_by": "mlx.core.dequantize(weight, scales, group_size, bits, mode, global_scale)",
            "dtype": "the dtype mx.dequantize returns (bfloat16 from uint8 scales; float32 with a global scale)",
            "sha256_of_every_quantized_weight": hashes,
            "sha256_of": "the decode's raw little-endian bytes (bf16 as uint16)",
        },
        **extra,
    }
    prov["files"] = _files(d)
    (d / "PROVENANCE.json").write_text(json.dumps(prov, indent=1) + "\n")


def mlx_lm_sample(src: Path, out: Path, mode: str) -> None:
    name = f"mlx_{mode}_smollm2tiny"
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    model, config = load_model(src)
    model, config = quantize_model(model, config, None, None, mode=mode)
    save_model(d, model)
    save_config(config, config_path=d / "config.json")
    shutil.copy(src / "generation_config.json", d)
    weights = dict(tree_flatten(model.parameters()))
    stored, hashes = _refs(weights, config["quantization"])
    mx.save_safetensors(str(d / "reference_dequant.safetensors"), stored,
                        metadata={"decoded_by": "mlx.core.dequantize", "mlx": mx.__version__})
    cmd = ["from mlx_lm.utils import load_model, quantize_model, save_model, save_config",
           f"model, config = load_model(Path('{src.name}'))",
           f"model, config = quantize_model(model, config, None, None, mode='{mode}')",
           "save_model(out, model); save_config(config, config_path=out / 'config.json')"]
    what = (f"MLX {mode} read (codes, {'E8M0' if mode == 'mxfp4' else 'E4M3'} scales) decodes like mx.dequantize "
            f"bit for bit; qckpt's {mode} writer reproduces these bytes; loads with mlx_lm.load")
    _provenance(d, name, cmd, src, what, hashes, {"format": f"mlx {mode}", "loads_with": "mlx_lm.utils.load_model"})


def global_sample(src: Path, out: Path) -> None:
    name = "mlx_nvfp4_global_smollm2"
    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    w = mx.load(str(src / "model.safetensors"))
    weights, qcfg = {}, {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    for p in SUBSET:
        x = w[f"{p}.weight"]
        gs = mx.max(mx.abs(x)).astype(mx.float32)
        q, s = mx.quantize(x, 16, 4, mode="nvfp4", global_scale=gs)
        weights.update({f"{p}.weight": q, f"{p}.scales": s, f"{p}.global_scale": gs})
        qcfg[p] = {"group_size": 16, "bits": 4, "mode": "nvfp4", "global_scale": True}
    mx.eval(weights)
    mx.save_safetensors(str(d / "model.safetensors"), weights, metadata={"format": "mlx"})
    config = json.loads((src / "config.json").read_text())
    config["quantization"] = qcfg
    save_config(config, config_path=d / "config.json")
    stored, hashes = _refs(weights, qcfg)
    mx.save_safetensors(str(d / "reference_dequant.safetensors"), stored,
                        metadata={"decoded_by": "mlx.core.dequantize(..., global_scale=...)", "mlx": mx.__version__})
    cmd = ["w = mx.load('model.safetensors')[f'{p}.weight']  # p in q/k/v/down of layer 0",
           "gs = mx.max(mx.abs(w)).astype(mx.float32)  # mlx_lm switch_layers._quantize_experts",
           "q, s = mx.quantize(w, 16, 4, mode='nvfp4', global_scale=gs)",
           "mx.save_safetensors('model.safetensors', {p.weight: q, p.scales: s, p.global_scale: gs}, "
           "metadata={'format': 'mlx'})"]
    what = ("MLX nvfp4 with a per-tensor global_scale (the tensor amax): the effective scale s * fp32(g / 2688) "
            "decodes like mx.dequantize(..., global_scale=g) bit for bit; qckpt's writer reproduces these bytes")
    _provenance(d, name, cmd, src, what, hashes, {
        "format": "mlx nvfp4 with global_scale",
        "note": "mlx-lm 0.32.2 attaches a global scale only to switch (expert) layers (utils._takes_global_scale); "
                "a dense nn.QuantizedLinear has no global_scale parameter, so this layout does not load through "
                "mlx_lm.load for a dense model: it is mx.quantize's output in mlx-lm's names, checked with "
                "mx.dequantize"})


if __name__ == "__main__":
    src_dir, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    mlx_lm_sample(src_dir, out_dir, "mxfp4")
    mlx_lm_sample(src_dir, out_dir, "nvfp4")
    global_sample(src_dir, out_dir)
