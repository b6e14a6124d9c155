"""``qckpt convert --to gguf --quant-type`` against llama-quantize's own files, tensor by tensor.

``minilm_llamacpp_Q4_K_M.gguf`` / ``minilm_llamacpp_Q6_K.gguf`` were written by llama.cpp's
llama-quantize (commit 0c1e57098bba, llama-cpp-python 0.3.36) from ``minilm_gguf_F16.gguf``
(sample_checkpoints/MANIFEST.json): qckpt's output from the same F16 file must choose the same ggml
type for every tensor and hold the same bytes, and record the same ``general.file_type``.
"""

import hashlib
import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.formats.registry import load

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints" / "gguf"


def _tensors(path):
    r = gguf.GGUFReader(str(path))
    return ({t.name: (t.tensor_type.name, np.asarray(t.data).view(np.uint8).tobytes()) for t in r.tensors},
            int(r.fields["general.file_type"].parts[-1][0]))


@pytest.mark.parametrize("file_type", ["Q4_K_M", "Q6_K"])
def test_minilm_matches_llama_quantize(tmp_path, file_type):
    dst = tmp_path / f"out_{file_type}.gguf"
    res = CliRunner().invoke(main, ["convert", str(SAMPLES / "minilm_gguf_F16.gguf"), str(dst), "--to", "gguf",
                                    "--quant-type", file_type, "--json"])
    assert res.exit_code == 0, res.output
    mine, ft_mine = _tensors(dst)
    theirs, ft_theirs = _tensors(SAMPLES / f"minilm_llamacpp_{file_type}.gguf")
    assert ft_mine == ft_theirs == {"Q4_K_M": 15, "Q6_K": 18}[file_type]
    assert sorted(mine) == sorted(theirs)
    for name, (t, data) in theirs.items():
        assert mine[name][0] == t, name
        assert mine[name][1] == data, f"{name} ({t}): bytes differ"
    doc = json.loads(res.output)
    assert doc["target"]["quant_type"] == file_type
    rows = {r["name"]: r for r in doc["tensors"]}
    assert len(rows) == 7 and all(r["readback_bit_exact"] for r in rows.values())
    down = rows["encoder.layer.0.output.dense.weight"]
    assert down["source"]["scheme"] == "F16 float" and "q6_k_ref" in down["target"]["quantizer"]
    # the proof decodes the written K-quant blocks with qckpt's decoders
    back = load(dst)["encoder.layer.0.output.dense.weight"]
    assert back.double_quant is not None and back.double_quant.kind == "Q6_K"


def test_kquant_gguf_source_same_type_is_copied(tmp_path):
    # llama-quantize copies a tensor already of the target type: Q6_K file -> Q6_K is exact
    dst = tmp_path / "again.gguf"
    res = CliRunner().invoke(main, ["convert", str(SAMPLES / "minilm_llamacpp_Q6_K.gguf"), str(dst), "--to", "gguf",
                                    "--quant-type", "Q6_K", "--json"])
    assert res.exit_code == 0, res.output
    mine, _ = _tensors(dst)
    theirs, _ = _tensors(SAMPLES / "minilm_llamacpp_Q6_K.gguf")
    assert {n: v[0] for n, v in mine.items()} == {n: v[0] for n, v in theirs.items()}
    assert all(mine[n][1] == theirs[n][1] for n in theirs)
    rows = {r["name"]: r for r in json.loads(res.output)["tensors"]}
    assert rows["encoder.layer.0.output.dense.weight"]["route"] == "carried"
    assert all(r["result"] == "exact" for r in rows.values())


def test_quantized_source_to_kquant_mix(tmp_path):
    # a Q8_0 source: the 1536-wide ffn_down is requantized to Q6_K from its dequantized values
    dst = tmp_path / "q8_to_q4km.gguf"
    res = CliRunner().invoke(main, ["convert", str(SAMPLES / "minilm_gguf_Q8_0.gguf"), str(dst), "--to", "gguf",
                                    "--quant-type", "Q4_K_M", "--json"])
    assert res.exit_code == 0, res.output
    mine, ft = _tensors(dst)
    assert ft == 15 and mine["blk.0.ffn_down.weight"][0] == "Q6_K" and mine["blk.0.attn_q.weight"][0] == "Q5_0"
    # llama.cpp's own bytes: dequantize_row_q8_0 then quantize_row_q6_K_ref (kquant_expected/make_q8_to_q6k.py)
    ref = json.loads((SAMPLES / "kquant_expected" / "q8_to_q6k.json").read_text())
    got = mine["blk.0.ffn_down.weight"][1]
    assert len(got) == ref["bytes"] and hashlib.sha256(got).hexdigest() == ref["sha256"]
    rows = {r["name"]: r for r in json.loads(res.output)["tensors"]}
    assert rows["encoder.layer.0.output.dense.weight"]["planned"] == "lossy"
    assert all(r["readback_bit_exact"] for r in rows.values())


def test_unknown_quant_type_is_refused(tmp_path):
    res = CliRunner().invoke(main, ["convert", str(SAMPLES / "minilm_gguf_F16.gguf"), str(tmp_path / "x.gguf"),
                                    "--to", "gguf", "--quant-type", "Q4_K_X"])
    assert res.exit_code != 0 and "Q4_K_X" in res.output and "Q4_K_M" in res.output
    assert not (tmp_path / "x.gguf").exists()


@pytest.mark.parametrize("ggml_type", ["Q4_K", "Q8_0"])
def test_single_type_on_a_float_source_matches_llama_quantize_pure(tmp_path, ggml_type):
    """``--quant-type Q4_K`` (one ggml type) on the F16 MiniLM: the types and bytes llama_model_quantize
    writes with pure=True (kquant_expected/make_pure.py): 384-wide rows fall back to Q5_0, the
    1536-wide ffn_down is Q4_K; biases stay F32."""
    ref = json.loads((SAMPLES / "kquant_expected" / "pure.json").read_text())["types"][ggml_type]
    dst = tmp_path / f"pure_{ggml_type}.gguf"
    res = CliRunner().invoke(main, ["convert", str(SAMPLES / "minilm_gguf_F16.gguf"), str(dst), "--to", "gguf",
                                    "--quant-type", ggml_type, "--json"])
    assert res.exit_code == 0, res.output
    mine, _ = _tensors(dst)
    assert sorted(mine) == sorted(ref)
    for name, want in ref.items():
        assert mine[name][0] == want["type"], name
        assert hashlib.sha256(mine[name][1]).hexdigest() == want["sha256"], f"{name} ({want['type']}): bytes differ"
    if ggml_type == "Q4_K":
        assert ref["blk.0.ffn_down.weight"]["type"] == "Q4_K" and ref["blk.0.attn_q.weight"]["type"] == "Q5_0"
