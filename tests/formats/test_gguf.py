"""Tests for the GGUF reader/writer (converter.formats.gguf.format) against real gguf-py / llama.cpp files."""

from __future__ import annotations

import json
import struct
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import gguf  # noqa: E402  (a declared runtime dependency)
from safetensors.numpy import load_file  # noqa: E402

from converter.errors import (ConverterError, CorruptFileError, FormatError, MalformedInputError,  # noqa: E402
                              NotRepresentableError, OutputExistsError, UnsupportedError)
from converter.formats.gguf.format import check_target, quantize_to_gguf, write_gguf  # noqa: E402
from converter.formats.gguf.names import gguf_to_hf, hf_to_gguf, llama_row_permutation  # noqa: E402
from converter.formats.registry import detect, get, load  # noqa: E402
from converter.formats.source import Source  # noqa: E402
from converter.groups import GroupMap  # noqa: E402
from converter.scheme import QuantScheme, ZeroPoint  # noqa: E402
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, spec_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_checkpoints" / "gguf"
LEGACY_FILES = ["minilm_gguf_Q4_0.gguf", "minilm_gguf_Q4_1.gguf", "minilm_gguf_Q5_0.gguf", "minilm_gguf_Q8_0.gguf"]
ALL_FILES = LEGACY_FILES + ["minilm_llamacpp_Q4_K_M.gguf", "minilm_llamacpp_Q6_K.gguf"]


def _manifest_names(fname: str) -> dict[str, str]:
    m = json.loads((ROOT / "sample_checkpoints" / "MANIFEST.json").read_text())
    entry = next(f for f in m["files"] if f["file"] == fname)
    return {g: t["hf_name"] for g, t in entry["tensors"].items()}


def _reader_tensor(path: Path, gname: str):
    return next(t for t in gguf.GGUFReader(path).tensors if t.name == gname)


# ------------------------------------------------------------------------------------------------
# Real files: decode vs the tools' decodes
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fname", ALL_FILES)
def test_real_file_matches_reference_and_gguf_py(fname):
    path = SAMPLES / fname
    ck = load(path)
    assert ck.format == "gguf"
    ref = load_file(str(path) + ".reference_dequant.safetensors")
    reader = gguf.GGUFReader(path)
    by_name = {t.name: t for t in reader.tensors}
    for name, t in ck.items():
        ours = t.dequantize()
        rt = by_name[ck.metadata["gguf_names"][name]]
        theirs = gguf.quants.dequantize(rt.data, rt.tensor_type)
        assert ours.dtype == np.float32
        assert np.array_equal(ours.view(np.uint32), theirs.astype(np.float32).view(np.uint32)), name
        if name in ref:
            assert np.array_equal(ours.view(np.uint32), ref[name].view(np.uint32)), name
            assert np.array_equal(ours.astype(np.float16), ref[name].astype(np.float16)), name
    assert set(ref) <= set(ck.names())


@pytest.mark.parametrize("fname", ALL_FILES)
def test_names_follow_manifest(fname):
    ck = load(SAMPLES / fname)
    expected = _manifest_names(fname)
    assert {g: h for h, g in ck.metadata["gguf_names"].items()} == expected
    assert ck.metadata["architecture"] == "bert"
    assert ck.metadata["gguf_kv"]["bert.embedding_length"] == 384


def test_non_square_orientation():
    path = SAMPLES / "minilm_gguf_Q4_0.gguf"
    rt = _reader_tensor(path, "blk.0.ffn_down.weight")
    assert [int(x) for x in rt.shape] == [1536, 384]  # raw ne, ne[0] = in
    ck = load(path)
    name = "encoder.layer.0.output.dense.weight"
    spec = ck.spec(name)
    assert spec.shape == (384, 1536) and spec.axes == ("out", "in")
    t = ck[name]
    assert t.codes.shape == (384, 1536) and t.scales.shape == (384, 48) and t.scales.dtype == np.float16
    assert t.scheme == QuantScheme(4, False, ZeroPoint.NONE, "F16", "half_away")
    up = ck["encoder.layer.0.intermediate.dense.weight"]
    assert up.shape == (1536, 384) and up.scales.shape == (1536, 12)
    bias = ck["encoder.layer.0.output.dense.bias"]
    assert isinstance(bias, DenseTensor) and bias.shape == (384,) and bias.data.dtype == np.float32


