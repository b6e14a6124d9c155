"""llama.cpp's Q6_K bytes of ``blk.0.ffn_down.weight`` of ``minilm_gguf_Q8_0.gguf`` requantized from its
dequantized values (run in /work/venvs/interop)::

    python sample_checkpoints/gguf/kquant_expected/make_q8_to_q6k.py

Both steps are llama.cpp's own C functions from the ``libggml-base.so`` of PyPI llama-cpp-python 0.3.36
(llama.cpp commit 0c1e57098bba), called through ctypes: ``dequantize_row_q8_0`` on the stored Q8_0 blocks
(the raw tensor bytes read with ``gguf.GGUFReader``), then ``quantize_row_q6_K_ref`` (what llama-quantize's
``ggml_quantize_chunk`` runs for Q6_K without an importance matrix) on those float32 values. Writes
``q8_to_q6k.json``: the tensor, its shape, the byte count and the SHA-256 of llama.cpp's Q6_K bytes.
"""

import ctypes
import glob
import hashlib
import json
import pathlib

import gguf
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE.parent / "minilm_gguf_Q8_0.gguf"
NAME = "blk.0.ffn_down.weight"


def main() -> None:
    lib = ctypes.CDLL(glob.glob(str(pathlib.Path(__import__("llama_cpp").__file__).parent / "lib" /
                                    "libggml-base.so"))[0])
    for fn in (lib.dequantize_row_q8_0, lib.quantize_row_q6_K_ref):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    t = next(t for t in gguf.GGUFReader(str(SRC)).tensors if t.name == NAME)
    assert t.tensor_type.name == "Q8_0"
    raw = np.ascontiguousarray(np.asarray(t.data).view(np.uint8).reshape(-1))
    n = int(np.prod(t.shape))
    x = np.zeros(n, np.float32)
    lib.dequantize_row_q8_0(raw.ctypes.data, x.ctypes.data, n)
    out = np.zeros(n // 256 * 210, np.uint8)
    lib.quantize_row_q6_K_ref(x.ctypes.data, out.ctypes.data, n)
    doc = {"source": SRC.name, "tensor": NAME, "gguf_shape": [int(v) for v in t.shape], "type": "Q6_K",
           "bytes": int(out.size), "sha256": hashlib.sha256(out.tobytes()).hexdigest(),
           "made_by": "llama.cpp dequantize_row_q8_0 + quantize_row_q6_K_ref (llama-cpp-python 0.3.36, "
                      "libggml-base.so, llama.cpp 0c1e57098bba)"}
    (HERE / "q8_to_q6k.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(doc)


if __name__ == "__main__":
    main()
