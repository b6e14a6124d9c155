"""GGUF grouped-query attention: the LLaMA q/k row permutation uses head_count_kv, derived from the k
rows when the key is absent (issue 16).

Expected row orders are written out by hand from llama.cpp ``convert_hf_to_gguf.py``
``LlamaModel.permute(w, n_head, n_head_kv)``: rows reshaped ``(n_heads, 2, head_dim / 2)`` and the two
inner axes swapped, ``n_heads = n_head_kv`` for k. With head size 4 a head's rows ``[a, a+1, a+2, a+3]``
are stored as ``[a, a+2, a+1, a+3]``.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from converter.errors import FormatError, ProofFailedError
from converter.formats.gguf import format as gguf_format
from converter.formats.gguf import heads as gguf_heads
from converter.formats.gguf.names import llama_row_permutation
from converter.formats.registry import load
from converter.tensor import Checkpoint, DenseTensor

#: 4 query heads x head size 4: stored (GGUF) row i holds logical row Q_ORDER[i]
Q_ORDER = [0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15]
#: 2 kv heads x head size 4
K_ORDER = [0, 2, 1, 3, 4, 6, 5, 7]
#: what un-permuting k with the 4 query heads gives: head size 2 per "head", no swap at all
K_ORDER_WRONG = [0, 1, 2, 3, 4, 5, 6, 7]

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "gguf" / "smollm2_vocab_tiny.gguf"


def _rows(n: int, width: int = 32) -> np.ndarray:
    """Row r holds r*1000 + column: every row is recognisable."""
    return (np.arange(n, dtype=np.float32)[:, None] * 1000 + np.arange(width, dtype=np.float32)).astype(np.float32)


def _llama_gguf(path: Path, *, kv_heads: int | None, k_rows: int = 8, key_length: int | None = None) -> None:
    """A LLaMA GGUF as llama.cpp's converter lays it out (rows permuted by hand), optionally without head_count_kv."""
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.embedding_length", 16)
    w.add_uint32("llama.attention.head_count", 4)
    if kv_heads is not None:
        w.add_uint32("llama.attention.head_count_kv", kv_heads)
    if key_length is not None:
        w.add_uint32("llama.attention.key_length", key_length)
    w.add_tensor("blk.0.attn_q.weight", _rows(16)[Q_ORDER])
    k = _rows(k_rows)
    w.add_tensor("blk.0.attn_k.weight", k[K_ORDER] if k_rows == 8 else k)
    w.add_tensor("blk.0.attn_v.weight", _rows(k_rows))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_hand_orders_are_llamacpp_permute():
    assert llama_row_permutation(16, 4).tolist() == Q_ORDER
    assert llama_row_permutation(8, 2).tolist() == K_ORDER
    assert llama_row_permutation(8, 4).tolist() == K_ORDER_WRONG  # the old default: a no-op on k


@pytest.mark.parametrize("kv_heads", [2, None])
def test_gqa_k_read_back_in_logical_order(tmp_path, kv_heads):
    """head_count_kv = 2 recorded, or absent and derived: 8 k rows / head size 16/4 = 2 heads."""
    path = tmp_path / "gqa.gguf"
    _llama_gguf(path, kv_heads=kv_heads)
    ck = load(path)
    assert np.array_equal(ck["model.layers.0.self_attn.q_proj.weight"].data, _rows(16))
    assert np.array_equal(ck["model.layers.0.self_attn.k_proj.weight"].data, _rows(8))
    assert np.array_equal(ck["model.layers.0.self_attn.v_proj.weight"].data, _rows(8))


def test_head_size_from_key_length(tmp_path):
    """key_length wins over embedding_length / head_count: 8 rows / key_length 8 = 1 kv head."""
    path = tmp_path / "kl.gguf"
    _llama_gguf(path, kv_heads=None, k_rows=8, key_length=8)
    k = load(path)["model.layers.0.self_attn.k_proj.weight"].data
    # stored rows were laid out for 2 heads; read as 1 head of size 8: stored row i -> logical order [0,4,1,5,..]
    stored = _rows(8)[K_ORDER]
    one_head = [0, 4, 1, 5, 2, 6, 3, 7]  # LlamaModel.permute(8 rows, 1 head) by hand
    assert np.array_equal(k[one_head], stored)


def test_k_rows_not_whole_heads_refused(tmp_path):
    path = tmp_path / "bad.gguf"
    _llama_gguf(path, kv_heads=None, k_rows=6)  # 6 rows / head size 4
    ck = load(path)
    with pytest.raises(FormatError) as exc:
        ck["model.layers.0.self_attn.k_proj.weight"]
    e = exc.value
    assert e.field == "llama.attention.head_count_kv" and "k_proj" in str(e.tensor) and e.found == 6
    assert "bad.gguf" in str(e.file)