def test_kquant_q6k_double_quant():
    path = SAMPLES / "minilm_llamacpp_Q6_K.gguf"
    ck = load(path)
    name = "encoder.layer.0.output.dense.weight"
    t = ck[name]
    assert ck.metadata["ggml_types"][name] == "Q6_K"
    assert t.scheme == QuantScheme(6, False, ZeroPoint.NONE, "F32", "half_away") and t.scheme.center == 32
    assert t.group_map.group_size == 16 and t.scales.shape == (384, 96) and t.scales.dtype == np.float32
    dq = t.double_quant
    assert dq is not None and dq.kind == "Q6_K" and dq.super_block == 256
    assert dq.super_scales.shape == (384, 6) and dq.super_scales.dtype == np.float16
    assert dq.sub_scales.shape == (384, 96) and dq.sub_scales.dtype == np.int8
    assert dq.super_mins is None and dq.sub_mins is None
    eff = np.repeat(dq.super_scales.astype(np.float32), 16, axis=1) * dq.sub_scales.astype(np.float32)
    assert np.array_equal(eff, t.scales)
    rt = _reader_tensor(path, "blk.0.ffn_down.weight")
    assert np.array_equal(t.dequantize(), gguf.quants.dequantize(rt.data, rt.tensor_type))
    # a K-quant is written as itself from its super-block fields: an exact repack, same bytes
    assert check_target(ck.spec(name)) is None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "repack.gguf"
        write_gguf(ck, out)
        back = _reader_tensor(out, "blk.0.ffn_down.weight")
        assert back.tensor_type == rt.tensor_type
        assert np.array_equal(np.asarray(back.data).view(np.uint8), np.asarray(rt.data).view(np.uint8))


def _raw_kquant_file(tmp_path, type_name, rows=4, row_len=512, seed=0):
    """A GGUF file holding one tensor of random (finite) K-quant blocks, written with gguf-py."""
    qt = gguf.GGMLQuantizationType[type_name]
    bs, ts = gguf.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, row_len // bs, ts), dtype=np.uint8)
    offs = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}[type_name]
    for o in offs:  # finite fp16 super-block scales
        raw[..., o:o + 2] = rng.uniform(-0.1, 0.1, size=raw.shape[:2]).astype("<f2").view(np.uint8).reshape(
            *raw.shape[:2], 2)
    raw = raw.reshape(rows, -1)
    w = gguf.GGUFWriter(tmp_path / f"{type_name}.gguf", "unknownarch")
    w.add_tensor("w.weight", raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tmp_path / f"{type_name}.gguf", raw


@pytest.mark.parametrize("type_name", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_every_kquant_bit_exact_with_gguf_py(tmp_path, type_name):
    path, raw = _raw_kquant_file(tmp_path, type_name)
    ck = load(path)
    assert ck.names() == ["w.weight"]  # unknown architecture: GGUF names kept
    t = ck["w.weight"]
    assert t.shape == (4, 512)
    assert np.array_equal(t.dequantize().view(np.uint32),
                          gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).view(np.uint32))
    has_mins = type_name in ("Q2_K", "Q4_K", "Q5_K")
    assert (t.scheme.zero_point is ZeroPoint.FLOAT) == has_mins
    if has_mins:
        dq = t.double_quant
        per = 256 // t.group_map.group_size
        expect = -(np.repeat(dq.super_mins.astype(np.float32), per, axis=1) * dq.sub_mins.astype(np.float32))
        assert np.array_equal(t.zero_points, expect)


# ------------------------------------------------------------------------------------------------
# Round trips and the writer
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fname", LEGACY_FILES)
def test_gguf_to_gguf_is_byte_identical(tmp_path, fname):
    src = SAMPLES / fname
    ck = load(src)
    out = tmp_path / fname
    summary = get("gguf").write(ck, out)
    assert summary["tensors"] == 14
    assert out.read_bytes() == src.read_bytes()  # header, key/values, tensor data: identical
    back = load(out)
    for name in ck.quantized_names():
        a, b = ck[name], back[name]
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales.view(np.uint16), b.scales.view(np.uint16))
        if a.zero_points is not None:
            assert np.array_equal(a.zero_points.view(np.uint16), b.zero_points.view(np.uint16))


