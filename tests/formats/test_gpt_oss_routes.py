"""gpt-oss MXFP4 experts routed to the targets that want them arranged otherwise, and back, bit-exactly.

- GGUF ``gpt-oss`` (llama.cpp ``convert_hf_to_gguf.py`` ``GptOssModel``): ``ffn_gate_exps`` / ``ffn_up_exps``
  from rows ``0::2`` / ``1::2`` of ``gate_up_proj``, ``ffn_down_exps``, biases ``ffn_*_exps.bias``,
  ``attn_sinks.weight``; MXFP4 blocks of 17 bytes (E8M0 byte, then 16 bytes holding element ``j`` in the low
  nibble and ``j + 16`` in the high nibble of byte ``j``, ggml ``block_mxfp4``).
- compressed-tensors: one Linear per expert (llm-compressor ``LinearExperts``), ``weight_packed`` low nibble first.

Expected bytes are computed here from the fixture's stored bytes by those published rules (never by qckpt).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from converter.ops.convert import convert_exact

DATA = Path(__file__).resolve().parents[1] / "data" / "gpt_oss"
FIXTURE = DATA / "tiny_mxfp4"
gguf = pytest.importorskip("gguf")


def raw_tensors(directory: Path) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """``{name: (dtype, shape, bytes)}`` of every safetensors file in ``directory``, read by hand."""
    out = {}
    for f in sorted(directory.glob("*.safetensors")):
        d = f.read_bytes()
        n = struct.unpack("<Q", d[:8])[0]
        head = json.loads(d[8:8 + n])
        head.pop("__metadata__", None)
        for k, v in head.items():
            a, b = v["data_offsets"]
            out[k] = (v["dtype"], tuple(v["shape"]), d[8 + n + a:8 + n + b])
    return out


SRC = raw_tensors(FIXTURE)


def u8(name: str) -> np.ndarray:
    dtype, shape, data = SRC[name]
    assert dtype == "U8"
    return np.frombuffer(data, np.uint8).reshape(shape)


def ggml_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> bytes:
    """gpt-oss ``[E, O, G, 16]`` (byte k: element 2k low, 2k+1 high) + ``[E, O, G]`` -> ggml ``block_mxfp4`` bytes."""
    lo, hi = blocks & 0x0F, blocks >> 4
    elems = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], 32)   # element order 0..31
    qs = elems[..., :16] | (elems[..., 16:] << 4)
    return np.concatenate([scales[..., None], qs], axis=-1).astype(np.uint8).tobytes()


def gguf_tensors(path: Path) -> dict:
    r = gguf.GGUFReader(str(path))
    return r, {t.name: t for t in r.tensors}


@pytest.fixture(scope="module")
def to_gguf(tmp_path_factory):
    dst = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    rep = convert_exact(FIXTURE, dst, "gguf")
    return dst, rep


def test_gguf_gpt_oss_names_keys_and_blocks(to_gguf):
    dst, rep = to_gguf
    assert all(r["bit_exact"] for r in rep["tensors"])
    r, t = gguf_tensors(dst)
    assert r.fields["general.architecture"].contents() == "gpt-oss"
    assert r.fields["gpt-oss.expert_count"].contents() == 2
    assert r.fields["gpt-oss.expert_used_count"].contents() == 2
    assert r.fields["gpt-oss.expert_feed_forward_length"].contents() == 64
    assert r.fields["gpt-oss.attention.sliding_window"].contents() == 8
    for L in (0, 1):
        p = f"model.layers.{L}.mlp.experts"
        gu_b, gu_s = u8(f"{p}.gate_up_proj_blocks"), u8(f"{p}.gate_up_proj_scales")
        dn_b, dn_s = u8(f"{p}.down_proj_blocks"), u8(f"{p}.down_proj_scales")
        want = {"ffn_gate_exps": ggml_mxfp4(gu_b[:, 0::2], gu_s[:, 0::2]),
                "ffn_up_exps": ggml_mxfp4(gu_b[:, 1::2], gu_s[:, 1::2]),
                "ffn_down_exps": ggml_mxfp4(dn_b, dn_s)}
        for stem, data in want.items():
            g = t[f"blk.{L}.{stem}.weight"]
            assert g.tensor_type.name == "MXFP4"
            assert [int(x) for x in g.shape] == [64, 64, 2]           # ne = (in, out, expert)
            assert np.asarray(g.data).tobytes() == data
        bias = SRC[f"{p}.gate_up_proj_bias"]
        b = np.frombuffer(bias[2], np.uint16).reshape(bias[1])
        assert np.asarray(t[f"blk.{L}.ffn_gate_exps.bias"].data).view(np.uint16).tobytes() == b[:, 0::2].tobytes()
        assert np.asarray(t[f"blk.{L}.ffn_up_exps.bias"].data).view(np.uint16).tobytes() == b[:, 1::2].tobytes()
        assert np.asarray(t[f"blk.{L}.ffn_down_exps.bias"].data).view(np.uint16).tobytes() \
            == SRC[f"{p}.down_proj_bias"][2]
        sinks = np.frombuffer(SRC[f"model.layers.{L}.self_attn.sinks"][2], np.uint16).astype(np.uint32) << 16
        assert np.array_equal(np.asarray(t[f"blk.{L}.attn_sinks.weight"].data).view(np.uint32), sinks)
        assert f"blk.{L}.ffn_gate_inp.weight" in t and f"blk.{L}.post_attention_norm.weight" in t
    assert not any("gate_up" in n for n in t)


def test_gguf_back_to_gpt_oss_is_the_source_bytes(to_gguf, tmp_path):
    dst, _ = to_gguf
    rep = convert_exact(dst, tmp_path / "back", "gpt-oss")
    assert all(r["bit_exact"] for r in rep["tensors"])
    back = raw_tensors(tmp_path / "back")
    assert set(back) == set(SRC)
    for k, (dtype, shape, data) in SRC.items():
        if len(shape) == 1:  # convert_hf_to_gguf.py writes 1-D tensors F32: widened, same values
            assert back[k][0] == "F32"
            assert np.array_equal(np.frombuffer(back[k][2], np.uint32),
                                  np.frombuffer(data, np.uint16).astype(np.uint32) << 16)
        else:
            assert back[k] == (dtype, shape, data), k
    cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "mxfp4"
    # config.json rebuilt from the GGUF keys: every field the fixture sets away from GptOssConfig's defaults
    src = json.loads((FIXTURE / "config.json").read_text())
    for k in ("architectures", "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "num_local_experts", "num_experts_per_tok",
              "sliding_window", "layer_types", "max_position_embeddings", "rms_norm_eps", "vocab_size",
              "attention_bias", "tie_word_embeddings", "rope_parameters"):
        assert cfg[k] == src[k], k


def test_gguf_round_trip_loads_in_transformers():
    """interop/gpt_oss_gguf_roundtrip.py (transformers 5.24): gpt-oss -> GGUF -> gpt-oss loads with the source's
    parameters and logits exactly."""
    doc = json.loads((DATA / "interop.json").read_text())["gguf_round_trip"]
    assert doc["same_parameter_names"] and doc["max_abs_parameter_diff"] == 0.0
    assert doc["max_abs_logit_diff_round_trip_vs_source"] == 0.0


def test_compressed_tensors_per_expert_linears_and_back(tmp_path):
    rep = convert_exact(FIXTURE, tmp_path / "ct", "compressed-tensors")
    assert all(r["bit_exact"] for r in rep["tensors"])
    ct = raw_tensors(tmp_path / "ct")
    for L in (0, 1):
        p = f"model.layers.{L}.mlp.experts"
        gu_b, gu_s = u8(f"{p}.gate_up_proj_blocks"), u8(f"{p}.gate_up_proj_scales")
        dn_b, dn_s = u8(f"{p}.down_proj_blocks"), u8(f"{p}.down_proj_scales")
        for e in (0, 1):
            for proj, (b, s) in {"gate_proj": (gu_b[e, 0::2], gu_s[e, 0::2]), "up_proj": (gu_b[e, 1::2], gu_s[e, 1::2]),
                                 "down_proj": (dn_b[e], dn_s[e])}.items():
                m = f"{p}.experts.{e}.{proj}"
                rows = b.shape[0]
                # compressed-tensors pack: element 2k low nibble of byte k (the gpt-oss order), [out, in/2]
                assert ct[f"{m}.weight_packed"][2] == np.ascontiguousarray(b).reshape(rows, -1).tobytes()
                assert ct[f"{m}.weight_scale"][2] == np.ascontiguousarray(s).tobytes()
    rep = convert_exact(tmp_path / "ct", tmp_path / "back", "gpt-oss")
    assert all(r["bit_exact"] for r in rep["tensors"])
    back = raw_tensors(tmp_path / "back")
    for k, v in SRC.items():
        if "experts" in k:
            assert back[k] == v, k


def test_stacked_split_then_fuse_is_identity():
    from converter.formats.gpt_oss import stacked
    from converter.formats.registry import load
    src = load(FIXTURE)
    back = stacked.fuse(stacked.split(src))
    assert back.names() == src.names()
    for n in src.quantized_names():
        a, b = src[n], back[n]
        assert np.array_equal(a.codes, b.codes) and a.scales.tobytes() == b.scales.tobytes()
    assert back.metadata["fused"].keys() == src.metadata["fused"].keys()


def test_mlx_switch_glu_mxfp4_and_back(tmp_path):
    """mlx-lm ``gpt_oss`` ``Model.sanitize`` makes ``gate_proj.weight`` = ``gate_up_proj_blocks[..., ::2, :]``
    viewed as uint32 with the last two axes flattened: so the MLX words are the gpt-oss bytes of rows 0::2."""
    rep = convert_exact(FIXTURE, tmp_path / "mlx", "mlx")
    assert all(r["bit_exact"] for r in rep["tensors"])
    mlx = raw_tensors(tmp_path / "mlx")
    cfg = json.loads((tmp_path / "mlx" / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": 32, "bits": 4, "mode": "mxfp4"}
    for L in (0, 1):
        p = f"model.layers.{L}.mlp.experts"
        gu_b, gu_s = u8(f"{p}.gate_up_proj_blocks"), u8(f"{p}.gate_up_proj_scales")
        dn_b, dn_s = u8(f"{p}.down_proj_blocks"), u8(f"{p}.down_proj_scales")
        for proj, (b, s) in {"gate_proj": (gu_b[:, 0::2], gu_s[:, 0::2]), "up_proj": (gu_b[:, 1::2], gu_s[:, 1::2]),
                             "down_proj": (dn_b, dn_s)}.items():
            e, o, g, _ = b.shape
            assert mlx[f"{p}.{proj}.weight"] == ("U32", (e, o, g * 4), np.ascontiguousarray(b).tobytes())
            assert mlx[f"{p}.{proj}.scales"] == ("U8", (e, o, g), np.ascontiguousarray(s).tobytes())
        bias = SRC[f"{p}.gate_up_proj_bias"]
        b = np.frombuffer(bias[2], np.uint16).reshape(bias[1])
        assert mlx[f"{p}.gate_proj.bias"][2] == b[:, 0::2].tobytes()
        assert mlx[f"{p}.up_proj.bias"][2] == b[:, 1::2].tobytes()
        assert mlx[f"{p}.down_proj.bias"][2] == SRC[f"{p}.down_proj_bias"][2]
    rep = convert_exact(tmp_path / "mlx", tmp_path / "back", "gpt-oss")
    assert all(r["bit_exact"] for r in rep["tensors"])
    back = raw_tensors(tmp_path / "back")
    for k, v in SRC.items():
        if "experts" in k:
            assert back[k] == v, k


def test_mlx_interop_figures_recorded():
    """interop/gpt_oss_mlx.py (mlx 0.32.4, mlx-lm 0.32.2 vs transformers 5.24): mlx's own dequantize of the
    written experts equals transformers' decode; float32 logits agree."""
    doc = json.loads((DATA / "interop.json").read_text())["mlx_lm"]
    assert doc["expert_modules"] == ["QuantizedSwitchLinear:mxfp4"]
    assert doc["max_abs_mx_dequantize_minus_convert_moe_packed_tensors"] == 0.0
    assert doc["f32"]["argmax_agreement"] == 1.0 and doc["f32"]["max_abs_logit_diff_mlx_lm_vs_transformers"] < 1e-2


