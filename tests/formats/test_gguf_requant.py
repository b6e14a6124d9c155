"""Requantizing to GGUF (``qckpt convert SRC DST --to gguf`` with requantize options) is llama.cpp's
reference quantizer: every written tensor's bytes equal ``gguf.quants.quantize(values, type)``, the
real tool (PyPI ``gguf`` 0.19.0, a qckpt dependency, ``gguf/quants.py``: ``quantize_blocks`` of
``Q4_0``, ``Q4_1``, ``Q5_0``, ``Q5_1``, ``Q8_0``, the numpy port of ``quantize_row_q*_ref``), called
here on the source's float32 dequantized values in GGUF row order (rows = ``out``, blocks along
``in``; LLaMA q/k rows permuted as ``convert_hf_to_gguf.py`` ``LlamaModel.permute`` does).

Sources: the shipped AutoAWQ sample (real MiniLM weights, autoawq 0.2.9, see
sample_checkpoints/MANIFEST.json), the shipped gguf-py Q8_0 sample (its values decoded by
``gguf.quants.dequantize``), and crafted blocks (ties ``x/d = k + 0.5``, all-zero blocks, largest
magnitude negative / positive / both, fp16 underflow of the block scale) held exactly by an 8-bit
asymmetric source. The error-report figures are checked against gguf's own decode of the written
bytes and, for a tiny case, against values computed by hand.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

import gguf

import converter
from converter.cli import main
from converter.errors import NotRepresentableError
from converter.formats.registry import load
from converter.groups import GroupMap
from converter.ops.requantize_model import requantize_model
from converter.quant.requant import Target
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor
from tests.conftest import SAMPLES

AWQ = SAMPLES / "awq_gemm_w4_g128_zp"
GPTQ = SAMPLES / "gptq_w4_g128_sym"
GGUF_Q8_0 = SAMPLES / "gguf" / "minilm_gguf_Q8_0.gguf"

#: requantize options -> the legacy type they give (README "Requantizing to GGUF")
OPTIONS = {
    "Q4_0": Target(bits=4, group_size=32, symmetric=True),
    "Q5_0": Target(bits=5, group_size=32, symmetric=True),
    "Q8_0": Target(bits=8, group_size=32, symmetric=True),
    "Q4_1": Target(bits=4, group_size=32, symmetric=False),
    "Q5_1": Target(bits=5, group_size=32, symmetric=False),
}


def _raw(path) -> dict:
    """GGUF name -> gguf-py ReaderTensor of the file at ``path``."""
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _check_written(out, rep, source_values: dict[str, np.ndarray], type_name: str, *, permute=None):
    """Every tensor's bytes are ``gguf.quants.quantize`` of its source values; the report row's
    figures are those of gguf's decode of the written bytes against the source values."""
    qt = gguf.GGMLQuantizationType[type_name]
    names = load(out).metadata["gguf_names"]
    raw = _raw(out)
    rows = {r["name"]: r for r in rep["tensors"]}
    assert set(rows) == set(source_values)
    for name, x in source_values.items():
        t = raw[names[name]]
        assert t.tensor_type == qt, name
        x_file = permute(name, x) if permute else x  # GGUF row order
        want = gguf.quants.quantize(x_file, qt)
        assert np.asarray(t.data).tobytes() == want.tobytes(), name
        r = rows[name]
        assert r["route"] == "requantized" and r["target"]["quantizer"].startswith(f"gguf {type_name}:"), name
        assert r["readback_bit_exact"] is True, name
        y = gguf.quants.dequantize(t.data, qt).astype(np.float32)
        e = y - x_file  # float32, as the report forms B - A (row order does not change the figures)
        v = r["vs_source"]
        assert v["max_abs"] == float(np.abs(e).max()), name
        assert v["changed_fraction"] == np.count_nonzero(e) / e.size, name
        sse, ssr = float(np.sum(e.astype(np.float64) ** 2)), float(np.sum(x.astype(np.float64) ** 2))
        assert v["mse"] == pytest.approx(sse / e.size, rel=1e-5, abs=1e-30), name
        if ssr > 0:
            assert v["rel_frobenius"] == pytest.approx(math.sqrt(sse / ssr), rel=1e-5, abs=1e-30), name