def test_mixed_kquant_file_legacy_tensors_repack(tmp_path):
    """A llama-quantize Q4_K_M file: its Q5_0/Q8_0 tensors write back byte-identical; Q6_K is refused."""
    src = SAMPLES / "minilm_llamacpp_Q4_K_M.gguf"
    ck = load(src)
    keep = [n for n in ck.names() if ck.metadata["ggml_types"][n] != "Q6_K"]
    sub = Checkpoint({n: ck.spec(n) for n in keep}, ck.__getitem__, format="gguf", metadata=ck.metadata)
    out = tmp_path / "mixed.gguf"
    write_gguf(sub, out)
    orig = {t.name: t for t in gguf.GGUFReader(src).tensors}
    for t in gguf.GGUFReader(out).tensors:
        assert t.tensor_type == orig[t.name].tensor_type
        assert np.asarray(t.data).tobytes() == np.asarray(orig[t.name].data).tobytes()


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_quantize_to_gguf_and_writer_output(tmp_path, type_name):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((48, 96)).astype(np.float32)
    t = quantize_to_gguf(w, type_name, name="model.layers.0.mlp.down_proj.weight")
    qt = gguf.GGMLQuantizationType[type_name]
    assert np.array_equal(t.dequantize(), gguf.quants.dequantize(gguf.quants.quantize(w, qt), qt))
    bias = DenseTensor("model.layers.0.mlp.down_proj.bias", rng.standard_normal(48).astype(np.float16))
    ck = Checkpoint.from_tensors([t, bias], config={"model_type": "qwen2"})
    out = tmp_path / "out.gguf"
    summary = write_gguf(ck, out)
    assert summary["architecture"] == "qwen2" and summary["types"][t.name] == type_name
    r = gguf.GGUFReader(out)
    assert r.fields["general.architecture"].contents() == "qwen2"
    assert r.fields["general.quantization_version"].contents() == 2
    assert r.fields["general.file_type"].contents() == int(gguf.LlamaFileType[f"MOSTLY_{type_name}"])
    rt = {x.name: x for x in r.tensors}
    assert set(rt) == {"blk.0.ffn_down.weight", "blk.0.ffn_down.bias"}
    wt = rt["blk.0.ffn_down.weight"]
    assert [int(x) for x in wt.shape] == [96, 48] and wt.tensor_type == qt
    assert np.asarray(wt.data).tobytes() == gguf.quants.quantize(w, qt).tobytes()
    assert np.array_equal(gguf.quants.dequantize(wt.data, qt), t.dequantize())
    assert np.array_equal(rt["blk.0.ffn_down.bias"].data, bias.data)
    back = load(out)
    assert back.names() == [t.name, bias.name]


def test_hand_computed_q4_0_block(tmp_path):
    """FORMATS.md 5.3: Q4_0 of [-16 .. 15] gives d = 2.0 and byte 0 = (lo 0, hi 8)."""
    x = np.arange(-16, 16, dtype=np.float32)[None, :]
    t = quantize_to_gguf(x, "Q4_0")
    assert t.scales.tolist() == [[2.0]]  # d = mx / -8 with mx = -16
    assert t.codes[0, 0] == 0 and t.codes[0, 16] == 8 and t.codes[0, 31] == 15
    # q = trunc(x/d + 8.5): -16 -> 0, -15 -> 1, -14 -> trunc(1.5) = 1 (llama.cpp's +8.5 then truncate)
    assert t.codes[0, :3].tolist() == [0, 1, 1]
    assert t.dequantize()[0, :3].tolist() == [-16.0, -14.0, -14.0]
    out = tmp_path / "h.gguf"
    write_gguf(Checkpoint.from_tensors([t]), out, arch="llama")
    data = np.asarray(gguf.GGUFReader(out).tensors[0].data).tobytes()
    assert data[:2] == np.float16(2.0).tobytes() and data[2] == 0x80