def test_gguf_yarn_rope_keys(to_gguf):
    """The fixture's ``rope_parameters`` (gpt-oss's YaRN: factor 32, original 4096, beta_fast 32, beta_slow 1) as
    ``convert_hf_to_gguf.py`` ``TextModel.set_gguf_parameters`` writes them."""
    r, _ = gguf_tensors(to_gguf[0])
    got = {k: r.fields[k].contents() for k in r.fields if k.startswith("gpt-oss.rope.")}
    assert got == {"gpt-oss.rope.freq_base": 150000.0, "gpt-oss.rope.scaling.type": "yarn",
                   "gpt-oss.rope.scaling.factor": 32.0, "gpt-oss.rope.scaling.original_context_length": 4096,
                   "gpt-oss.rope.scaling.yarn_beta_fast": 32.0, "gpt-oss.rope.scaling.yarn_beta_slow": 1.0}


def test_chain_through_every_arrangement_gives_back_the_source_bytes(tmp_path):
    """gpt-oss -> compressed-tensors (per-expert Linear) -> GGUF (stacked, split) -> MLX (stacked) ->
    compressed-tensors -> gpt-oss (fused, interleaved): every hop proven bit-exact, the experts' bytes unchanged."""
    hops = [(FIXTURE, tmp_path / "ct", "compressed-tensors"), (tmp_path / "ct", tmp_path / "g.gguf", "gguf"),
            (tmp_path / "g.gguf", tmp_path / "mlx", "mlx"), (tmp_path / "mlx", tmp_path / "ct2", "compressed-tensors"),
            (tmp_path / "ct2", tmp_path / "go", "gpt-oss")]
    for src, dst, to in hops:
        rep = convert_exact(src, dst, to)
        assert all(r["bit_exact"] for r in rep["tensors"]), to
    back = raw_tensors(tmp_path / "go")
    assert set(back) == set(SRC)
    for k, v in SRC.items():
        if "experts" in k:
            assert back[k] == v, k
