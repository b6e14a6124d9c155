"""Cut the FP8 quantizer fixture ``smollm2_fp8_fixture.safetensors`` from the project's shared real files.

Run from the repository root with the shared folder present::

    python tests/data/fp8/make_fixture.py /work/shared/real

Inputs (FP_MANIFEST.json of the shared folder):

- ``fp_sources/smollm2_tiny1L/model.safetensors`` (bf16; layer 0 of SmolLM2-135M-Instruct as
  transformers' GGUF loader decodes it; its q/k/v/down tensors are bit-identical to the
  ``smollm2_L0_subset`` the model-free tools quantized);
- ``ct_fp8_channel_smollm2/model.safetensors``: llm-compressor 0.14.0.1 ``model_free_ptq(scheme=
  "FP8_DYNAMIC")`` (compressed-tensors 0.19.0): E4M3 codes, BF16 per-channel ``weight_scale``;
- ``deepseek_fp8_block_smollm2tiny/model.safetensors``: auto-round 0.15.1 ``FP8_BLOCK``
  ``format="fp8"``: E4M3 codes, BF16 128 x 128 ``weight_scale_inv``.

Kept (plain safetensors, F8 codes stored as U8 bytes so any reader loads them):
``k_proj`` whole (``[192, 576]``: a partial 64-row and 64-column edge block) and ``down_proj`` rows
512..575 (``[64, 1536]``: the partial last block row; per-channel and 128 x 128 tiles are
independent of the other rows), each as ``<name>.bf16`` (source), ``<name>.ct_channel.codes`` /
``.scale`` and ``<name>.autoround_block.codes`` / ``.scale_inv`` (the tools' outputs, the same rows).
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

K = "model.layers.0.self_attn.k_proj.weight"
D = "model.layers.0.mlp.down_proj.weight"
DT = {"BF16": np.uint16, "F8_E4M3": np.uint8}


def _load(path: Path) -> dict[str, np.ndarray]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    out = {}
    for name, v in head.items():
        if name != "__metadata__" and v["dtype"] in DT:
            a, b = v["data_offsets"]
            out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype=DT[v["dtype"]]).reshape(v["shape"])
    return out


def main(real: Path) -> None:
    src = _load(real / "fp_sources/smollm2_tiny1L/model.safetensors")
    ct = _load(real / "ct_fp8_channel_smollm2/model.safetensors")
    ds = _load(real / "deepseek_fp8_block_smollm2tiny/model.safetensors")
    out = {}
    for name, rows, brows in ((K, slice(None), slice(None)), (D, slice(512, 576), slice(4, 5))):
        out[f"{name}.bf16"] = src[name][rows]
        out[f"{name}.ct_channel.codes"] = ct[name][rows]
        out[f"{name}.ct_channel.scale"] = ct[name + "_scale"][rows]
        out[f"{name}.autoround_block.codes"] = ds[name][rows]
        out[f"{name}.autoround_block.scale_inv"] = ds[name + "_scale_inv"][brows]
    out = {k: np.ascontiguousarray(v) for k, v in out.items()}
    save_file(out, str(Path(__file__).parent / "smollm2_fp8_fixture.safetensors"),
              metadata={"note": "BF16 arrays stored as U16 bit patterns, F8_E4M3 codes as U8 bytes; see README.md"})


if __name__ == "__main__":
    main(Path(sys.argv[1]))