def test_writer_derives_and_records_head_count_kv(tmp_path):
    """A config without num_key_value_heads: k is permuted with 2 heads (8 rows / 16/4) and the count recorded."""
    q = DenseTensor("model.layers.0.self_attn.q_proj.weight", _rows(16))
    k = DenseTensor("model.layers.0.self_attn.k_proj.weight", _rows(8))
    cfg = {"model_type": "llama", "num_attention_heads": 4, "hidden_size": 16}
    out = tmp_path / "w.gguf"
    gguf_format.write_gguf(Checkpoint.from_tensors([q, k], config=cfg), out)
    r = gguf.GGUFReader(out)
    assert r.fields["llama.attention.head_count_kv"].contents() == 2
    raw = {t.name: np.asarray(t.data) for t in r.tensors}
    assert np.array_equal(raw["blk.0.attn_k.weight"], _rows(8)[K_ORDER])
    assert np.array_equal(raw["blk.0.attn_q.weight"], _rows(16)[Q_ORDER])


def test_writer_refuses_k_rows_not_whole_heads(tmp_path):
    k = DenseTensor("model.layers.0.self_attn.k_proj.weight", _rows(6))
    cfg = {"model_type": "llama", "num_attention_heads": 4, "hidden_size": 16}
    with pytest.raises(FormatError, match="whole number of heads"):
        gguf_format.write_gguf(Checkpoint.from_tensors([k], config=cfg), tmp_path / "x.gguf")


def _quantized_llama(tmp_path: Path) -> Path:
    """A safetensors checkpoint (qckpt's native format) of 8-bit q/k, config without num_key_value_heads."""
    import converter
    from converter.groups import GroupMap
    from converter.scheme import QuantScheme, ZeroPoint
    scheme = QuantScheme(8, signed=False, zero_point=ZeroPoint.INTEGER, scale_dtype="F32")
    rng = np.random.default_rng(16)
    q = converter.quantize(rng.standard_normal((16, 32)).astype(np.float32), scheme, GroupMap.per_group(32),
                           name="model.layers.0.self_attn.q_proj.weight")
    k = converter.quantize(rng.standard_normal((8, 32)).astype(np.float32), scheme, GroupMap.per_group(32),
                           name="model.layers.0.self_attn.k_proj.weight")
    cfg = {"model_type": "llama", "num_attention_heads": 4, "hidden_size": 16}
    src = tmp_path / "src.safetensors"
    converter.save(Checkpoint.from_tensors([q, k], config=cfg), src)
    return src


def test_readback_proof_is_independent_of_the_permutation_code(tmp_path, monkeypatch):
    """Writer and reader sharing one wrong head count (the old default) cancel out in the read-back; the
    proof still catches k because it checks the stored rows against llama.cpp's permute of the source: the
    output is refused naming k alone (q is right), and nothing is written."""
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    src = _quantized_llama(tmp_path)
    target = Target(bits=8, group_size=32, symmetric=True)  # Q8_0
    good = requantize_model(src, tmp_path / "good.gguf", target, to="gguf")
    assert all(r["readback_bit_exact"] for r in good["tensors"]) and len(good["tensors"]) == 2

    def wrong(gguf_name, rows, arch, kv, config, *, file=None, tensor=None):  # k permuted with the q head count
        heads = gguf_heads.qk_heads(gguf_name, rows, arch, kv, config, file=file, tensor=tensor)
        return None if heads is None else llama_row_permutation(rows, 4)

    monkeypatch.setattr("converter.formats.gguf.tensor_plan.qk_permutation", wrong)  # the writer's lookup
    monkeypatch.setattr("converter.formats.gguf.reader.qk_permutation", wrong)
    with pytest.raises(ProofFailedError) as e:
        requantize_model(src, tmp_path / "bad.gguf", target, to="gguf")
    assert e.value.found == "model.layers.0.self_attn.k_proj.weight"  # k only: q reads back right
    assert not (tmp_path / "bad.gguf").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if "qckpt-tmp" in p.name) == []


def test_proof_names_the_rows_that_moved(tmp_path):
    """prove_qk_rows on a file whose k was permuted with the 4 query heads (a no-op) against the logical source."""
    from converter.formats.gguf.qk_proof import prove_qk_rows
    path = tmp_path / "wrong.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("blk.0.attn_q.weight", _rows(16)[Q_ORDER])
    w.add_tensor("blk.0.attn_k.weight", _rows(8)[K_ORDER_WRONG])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    src = Checkpoint.from_tensors([DenseTensor("model.layers.0.self_attn.q_proj.weight", _rows(16)),
                                   DenseTensor("model.layers.0.self_attn.k_proj.weight", _rows(8))],
                                  config={"num_attention_heads": 4})
    failed = prove_qk_rows(src, path)
    assert list(failed) == ["model.layers.0.self_attn.k_proj.weight"]
    assert "with 2 heads (4 of 8 rows differ)" in failed["model.layers.0.self_attn.k_proj.weight"]


