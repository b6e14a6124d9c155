"""Make ``fp8_real_subset.safetensors``: a small subset of the real FP8 samples (no qckpt code).

Run from the repository root with the shared corpus present::

    python tests/validate/data/make_fp8_fixtures.py /work/shared/real

Sources (FP_MANIFEST.json of the corpus names the tools and versions):

- ``deepseek_fp8_block_smollm2tiny/model.safetensors`` (auto-round 0.15.1 ``format='fp8'``: E4M3
  weights, BF16 ``weight_scale_inv`` [ceil(out/128), ceil(in/128)], a multiplier): layer-0 ``k_proj``
  and ``v_proj``, whole (192 x 576: a 64-tall and a 64-wide partial edge block), under ``deepseek/``.
- ``ct_fp8_channel_smollm2/model.safetensors`` (llm-compressor 0.14.0.1 ``model_free_ptq`` FP8_DYNAMIC:
  E4M3 weights, BF16 ``weight_scale`` [out, 1]): layer-0 ``q/k/v/down_proj``, rows 0..31 with their
  per-channel scales (rows of a per-channel tensor are independent: the crop is what the tool writes
  for those channels), under ``ct/``.
- ``fp_sources/smollm2_tiny1L/model.safetensors`` (the bf16 weights both tools quantized): layer-0
  ``k_proj``, under ``source/`` (the float reference of ``validate --reference``).

The file is parsed and written by hand (header JSON + raw little-endian bytes), so the arrays are the
sources' bytes unchanged.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

OUT = Path(__file__).with_name("fp8_real_subset.safetensors")
ITEM = {"F8_E4M3": 1, "BF16": 2, "F32": 4}


def read(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def take(path: Path, name: str, rows: int | None = None) -> tuple[str, list[int], bytes]:
    header, data = read(path)
    h = header[name]
    a, b = h["data_offsets"]
    buf, shape = data[a:b], list(h["shape"])
    if rows is not None:  # leading rows of a row-major array
        row_bytes = len(buf) // shape[0]
        buf, shape = buf[:rows * row_bytes], [rows] + shape[1:]
    return h["dtype"], shape, buf


def main(real: Path) -> None:
    ds = real / "deepseek_fp8_block_smollm2tiny" / "model.safetensors"
    ct = real / "ct_fp8_channel_smollm2" / "model.safetensors"
    src = real / "fp_sources" / "smollm2_tiny1L" / "model.safetensors"
    arrays: dict[str, tuple[str, list[int], bytes]] = {}
    for proj in ("k_proj", "v_proj"):
        w = f"model.layers.0.self_attn.{proj}.weight"
        arrays[f"deepseek/{w}"] = take(ds, w)
        arrays[f"deepseek/{w}_scale_inv"] = take(ds, w + "_scale_inv")
    for w in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
              "model.layers.0.self_attn.v_proj.weight", "model.layers.0.mlp.down_proj.weight"):
        arrays[f"ct/{w}"] = take(ct, w, rows=32)
        arrays[f"ct/{w}_scale"] = take(ct, w + "_scale", rows=32)
    arrays["source/model.layers.0.self_attn.k_proj.weight"] = take(src, "model.layers.0.self_attn.k_proj.weight")
    meta = {"made_by": "tests/validate/data/make_fp8_fixtures.py"}
    for key, p in (("deepseek", ds), ("ct", ct), ("source", src)):
        meta[f"{key}.file"] = str(p.relative_to(real.parent))
        meta[f"{key}.sha256"] = hashlib.sha256(p.read_bytes()).hexdigest()
    header: dict = {"__metadata__": meta}
    offset, blobs = 0, []
    for name, (dtype, shape, buf) in arrays.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(buf)]}
        offset += len(buf)
        blobs.append(buf)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    OUT.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    print(OUT, OUT.stat().st_size, hashlib.sha256(OUT.read_bytes()).hexdigest())


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/work/shared/real"))
