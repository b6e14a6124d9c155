"""What ``llama-quantize --pure`` makes of ``minilm_gguf_F16.gguf`` for one ggml type (run in /work/venvs/interop)::

    python sample_checkpoints/gguf/kquant_expected/make_pure.py

``llama_cpp.llama_model_quantize`` (PyPI llama-cpp-python 0.3.36, llama.cpp commit 0c1e57098bba) with
``pure = True`` (every tensor llama.cpp quantizes gets the file type's default type, no per-tensor mix; a
row length the type cannot hold falls back as llama.cpp does, e.g. Q4_K -> Q5_0 for 384-wide rows) and
``ftype`` Q4_K_M (default type Q4_K) and Q8_0. Writes ``pure.json``: per type, each tensor's ggml type
and the SHA-256 of its stored bytes.
"""

import ctypes
import hashlib
import json
import pathlib
import tempfile

import gguf
import llama_cpp
import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE.parent / "minilm_gguf_F16.gguf"
FTYPES = {"Q4_K": 15, "Q8_0": 7}  # LLAMA_FTYPE_MOSTLY_Q4_K_M (default type Q4_K), LLAMA_FTYPE_MOSTLY_Q8_0


def main() -> None:
    out = {"source": SRC.name, "llama_cpp_python": llama_cpp.__version__, "pure": True, "types": {}}
    with tempfile.TemporaryDirectory() as d:
        for name, ft in FTYPES.items():
            dst = str(pathlib.Path(d) / f"{name}.gguf")
            p = llama_cpp.llama_model_quantize_default_params()
            p.ftype, p.nthread, p.pure = ft, 1, True
            assert llama_cpp.llama_model_quantize(str(SRC).encode(), dst.encode(), ctypes.byref(p)) == 0
            r = gguf.GGUFReader(dst)
            out["types"][name] = {t.name: {"type": t.tensor_type.name,
                                           "sha256": hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()}
                                  for t in r.tensors}
    (HERE / "pure.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