# ------------------------------------------------------------------------------------------------
# Real weights
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("type_name", list(OPTIONS))
def test_awq_sample_requantized_bytes_are_gguf_quants_quantize(tmp_path, type_name):
    src = load(AWQ)
    values = {n: src[n].dequantize() for n in src.quantized_names()}
    out = tmp_path / f"{type_name}.gguf"
    rep = requantize_model(AWQ, out, OPTIONS[type_name], to="gguf")
    _check_written(out, rep, values, type_name)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1"])
def test_gguf_q8_0_sample_requantized_bytes_are_gguf_quants_quantize(tmp_path, type_name):
    # source values decoded by gguf-py itself (rows = out, bert: no permutation)
    src_names = load(GGUF_Q8_0).metadata["gguf_names"]
    raw = _raw(GGUF_Q8_0)
    values = {n: gguf.quants.dequantize(raw[g].data, raw[g].tensor_type).astype(np.float32)
              for n, g in src_names.items() if raw[g].tensor_type == gguf.GGMLQuantizationType.Q8_0}
    out = tmp_path / f"{type_name}.gguf"
    rep = requantize_model(GGUF_Q8_0, out, OPTIONS[type_name], to="gguf")
    _check_written(out, rep, values, type_name)


def _permute_like_llamacpp(w, n_head):
    """``convert_hf_to_gguf.py`` ``LlamaModel.permute`` (llama.cpp)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0", "Q4_1"])
def test_llama_qk_quantize_then_permute_is_permute_then_quantize(tmp_path, type_name):
    """The writer quantizes logical rows and permutes them; the file holds what gguf-py makes of the
    permuted rows (whole rows move, blocks never cross rows)."""
    w = converter.load(SAMPLES / "minilm_fp16.safetensors")["encoder.layer.0.attention.self.query.weight"]
    w = w.dequantize()[:, :128]
    scheme = QuantScheme(8, signed=False, zero_point=ZeroPoint.INTEGER, scale_dtype="F32")
    q = converter.quantize(w[:48], scheme, GroupMap.per_group(32), name="model.layers.0.self_attn.q_proj.weight")
    k = converter.quantize(w[48:64], scheme, GroupMap.per_group(32), name="model.layers.0.self_attn.k_proj.weight")
    cfg = {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 128}
    src = tmp_path / "src.safetensors"
    converter.save(Checkpoint.from_tensors([q, k], config=cfg), src)
    heads = {q.name: 4, k.name: 2}
    values = {t.name: t.dequantize() for t in (q, k)}
    out = tmp_path / "llama.gguf"
    rep = requantize_model(src, out, OPTIONS[type_name], to="gguf")
    _check_written(out, rep, values, type_name, permute=lambda n, x: _permute_like_llamacpp(x, heads[n]))
    assert not np.array_equal(_permute_like_llamacpp(values[q.name], 4), values[q.name])  # the check is not void
    # read back, the rows are in logical order again: gguf's decode of its quantization of the logical rows
    qt = gguf.GGMLQuantizationType[type_name]
    back = load(out)
    for name, x in values.items():
        assert np.array_equal(back[name].dequantize(), gguf.quants.dequantize(gguf.quants.quantize(x, qt), qt))


# ------------------------------------------------------------------------------------------------
# Crafted blocks
# ------------------------------------------------------------------------------------------------

def _odd(lo: int, n: int) -> list[int]:
    return [lo + 2 * i for i in range(n)]


#: (scale s, integer offsets k): the block's values are exactly ``s * k`` (|k| <= 255, max-min <= 255).
CRAFTED = [
    # Q4_0 d = mx/-8: largest magnitude negative (-16 -> d = 2) / positive (16 -> d = -2); odd x: x/d = k + 0.5
    (1.0, [-16] + _odd(-15, 16) + _odd(-15, 15)),
    (1.0, [16] + _odd(-15, 16) + _odd(-13, 15)),
    # equal magnitudes: the first one decides the sign of d (quantize_row_q4_0_ref: strict >)
    (1.0, [16, -16] + _odd(-15, 16) + _odd(-13, 14)),
    (1.0, [-16, 16] + _odd(-15, 16) + _odd(-13, 14)),
    # all zero: d = 0, codes at the centre
    (1.0, [0] * 32),
    # Q8_0 d = amax/127 = 2s: odd k gives x/d = k/2, ties of roundf (half away from zero)
    (1 / 16, [254] + _odd(1, 31)),
    (1 / 16, [-254] + _odd(-61, 31)),
    # Q5_0 d = mx/-16 = 2
    (1.0, [-32] + _odd(-31, 31)),
    # Q4_1 d = (max - min)/15 = 2s, m = min: (x - min)/d = odd/2
    (1 / 4, [-10, 20] + [-10 + o for o in _odd(1, 15)] + [-10 + o for o in _odd(1, 15)]),
    # Q5_1 d = (max - min)/31 = 2s
    (1 / 4, [-10, 52] + [-10 + o for o in _odd(1, 30)]),
    # fp16 underflow: d far below the smallest fp16 subnormal (stored as 0) / a subnormal d
    (2.0 ** -30, [127, -100, 3, -3] + list(range(-56, 84, 5))),
    (2.0 ** -22, [-127, 100, 1, -1] + list(range(-70, 70, 5))),
    # a block of one value repeated, and a one-hot block
    (0.5, [7] * 32),
    (1.0, [0] * 31 + [-5]),
]


def _crafted_tensor(name="model.layers.0.mlp.down_proj.weight"):
    """The CRAFTED blocks, two per row, as uint8 codes with integer zero points and F32 scales per 32."""
    blocks = [(np.float32(s), np.array(k, dtype=np.int64)) for s, k in CRAFTED]
    assert all(k.size == 32 for _, k in blocks)
    n_rows = len(blocks) // 2
    zeros = np.array([max(0, -int(k.min())) for _, k in blocks], dtype=np.int64)
    codes = np.stack([k + z for (_, k), z in zip(blocks, zeros)])
    assert codes.min() >= 0 and codes.max() <= 255
    values = np.stack([s * k.astype(np.float32) for s, k in blocks]).reshape(n_rows, 64)
    t = QuantizedTensor(name, ("out", "in"), codes.astype(np.uint8).reshape(n_rows, 64),
                        np.array([s for s, _ in blocks], dtype=np.float32).reshape(n_rows, 2),
                        QuantScheme(8, signed=False, zero_point=ZeroPoint.INTEGER, scale_dtype="F32"),
                        GroupMap.per_group(32), zero_points=zeros.astype(np.uint8).reshape(n_rows, 2))
    return t, values


@pytest.fixture(scope="module")
def crafted_source(tmp_path_factory):
    t, values = _crafted_tensor()
    assert np.array_equal(t.dequantize(), values)  # the source holds the crafted values exactly
    src = tmp_path_factory.mktemp("crafted") / "crafted.safetensors"
    converter.save(Checkpoint.from_tensors([t], config={"model_type": "qwen2"}), src)
    return src, {t.name: values}


@pytest.mark.parametrize("type_name", list(OPTIONS))
def test_crafted_ties_zero_blocks_signs_underflow(tmp_path, crafted_source, type_name):
    src, values = crafted_source
    out = tmp_path / f"{type_name}.gguf"
    rep = requantize_model(src, out, OPTIONS[type_name], to="gguf")
    _check_written(out, rep, values, type_name)
    assert rep["tensors"][0]["degenerate_groups"] == 1  # the all-zero block


def test_crafted_blocks_by_hand(tmp_path, crafted_source):
    """A few crafted codes worked out by hand from ``quantize_row_q4_0_ref`` / ``_q8_0_ref``."""
    src, values = crafted_source
    name = next(iter(values))
    q4 = load(requantize_model(src, tmp_path / "q4.gguf", OPTIONS["Q4_0"], to="gguf")["destination"])[name]
    # block 0: mx = -16 -> d = 2; x = -15 -> trunc(-7.5 + 8.5) = 1 -> -14; x = -1 -> trunc(8.0) = 8 -> 0;
    # x = 1 -> trunc(9.0) = 9 -> 2 (ties round up, not to even)
    assert float(q4.scales[0, 0]) == 2.0
    assert q4.dequantize()[0, :2].tolist() == [-16.0, -14.0]
    assert q4.dequantize()[0, 8:10].tolist() == [0.0, 2.0]  # x = -1, 1
    # block 1: mx = +16 -> d = -2 (negative scale)
    assert float(q4.scales[0, 1]) == -2.0
    # blocks 2 / 3: equal magnitudes, the first decides
    assert float(q4.scales[1, 0]) == -2.0 and float(q4.scales[1, 1]) == 2.0
    # block 4: all zero -> d = 0
    assert float(q4.scales[2, 0]) == 0.0
    # block 10: d = 127 * 2^-30 / -8 underflows fp16 to (negative) zero: every value decodes to 0
    assert float(q4.scales[5, 0]) == 0.0 and not q4.dequantize()[5, :32].any()
    q8 = load(requantize_model(src, tmp_path / "q8.gguf", OPTIONS["Q8_0"], to="gguf")["destination"])[name]
    # block 5: amax = 254/16 -> d = 1/8; x = 1/16 -> x/d = 0.5 -> roundf -> 1 (not 0, half-to-even's answer)
    assert float(q8.scales[2, 1]) == 0.125
    assert q8.codes[2, 32:35].tolist() == [127, 1, 2]  # x/d = 127, 0.5, 1.5
    # block 6: negative ties -> away from zero: x/d = -30.5 -> -31
    assert q8.codes[3, 1] == -31


def test_error_report_figures_by_hand(tmp_path):
    """Row 0: one block ``[-8, 0.5, -0.5, 0 ...]``; row 1: zeros. Q4_0: d = -8 / -8 = 1;
    ``-8 -> trunc(0.5) = 0 -> -8``, ``0.5 -> trunc(9.0) = 9 -> 1``, ``-0.5 -> trunc(8.0) = 8 -> 0``,
    ``0 -> 8 -> 0``: errors +0.5 and +0.5, everything else exact."""
    x = np.zeros((2, 32), dtype=np.float32)
    x[0, :3] = [-8.0, 0.5, -0.5]
    codes = (x / np.float32(0.5)).astype(np.int64) + 16
    t = QuantizedTensor("model.layers.0.mlp.up_proj.weight", ("out", "in"), codes.astype(np.uint8),
                        np.full((2, 1), 0.5, np.float32),
                        QuantScheme(8, signed=False, zero_point=ZeroPoint.INTEGER, scale_dtype="F32"),
                        GroupMap.per_group(32), zero_points=np.full((2, 1), 16, np.uint8))
    assert np.array_equal(t.dequantize(), x)
    src = tmp_path / "tiny.safetensors"
    converter.save(Checkpoint.from_tensors([t], config={"model_type": "qwen2"}), src)
    rep = requantize_model(src, tmp_path / "tiny.gguf", OPTIONS["Q4_0"], to="gguf")
    row = rep["tensors"][0]
    v = row["vs_source"]
    assert v["numel"] == 64
    assert v["mse"] == 0.5 / 64
    assert v["rmse"] == pytest.approx(math.sqrt(0.5 / 64), rel=1e-12)
    assert v["max_abs"] == 0.5
    assert v["changed_fraction"] == 2 / 64
    assert v["rel_frobenius"] == pytest.approx(math.sqrt(0.5 / 64.5), rel=1e-12)
    assert v["sqnr_db"] == pytest.approx(10 * math.log10(64.5 / 0.5), rel=1e-12)
    assert v["worst_channel"] == {"index": [0], "mse": 0.5 / 32}
    assert v["worst_group"] == {"index": [0, 0], "mse": 0.5 / 32, "elements": 32}
    assert row["degenerate_groups"] == 1 and row["result"] == "lossy" and row["readback_bit_exact"] is True
    assert rep["overall"]["vs_source"]["mse"] == 0.5 / 64


# ------------------------------------------------------------------------------------------------
# Which options give which type; what is refused; the carried route
# ------------------------------------------------------------------------------------------------

def test_cli_reports_the_quantizer(tmp_path):
    dst = tmp_path / "q41.gguf"
    r = CliRunner().invoke(main, ["convert", str(AWQ), str(dst), "--to", "gguf", "--bits", "4",
                                  "--group-size", "32", "--asym", "--json"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert {t["target"]["quantizer"] for t in doc["tensors"]} == \
        {"gguf Q4_1: llama.cpp quantize_row_q4_1_ref (gguf.quants.quantize)"}
    assert {t.tensor_type.name for t in gguf.GGUFReader(dst).tensors} >= {"Q4_1"}


@pytest.mark.parametrize("opts, field, words", [
    (dict(bits=4, group_size=32, symmetric=True, scale_dtype="f32"), "--scale-dtype", "fp16"),
    (dict(bits=4, group_size=32, symmetric=True, scale_dtype="bf16"), "--scale-dtype", "fp16"),
    (dict(bits=6, group_size=32, symmetric=True), "scheme", "6-bit"),
    (dict(bits=8, group_size=32, symmetric=False), "scheme", "8-bit"),
    (dict(bits=4, group_size=48, symmetric=True), "scheme", "32 consecutive"),
])
def test_requests_gguf_cannot_meet_are_refused_naming_the_options(tmp_path, opts, field, words):
    dst = tmp_path / "x.gguf"
    with pytest.raises(NotRepresentableError) as ei:
        requantize_model(AWQ, dst, Target(**opts), to="gguf")
    msg = str(ei.value)
    assert ei.value.field == field and words in msg
    assert "--group-size" in msg and "--bits" in msg and ("--sym" in msg or "--asym" in msg)
    assert not dst.exists()


def test_exact_carry_keeps_codes_and_reads_back(tmp_path):
    """GPTQ group 128 -> --group-size 32 --sym: the values are on the Q4_0 grid already (scales repeated),
    so codes are carried (zero error) rather than recomputed; the read-back proof holds (it failed before:
    the digest compared the rounding label, half_even vs GGUF's)."""
    out = tmp_path / "carried.gguf"
    rep = requantize_model(GPTQ, out, OPTIONS["Q4_0"], to="gguf")
    assert {(r["route"], r["result"], r["readback_bit_exact"]) for r in rep["tensors"]} == {("carried", "exact", True)}
    src, back = load(GPTQ), load(out)
    for name in src.quantized_names():
        assert np.array_equal(back[name].dequantize(), src[name].dequantize())


def test_group_128_target_written_as_blocks_reads_back(tmp_path):
    """--bits 4 --sym keeps group 128: qckpt's round-to-nearest (not llama.cpp's quantizer), written
    as Q4_0 blocks repeating each group's scale; the read-back proof compares the tensor in that form."""
    out = tmp_path / "g128.gguf"
    rep = requantize_model(AWQ, out, Target(bits=4, symmetric=True), to="gguf")
    assert all(r["readback_bit_exact"] and "quantizer" not in r["target"] for r in rep["tensors"])
    assert {t.tensor_type.name for t in gguf.GGUFReader(out).tensors if len(t.shape) == 2} == {"Q4_0"}


# ------------------------------------------------------------------------------------------------
# The output head: llama.cpp keeps it above the requested type (llama_tensor_get_type)
# ------------------------------------------------------------------------------------------------

def _tied_llama_source(tmp_path, with_head=False, width=64):
    """A native llama-named checkpoint: a quantized (int8, groups of 32) embedding 6 x ``width``, an up_proj,
    and optionally a quantized lm_head; no lm_head means a tied head."""
    from converter.formats.native import write_native
    rng = np.random.default_rng(12)
    ts = []
    for name, shape in (("model.embed_tokens.weight", (6, width)), ("model.layers.0.mlp.up_proj.weight", (8, width)),
                        *((("lm_head.weight", (6, width)),) if with_head else ())):
        q = rng.integers(-127, 128, shape).astype(np.int8)
        ts.append(QuantizedTensor(name, ("out", "in"), q,
                                  rng.uniform(0.001, 0.01, (shape[0], width // 32)).astype(np.float16),
                                  QuantScheme(8, True, ZeroPoint.NONE, "F16"), GroupMap.per_group(32)))
    p = tmp_path / ("head.safetensors" if with_head else "tied.safetensors")
    cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": not with_head,
           "num_attention_heads": 2, "num_key_value_heads": 2, "hidden_size": width}
    write_native(Checkpoint.from_tensors(ts, config=cfg), p)
    return p


@pytest.mark.parametrize("with_head", [False, True])
def test_a_256_wide_output_head_is_q6_k_like_llama_quantize(tmp_path, with_head):
    """llama-quantize Q4_0 writes the output head (or the tied token embedding) as Q6_K when its rows are a
    multiple of 256 (llama_tensor_get_type); qckpt wrote Q8_0 while it had no K-quant writer."""
    src = _tied_llama_source(tmp_path, with_head, width=256)
    rep = requantize_model(src, tmp_path / "q4_0.gguf", OPTIONS["Q4_0"], to="gguf")
    raw = _raw(tmp_path / "q4_0.gguf")
    head_gguf, head_hf = ("output.weight", "lm_head.weight") if with_head else ("token_embd.weight",
                                                                                 "model.embed_tokens.weight")
    assert raw[head_gguf].tensor_type == gguf.GGMLQuantizationType.Q6_K
    assert raw["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    row = next(d for d in rep["modules"] if d["tensor"] == head_hf)
    assert "Q6_K" in row["reason"] and "llama_tensor_get_type" in row["reason"]
    # gguf-py's own decode of the written Q6_K head is what qckpt reads back
    y = gguf.quants.dequantize(raw[head_gguf].data, gguf.GGMLQuantizationType.Q6_K).astype(np.float32)
    assert np.array_equal(y, load(tmp_path / "q4_0.gguf")[head_hf].dequantize())


@pytest.mark.parametrize("with_head", [False, True])
def test_output_head_requantized_to_q8_0_like_llama_quantize(tmp_path, with_head):
    # llama-quantize Q4_0 writes output.weight -- or token_embd when there is none (a tied head) -- as
    # Q8_0 when its row length is not a multiple of 256 (here 64). Measured on SmolLM2-135M-Instruct:
    # qckpt's Q4_0 output was byte-identical to llama-cpp-python 0.3.36's llama_model_quantize
    # (ftype MOSTLY_Q4_0) in all 272 tensors, and with token_embd at Q4_0 it no longer answered ' Paris'
    src = _tied_llama_source(tmp_path, with_head)
    ck = load(src)
    out = tmp_path / "q4_0.gguf"
    rep = requantize_model(src, out, OPTIONS["Q4_0"], to="gguf")
    raw = _raw(out)
    head_gguf, head_hf = ("output.weight", "lm_head.weight") if with_head else ("token_embd.weight",
                                                                                 "model.embed_tokens.weight")
    x = ck[head_hf].dequantize()
    assert raw[head_gguf].tensor_type == gguf.GGMLQuantizationType.Q8_0
    # the source head is already int8 in groups of 32: its codes are carried (zero error), so gguf-py's
    # decode of the written Q8_0 blocks is the source's values exactly
    y = gguf.quants.dequantize(raw[head_gguf].data, gguf.GGMLQuantizationType.Q8_0).astype(np.float32)
    assert np.array_equal(y, x)
    assert next(r for r in rep["tensors"] if r["name"] == head_hf)["vs_source"]["exact"] is True
    assert raw["blk.0.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    if with_head:  # with its own head, the embedding gets the requested type (as in llama.cpp)
        assert raw["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    row = next(d for d in rep["modules"] if d["tensor"] == head_hf)
    assert row["decision"] == "quantized" and "Q8_0" in row["reason"] and "not a multiple of 256" in row["reason"]
    # asked for 8 bits: nothing to override
    rep8 = requantize_model(src, tmp_path / "q8.gguf", OPTIONS["Q8_0"], to="gguf")
    assert "llama_tensor_get_type" not in next(d for d in rep8["modules"] if d["tensor"] == head_hf)["reason"]
