"""Dequantizing a gpt-oss expert stack streams expert by expert: same bytes as the whole-tensor decode, and a
working set bounded by the memory budget (not the stack's float32 size).

The synthetic stack's values are decoded here by hand from its stored bytes (E2M1 table, low nibble first, E8M0
``2^(b - 127)``, transformers' ``[E, in, out]`` order), not by qckpt.
"""

from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from safetensors.numpy import load_file

from converter.formats.plain import write_plain
from converter.formats.registry import load
from converter.runtime import run_options
from converter.write.safetensors import write_safetensors

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
E, OUT, IN = 64, 256, 256          # gate_up_proj: float32 16 MiB, one expert 256 KiB


def hand_decode(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``[E, O, G, 16]`` + ``[E, O, G]`` -> float32 ``[E, in, out]`` (transformers' BF16 parameter order)."""
    el = np.stack([E2M1[blocks & 0x0F], E2M1[blocks >> 4]], axis=-1).reshape(*blocks.shape[:-1], 32)
    vals = el * np.ldexp(np.float32(1), scales.astype(np.int32) - 127)[..., None]
    return vals.reshape(blocks.shape[0], blocks.shape[1], -1).transpose(0, 2, 1)


@pytest.fixture
def stack(tmp_path):
    rng = np.random.default_rng(4)
    blocks = rng.integers(0, 256, (E, OUT, IN // 32, 16), dtype=np.uint8)
    scales = rng.integers(120, 131, (E, OUT, IN // 32), dtype=np.uint8)
    d = tmp_path / "src"
    d.mkdir()
    p = "model.layers.0.mlp.experts.gate_up_proj"
    write_safetensors(d / "model.safetensors", {f"{p}_blocks": blocks, f"{p}_scales": scales}, {"format": "pt"})
    (d / "config.json").write_text(json.dumps({
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": IN,
        "intermediate_size": OUT // 2, "num_local_experts": E, "num_hidden_layers": 1,
        "quantization_config": {"quant_method": "mxfp4"}}))
    return d, p, hand_decode(blocks, scales)


def _peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_expert_stack_dequantize_streams_and_is_identical(stack, tmp_path):
    src, name, want = stack
    full = want.nbytes                                  # 16 MiB of float32
    write_plain(load(src), tmp_path / "warm-up", dtype="F32")   # the format modules' imports are not data
    with run_options(workers=1, max_memory="1M"):
        peak = _peak(lambda: write_plain(load(src), tmp_path / "streamed", dtype="F32"))
    got = load_file(str(next((tmp_path / "streamed").glob("*.safetensors"))))[name]
    assert got.shape == (E, IN, OUT)
    assert got.tobytes() == want.astype(np.float32).tobytes()
    assert peak < full // 4, f"peak {peak} B for a {full} B float32 stack"
    with run_options(workers=1, max_memory="1G"):       # whole: the same bytes
        whole_peak = _peak(lambda: write_plain(load(src), tmp_path / "whole", dtype="F32"))
    whole = load_file(str(next((tmp_path / "whole").glob("*.safetensors"))))[name]
    assert whole.tobytes() == got.tobytes()
    assert whole_peak > full                            # the budget is what bounds the streamed run


def test_proof_of_a_float_export_runs_in_expert_blocks(stack, monkeypatch):
    """The read-back proof of ``--to plain`` compares a few experts at a time: same verdicts as whole, and a
    changed value is found with its hand-computed difference."""
    from converter.ops import compare
    from converter.tensor import DenseTensor
    src, name, want = stack
    t = load(src)[name]
    calls = []
    real = compare.take_rows
    monkeypatch.setattr(compare, "take_rows", lambda a, r0, r1: calls.append((r0, r1)) or real(a, r0, r1))
    monkeypatch.setattr(compare, "DENSE_BLOCK", IN * OUT * 3)       # three experts a block
    row = compare.compare_tensors(t, DenseTensor(name, want), ["expert", "in", "out"])
    assert row["bit_exact"] and row["mode"] == "dequantized" and row["max_abs_diff"] == 0.0
    assert calls[:2] == [(0, 3), (3, 6)] and calls[-1] == (63, 64)
    bad = want.copy()
    bad[40, 7, 9] += 0.25
    row = compare.compare_tensors(t, DenseTensor(name, bad), ["expert", "in", "out"])
    assert not row["bit_exact"] and row["max_abs_diff"] == 0.25


def test_exact_repack_proof_does_not_dequantize(stack, monkeypatch):
    """Identical codes, scales and parameters prove identical values: no float32 copy of the stack is made."""
    from converter.ops import compare
    from converter.tensor import QuantizedTensor
    src, name, _ = stack
    a, b = load(src)[name], load(src)[name]

    def refuse(self, *args, **kwargs):
        raise AssertionError("dequantized")
    monkeypatch.setattr(QuantizedTensor, "dequantize", refuse)
    row = compare.compare_tensors(a, b)
    assert row["mode"] == "exact" and row["bit_exact"]


def test_gguf_repack_proof_does_not_dequantize(stack, tmp_path, monkeypatch):
    """GGUF reads MXFP4 with rounding ``half_away``, gpt-oss with ``half_even``: a quantizer's rounding is not a
    parameter of the decode, so identical bytes still prove identical values without a float32 copy."""
    from converter.formats.registry import get
    from converter.ops import compare
    from converter.ops.convert import convert_exact
    from converter.tensor import QuantizedTensor
    src, name, _ = stack
    convert_exact(src, tmp_path / "o.gguf", "gguf")
    a = get("gguf").arrange(load(src))
    out = load(tmp_path / "o.gguf", format="gguf")
    pairs = [(a[n], out[n]) for n in a.quantized_names()]
    assert {x.scheme.rounding for x, _ in pairs} != {y.scheme.rounding for _, y in pairs}

    def refuse(self, *args, **kwargs):
        raise AssertionError("dequantized")
    monkeypatch.setattr(QuantizedTensor, "dequantize", refuse)
    for x, y in pairs:
        row = compare.compare_tensors(x, y)
        assert row["mode"] == "exact" and row["bit_exact"], row
