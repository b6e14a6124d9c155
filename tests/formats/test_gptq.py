"""Tests for converter.formats.gptq.format: real GPTQModel files, CASES.md reproducers, round trips, errors."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from converter.errors import FormatError, MissingTensorError, NotRepresentableError, UnsupportedError
from converter.formats.gptq import format as gptq
from converter.formats.registry import detect, get, load
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, spec_of

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
REAL = ("gptq_w4_g128_sym", "gptq_w4_gchan_sym")


# -- helpers -----------------------------------------------------------------------------------------
def ref_pack(fields: np.ndarray, bits: int) -> list[int]:
    """Independent reference: one LSB-first bit stream of ``fields`` cut into 32-bit words (pure Python)."""
    acc = 0
    for k, v in enumerate(int(x) for x in fields):
        acc |= (v & ((1 << bits) - 1)) << (k * bits)
    n = -(-len(fields) * bits // 32)
    return [(acc >> (32 * w)) & 0xFFFFFFFF for w in range(n)]


def i32(words) -> np.ndarray:
    return np.array(words, dtype=np.uint32).view(np.int32)


def pack_qweight(q_io: np.ndarray, bits: int) -> np.ndarray:
    """Codes stored ``[I, O]`` -> qweight ``[ceil(I*b/32), O]`` via :func:`ref_pack` per column."""
    return i32(np.array([ref_pack(q_io[:, o], bits) for o in range(q_io.shape[1])], dtype=np.uint64).T)


def pack_qzeros(z_go: np.ndarray, bits: int) -> np.ndarray:
    return i32(np.array([ref_pack(z_go[g], bits) for g in range(z_go.shape[0])], dtype=np.uint64))


def make_dir(tmp: Path, tensors: dict, qcfg: dict | None, name: str = "ckpt") -> Path:
    d = tmp / name
    d.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(d / "model.safetensors"))
    if qcfg is not None:
        (d / "config.json").write_text(json.dumps({"model_type": "test", "quantization_config": qcfg}))
    return d


def qcfg(bits=4, group_size=128, sym=True, fmt="gptq_v2", **kw) -> dict:
    return {"quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym, "desc_act": False,
            "checkpoint_format": fmt, **kw}


def layer(q_io, z_go, s_go, bits, g_idx=None, prefix="l", zero_store=None):
    t = {f"{prefix}.qweight": pack_qweight(np.asarray(q_io), bits),
         f"{prefix}.qzeros": zero_store if zero_store is not None else pack_qzeros(np.asarray(z_go), bits),
         f"{prefix}.scales": np.asarray(s_go, dtype=np.float16)}
    if g_idx is not None:
        t[f"{prefix}.g_idx"] = np.asarray(g_idx, dtype=np.int32)
    return t


def f16_bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float16).view(np.uint16)


# -- real samples ----------------------------------------------------------------------------------
@pytest.mark.parametrize("d", REAL)
def test_real_sample_decode_matches_reference_bit_exact(d):
    path = SAMPLES / d
    assert detect(Source(path)).format == "gptq" and detect(Source(path)).confidence == 90
    ck = load(path)
    ref = load_file(str(path / "reference_dequant.safetensors"))
    assert ref  # four tensors: two weights, two biases
    for name, want in ref.items():
        t = ck[name]
        got = t.dequantize().astype(np.float16) if isinstance(t, QuantizedTensor) else t.data
        assert got.shape == want.shape
        assert np.array_equal(f16_bits(got), f16_bits(want)), name  # bit-exact in fp16
    w = ck["encoder.layer.0.output.dense.weight"]
    assert w.shape == (384, 1536) and w.scheme.zero_point is ZeroPoint.NONE and not w.scheme.signed
    if d == "gptq_w4_gchan_sym":
        assert w.group_map.describe() == "channel(out)" and w.scales.shape == (384, 1)
    else:
        assert w.group_map.describe() == "group(in, 128)" and w.scales.shape == (384, 12)  # trivial g_idx dropped
    assert ck.metadata["checkpoint_format"] == "gptq"


def test_real_sample_specs_from_headers():
    ck = load(SAMPLES / "gptq_w4_g128_sym")
    spec = ck.spec("encoder.layer.0.intermediate.dense.weight")
    assert spec.kind == "quantized" and spec.shape == (1536, 384) and spec.axes == (OUT, IN)
    assert spec.scheme == QuantScheme(4, False, ZeroPoint.NONE, "F16") and not spec.act_order
    roles = {a.role: (a.name, a.dtype, a.shape) for a in spec.stored}
    assert roles == {"codes": ("encoder.layer.0.intermediate.dense.qweight", "I32", (48, 1536)),
                     "zero_points": ("encoder.layer.0.intermediate.dense.qzeros", "I32", (3, 192)),
                     "scales": ("encoder.layer.0.intermediate.dense.scales", "F16", (3, 1536)),
                     "g_idx": ("encoder.layer.0.intermediate.dense.g_idx", "I32", (384,))}
    assert ck.spec("pooler.dense.bias").kind == "dense"
    assert len(ck.quantized_names()) == 7 and len(ck) == 14


@pytest.mark.parametrize("d", REAL)
def test_real_sample_write_v1_reproduces_the_files_byte_for_byte(d, tmp_path):
    ck = load(SAMPLES / d)
    out = tmp_path / "out"
    res = get("gptq").write(ck, out, checkpoint_format="gptq")
    orig = load_file(str(SAMPLES / d / "model.safetensors"))
    new = load_file(str(out / "model.safetensors"))
    assert set(orig) == set(new)
    for k in orig:
        assert orig[k].dtype == new[k].dtype and orig[k].shape == new[k].shape, k
        assert orig[k].tobytes() == new[k].tobytes(), k
    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert json.loads((out / "quantize_config.json").read_text()) == qc
    src_qc = json.loads((SAMPLES / d / "config.json").read_text())["quantization_config"]
    for key in ("quant_method", "bits", "group_size", "desc_act", "sym", "checkpoint_format", "format", "pack_dtype"):
        assert qc[key] == src_qc[key], key
    assert cfg["hidden_size"] == 384 and res["tensors"] == 14


@pytest.mark.parametrize("d", REAL)
def test_real_sample_v2_round_trip_bit_exact(d, tmp_path):
    ck = load(SAMPLES / d)
    get("gptq").write(ck, tmp_path / "v2", checkpoint_format="gptq_v2")
    new = load_file(str(tmp_path / "v2" / "model.safetensors"))
    assert {int(w) for w in np.unique(new["pooler.dense.qzeros"].view(np.uint32))} == {0x88888888}
    back = load(tmp_path / "v2")
    assert back.metadata["checkpoint_format"] == "gptq_v2"
    for name in ck.names():
        a, b = ck[name], back[name]
        if isinstance(a, QuantizedTensor):
            assert np.array_equal(a.codes, b.codes) and np.array_equal(f16_bits(a.scales), f16_bits(b.scales))
            assert a.scheme == b.scheme and a.group_map.describe() == b.group_map.describe()
        else:
            assert a.data.tobytes() == b.data.tobytes()


# -- CASES.md B01: v1 vs v2 zero-point convention ------------------------------------------------
B01_Q = np.array([[8, 12], [5, 8], [15, 0], [8, 9]])  # stored [I=4, O=2]
B01_S = [[0.5, 0.25]]


@pytest.mark.parametrize("group_size", [-1, 4, 128])
def test_b01_v2_zero_points_read_as_is(tmp_path, group_size):
    d = make_dir(tmp_path, layer(B01_Q, [[8, 8]], B01_S, 4, g_idx=[0] * 4), qcfg(group_size=group_size))
    t = load(d)["l.weight"]
    assert t.scheme.zero_point is ZeroPoint.NONE
    assert t.dequantize().tolist() == [[0, -1.5, 3.5, 0], [1.0, 0, -2.0, 0.25]]


def test_b01_same_words_labelled_v1_give_the_buggy_values(tmp_path):
    # v2 words read as v1 (z = 9): every element shifted by -s of its column; sym config but non-centre zeros
    d = make_dir(tmp_path, layer(B01_Q, [[8, 8]], B01_S, 4, g_idx=[0] * 4), qcfg(fmt="gptq"))
    t = load(d)["l.weight"]
    assert t.scheme.zero_point is ZeroPoint.INTEGER and t.zero_points.tolist() == [[9], [9]]
    assert t.dequantize().tolist() == [[-0.5, -2.0, 3.0, -0.5], [0.75, -0.25, -2.25, 0]]
    # and the true v1 encoding (stored 7) reads correctly
    d1 = make_dir(tmp_path, layer(B01_Q, [[7, 7]], B01_S, 4, g_idx=[0] * 4), qcfg(fmt="gptq"), name="v1")
    assert load(d1)["l.weight"].dequantize().tolist() == [[0, -1.5, 3.5, 0], [1.0, 0, -2.0, 0.25]]


def test_sym_config_with_off_centre_zeros_is_planned_as_loaded(tmp_path):
    # config says sym, but one zero is 9: the spec (headers + qzeros) and the load agree on INTEGER
    # zero points, and the config claim is kept in declared_scheme for the validator
    d = make_dir(tmp_path, layer(B01_Q, [[8, 9]], B01_S, 4, g_idx=[0] * 4), qcfg(group_size=4))
    ck = load(d)
    spec, t = ck.spec("l.weight"), ck["l.weight"]
    assert spec.scheme == t.scheme == QuantScheme(4, False, ZeroPoint.INTEGER, "F16")
    assert spec.declared_scheme == QuantScheme(4, False, ZeroPoint.NONE, "F16")
    assert t.zero_points.tolist() == [[8], [9]]
    assert t.dequantize().tolist() == [[0, -1.5, 3.5, 0], [0.75, -0.25, -2.25, 0]]
    # all zeros at the centre: symmetric in both, nothing declared apart
    d8 = make_dir(tmp_path, layer(B01_Q, [[8, 8]], B01_S, 4, g_idx=[0] * 4), qcfg(group_size=4), name="c")
    ck8 = load(d8)
    assert ck8.spec("l.weight").scheme == ck8["l.weight"].scheme and ck8.spec("l.weight").declared_scheme is None
    assert ck8.spec("l.weight").scheme.zero_point is ZeroPoint.NONE


def test_sym_config_with_off_centre_zeros_converts_through_the_cli(tmp_path):
    from click.testing import CliRunner
    from converter.cli import main
    d = make_dir(tmp_path, layer(B01_Q, [[8, 9]], B01_S, 4, g_idx=[0] * 4), qcfg(group_size=4))
    out = tmp_path / "out.safetensors"
    r = CliRunner().invoke(main, ["convert", str(d), str(out), "--to", "native"])
    assert r.exit_code == 0, r.output
    back = load(out)["l.weight"]
    assert back.zero_points.tolist() == [[8], [9]]
    assert back.dequantize().tolist() == [[0, -1.5, 3.5, 0], [0.75, -0.25, -2.25, 0]]


def test_missing_checkpoint_format_means_v1(tmp_path):
    cfg = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}
    d = make_dir(tmp_path, layer(B01_Q, [[7, 7]], B01_S, 4), cfg)
    assert load(d)["l.weight"].scheme.zero_point is ZeroPoint.NONE


# -- CASES.md B03: v1 cannot hold a zero point of 0 ---------------------------------------------
B03_Z = [3, 4, 5, 6, 7, 0, 2, 9]


def _b03_layer(zero_words):
    q = np.full((3, 8), 8)
    q[:, 5] = [0, 5, 15]
    s = np.full((1, 8), 0.1)
    return layer(q, None, s, 4, g_idx=[0, 0, 0], zero_store=i32(zero_words).reshape(1, 1))


def test_b03_autogptq_unmasked_word_decodes_like_gptqmodel(tmp_path):
    # AutoGPTQ's unmasked OR of z-1 = -1 gives 0xFFF65432 (columns 6, 7 destroyed at write time).
    assert ref_pack([z - 1 for z in B03_Z[:5]], 4)[0] | (0xFFFFFFFF << 20) & 0xFFFFFFFF == 0xFFF65432
    d = make_dir(tmp_path, _b03_layer([0xFFF65432]), qcfg(fmt="gptq", sym=False))
    t = load(d)["l.weight"]
    # word-level +0x11111111 (GPTQModel convert_gptq_v1_to_v2_format_module): 0x11076543
    assert t.zero_points[:, 0].tolist() == [3, 4, 5, 6, 7, 0, 1, 1]
    s = float(np.float16(0.1))
    np.testing.assert_array_equal(t.dequantize()[5], np.float32([0, 5, 15]) * np.float32(s))  # column 5 correct
    # AutoGPTQ's per-field (f + 1) & 15 reading of the same word
    field = gptq.decode_qzeros(i32([0xFFF65432]).reshape(1, 1), 4, 8, v1=True, v1_rule="field")
    assert field[:, 0].tolist() == [3, 4, 5, 6, 7, 0, 0, 0]


def test_b03_gptqmodel_v1_word_with_borrow_decodes_exactly(tmp_path):
    v2_word = ref_pack(B03_Z, 4)[0]
    assert v2_word == 0x92076543
    v1_word = (v2_word - 0x11111111) % 2**32  # GPTQModel convert_gptq_v2_to_v1_format_module
    assert v1_word == 0x80F65432
    d = make_dir(tmp_path, _b03_layer([v1_word]), qcfg(fmt="gptq", sym=False))
    t = load(d)["l.weight"]
    assert t.zero_points[:, 0].tolist() == B03_Z
    s = np.float32(np.float16(0.1))
    np.testing.assert_array_equal(t.dequantize()[5], np.float32([0, 5, 15]) * s)  # (q - 0) * s, not (q - 16) * s


def test_b03_writing_zero_point_0_as_v1_is_refused(tmp_path):
    d = make_dir(tmp_path, _b03_layer([0x92076543]), qcfg(sym=False))
    ck = load(d)
    with pytest.raises(NotRepresentableError) as e:
        get("gptq").write(ck, tmp_path / "v1", checkpoint_format="gptq")
    msg = str(e.value)
    assert "l.weight" in msg and "out 5, group 0" in msg and "gptq_v2" in msg
    assert not (tmp_path / "v1").exists()
    get("gptq").write(ck, tmp_path / "v2", checkpoint_format="gptq_v2")
    assert load_file(str(tmp_path / "v2" / "model.safetensors"))["l.qzeros"].view(np.uint32).tolist() == [[0x92076543]]
    back = load(tmp_path / "v2")["l.weight"]
    assert back.zero_points[:, 0].tolist() == B03_Z


# -- CASES.md B06: scales stored [G, O] ----------------------------------------------------------
def test_b06_scales_orientation_and_v1_offset(tmp_path):
    S = np.array([[1, 2], [10, 20]], dtype=np.float16)  # logical [O, G]
    stored = S.T  # GPTQ [G, O] = [[1, 10], [2, 20]]
    assert stored.tolist() == [[1, 10], [2, 20]]
    d = make_dir(tmp_path, layer(np.full((4, 2), 9), [[8, 8], [8, 8]], stored, 4, g_idx=[0, 0, 1, 1]),
                 qcfg(group_size=2))
    t = load(d)["l.weight"]
    assert t.dequantize().tolist() == [[1, 1, 2, 2], [10, 10, 20, 20]]
    get("gptq").write(load(d), tmp_path / "w")
    assert load_file(str(tmp_path / "w" / "model.safetensors"))["l.scales"].tolist() == [[1, 10], [2, 20]]
    # v1-stored 7 is zero point 8
    d1 = make_dir(tmp_path, layer(np.array([[0], [8], [15]]), [[7]], [[0.1]], 4, g_idx=[0] * 3),
                  qcfg(fmt="gptq", group_size=-1),
                  name="v1")
    s = np.float32(np.float16(0.1))
    got = load(d1)["l.weight"].dequantize()[0]
    np.testing.assert_array_equal(got, np.float32([-8, 0, 7]) * s)
    np.testing.assert_allclose(got, [-0.8, 0, 0.7], atol=1e-3)


# -- CASES.md B11: act-order g_idx kept ----------------------------------------------------------
def test_b11_act_order_g_idx(tmp_path):
    g_idx = [1, 0, 1, 0]
    q = (8 + np.array([2, 3, 4, 5])).reshape(4, 1)
    d = make_dir(tmp_path, layer(q, [[8], [8]], [[0.1], [1.0]], 4, g_idx=g_idx), qcfg(group_size=2, desc_act=True))
    ck = load(d)
    assert ck.spec("l.weight").act_order
    t = ck["l.weight"]
    assert t.group_map.g_idx.tolist() == g_idx
    np.testing.assert_allclose(t.dequantize()[0], [2.0, 0.3, 4.0, 0.5], rtol=1e-3)
    ignored = t.replace(group_map=GroupMap.per_group(2)).dequantize()[0]
    np.testing.assert_allclose(ignored, [0.2, 0.3, 4.0, 5.0], rtol=1e-3)
    res = get("gptq").write(ck, tmp_path / "w")
    assert res["quantization_config"]["desc_act"] is True
    assert load_file(str(tmp_path / "w" / "model.safetensors"))["l.g_idx"].tolist() == g_idx
    back = load(tmp_path / "w")["l.weight"]
    assert back.group_map.g_idx.tolist() == g_idx and np.array_equal(back.codes, t.codes)


# -- CASES.md B13 / B14: partial final group -----------------------------------------------------
def test_b13_partial_final_group(tmp_path):
    q = (8 + np.array([2, -1, 3, 1, 4, -2])).reshape(6, 1)
    d = make_dir(tmp_path, layer(q, [[8], [8]], [[0.1], [0.5]], 4, g_idx=[0, 0, 0, 0, 1, 1]), qcfg(group_size=4))
    t = load(d)["l.weight"]
    assert t.scales.shape == (1, 2) and t.group_map.g_idx is None
    np.testing.assert_allclose(t.dequantize()[0], [0.2, -0.1, 0.3, 0.1, 2.0, -1.0], rtol=1e-3)
    assert t.dequantize()[0, 4:].tolist() == [2.0, -1.0]  # scale 0.5 for the tail, not 0.1


def test_b14_partial_group_plan_notes_padding(tmp_path):
    K, O = 192, 32
    rng = np.random.default_rng(0)
    q = rng.integers(0, 16, (K, O))
    d = make_dir(tmp_path, layer(q, np.full((2, O), 8), np.ones((2, O)), 4), qcfg(group_size=128))
    ck = load(d)
    spec = ck.spec("l.weight")
    assert spec.shape == (O, K) and spec.group_map.n_groups(spec.shape, spec.axes) == 2
    assert any("padded I = 256" in n for n in spec.notes)
    res = get("gptq").write(ck, tmp_path / "w")
    assert any("padded to 256" in n for n in res["notes"]["l.weight"])


# -- CASES.md B17: per-channel -------------------------------------------------------------------
def test_b17_per_channel_not_all_zero(tmp_path):
    q = np.array([[9, 6], [10, 8], [7, 15], [8, 0]])
    d = make_dir(tmp_path, layer(q, [[8, 8]], [[0.5, 2.0]], 4, g_idx=[0] * 4), qcfg(group_size=-1))
    ck = load(d)
    t = ck["l.weight"]
    assert t.group_map.describe() == "channel(out)" and t.scales.tolist() == [[0.5], [2.0]]
    want = [[0.5, 1.0, -0.5, 0.0], [-4.0, 0.0, 14.0, -16.0]]
    assert t.dequantize().tolist() == want
    res = get("gptq").write(ck, tmp_path / "w")
    assert res["quantization_config"]["group_size"] == -1
    out = load_file(str(tmp_path / "w" / "model.safetensors"))
    assert out["l.qweight"].any() and out["l.scales"].shape == (1, 2) and out["l.g_idx"].tolist() == [0] * 4
    assert load(tmp_path / "w")["l.weight"].dequantize().tolist() == want


# -- synthetic round trips: 2/3/4/8-bit, rectangular, partial groups ----------------------------
def _rand_tensor(bits, O, I, G, *, sym, seed, signed=False, zero_min=0):
    rng = np.random.default_rng(seed)
    gm = GroupMap.per_group(G) if G > 0 else GroupMap.per_channel(OUT)
    scheme = QuantScheme(bits, signed, ZeroPoint.NONE if sym else ZeroPoint.INTEGER, "F16")
    codes = rng.integers(scheme.qmin, scheme.qmax + 1, (O, I)).astype(scheme.code_dtype)
    pshape = gm.param_shape((O, I), (OUT, IN))
    scales = (rng.random(pshape) + 0.01).astype(np.float16)
    zp = None if sym else rng.integers(zero_min, 2 ** bits, pshape).astype(np.uint8)
    return QuantizedTensor("m.layer.weight", (OUT, IN), codes, scales, scheme, gm, zero_points=zp)


@pytest.mark.parametrize("bits,O,I,G", [(2, 37, 70, 32), (3, 33, 53, 16), (3, 20, 96, -1), (4, 45, 19, 8),
                                        (8, 29, 41, 16), (8, 7, 64, -1)])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("sym", [True, False])
def test_round_trip_bits_and_shapes(tmp_path, bits, O, I, G, fmt, sym):
    t = _rand_tensor(bits, O, I, G, sym=sym, seed=bits * 100 + O, zero_min=1 if fmt == "gptq" else 0)
    bias = DenseTensor("m.layer.bias", np.arange(O, dtype=np.float16))
    ck = Checkpoint.from_tensors([t, bias])
    get("gptq").write(ck, tmp_path / "w", checkpoint_format=fmt)
    files = load_file(str(tmp_path / "w" / "model.safetensors"))
    nG = 1 if G < 0 else -(-I // G)
    assert files["m.layer.qweight"].shape == (-(-I * bits // 32), O)
    assert files["m.layer.qzeros"].shape == (nG, -(-O * bits // 32)) and files["m.layer.scales"].shape == (nG, O)
    # independent check of the packing against the pure-Python bit stream
    assert files["m.layer.qweight"][:, 3].view(np.uint32).tolist() == ref_pack(t.codes[3], bits)
    back = load(tmp_path / "w")
    b = back["m.layer.weight"]
    assert b.scheme.zero_point is t.scheme.zero_point and b.scheme.bits == bits
    assert np.array_equal(b.codes, t.codes) and np.array_equal(f16_bits(b.scales), f16_bits(t.scales))
    if not sym:
        assert np.array_equal(b.zero_points, t.zero_points)
    assert np.array_equal(b.dequantize(), t.dequantize())
    assert back["m.layer.bias"].data.tobytes() == bias.data.tobytes()
    # write -> read -> write gives identical bytes
    get("gptq").write(back, tmp_path / "w2", checkpoint_format=fmt)
    again = load_file(str(tmp_path / "w2" / "model.safetensors"))
    assert all(files[k].tobytes() == again[k].tobytes() for k in files)


@pytest.mark.parametrize("bits,words", [(2, [0x55555555]), (4, [0x77777777]), (8, [0x7F7F7F7F]),
                                        (3, [0xDB6DB6DB, 0xB6DB6DB6, 0x6DB6DB6D])])
def test_v1_sym_marker_words(tmp_path, bits, words):
    O = 96  # 3 words at 3 bits, whole words otherwise
    t = _rand_tensor(bits, O, 64, 32, sym=True, seed=1)
    get("gptq").write(Checkpoint.from_tensors([t]), tmp_path / "w", checkpoint_format="gptq")
    qz = load_file(str(tmp_path / "w" / "model.safetensors"))["m.layer.qzeros"].view(np.uint32)
    per = len(words)
    assert qz.shape == (2, -(-O * bits // 32))
    assert qz.reshape(2, -1, per).tolist() == [[words] * (qz.shape[1] // per)] * 2
    assert load(tmp_path / "w")["m.layer.weight"].scheme.zero_point is ZeroPoint.NONE


def test_3bit_v1_zero_0_round_trips_per_field_but_is_refused_on_write(tmp_path):
    # 3-bit v1 is a per-field (z-1) & 7 shift (GPTQModel _correct_gptq_v1_qzeros): stored 7 reads as 0
    z = np.zeros((1, 11), dtype=np.uint8)
    words = pack_qzeros(np.full((1, 11), 7), 3)
    got = gptq.decode_qzeros(words, 3, 11, v1=True)
    assert got.ravel().tolist() == z.ravel().tolist()
    t = _rand_tensor(3, 11, 32, -1, sym=False, seed=3)
    t = t.replace(zero_points=np.zeros_like(t.zero_points))
    with pytest.raises(NotRepresentableError):
        get("gptq").write(Checkpoint.from_tensors([t]), tmp_path / "w", checkpoint_format="gptq")


# -- scheme conversions on write -------------------------------------------------------------------
def test_signed_codes_written_as_unsigned(tmp_path):
    t = _rand_tensor(4, 16, 32, 16, sym=True, seed=5, signed=True)
    assert t.codes.dtype == np.int8 and int(t.codes.min()) < 0
    res = get("gptq").write(Checkpoint.from_tensors([t]), tmp_path / "w")
    b = load(tmp_path / "w")["m.layer.weight"]
    assert not b.scheme.signed and b.scheme.zero_point is ZeroPoint.NONE
    assert np.array_equal(b.codes.astype(np.int16) - 8, t.codes.astype(np.int16))
    assert np.array_equal(b.dequantize(), t.dequantize())
    assert any("signed codes" in n for n in res["notes"]["m.layer.weight"])


def test_bf16_scales_cast_exactly_f32_refused_unless_rounding_allowed(tmp_path):
    t = _rand_tensor(4, 16, 32, 16, sym=True, seed=6)
    tb = t.replace(scales=t.scales.astype(np.float32).astype(ml_dtypes.bfloat16),
                   scheme=t.scheme.replace(scale_dtype="BF16"))
    assert gptq.check_target(spec_of(tb)) is None
    get("gptq").write(Checkpoint.from_tensors([tb]), tmp_path / "bf")
    assert np.array_equal(load(tmp_path / "bf")["m.layer.weight"].dequantize(), tb.dequantize())
    tf = t.replace(scales=t.scales.astype(np.float32) + np.float32(1e-6), scheme=t.scheme.replace(scale_dtype="F32"))
    assert "fp16" in gptq.check_target(spec_of(tf))
    with pytest.raises(NotRepresentableError):
        get("gptq").write(Checkpoint.from_tensors([tf]), tmp_path / "f32")
    res = get("gptq").write(Checkpoint.from_tensors([tf]), tmp_path / "f32r", allow_scale_rounding=True)
    assert "scales rounded to fp16 (not exact)" in res["notes"]["m.layer.weight"]


def test_check_target_reasons():
    base = _rand_tensor(4, 8, 16, 8, sym=True, seed=7)
    ok = spec_of(base)
    assert gptq.check_target(ok) is None
    assert gptq.check_target(spec_of(DenseTensor("b", np.zeros(3, np.float16)))) is None
    from dataclasses import replace
    bad = {
        "codebook": replace(ok, scheme=QuantScheme(4, False, codebook=tuple(range(16)))),
        "bits": replace(ok, scheme=QuantScheme(5, False)),
        "axis": replace(ok, group_map=GroupMap.per_group(8, axis=OUT)),
        "in-channel": replace(ok, group_map=GroupMap.per_channel(IN)),
        "F32": replace(ok, scheme=QuantScheme(4, False, scale_dtype="F32")),
    }
    for k, spec in bad.items():
        assert isinstance(gptq.check_target(spec), str), k
    assert gptq.check_target(replace(ok, group_map=GroupMap.per_tensor())) is None
    # a float bias passes the header check; each group's -bias/scale is checked when encoding
    assert gptq.check_target(replace(ok, scheme=QuantScheme(4, False, ZeroPoint.FLOAT))) is None


def test_float_bias_written_as_integer_zero_or_refused(tmp_path):
    from converter.quant.recode import as_float_bias
    base = _rand_tensor(4, 8, 16, 8, sym=False, seed=11)
    # power-of-two scales: -z*s is exact in fp16, so the float bias form is exact too
    base = base.replace(scales=np.exp2(np.round(np.log2(base.scales.astype(np.float32)))).astype(np.float16))
    fb, exact = as_float_bias(base)
    assert exact
    res = get("gptq").write(Checkpoint.from_tensors([fb]), tmp_path / "ok")
    back = get("gptq").read(Source(tmp_path / "ok"))[base.name]
    assert np.array_equal(back.codes, base.codes) and np.array_equal(back.zero_points, base.zero_points)
    assert np.array_equal(back.scales, base.scales) and not res["quantization_config"]["sym"]
    shifted = fb.zero_points.astype(np.float32) + 0.25 * fb.scales.astype(np.float32)
    off = fb.replace(zero_points=shifted.astype(np.float16))
    with pytest.raises(NotRepresentableError, match="float bias is not an integer zero point"):
        get("gptq").write(Checkpoint.from_tensors([off]), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()
    # integer zero points that all equal the centre 8 are written as sym: true (same qzeros)
    sym = _rand_tensor(4, 8, 16, 8, sym=True, seed=12)
    from converter.quant.recode import as_integer_zero
    res = get("gptq").write(Checkpoint.from_tensors([as_integer_zero(sym)]), tmp_path / "sym")
    assert res["quantization_config"]["sym"] is True


def test_mixed_bits_refused(tmp_path):
    a = _rand_tensor(4, 8, 32, 16, sym=True, seed=8)
    b = _rand_tensor(8, 8, 32, 16, sym=True, seed=9).replace(name="m.other.weight")
    with pytest.raises(NotRepresentableError, match="one bits/group_size"):
        get("gptq").write(Checkpoint.from_tensors([a, b]), tmp_path / "w")


# -- detection and bad input -------------------------------------------------------------------------
def test_detect_by_tensor_names_only_and_infer_bits(tmp_path):
    d = make_dir(tmp_path, layer(B01_Q, [[8, 8]], B01_S, 4, g_idx=[0] * 4), None)
    det = detect(Source(d))
    assert det.format == "gptq" and det.confidence == 60
    awq = make_dir(tmp_path, layer(B01_Q, [[8, 8]], B01_S, 4), {"quant_method": "awq"}, name="awq")
    assert gptq.detect_gptq(Source(awq)) is None


def test_qweight_without_partner_is_missing_tensor(tmp_path):
    for partner in ("scales", "qzeros"):
        t = layer(B01_Q, [[8, 8]], B01_S, 4)
        del t[f"l.{partner}"]
        d = make_dir(tmp_path, t, qcfg(), name=partner)
        with pytest.raises(MissingTensorError) as e:
            load(d)
        assert e.value.tensor == "l.qweight" and e.value.expected == f"l.{partner}"
        assert "model.safetensors" in str(e.value)
    t = layer(B01_Q, [[8, 8]], B01_S, 4)
    del t["l.qweight"]
    d = make_dir(tmp_path, t, qcfg(), name="orphan")
    with pytest.raises(MissingTensorError, match="l.qweight"):
        load(d)


def test_bits_config_contradicting_shapes(tmp_path):
    # (tiny shapes such as I=4, O=2 pack into one word at 4 and 8 bits alike, so use I=64, O=16)
    d = make_dir(tmp_path, layer(np.full((64, 16), 8), np.full((1, 16), 8), np.ones((1, 16)), 4, g_idx=[0] * 64),
                 qcfg(bits=8))
    with pytest.raises(FormatError) as e:
        load(d)
    assert e.value.tensor == "l.qweight" and e.value.field == "shape"
    assert e.value.expected == [16, 16] and e.value.found == [8, 16] and "8-bit" in str(e.value)


def test_group_size_config_contradicting_scales(tmp_path):
    d = make_dir(tmp_path, layer(np.full((64, 8), 8), np.full((2, 8), 8), np.ones((2, 8)), 4), qcfg(group_size=16))
    with pytest.raises(FormatError) as e:
        load(d)
    assert e.value.tensor == "l.scales" and e.value.expected == [4, 8] and e.value.found == [2, 8]
    d2 = make_dir(tmp_path, layer(np.full((64, 8), 8), np.full((2, 8), 8), np.ones((2, 8)), 4),
                  qcfg(group_size=-1), name="perchan")
    with pytest.raises(FormatError, match="one group"):
        load(d2)


def test_g_idx_out_of_range(tmp_path):
    d = make_dir(tmp_path, layer(B01_Q, [[8, 8]], B01_S, 4, g_idx=[0, 0, 1, 0]), qcfg(group_size=4))
    ck = load(d)
    with pytest.raises(FormatError) as e:
        ck["l.weight"]
    assert e.value.tensor == "l.g_idx" and e.value.expected == "[0, 1)"


def test_unsupported_layouts_and_contradicting_format_keys(tmp_path):
    d = make_dir(tmp_path, layer(B01_Q, [[8, 8]], B01_S, 4), qcfg(fmt="marlin"))
    with pytest.raises(UnsupportedError):
        load(d)
    d2 = make_dir(tmp_path, layer(B01_Q, [[8, 8]], B01_S, 4), {**qcfg(), "format": "gptq"}, name="clash")
    with pytest.raises(FormatError, match="disagree"):
        load(d2)
    d3 = make_dir(tmp_path, layer(B01_Q, [[8, 8]], B01_S, 4), qcfg(bits=5), name="b5")
    with pytest.raises(UnsupportedError):
        load(d3)


def test_dynamic_override_per_module(tmp_path):
    t = {**layer(B01_Q, [[8, 8]], B01_S, 4, g_idx=[0] * 4, prefix="a"),
         **layer(np.full((4, 2), 200), [[128, 128]], B01_S, 8, g_idx=[0] * 4, prefix="b")}
    d = make_dir(tmp_path, t, qcfg(dynamic={"+:^b$": {"bits": 8}}))
    ck = load(d)
    assert ck["a.weight"].scheme.bits == 4 and ck["b.weight"].scheme.bits == 8
    assert ck["b.weight"].dequantize().tolist() == [[36.0] * 4, [18.0] * 4]


def test_sharded_write_and_extra_files_round_trip(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for f in ("config.json", "quantize_config.json", "model.safetensors"):
        (src / f).write_bytes((SAMPLES / "gptq_w4_g128_sym" / f).read_bytes())
    (src / "tokenizer.json").write_text("{}")
    ck = load(src)
    res = get("gptq").write(ck, tmp_path / "sh", max_shard_bytes=200_000)
    assert "model.safetensors.index.json" in res["files"] and "tokenizer.json" in res["files"]
    back = load(tmp_path / "sh")
    assert len(Source(tmp_path / "sh").files) > 1
    for name in ck.quantized_names():
        assert np.array_equal(ck[name].codes, back[name].codes)
        assert np.array_equal(f16_bits(ck[name].scales), f16_bits(back[name].scales))


# -- conformance (tests/formats/conformance.py) ------------------------------------------------------
from tests.formats.conformance import QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance  # noqa: E402
from tests.conftest import SAMPLES as _SAMPLES  # noqa: E402


class TestGPTQConformance(QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance):
    FORMAT = "gptq"
    SAMPLES = tuple((_SAMPLES / d, _SAMPLES / d / "reference_dequant.safetensors")
                    for d in ("gptq_w4_g128_sym", "gptq_w4_gchan_sym"))


def test_output_keeps_the_source_checkpoint_format_unless_told(tmp_path):
    """Issue 17: a GPTQ repack kept v1 only when asked; now the source's format is the default."""
    from click.testing import CliRunner
    from converter.cli import main

    def fmt(d):
        return json.loads((d / "config.json").read_text())["quantization_config"]["checkpoint_format"]

    v1_sample = SAMPLES / "gptq_w4_g128_sym"
    assert load(v1_sample).metadata["checkpoint_format"] == "gptq"  # GPTQModel v1 sample
    get("gptq").write(load(v1_sample), tmp_path / "keep")
    assert fmt(tmp_path / "keep") == "gptq"
    assert load(tmp_path / "keep")["pooler.dense.weight"].dequantize().tolist() == \
        load(v1_sample)["pooler.dense.weight"].dequantize().tolist()
    get("gptq").write(load(tmp_path / "keep"), tmp_path / "v2", checkpoint_format="gptq_v2")
    get("gptq").write(load(tmp_path / "v2"), tmp_path / "v2again")  # a v2 source stays v2
    assert fmt(tmp_path / "v2again") == "gptq_v2"
    run = CliRunner().invoke
    assert run(main, ["convert", str(tmp_path / "v2"), str(tmp_path / "cli_v1"), "--to", "gptq", "--gptq-format",
                      "v1"]).exit_code == 0
    assert fmt(tmp_path / "cli_v1") == "gptq"
    r = run(main, ["convert", str(v1_sample), str(tmp_path / "cli_req"), "--to", "gptq", "--bits", "8",
                   "--per-channel", "--gptq-format", "v2"])
    assert r.exit_code == 0, r.output
    assert fmt(tmp_path / "cli_req") == "gptq_v2"
    r = run(main, ["convert", str(v1_sample), str(tmp_path / "awq"), "--to", "awq", "--gptq-format", "v1"])
    assert r.exit_code == 2 and "--gptq-format" in r.output and not (tmp_path / "awq").exists()
    # a float source gets v2 (GPTQModel's default)
    r = run(main, ["quantize", str(SAMPLES / "minilm_fp16.safetensors"), str(tmp_path / "q"), "--bits", "4",
                   "--group-size", "128", "--to", "gptq"])
    assert r.exit_code == 0 and fmt(tmp_path / "q") == "gptq_v2"


