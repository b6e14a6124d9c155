"""Issue 18 item 10: convert's refusals say what the source's tensors are.

A GGUF whose weights are all IQ types was described as "no quantized tensors ... 3 dense tensors, quantize it
first" (they are quantized, in a type qckpt cannot decode); a float source given requantize options was
described as "found memory with 14 dense tensors" (the name of an internal view) with a hint to "change the
target".
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.errors import NotRepresentableError, UnsupportedError
from converter.ops.convert import refuse_float_source, refuse_undecodable
from converter.tensor import Checkpoint, DenseTensor, StoredArray, TensorSpec, spec_of

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"


def iq_only_gguf(path: Path) -> Path:
    """Two IQ4_NL weights (raw blocks: 2 rows of 2 x 18 bytes = 64 weights each) and one F32 norm."""
    w = gguf.GGUFWriter(path, "llama")
    for name in ("blk.0.ffn_down.weight", "blk.0.ffn_up.weight"):
        w.add_tensor(name, np.zeros((2, 36), np.uint8), raw_dtype=gguf.GGMLQuantizationType.IQ4_NL)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_undecodable_tensors_are_named_quantized_by_type():
    opaque = [TensorSpec(f"w{i}.weight", "opaque", (4, 256), (StoredArray(f"w{i}", "other", t, (4, 136), 544),),
                         dtype=t) for i, t in enumerate(["IQ2_XXS", "IQ2_XXS", "TQ1_0"])]
    norm = spec_of(DenseTensor("norm.weight", np.ones(256, np.float32)))
    ck = Checkpoint({s.name: s for s in [*opaque, norm]}, lambda n: None, format="gguf", path="m.gguf")
    with pytest.raises(UnsupportedError) as info:
        refuse_undecodable(ck, "gptq")
    msg = str(info.value)
    assert "3 of the source's tensors are quantized" in msg and "IQ2_XXS (2), TQ1_0 (1)" in msg
    assert info.value.tensor == "w0.weight" and info.value.found == "IQ2_XXS"
    assert "dense" not in msg and "no quantized" not in msg
    refuse_undecodable(Checkpoint({norm.name: norm}, lambda n: None, format="plain"), "gptq")  # none: no error


@pytest.mark.parametrize("options", [[], ["--bits", "4", "--group-size", "32"]], ids=["repack", "requantize"])
def test_iq_gguf_is_not_called_dense(tmp_path, options):
    src = iq_only_gguf(tmp_path / "iq.gguf")
    r = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "out"), "--to", "gptq", *options])
    # whether IQ4_NL is decodable or not, the tensors are quantized: never "no quantized tensors ... dense"
    assert "no quantized tensors" not in r.output and "float checkpoint" not in r.output, r.output
    assert "quantize it first" not in r.output
    if r.exit_code == 0:  # decoded by gguf-py (values only): requantized, each IQ4_NL tensor a row of its own
        assert "2 quantized tensors" in r.output and "lossy" in r.output
    else:
        assert "IQ4_NL" in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("options", [[], ["--bits", "4", "--group-size", "128"]], ids=["repack", "requantize"])
def test_float_source_named_by_its_format(tmp_path, options):
    r = CliRunner().invoke(main, ["convert", str(SAMPLES / "minilm_fp16.safetensors"), str(tmp_path / "out"),
                                  "--to", "gptq", *options])
    assert r.exit_code == 3, r.output
    assert "memory" not in r.output and "change the target" not in r.output
    # the sample holds 14 float16 tensors (7 weights, 7 biases), none quantized
    assert "the source is a float checkpoint (plain, 14 dense tensors)" in r.output
    assert "qckpt quantize SRC DST --to gptq" in r.output
    assert not (tmp_path / "out").exists()


def test_float_view_names_the_source_format():
    ck = Checkpoint({"a": spec_of(DenseTensor("a", np.zeros(3, np.float32)))}, lambda n: None, format="memory")
    with pytest.raises(NotRepresentableError, match=r"float checkpoint \(plain, 1 dense tensor\)"):
        refuse_float_source(ck, "mlx", source_format="plain")


def test_mxfp4_gguf_is_quantized_not_dense(tmp_path):
    """An MXFP4 GGUF (gguf-py's own quantizer) is a quantized source: refused by GPTQ for its FP4 codebook,
    never as 'no quantized tensors'."""
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    path = tmp_path / "mx.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(x, gguf.GGMLQuantizationType.MXFP4),
                 raw_dtype=gguf.GGMLQuantizationType.MXFP4)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    r = CliRunner().invoke(main, ["convert", str(path), str(tmp_path / "out"), "--to", "gptq"])
    assert r.exit_code == 3, r.output
    assert not any(w in r.output for w in ("no quantized tensors", "dense tensors", "float checkpoint"))
    assert "model.layers.0.mlp.up_proj.weight" in r.output and "FP4" in r.output
