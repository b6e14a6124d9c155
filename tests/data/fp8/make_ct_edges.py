"""Write ``ct_edges.json``: what compressed-tensors 0.20.1 makes of a few crafted per-channel FP8 E4M3 rows
(edge cases of the scale and of the sign of zero). Run in a venv with torch and compressed-tensors 0.20.1
(the project used ``/work/venvs/interop``: torch 2.13 CPU)::

    python tests/data/fp8/make_ct_edges.py

The scale comes from ``compressed_tensors.quantization.utils.calculate_qparams`` (what llm-compressor's
min-max observer feeds the per-channel min / max to) and the codes from
``compressed_tensors.quantization.lifecycle.forward.quantize`` with the zero point passed, as
``compressors/naive_quantized/base.py`` ``compress_weight`` calls it (the module's ``weight_zero_point``,
zeros for symmetric FP8, removed from the file only afterwards).
"""

import json
from pathlib import Path

import compressed_tensors
import torch
from compressed_tensors.quantization import QuantizationArgs
from compressed_tensors.quantization.lifecycle.forward import quantize
from compressed_tensors.quantization.utils import calculate_qparams

ROWS = [
    [-0.0, 0.5, -1.0, 0.25],   # -0.0 weight: +0.0 after the zero point is added -> 0x00
    [1e-6, -2e-6, 3e-7, 0.0],  # amax / 448 underflows F16 to 0 -> finfo(F16).eps
    [448.0, -1e-4, -0.0, 0.0],  # -1e-4 rounds to -0 only in the E4M3 cast -> 0x80
    [0.0, -0.0, 0.0, 0.0],     # all zero: compressed-tensors writes eps (qckpt contract 2: scale 1), codes 0x00
]


def main() -> None:
    args = QuantizationArgs(num_bits=8, type="float", strategy="channel", symmetric=True)
    out = {"compressed_tensors": compressed_tensors.__version__, "torch": torch.__version__, "rows": ROWS}
    for name, dt, bits in (("BF16", torch.bfloat16, torch.int16), ("F16", torch.float16, torch.int16)):
        w = torch.tensor(ROWS, dtype=dt)
        mn, mx = torch.amin(w, dim=1, keepdim=True), torch.amax(w, dim=1, keepdim=True)
        scale, zp = calculate_qparams(mn, mx, args)
        codes = quantize(w, scale, zp, args, dtype=torch.float8_e4m3fn)
        out[name] = {"weight_bits": (w.view(bits).to(torch.int32) & 0xFFFF).tolist(),
                     "scale_bits": (scale.view(bits).to(torch.int32) & 0xFFFF).flatten().tolist(),
                     "codes": codes.view(torch.uint8).tolist()}
    (Path(__file__).parent / "ct_edges.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