def _ct_like_signed_int4(rng, out=8, inn=64, scale_dtype=np.float16):
    codes = rng.integers(-8, 8, size=(out, inn)).astype(np.int8)
    scales = (rng.uniform(0.01, 0.1, size=(out, inn // 32))).astype(scale_dtype)
    return QuantizedTensor("model.layers.0.self_attn.o_proj.weight", ("out", "in"), codes, scales,
                           QuantScheme(4, True, ZeroPoint.NONE, {np.float16: "F16", np.float32: "F32"}.get(
                               scale_dtype, "BF16")), GroupMap.per_group(32, "in"))


def test_signed_int4_group32_to_q4_0(tmp_path):
    t = _ct_like_signed_int4(np.random.default_rng(2))
    ck = Checkpoint.from_tensors([t], config={"model_type": "llama", "num_attention_heads": 2})
    assert check_target(ck.spec(t.name)) is None
    out = tmp_path / "ct.gguf"
    assert write_gguf(ck, out, gguf_type="Q4_0")["types"][t.name] == "Q4_0"
    back = load(out)[t.name]
    assert back.scheme.center == 8 and not back.scheme.signed
    assert np.array_equal(back.codes.astype(np.int16) - 8, t.codes.astype(np.int16))
    assert np.array_equal(back.scales.view(np.uint16), t.scales.view(np.uint16))
    assert np.array_equal(back.dequantize(), t.dequantize())


def test_bf16_scales_exact_cast_and_f32_inexact_refused(tmp_path):
    rng = np.random.default_rng(3)
    t = _ct_like_signed_int4(rng)
    bf = t.replace(scales=t.scales.astype(np.float32).astype(ml_dtypes.bfloat16),
                   scheme=t.scheme.replace(scale_dtype="BF16"))
    out = tmp_path / "bf.gguf"
    write_gguf(Checkpoint.from_tensors([bf]), out, arch="llama")
    back = load(out)[bf.name]
    assert np.array_equal(back.scales.astype(np.float32), bf.scales.astype(np.float32))
    bad = t.replace(scales=np.full(t.scales.shape, 0.1, np.float32), scheme=t.scheme.replace(scale_dtype="F32"))
    dst = tmp_path / "bad.gguf"
    with pytest.raises(NotRepresentableError, match="fp16") as ei:
        write_gguf(Checkpoint.from_tensors([bad]), dst, arch="llama")
    assert ei.value.tensor == bad.name and ei.value.field == "scales"
    assert not dst.exists() and not [p for p in tmp_path.iterdir() if "qckpt-tmp" in p.name]


def test_check_target_reasons():
    rng = np.random.default_rng(4)
    base = _ct_like_signed_int4(rng, inn=128)
    g128 = base.replace(scales=base.scales[:, :1], group_map=GroupMap.per_group(128, "in"))
    # groups of 32k along in, per channel, per tensor: each 32-block repeats its scale (exact)
    assert check_target(spec_of(g128)) is None
    assert check_target(spec_of(base.replace(scales=base.scales[:, :1], group_map=GroupMap.per_channel()))) is None
    g16 = QuantizedTensor("w", ("out", "in"), base.codes, np.repeat(base.scales, 2, axis=1), base.scheme,
                          GroupMap.per_group(16, "in"))
    assert "32 consecutive" in check_target(spec_of(g16))
    g48 = QuantizedTensor("w", ("out", "in"), base.codes[:, :96], np.ones((base.shape[0], 2), np.float16),
                          base.scheme, GroupMap.per_group(48, "in"))
    assert "32 consecutive" in check_target(spec_of(g48))
    gidx = base.replace(group_map=GroupMap.per_group(32, "in", g_idx=np.arange(128, dtype=np.int32)[::-1] // 32))
    assert "act-order" in check_target(spec_of(gidx))
    asym = QuantizedTensor("w", ("out", "in"), (base.codes.astype(np.int16) + 8).astype(np.uint8), base.scales,
                           QuantScheme(4, False, ZeroPoint.INTEGER), GroupMap.per_group(32, "in"),
                           zero_points=np.full(base.scales.shape, 8, np.uint8))
    assert "integer zero points" in check_target(spec_of(asym))
    three = QuantizedTensor("w", ("out", "in"), np.zeros((2, 32), np.uint8), np.ones((2, 1), np.float16),
                            QuantScheme(3, False), GroupMap.per_group(32, "in"))
    assert "3-bit" in check_target(spec_of(three))
    nf4 = QuantizedTensor("w", ("out", "in"), np.zeros((2, 32), np.uint8), np.ones((2, 1), np.float16),
                          QuantScheme(4, False, codebook=tuple(np.linspace(-1, 1, 16))), GroupMap.per_group(32, "in"))
    assert "codebook" in check_target(spec_of(nf4))
    assert check_target(spec_of(DenseTensor("b", np.zeros(3, np.float32)))) is None
    assert check_target(spec_of(base)) is None
    with pytest.raises(NotRepresentableError, match="Q8_0"):
        write_gguf(Checkpoint.from_tensors([base]), Path("/nonexistent/x.gguf"), arch="llama", gguf_type="Q8_0")


def test_group128_written_as_q4_0_blocks(tmp_path):
    """Groups of 128 (GPTQ/CT) -> Q4_0: the block scale d repeats 4 times per group; values identical."""
    rng = np.random.default_rng(6)
    base = _ct_like_signed_int4(rng, inn=256)
    g = base.replace(scales=base.scales[:, ::4].copy(), group_map=GroupMap.per_group(128, "in"))
    out = tmp_path / "g.gguf"
    write_gguf(Checkpoint.from_tensors([g]), out, arch="llama")
    back = load(out)[g.name]
    assert back.group_map.group_size == 32 and np.array_equal(back.dequantize(), g.dequantize())
    assert np.array_equal(back.scales, np.repeat(g.scales, 4, axis=1))


def test_expert_stacked_tensor_round_trip(tmp_path):
    rng = np.random.default_rng(5)
    w = rng.standard_normal((3, 4, 64)).astype(np.float32)
    t = quantize_to_gguf(w, "Q8_0", name="blk.0.ffn_up_exps.weight")
    assert t.axes == ("expert", "out", "in") and t.scales.shape == (3, 4, 2)
    out = tmp_path / "moe.gguf"
    write_gguf(Checkpoint.from_tensors([t]), out, arch="llama")
    rt = gguf.GGUFReader(out).tensors[0]
    assert [int(x) for x in rt.shape] == [64, 4, 3]
    back = load(out)["blk.0.ffn_up_exps.weight"]
    assert np.array_equal(back.codes, t.codes) and np.array_equal(back.dequantize(), t.dequantize())


def test_output_exists(tmp_path):
    out = tmp_path / "o.gguf"
    out.write_bytes(b"x")
    ck = load(SAMPLES / "minilm_gguf_Q8_0.gguf")
    with pytest.raises(OutputExistsError):
        write_gguf(ck, out)
    write_gguf(ck, out, overwrite=True)
    assert out.read_bytes() == (SAMPLES / "minilm_gguf_Q8_0.gguf").read_bytes()


# ------------------------------------------------------------------------------------------------
# Names, LLaMA permutation, key/values
# ------------------------------------------------------------------------------------------------

def test_name_tables():
    assert gguf_to_hf("blk.3.attn_q.weight", "llama") == "model.layers.3.self_attn.q_proj.weight"
    assert gguf_to_hf("blk.3.ffn_down.weight", "llama") == "model.layers.3.mlp.down_proj.weight"
    assert gguf_to_hf("output.weight", "llama") == "lm_head.weight"
    assert gguf_to_hf("output_norm.weight", "llama") == "model.norm.weight"
    assert gguf_to_hf("blk.0.attn_output_norm.bias", "bert") == "encoder.layer.0.attention.output.LayerNorm.bias"
    assert gguf_to_hf("blk.0.attn_q.weight", "mamba") == "blk.0.attn_q.weight"
    for arch in ("llama", "bert"):
        for g in ("blk.11.attn_k.bias", "blk.2.ffn_up.weight", "token_embd.weight"):
            assert hf_to_gguf(gguf_to_hf(g, arch), arch) == g


def test_llama_permutation_hand_computed():
    # LlamaModel.permute: rows reshaped (n_head, 2, head_dim/2), inner axes swapped.
    assert llama_row_permutation(8, 2).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]
    assert llama_row_permutation(8, 1).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    with pytest.raises(FormatError):
        llama_row_permutation(6, 2)


def _permute_like_llamacpp(w, n_head):
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_llama_qk_permuted_on_write_and_undone_on_read(tmp_path):
    rng = np.random.default_rng(6)
    q = rng.standard_normal((16, 32)).astype(np.float32)  # 4 heads x head_dim 4
    k = rng.standard_normal((8, 32)).astype(np.float32)  # 2 kv heads
    qt = quantize_to_gguf(q, "Q8_0", name="model.layers.0.self_attn.q_proj.weight")
    kd = DenseTensor("model.layers.0.self_attn.k_proj.weight", k)
    v = DenseTensor("model.layers.0.self_attn.v_proj.weight", k.copy())
    cfg = {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32}
    out = tmp_path / "llama.gguf"
    write_gguf(Checkpoint.from_tensors([qt, kd, v], config=cfg), out)
    r = gguf.GGUFReader(out)
    rt = {t.name: t for t in r.tensors}
    assert r.fields["llama.attention.head_count"].contents() == 4
    assert np.array_equal(np.asarray(rt["blk.0.attn_k.weight"].data), _permute_like_llamacpp(k, 2))
    assert np.array_equal(np.asarray(rt["blk.0.attn_v.weight"].data), k)
    q_file = gguf.quants.dequantize(rt["blk.0.attn_q.weight"].data, gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(q_file, _permute_like_llamacpp(qt.dequantize(), 4))
    back = load(out)
    assert np.array_equal(back["model.layers.0.self_attn.k_proj.weight"].data, k)
    bq = back["model.layers.0.self_attn.q_proj.weight"]
    assert np.array_equal(bq.codes, qt.codes) and np.array_equal(bq.scales, qt.scales)
    # GGUF -> GGUF keeps the file byte-identical (permutation undone then re-applied)
    out2 = tmp_path / "llama2.gguf"
    write_gguf(back, out2)
    assert out2.read_bytes() == out.read_bytes()


def test_llama_qk_without_head_count_is_refused(tmp_path):
    kd = DenseTensor("model.layers.0.self_attn.k_proj.weight", np.zeros((8, 32), np.float32))
    with pytest.raises(FormatError, match="head count"):
        write_gguf(Checkpoint.from_tensors([kd], config={"model_type": "llama"}), tmp_path / "x.gguf")


def test_key_values_kept_with_types(tmp_path):
    path = tmp_path / "kv.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.block_count", 1)
    w.add_token_list(["<s>", "</s>", "héllo"])
    w.add_token_types([1, 3, 1])
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_int64("custom.big", -5)
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.add_tensor("token_embd.weight", np.arange(96, dtype=np.float16).reshape(3, 32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ck = load(path)
    kv, types = ck.metadata["gguf_kv"], ck.metadata["gguf_kv_types"]
    assert kv["tokenizer.ggml.tokens"] == ["<s>", "</s>", "héllo"]
    assert types["tokenizer.ggml.tokens"] == ["ARRAY", "STRING"] and types["custom.big"] == "INT64"
    json.dumps(kv)
    assert ck.names() == ["model.norm.weight", "model.embed_tokens.weight"]
    assert ck["model.embed_tokens.weight"].data.dtype == np.float16
    out = tmp_path / "kv2.gguf"
    write_gguf(ck, out)
    back = load(out)
    kv2, types2 = back.metadata["gguf_kv"], back.metadata["gguf_kv_types"]
    for key in kv:  # every source key kept with its value and type; the managed keys are added
        assert kv2[key] == kv[key] and types2[key] == types[key], key
    # file type from the 2-D tensors (token_embd is F16): MOSTLY_F16 = 1
    assert kv2["general.quantization_version"] == 2 and kv2["general.file_type"] == 1
    a = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(path).tensors}
    b = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(out).tensors}
    assert a == b


# ------------------------------------------------------------------------------------------------
# Detection, unsupported types, corrupt files
# ------------------------------------------------------------------------------------------------

def test_detection():
    src = Source(SAMPLES / "minilm_gguf_Q4_0.gguf")
    assert src.kind == "gguf"
    d = detect(src)
    assert d.format == "gguf" and d.confidence == 100


def _opaque_file(tmp_path):
    """Q8_1 and Q8_K tensors (ggml types gguf-py 0.19 lists but does not decode either: llama.cpp's dot-product
    intermediates; IQ* / TQ* decode through gguf-py now, tests/formats/test_gguf_fallback.py) beside a Q8_0
    weight and a norm. Raw bytes: nothing reads their values."""
    path = tmp_path / "iq.gguf"
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((4, 292), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_K)
    w.add_tensor("blk.0.ffn_down.weight", np.zeros((2, 80), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    w.add_tensor("blk.0.ffn_gate.weight", gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("output_norm.weight", np.ones(256, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


UP, DOWN, GATE = (f"model.layers.0.mlp.{m}_proj.weight" for m in ("up", "down", "gate"))


def test_unsupported_type_listed_as_opaque_and_refused_on_load(tmp_path):
    ck = load(_opaque_file(tmp_path))
    spec = ck.spec(DOWN)
    assert (spec.kind, spec.shape, spec.dtype, spec.scheme, spec.axes) == ("opaque", (2, 64), "Q8_1", None, None)
    assert [(a.role, a.dtype, a.nbytes) for a in spec.stored] == [("other", "Q8_1", 160)]
    assert (ck.spec(UP).kind, ck.spec(UP).dtype, ck.spec(UP).stored[0].nbytes) == ("opaque", "Q8_K", 4 * 292)
    assert ck.quantized_names() == [GATE]
    assert "Q8_1" in check_target(spec) and "cannot decode" in check_target(spec)
    with pytest.raises(UnsupportedError, match="Q8_1") as ei:
        ck[DOWN]
    assert DOWN in str(ei.value) and "iq.gguf" in str(ei.value)
    with pytest.raises(UnsupportedError, match="Q8_K"):  # iterating refuses it too: dequantize is impossible
        for _, t in ck.items():
            t.dequantize()
    assert ck[GATE].scheme.bits == 8  # the decodable tensors still load


def test_every_writer_refuses_opaque_tensors_naming_the_ggml_type(tmp_path):
    from converter.formats.registry import formats
    ck = load(_opaque_file(tmp_path))
    for name, h in formats().items():
        if h.write is None:
            continue
        reason = h.check_target(ck.spec(DOWN))
        assert reason and "Q8_1" in reason, name
        assert h.check_target(ck.spec("model.norm.weight")) is None, name
        with pytest.raises(UnsupportedError, match="Q8_K|Q8_1") as ei:
            h.write(ck, tmp_path / f"out-{name}")
        assert not isinstance(ei.value, NotRepresentableError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iq.gguf"]  # nothing written


def test_opaque_tensors_in_inspect_audit_convert_cli(tmp_path):
    from click.testing import CliRunner
    from converter.cli import main
    from converter.schemas import validate_document
    path = _opaque_file(tmp_path)
    run = lambda *a: CliRunner().invoke(main, [str(x) for x in a])  # noqa: E731
    r = run("inspect", path, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "inspect")
    rows = {t["name"]: t for t in doc["tensors"]}
    assert rows[DOWN]["kind"] == "opaque" and rows[DOWN]["dtype"] == "Q8_1"
    assert rows[DOWN]["stored"][0]["role"] == "other" and doc["n_quantized"] == 1
    assert run("inspect", path).exit_code == 0
    r = run("audit", path, "--json", "--what-if")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "audit")
    rows = {t["name"]: t for t in doc["tensors"]}
    assert rows[UP]["bytes"]["other"] == 1168 and rows[DOWN]["bytes"]["other"] == 160 and "bits" not in rows[UP]
    assert doc["totals"]["bytes_by_role"]["other"] == 1328 and doc["totals"]["quantized_weights"] == 4 * 256
    assert run("audit", path).exit_code == 0
    for args in (("--to", "native"), ("--to", "gguf"), ("--to", "plain"), ("--bits", "4", "--group-size", "32")):
        r = run("convert", path, tmp_path / "out", *args)
        assert r.exit_code == 3, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("qckpt: error:") and "Q8_K" in lines[0], r.output
    r = run("validate", path, "--json")
    assert r.exit_code == 0, r.output
    found = {(f["code"], f["tensor"]) for f in json.loads(r.output)["findings"]}
    assert found == {("opaque", UP), ("opaque", DOWN)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iq.gguf"]


def _corrupt_variants():
    src = (SAMPLES / "minilm_llamacpp_Q4_K_M.gguf").read_bytes()
    out = {f"truncated_{n}": src[:n] for n in (0, 3, 7, 20, 300, 1400, 5000, len(src) - 1)}
    out["bad_magic"] = b"GGUX" + src[4:]
    for tc in (0, 13, 15, 2 ** 63):
        out[f"tensor_count_{tc}"] = src[:8] + struct.pack("<Q", tc) + src[16:]
    for kc in (11, 13, 2 ** 40):
        out[f"kv_count_{kc}"] = src[:16] + struct.pack("<Q", kc) + src[24:]
    out["bad_version"] = src[:4] + struct.pack("<I", 7) + src[8:]
    return out


@pytest.mark.parametrize("case", sorted(_corrupt_variants()))
def test_corrupt_files_raise_corrupt_file_error(tmp_path, case):
    path = tmp_path / "bad.gguf"
    path.write_bytes(_corrupt_variants()[case])
    with pytest.raises(CorruptFileError) as ei:
        ck = load(path)
        for _ in ck.items():
            pass
    assert "bad.gguf" in str(ei.value)


def test_random_header_damage_only_typed_errors(tmp_path):
    src = (SAMPLES / "minilm_llamacpp_Q6_K.gguf").read_bytes()
    rng = np.random.default_rng(7)
    path = tmp_path / "fuzz.gguf"
    for _ in range(60):
        b = bytearray(src)
        for _ in range(int(rng.integers(1, 4))):
            pos = int(rng.integers(0, 1504))
            b[pos] = int(rng.integers(0, 256))
        path.write_bytes(bytes(b))
        try:
            ck = load(path)
            for _, t in ck.items():
                t.dequantize()
        except MalformedInputError as exc:  # a ConverterError too: without this the test could never fail
            pytest.fail(f"reader bug on damaged header: {exc}")
        except ConverterError:
            pass


def test_dense_bf16_f16_pass_through(tmp_path):
    rng = np.random.default_rng(8)
    bf = DenseTensor("model.layers.0.mlp.gate_proj.weight", rng.standard_normal((4, 32)).astype(ml_dtypes.bfloat16))
    h = DenseTensor("model.norm.weight", rng.standard_normal(32).astype(np.float16))
    out = tmp_path / "dense.gguf"
    write_gguf(Checkpoint.from_tensors([bf, h]), out, arch="llama")
    rt = {t.name: t for t in gguf.GGUFReader(out).tensors}
    assert rt["blk.0.ffn_gate.weight"].tensor_type == gguf.GGMLQuantizationType.BF16
    assert [int(x) for x in rt["blk.0.ffn_gate.weight"].shape] == [32, 4]
    back = load(out)
    assert back[bf.name].data.dtype == ml_dtypes.bfloat16
    assert np.array_equal(back[bf.name].data.view(np.uint16), bf.data.view(np.uint16))
    assert np.array_equal(back[h.name].data, h.data)


def test_compressed_tensors_g32_to_q4_0_and_back_reproduces_codes_and_scales(tmp_path):
    """Issue: compressed-tensors group-32 4-bit sym -> Q4_0 -> compressed-tensors, through the files and
    `convert_exact` (codes identical, scales identical, values bit-exact at every hop)."""
    from converter.formats import registry
    from converter.ops.convert import convert_exact
    rng = np.random.default_rng(11)
    w = rng.normal(size=(48, 96)).astype(np.float32)
    from converter.quant.quantize import quantize
    t = quantize(w, QuantScheme(4, True, scale_dtype="F16"), GroupMap.per_group(32, "in"),
                           name="model.layers.0.mlp.down_proj.weight")
    cfg = {"model_type": "llama", "num_attention_heads": 2, "hidden_size": 96}
    registry.get("compressed-tensors").write(Checkpoint.from_tensors([t], config=cfg), tmp_path / "ct")
    r1 = convert_exact(tmp_path / "ct", tmp_path / "m.gguf", "gguf")
    r2 = convert_exact(tmp_path / "m.gguf", tmp_path / "ct2", "compressed-tensors")
    assert r1["summary"]["all_exact"] and r2["summary"]["all_exact"]
    assert load(tmp_path / "m.gguf").metadata["ggml_types"][t.name] == "Q4_0"
    a, b = load(tmp_path / "ct")[t.name], load(tmp_path / "ct2")[t.name]
    assert a.scheme == b.scheme and a.scheme.signed
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.scales.view(np.uint16), b.scales.view(np.uint16))
    np.testing.assert_array_equal(a.codes, t.codes)


# -- conformance (tests/formats/conformance.py) ------------------------------------------------------
from tests.formats.conformance import QuantizedFormatConformance, ToolDecodeConformance  # noqa: E402
from tests.conftest import SAMPLES as _SAMPLES  # noqa: E402


class TestGGUFConformance(QuantizedFormatConformance, ToolDecodeConformance):
    FORMAT = "gguf"
    SAMPLES = tuple((_SAMPLES / "gguf" / f, _SAMPLES / "gguf" / (f + ".reference_dequant.safetensors"))
                    for f in ("minilm_gguf_F16.gguf", "minilm_gguf_Q4_0.gguf", "minilm_gguf_Q4_1.gguf",
                              "minilm_gguf_Q5_0.gguf", "minilm_gguf_Q8_0.gguf", "minilm_llamacpp_Q4_K_M.gguf",
                              "minilm_llamacpp_Q6_K.gguf"))
