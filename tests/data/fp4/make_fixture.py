"""Cut the FP4 quantizer fixture ``smollm2_fp4_fixture.safetensors`` from the project's shared real files.

Run once (not part of pytest): ``python tests/data/fp4/make_fixture.py /path/to/shared/real``. Every
array is stored as raw bits (BF16 as U16, E4M3 as U8) so ``safetensors.numpy`` loads it:

* ``<name>.bf16`` (U16): the bf16 source weights llm-compressor quantized (layer-0 q/k/v whole; the
  down_proj rows 0..63 plus the row holding the tensor's absmax, as ``down_rows`` says);
* ``<name>.mxfp4.packed`` / ``.mxfp4.scale`` (U8): ``ct_mxfp4_smollm2`` ``weight_packed`` /
  ``weight_scale`` of the same rows;
* ``<name>.nvfp4.packed`` / ``.nvfp4.scale`` (U8, E4M3 bytes) / ``.nvfp4.global`` (F32 [1]):
  ``ct_nvfp4_smollm2`` ``weight_packed`` / ``weight_scale`` / ``weight_global_scale``;

``make_mlx.py`` (interop venv, mlx 0.32.4) adds ``smollm2_mlx_mxfp4.safetensors``: what
``mx.quantize(w, group_size=32, bits=4, mode="mxfp4")`` makes of the k_proj and v_proj bf16 weights.
"""

import hashlib
import json
import struct
import sys
from pathlib import Path

import numpy as np

NAMES = ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
         "model.layers.0.self_attn.v_proj.weight", "model.layers.0.mlp.down_proj.weight"]
RAW = {"BF16": np.uint16, "U8": np.uint8, "F32": np.float32, "F8_E4M3": np.uint8}


def read_raw(path: Path) -> dict[str, np.ndarray]:
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, z = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + a:8 + n + z], RAW[v["dtype"]]).reshape(v["shape"])
    return out


def write_raw(path: Path, arrays: dict[str, np.ndarray]) -> None:
    dt = {np.dtype(np.uint16): "U16", np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32",
          np.dtype(np.int64): "I64"}
    head, blobs, off = {}, [], 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        b = a.tobytes()
        head[name] = {"dtype": dt[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(head).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main(real: Path) -> None:
    src = read_raw(real / "fp_sources/smollm2_tiny1L/model.safetensors")
    mx = read_raw(real / "ct_mxfp4_smollm2/model.safetensors")
    nv = read_raw(real / "ct_nvfp4_smollm2/model.safetensors")
    down = NAMES[3]
    w = src[down].view(np.uint16)
    mag = np.abs(w.astype(np.uint16) & 0x7FFF)  # bf16 magnitudes order as their bits
    top = int(np.unravel_index(int(np.argmax(mag)), mag.shape)[0])
    rows = sorted(set(range(63 if top >= 63 else 64)) | {top})  # 64 rows
    out = {"down_rows": np.array(rows, np.int64)}
    for n in NAMES:
        base = n[: -len(".weight")]
        sel = rows if n == down else slice(None)
        out[f"{n}.bf16"] = src[n].view(np.uint16)[sel]
        out[f"{n}.mxfp4.packed"] = mx[base + ".weight_packed"][sel]
        out[f"{n}.mxfp4.scale"] = mx[base + ".weight_scale"][sel]
        out[f"{n}.nvfp4.packed"] = nv[base + ".weight_packed"][sel]
        out[f"{n}.nvfp4.scale"] = nv[base + ".weight_scale"][sel]
        out[f"{n}.nvfp4.global"] = nv[base + ".weight_global_scale"].astype(np.float32)
    dst = Path(__file__).parent / "smollm2_fp4_fixture.safetensors"
    write_raw(dst, out)
    print(dst, hashlib.sha256(dst.read_bytes()).hexdigest(), dst.stat().st_size)
    for rel in ("fp_sources/smollm2_tiny1L/model.safetensors", "ct_mxfp4_smollm2/model.safetensors",
                "ct_nvfp4_smollm2/model.safetensors"):
        print(rel, hashlib.sha256((real / rel).read_bytes()).hexdigest())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