def test_proof_counts_the_moved_rows_of_a_bias(tmp_path):
    """A 1-D k bias stored unpermuted (as if permuted with the 4 query heads): 4 of its 8 rows (values) moved."""
    from converter.formats.gguf.qk_proof import prove_qk_rows
    path = tmp_path / "wrong_bias.gguf"
    bias = np.arange(8, dtype=np.float32) + 1
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("blk.0.attn_q.weight", _rows(16)[Q_ORDER])
    w.add_tensor("blk.0.attn_k.bias", bias[K_ORDER_WRONG])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    src = Checkpoint.from_tensors([DenseTensor("model.layers.0.self_attn.q_proj.weight", _rows(16)),
                                   DenseTensor("model.layers.0.self_attn.k_proj.bias", bias)],
                                  config={"num_attention_heads": 4, "num_key_value_heads": 2})
    failed = prove_qk_rows(src, path)
    assert list(failed) == ["model.layers.0.self_attn.k_proj.bias"]
    assert "with 2 heads (4 of 8 rows differ)" in failed["model.layers.0.self_attn.k_proj.bias"]


# ------------------------------------------------------------------------------------------------
# SmolLM2 (GQA 9 / 3, head size 576 / 9 = 64): unchanged
# ------------------------------------------------------------------------------------------------

def _llamacpp_unpermute(stored: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of ``LlamaModel.permute`` written out: stored rows (n_head, head_dim/2, 2) -> (n_head, 2, head_dim/2)."""
    return stored.reshape(n_head, stored.shape[0] // n_head // 2, 2, *stored.shape[1:]).swapaxes(1, 2) \
        .reshape(stored.shape)


def test_smollm2_fixture_k_rows_with_and_without_head_count_kv():
    r = gguf.GGUFReader(FIXTURE)
    t = next(t for t in r.tensors if t.name == "blk.0.attn_k.weight")
    stored = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    want = _llamacpp_unpermute(stored, 3)
    ck = load(FIXTURE)
    assert ck.metadata["gguf_kv"]["llama.attention.head_count_kv"] == 3
    got = ck["model.layers.0.self_attn.k_proj.weight"].dequantize()
    assert np.array_equal(got, want)
    assert not np.array_equal(want, stored)  # the check is not void: rows do move
    with pytest.raises(FormatError):  # the query head count (9) does not even divide the 192 k rows
        llama_row_permutation(192, 9)
    kv = dict(ck.metadata["gguf_kv"])
    del kv["llama.attention.head_count_kv"]
    perm = gguf_heads.qk_permutation("blk.0.attn_k.weight", 192, "llama", kv, {})
    assert np.array_equal(perm, gguf_heads.qk_permutation("blk.0.attn_k.weight", 192, "llama",
                                                          ck.metadata["gguf_kv"], {}))
    assert gguf_heads.kv_head_count(kv, {}, "llama", 192) == 3


REAL = Path("/work/shared/real/smollm2_135m_instruct_Q4_1.gguf")


@pytest.mark.skipif(not REAL.exists(), reason="the real SmolLM2 GGUF is in the shared folder only (fixture test above)")
def test_real_smollm2_k_rows_unchanged():
    r = gguf.GGUFReader(REAL)
    t = next(t for t in r.tensors if t.name == "blk.3.attn_k.weight")
    want = _llamacpp_unpermute(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), 3)
    ck = load(REAL)
    assert np.array_equal(ck["model.layers.3.self_attn.k_proj.weight"].dequantize(), want)
    from converter.formats.gguf.qk_proof import prove_qk_rows
    assert prove_qk_rows(ck, REAL, ck) == {}  # all 30 layers' q (9 heads) and k (3 heads) rows


def test_gguf_without_head_count_kv_written_with_it(tmp_path):
    """GGUF -> GGUF: the count derived on read (2, not head_count 4) is recorded; the k bytes are unchanged and
    the independent proof agrees (fast path: architecture from the read-back checkpoint)."""
    from converter.formats.gguf.qk_proof import prove_qk_rows
    src = tmp_path / "nokv.gguf"
    _llama_gguf(src, kv_heads=None)
    out = tmp_path / "out.gguf"
    gguf_format.write_gguf(load(src), out)
    r = gguf.GGUFReader(out)
    assert r.fields["llama.attention.head_count_kv"].contents() == 2
    raw = {t.name: np.asarray(t.data) for t in r.tensors}
    assert np.array_equal(raw["blk.0.attn_k.weight"], _rows(8)[K_ORDER])
    assert prove_qk_rows(load(src), out, load(out)) == {}
    # an MHA file (k rows = head_count heads) is copied as it is: no key added
    mha = tmp_path / "mha.gguf"
    w = gguf.GGUFWriter(mha, "llama")
    w.add_uint32("llama.embedding_length", 16)
    w.add_uint32("llama.attention.head_count", 4)
    w.add_tensor("blk.0.attn_k.weight", _rows(16)[Q_ORDER])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out2 = tmp_path / "mha_out.gguf"
    gguf_format.write_gguf(load(mha), out2)
    r2 = gguf.GGUFReader(out2)
    assert "llama.attention.head_count_kv" not in r2.fields
    assert np.array_equal(np.asarray(r2.tensors[0].data), _rows(16)[Q_ORDER])
