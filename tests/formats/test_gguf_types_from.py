"""``qckpt convert --to gguf --gguf-types-from FILE``: every tensor gets its namesake's ggml type in FILE.

The GGUF sources are written here by gguf-py (``GGUFWriter``, blocks by ``gguf.quants.quantize``: llama.cpp's
reference quantizers), a tiny LLaMA with GQA (4 query / 2 kv heads of 16) in the mix the real SmolLM2 file has
(token embedding Q8_0, Linear weights Q4_1, one Q8_0 Linear, F32 norms). The expected bytes are gguf-py's: a
GGUF dequantized by qckpt and converted back with its own types must give back the very bytes gguf-py wrote
(``interop/gguf_types_roundtrip.py`` does the same on the real 135M file with llama.cpp generating).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.formats.gguf.schemes import quantize_to_gguf
from converter.schemas import validate_document

Q8, Q41 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_1
#: the tiny model's mix: (GGUF name, logical shape (out, in), type); norms are F32
MIX = [("token_embd", (261, 64), Q8), ("blk.0.attn_q", (64, 64), Q41), ("blk.0.attn_k", (32, 64), Q41),
       ("blk.0.attn_v", (32, 64), Q8), ("blk.0.attn_output", (64, 64), Q41), ("blk.0.ffn_gate", (128, 64), Q41),
       ("blk.0.ffn_up", (128, 64), Q41), ("blk.0.ffn_down", (64, 128), Q8)]
NORMS = ("blk.0.attn_norm", "blk.0.ffn_norm", "output_norm")


def write_mix(path: Path, *, arch: str = "llama", ffn: int = 128, drop: str | None = None,
              extra: str | None = None, norm_type=np.float32, file_type=gguf.LlamaFileType.MOSTLY_Q8_0) -> Path:
    """A one-block LLaMA GGUF in the MIX (gguf-py). ``ffn``: feed-forward width; ``drop``: a GGUF name left out;
    ``extra``: a further Q8_0 [261, 64] tensor; ``norm_type``: the norms' dtype; ``file_type``: general.file_type
    (default MOSTLY_Q8_0, which the writer's own rule, the most weights' type Q4_1, would not give)."""
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    syms, n = [], 0
    for b in range(256):
        syms.append(chr(b) if b in keep else chr(256 + n))
        n += b not in keep
    tokens = syms + ["Ġt", "he", "the", "<s>", "</s>"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name("tiny mix")
    for key, value in (("block_count", 1), ("context_length", 256), ("embedding_length", 64),
                       ("feed_forward_length", ffn), ("attention.head_count", 4), ("attention.head_count_kv", 2),
                       ("vocab_size", len(tokens)), ("rope.dimension_count", 16)):
        w.add_uint32(f"{arch}.{key}", value)
    w.add_float32(f"{arch}.rope.freq_base", 50000.0)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([1] * 259 + [3, 3])
    w.add_token_merges(["Ġ t", "h e", "t he"])
    w.add_bos_token_id(259)
    w.add_eos_token_id(260)
    w.add_file_type(file_type)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    rng = np.random.default_rng(11)
    mix = [(g, (ffn, 64) if g in ("blk.0.ffn_gate", "blk.0.ffn_up") else (64, ffn) if g == "blk.0.ffn_down" else s, t)
           for g, s, t in MIX] + ([(extra, (261, 64), Q8)] if extra else [])
    for name, shape, qt in mix:
        if name == drop:
            continue
        values = (0.05 * rng.standard_normal(shape) + 0.01 * rng.standard_normal((shape[0], 1))).astype(np.float32)
        values[0, :32] = 0.0  # an all-zero block
        values[1, :32] = 0.03  # a constant block
        w.add_tensor(f"{name}.weight", gguf.quants.quantize(values, qt), raw_dtype=qt)
    for name in NORMS:
        w.add_tensor(f"{name}.weight", (1 + 0.1 * rng.standard_normal(64)).astype(norm_type))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tensors(path: Path) -> dict[str, tuple[str, bytes]]:
    return {t.name: (t.tensor_type.name, np.asarray(t.data).view(np.uint8).tobytes())
            for t in gguf.GGUFReader(str(path)).tensors}


def _file_type(path: Path) -> int:
    return int(gguf.GGUFReader(str(path)).fields["general.file_type"].contents())


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """(source GGUF, the Hugging Face folder ``qckpt dequantize`` makes of it)."""
    tmp = tmp_path_factory.mktemp("types_from")
    src = write_mix(tmp / "src.gguf")
    res = CliRunner().invoke(main, ["dequantize", str(src), str(tmp / "hf"), "--quiet"])
    assert res.exit_code == 0, res.output
    return src, tmp / "hf"


def _convert(hf: Path, dst: Path, *extra: str):
    return CliRunner().invoke(main, ["convert", str(hf), str(dst), "--to", "gguf", *extra, "--quiet", "--json"])


@pytest.mark.parametrize("with_metadata", [False, True])
def test_types_and_bytes_come_back(folder, tmp_path, with_metadata):
    src, hf = folder
    dst = tmp_path / "back.gguf"
    res = _convert(hf, dst, "--gguf-types-from", str(src), *(["--gguf-metadata", str(src)] if with_metadata else []))
    assert res.exit_code == 0, res.output
    mine, theirs = _tensors(dst), _tensors(src)
    assert sorted(mine) == sorted(theirs)
    assert {n: t for n, (t, _) in mine.items()} == {n: t for n, (t, _) in theirs.items()}
    # every block bit-exact: Q4_1 / Q8_0 of values that were Q4_1 / Q8_0 give back gguf-py's codes and scales
    assert [n for n in theirs if mine[n][1] != theirs[n][1]] == []
    assert _file_type(dst) == _file_type(src) == int(gguf.LlamaFileType.MOSTLY_Q8_0)  # the file's, not the rule's
    doc = json.loads(res.output)
    assert doc["target"]["types_from"] == str(src)
    validate_document(doc, "error-report")
    # the float weights the file stores quantized are reported quantized (they used to read "kept dense")
    assert doc["module_summary"] == {"quantized": 8, "dequantized": 0, "kept dense": 0}
    assert all(r["readback_bit_exact"] for r in doc["tensors"])


def test_gguf_source_with_its_own_types_is_carried(folder, tmp_path):
    # a GGUF source given its own types: every quantized tensor carried as stored (no requantization)
    src, _ = folder
    dst = tmp_path / "same.gguf"
    res = _convert(src, dst, "--gguf-types-from", str(src))
    assert res.exit_code == 0, res.output
    mine, theirs = _tensors(dst), _tensors(src)
    assert mine == theirs
    rows = json.loads(res.output)["tensors"]
    assert len(rows) == 8 and all(r["result"] == "exact" for r in rows)


def test_reasons_name_the_file_and_type(folder, tmp_path):
    src, hf = folder
    res = CliRunner().invoke(main, ["convert", str(hf), str(tmp_path / "p.gguf"), "--to", "gguf", "--gguf-types-from",
                                    str(src), "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    types = doc["gguf"]["types"]
    assert types["model.embed_tokens.weight"] == "Q8_0" and types["model.layers.0.self_attn.k_proj.weight"] == "Q4_1"
    assert types["model.layers.0.input_layernorm.weight"] == "F32" and doc["gguf"]["file_type"] == 7
    reasons = {m["tensor"]: m["reason"] for m in doc["modules"]}
    assert reasons["model.layers.0.mlp.down_proj.weight"] == "--gguf-types-from src.gguf: blk.0.ffn_down.weight -> Q8_0"


def test_reencode_of_own_blocks_edge_cases():
    # llama.cpp's reference quantizer (gguf-py) on the values of its own Q4_1 / Q8_0 blocks, and qckpt's quantizer
    # on them: the same blocks back, except where the block's fp16 scale d underflowed to 0 (a step below 2^-25,
    # half the smallest fp16 subnormal): every value of such a block decodes to its minimum m (Q4_1) or to 0
    # (Q8_0) whatever its codes, so the re-encode writes codes 0: other bytes, the same values (and the same
    # llama.cpp dot products, which multiply the codes' sum by d = 0).
    rng = np.random.default_rng(3)
    rows = {"normal": 0.1 * rng.standard_normal(64), "zeros": np.zeros(64), "constant": np.full(64, -0.7),
            "positive": np.abs(rng.standard_normal(64)), "negative": -np.abs(rng.standard_normal(64)),
            "1e-6": 1e-6 * rng.standard_normal(64), "3e-8": 3e-8 * rng.standard_normal(64),
            "60000": 60000.0 * np.tanh(rng.standard_normal(64)),
            "mixed": np.r_[np.full(32, 5.0), np.linspace(-1, 1, 32)]}
    values = np.stack(list(rows.values())).astype(np.float32)
    # by hand: Q8_0 d = amax / 127 underflows for the 1e-6 and 3e-8 rows, Q4_1 d = (max - min) / 15 for 3e-8 only
    expect_differing = {Q41: {"3e-8"}, Q8: {"1e-6", "3e-8"}}
    for qt in (Q41, Q8):
        size = gguf.GGML_QUANT_SIZES[qt][1]
        blocks = gguf.quants.quantize(values, qt)
        decoded = gguf.quants.dequantize(blocks, qt)
        again = gguf.quants.quantize(decoded, qt)
        differing = {name for i, name in enumerate(rows)
                     if not np.array_equal(blocks[i].reshape(-1, size), again[i].reshape(-1, size))}
        assert differing == expect_differing[qt], qt.name
        for i, name in enumerate(rows):
            d = blocks[i].reshape(-1, size)[:, :2].copy().view(np.float16)
            assert (name in differing) == bool((d == 0).all() and np.any(blocks[i].reshape(-1, size)[:, 4:])), name
        assert np.array_equal(gguf.quants.dequantize(again, qt), decoded)  # the same values
        mine = quantize_to_gguf(decoded, qt.name, name="w").dequantize()
        assert np.array_equal(mine.astype(np.float32), decoded), qt.name  # qckpt's quantizer: the same values


def _refused(hf: Path, other: Path, tmp_path: Path):
    res = CliRunner().invoke(main, ["convert", str(hf), str(tmp_path / "x.gguf"), "--to", "gguf",
                                    "--gguf-types-from", str(other)])
    assert res.exit_code == 3, res.output
    assert not (tmp_path / "x.gguf").exists()
    assert str(other) in res.output or other.name in res.output, res.output
    return res.output


def test_refuses_shape_mismatch(folder, tmp_path):
    _, hf = folder
    out = _refused(hf, write_mix(tmp_path / "ffn96.gguf", ffn=96), tmp_path)
    # the first tensor in the folder's order whose shape differs (ffn_down, [64, 96] in the file)
    assert "shape differs" in out and "model.layers.0.mlp.down" in out
    assert "expected [64, 96], found [64, 128]" in out


def test_refuses_tensor_missing_from_file(folder, tmp_path):
    _, hf = folder
    out = _refused(hf, write_mix(tmp_path / "nodown.gguf", drop="blk.0.ffn_down"), tmp_path)
    assert "no namesake" in out and "down_proj" in out and "blk.0.ffn_down.weight" in out


def test_refuses_tensor_only_in_file(folder, tmp_path):
    _, hf = folder
    out = _refused(hf, write_mix(tmp_path / "head.gguf", extra="output"), tmp_path)
    assert "would not have" in out and "found ['output.weight']" in out


def test_refuses_other_architecture(folder, tmp_path):
    _, hf = folder
    out = _refused(hf, write_mix(tmp_path / "qwen.gguf", arch="qwen2"), tmp_path)
    assert "architecture" in out and "qwen2" in out


def test_refuses_float_type_not_stored(folder, tmp_path):
    _, hf = folder
    out = _refused(hf, write_mix(tmp_path / "f16norm.gguf", norm_type=np.float16), tmp_path)
    assert "stores this tensor as F16" in out and "layernorm" in out and "1-D float tensors are written F32" in out


@pytest.mark.parametrize("extra, word", [(["--quant-type", "Q4_1"], "--quant-type"), (["--bits", "4"], "--bits"),
                                         (["--group-size", "32"], "--group-size")])
def test_usage_errors(folder, tmp_path, extra, word):
    src, hf = folder
    res = CliRunner().invoke(main, ["convert", str(hf), str(tmp_path / "u.gguf"), "--to", "gguf",
                                    "--gguf-types-from", str(src), *extra])
    assert res.exit_code == 2 and word in res.output, res.output
    res = CliRunner().invoke(main, ["convert", str(hf), str(tmp_path / "u"), "--to", "mlx",
                                    "--gguf-types-from", str(src)])
    assert res.exit_code == 2 and "--to gguf" in res.output, res.output


def test_api_refuses_types_from_for_another_format(folder, tmp_path):
    import converter
    from converter.errors import NotRepresentableError
    src, hf = folder
    with pytest.raises(NotRepresentableError, match="mlx writer does not take per-tensor types"):
        converter.convert(hf, tmp_path / "m", to="mlx", target={"types_from": str(src)})
    assert not (tmp_path / "m").exists()
    with pytest.raises(Exception, match="no other target option"):
        converter.convert(hf, tmp_path / "g.gguf", to="gguf", target={"types_from": str(src), "bits": 4})