def test_a_requantized_v1_source_stays_v1_and_a_zero_point_0_names_the_option(tmp_path):
    """Issue 17: the source's checkpoint_format is kept through a requantization too (the requantize view names
    the format it came from); v1 cannot hold a zero point of 0 (CASES.md B03), so an asymmetric requantization
    of a group of non-negative weights (z = round(-min/s) = 0) is refused, naming --gptq-format v2."""
    from click.testing import CliRunner
    from safetensors.numpy import save_file
    from converter.cli import main
    run = CliRunner().invoke
    w = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    w[:8] = np.abs(w[:8])  # the first rows' groups are all >= 0: their asymmetric zero point is 0
    save_file({"l.weight": w}, str(tmp_path / "w.safetensors"))
    r = run(main, ["quantize", str(tmp_path / "w.safetensors"), str(tmp_path / "v1"), "--bits", "4",
                   "--group-size", "32", "--to", "gptq", "--gptq-format", "v1", "--include", "l.weight"])
    assert r.exit_code == 0, r.output
    fmt = lambda d: json.loads((d / "config.json").read_text())["quantization_config"]["checkpoint_format"]  # noqa: E731
    assert fmt(tmp_path / "v1") == "gptq"
    r = run(main, ["convert", str(tmp_path / "v1"), str(tmp_path / "w8"), "--to", "gptq", "--bits", "8",
                   "--per-channel"])
    assert r.exit_code == 0, r.output
    assert fmt(tmp_path / "w8") == "gptq"  # kept through the requantization
    r = run(main, ["convert", str(tmp_path / "v1"), str(tmp_path / "asym"), "--to", "gptq", "--bits", "4",
                   "--group-size", "64", "--asym"])  # new groups: a real requantization (g32 sym would carry z = 8)
    assert r.exit_code == 3 and "cannot hold a zero point of 0" in r.output and "--gptq-format v2" in r.output
    assert not (tmp_path / "asym").exists()
    r = run(main, ["convert", str(tmp_path / "v1"), str(tmp_path / "asym"), "--to", "gptq", "--bits", "4",
                   "--group-size", "64", "--asym", "--gptq-format", "v2"])
    assert r.exit_code == 0 and fmt(tmp_path / "asym") == "gptq_v2"


def test_a_suggested_command_line_keeps_the_writer_options(tmp_path):
    """Review finding: the complete command line of a refusal dropped --gptq-format (following it silently wrote
    another checkpoint format); it keeps the writer options the user gave, and works as given."""
    import shlex

    from click.testing import CliRunner
    from converter.cli import main
    from converter.ops.command_line import command_line
    from converter.quant.target import Target
    line = command_line("a", "b", "gguf", Target(bits=8, granularity="group", group_size=32),
                        write_options={"gguf_metadata": "vocab.gguf"})
    assert line.endswith("--gguf-metadata vocab.gguf")
    src = SAMPLES / "gptq_w4_g128_sym"
    r = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "o"), "--to", "gptq", "--bits", "5",
                                  "--gptq-format", "v2", "--json"])
    assert r.exit_code == 3
    hint = json.loads(r.output)["hint"]
    words = shlex.split(hint[hint.index("qckpt convert"):])
    assert words[words.index("--gptq-format") + 1] == "v2"
    r = CliRunner().invoke(main, words[1:])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "o" / "config.json").read_text())["quantization_config"]["checkpoint_format"] \
        == "gptq_v2"
