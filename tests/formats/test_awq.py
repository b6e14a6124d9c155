"""AWQ reader/writer: real AutoAWQ sample, hand-computed cases (CASES.md B06, B09), round trips, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from converter.errors import FormatError, MissingTensorError, NotRepresentableError, UnsupportedError
from converter.formats import awq
from converter.formats.registry import detect, get, load
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.layout import IN, OUT, AxisMap
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, spec_of

SAMPLE = Path(__file__).resolve().parents[2] / "sample_checkpoints" / "awq_gemm_w4_g128_zp"
REF_NAMES = ("encoder.layer.0.attention.self.query.weight", "encoder.layer.0.output.dense.weight")
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ packing_utils.AWQ_ORDER, written out independently here
U4 = QuantScheme(4, False, ZeroPoint.INTEGER, "F16")


# -- helpers (independent of converter.kernels.packing) ----------------------------------------
def awq_pack_rows(vals: np.ndarray) -> np.ndarray:
    """[r, 8c] nibble values -> [r, c] int32 words, nibble k = column 8c + ORDER[k]."""
    v = vals.astype(np.uint32).reshape(vals.shape[0], -1, 8)[:, :, list(ORDER)]
    return (v << (4 * np.arange(8, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32).view(np.int32)


def awq_unpack_rows(words: np.ndarray) -> np.ndarray:
    w = words.view(np.uint32)[:, :, None] >> (4 * np.arange(8, dtype=np.uint32))
    nib = (w & 0xF).astype(np.uint8)
    out = np.empty_like(nib)
    out[:, :, list(ORDER)] = nib
    return out.reshape(words.shape[0], -1)


def seq_pack_rows(vals: np.ndarray) -> np.ndarray:
    """[r, 8c] -> [r, c] int32, nibble k = column 8c + k (GEMV / GPTQ order)."""
    v = vals.astype(np.uint32).reshape(vals.shape[0], -1, 8)
    return (v << (4 * np.arange(8, dtype=np.uint32))).sum(axis=-1, dtype=np.uint32).view(np.int32)


def make_dir(path: Path, tensors: dict, qc: dict | None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path / "model.safetensors"),
              metadata={"format": "pt"})
    cfg = {"model_type": "test"}
    if qc is not None:
        cfg["quantization_config"] = qc
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def qc(**kw) -> dict:
    base = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    base.update(kw)
    return base


def gemm_arrays(codes: np.ndarray, zeros: np.ndarray, scales: np.ndarray, prefix: str = "l") -> dict:
    """Logical codes [O, I], zeros [O, nG], scales [O, nG] -> AWQ GEMM tensors (test-side packer)."""
    return {f"{prefix}.qweight": awq_pack_rows(codes.T), f"{prefix}.qzeros": awq_pack_rows(zeros.T),
            f"{prefix}.scales": np.ascontiguousarray(scales.T.astype(np.float16))}


def write_read(tensors, tmp_path, name="out"):
    ck = Checkpoint.from_tensors(tensors, config={"model_type": "test"})
    get("awq").write(ck, tmp_path / name)
    return load(tmp_path / name), tmp_path / name


# -- real sample ----------------------------------------------------------------------------
def test_detect_real_sample():
    d = detect(Source(SAMPLE))
    assert (d.format, d.confidence) == ("awq", 90)


def test_real_sample_matches_autoawq_reference_bit_exact():
    """dequant in float32 then one cast to fp16 equals AutoAWQ's fp16 ``dequantize_gemm``: (q - z) is an
    exact small integer and the fp16 * int product is exact in float32, so both round once."""
    ck = load(SAMPLE)
    ref = load_file(str(SAMPLE / "reference_dequant.safetensors"))
    for name in REF_NAMES:
        t = ck[name]
        assert t.scheme == U4 and t.group_map.group_size == 128 and t.group_map.axis == IN
        ours = t.dequantize().astype(np.float16)
        assert ours.shape == ref[name].shape
        assert np.array_equal(ours.view(np.uint16), ref[name].view(np.uint16))
        bias = name[:-len(".weight")] + ".bias"
        assert np.array_equal(ck[bias].data.view(np.uint16), ref[bias].view(np.uint16))


def test_real_sample_wrong_interleave_does_not_match():
    """Sequential nibble order (the B09 bug) on the real file misses the reference."""
    src = Source(SAMPLE)
    name = REF_NAMES[0]
    p = name[:-len(".weight")]
    wrong = AxisMap((IN, OUT), packed_axis=OUT, bits=4, container="I32")
    codes = wrong.to_logical(src.read(p + ".qweight"), (OUT, IN), {OUT: 384, IN: 384})
    good = load(SAMPLE)[name]
    bad = good.replace(codes=codes).dequantize().astype(np.float16)
    ref = load_file(str(SAMPLE / "reference_dequant.safetensors"))[name]
    assert not np.array_equal(bad, ref)


def test_real_sample_round_trip_byte_exact(tmp_path):
    ck = load(SAMPLE)
    summary = get("awq").write(ck, tmp_path / "rt")
    assert "model.safetensors" in summary["files"]
    orig = load_file(str(SAMPLE / "model.safetensors"))
    new = load_file(str(tmp_path / "rt" / "model.safetensors"))
    assert set(orig) == set(new)
    for k in orig:
        assert orig[k].dtype == new[k].dtype and orig[k].shape == new[k].shape, k
        assert orig[k].tobytes() == new[k].tobytes(), k
    cfg = json.loads((tmp_path / "rt" / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
                                          "version": "gemm", "modules_to_not_convert": None}
    assert cfg["hidden_size"] == 384
    ck2 = load(tmp_path / "rt")
    for name in ck.quantized_names():
        a, b = ck[name], ck2[name]
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales.view(np.uint16), b.scales.view(np.uint16))
        assert np.array_equal(a.zero_points, b.zero_points)


def test_name_only_detection_and_inferred_config(tmp_path):
    arrays = load_file(str(SAMPLE / "model.safetensors"))
    d = make_dir(tmp_path / "noconf", arrays, None)
    det = detect(Source(d))
    assert (det.format, det.confidence) == ("awq", 60)
    a, b = load(SAMPLE), load(d, format="awq")
    t = b[REF_NAMES[1]]
    assert t.group_map.group_size == 128
    assert np.array_equal(t.dequantize(), a[REF_NAMES[1]].dequantize())


def test_gptq_shapes_not_detected_as_awq(tmp_path):
    # GPTQ: qweight [I/8, O], scales [nG, O] -> scales.shape[1] == qweight.shape[1]
    d = make_dir(tmp_path / "g", {"l.qweight": np.zeros((2, 16), np.int32), "l.qzeros": np.zeros((1, 2), np.int32),
                                  "l.scales": np.ones((1, 16), np.float16)}, None)
    assert awq.detect_awq(Source(d)) is None


# -- CASES.md B09: linear vs AWQ nibble order ------------------------------------------------
B09_RIGHT = np.array([-3.5, -3.0, -2.5, -2.0, -1.5, -1.0, -0.5, 0.0], np.float32)
B09_BUGGY = np.array([-3.5, -1.5, -3.0, -1.0, -2.5, -0.5, -2.0, 0.0], np.float32)


def _b09_dir(tmp_path, word: int, name: str) -> Path:
    # O=8, I=1, per channel (group_size -1): qweight [I=1, O/8=1], qzeros [1, 1], scales [1, 8]
    return make_dir(tmp_path / name, {"l.qweight": np.array([[word]], np.uint32).view(np.int32),
                                      "l.qzeros": np.array([[0x88888888]], np.uint32).view(np.int32),
                                      "l.scales": np.full((1, 8), 0.5, np.float16)}, qc(group_size=-1))


def test_b09_awq_packed_word_decodes_right(tmp_path):
    t = load(_b09_dir(tmp_path, 0x86427531, "awq"))["l.weight"]
    assert t.codes[:, 0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert np.array_equal(t.dequantize()[:, 0], B09_RIGHT)


def test_b09_linear_packed_word_is_scrambled_by_awq_order(tmp_path):
    t = load(_b09_dir(tmp_path, 0x87654321, "lin"))["l.weight"]
    assert t.codes[:, 0].tolist() == [1, 5, 2, 6, 3, 7, 4, 8]
    assert np.array_equal(t.dequantize()[:, 0], B09_BUGGY)


def test_b09_writer_packs_awq_order(tmp_path):
    codes = np.arange(1, 9, dtype=np.uint8)[:, None]
    t = QuantizedTensor("l.weight", (OUT, IN), codes, np.full((8, 1), 0.5, np.float16), U4,
                        GroupMap.per_channel(OUT), zero_points=np.full((8, 1), 8, np.int16))
    back, d = write_read([t], tmp_path)
    raw = load_file(str(d / "model.safetensors"))
    assert int(raw["l.qweight"].view(np.uint32)[0, 0]) == 0x86427531
    assert int(raw["l.qzeros"].view(np.uint32)[0, 0]) == 0x88888888
    assert json.loads((d / "config.json").read_text())["quantization_config"]["group_size"] == -1
    assert np.array_equal(back["l.weight"].dequantize()[:, 0], B09_RIGHT)


# -- CASES.md B06: GPTQ -> AWQ orientation and zero offset --------------------------------------
def test_b06_gptq_to_awq_mixed_scales(tmp_path):
    """Logical S = [[1,2],[10,20], ...] (GPTQ stores [G,O] = [[1,10,..],[2,20,..]]); (q - z) = 1."""
    O, I, G = 8, 4, 2
    gptq_scales = np.array([[1, 10, 100, 1000, 0.5, 0.25, 4, 8],
                            [2, 20, 200, 2000, 1.0, 0.5, 8, 16]], np.float16)  # [G, O] as stored by GPTQ
    scales = AxisMap((IN, OUT)).to_logical(gptq_scales, (OUT, IN), {OUT: O, IN: 2})  # what a GPTQ reader yields
    assert scales[:2].tolist() == [[1, 2], [10, 20]]
    v1_zero = np.full((O, 2), 7, np.int16)  # GPTQ v1 stores z - 1
    t = QuantizedTensor("l.weight", (OUT, IN), np.full((O, I), 9, np.uint8), np.ascontiguousarray(scales), U4,
                        GroupMap.per_group(G), zero_points=v1_zero + 1)
    back, d = write_read([t], tmp_path)
    raw = load_file(str(d / "model.safetensors"))
    assert raw["l.scales"].shape == (2, 8) and np.array_equal(raw["l.scales"], gptq_scales)  # AWQ is [nG, O] too
    assert raw["l.qweight"].shape == (4, 1) and raw["l.qzeros"].shape == (2, 1)
    w = back["l.weight"].dequantize()
    assert w[:2].tolist() == [[1, 1, 2, 2], [10, 10, 20, 20]]
    assert w[:2].tolist() != [[1, 1, 10, 10], [2, 2, 20, 20]]  # the copied-[G,O]-into-[O,G] bug


def test_b06_zero_offset(tmp_path):
    """v1-stored 7 is zero 8: q = [0, 8, 15], s = 0.1 -> [-0.8, 0, 0.7] (s is fp16(0.1))."""
    s16 = np.float16(0.1)
    codes = np.tile(np.array([0, 8, 15], np.uint8), (8, 1))
    t = QuantizedTensor("l.weight", (OUT, IN), codes, np.full((8, 1), s16, np.float16), U4,
                        GroupMap.per_channel(OUT), zero_points=np.full((8, 1), 7 + 1, np.int16))
    back, _ = write_read([t], tmp_path)
    row = back["l.weight"].dequantize()[0]
    assert np.array_equal(row, np.array([-8, 0, 7], np.float32) * np.float32(s16))
    assert np.allclose(row, [-0.8, 0.0, 0.7], atol=1e-3)
    assert not np.allclose(row, [-0.7, 0.1, 0.8], atol=1e-2)


# -- rectangular orientation probe ----------------------------------------------------------------
def test_rectangular_orientation(tmp_path):
    """O=16, I=48, G=16: power-of-two scales by row and by group; distinct codes; stored layout
    checked with the test's own unpacker, and a transposed / wrong-axis reading fails."""
    O, I, G = 16, 48, 16
    rng = np.random.default_rng(7)
    codes = rng.integers(0, 16, (O, I), dtype=np.uint8)
    zeros = rng.integers(0, 16, (O, I // G)).astype(np.int16)
    scales = (2.0 ** (np.arange(O)[:, None] - 8 + 3 * np.arange(I // G)[None, :])).astype(np.float16)
    t = QuantizedTensor("m.proj.weight", (OUT, IN), codes, scales, U4, GroupMap.per_group(G), zero_points=zeros)
    bias = DenseTensor("m.proj.bias", np.arange(O, dtype=np.float16))
    back, d = write_read([t, bias], tmp_path)
    raw = load_file(str(d / "model.safetensors"))
    assert raw["m.proj.qweight"].shape == (I, O // 8) and raw["m.proj.qweight"].dtype == np.int32
    assert raw["m.proj.qzeros"].shape == (I // G, O // 8) and raw["m.proj.scales"].shape == (I // G, O)
    assert np.array_equal(awq_unpack_rows(raw["m.proj.qweight"]), codes.T)
    assert np.array_equal(awq_unpack_rows(raw["m.proj.qzeros"]), zeros.T)
    assert np.array_equal(raw["m.proj.scales"], scales.T)
    assert np.array_equal(raw["m.proj.bias"], bias.data)
    r = back["m.proj.weight"]
    assert np.array_equal(r.codes, codes) and np.array_equal(r.zero_points, zeros)
    expected = (codes.astype(np.float32) - np.repeat(zeros, G, 1)) * np.repeat(scales.astype(np.float32), G, 1)
    assert np.array_equal(r.dequantize(), expected)
    # a hand-built file from the test packer decodes identically
    d2 = make_dir(tmp_path / "hand", {**gemm_arrays(codes, zeros, scales, "m.proj"), "m.proj.bias": bias.data},
                  qc(group_size=G))
    assert np.array_equal(load(d2)["m.proj.weight"].dequantize(), expected)


# -- symmetric (zero_point false), signed and float-bias sources ---------------------------------
def _sym_arrays(with_zeros: bool, zero_value: int = 8):
    O, I = 8, 32
    codes = (np.arange(O * I) % 16).reshape(O, I).astype(np.uint8)
    scales = np.full((O, 2), 0.25, np.float16)
    arr = gemm_arrays(codes, np.full((O, 2), zero_value), scales)
    if not with_zeros:
        del arr["l.qzeros"]
    return arr, codes


@pytest.mark.parametrize("with_zeros", [False, True])
def test_zero_point_false_reads_symmetric(tmp_path, with_zeros):
    arr, codes = _sym_arrays(with_zeros)
    t = load(make_dir(tmp_path / "s", arr, qc(group_size=16, zero_point=False)))["l.weight"]
    assert t.scheme.zero_point is ZeroPoint.NONE and t.zero_points is None and not t.scheme.signed
    assert np.array_equal(t.dequantize(), (codes.astype(np.float32) - 8) * 0.25)


def test_zero_point_false_contradicted_by_qzeros(tmp_path):
    arr, _ = _sym_arrays(True, zero_value=7)
    ck = load(make_dir(tmp_path / "s", arr, qc(group_size=16, zero_point=False)))
    with pytest.raises(FormatError) as ei:
        ck["l.weight"]
    e = ei.value
    assert e.tensor == "l.qzeros" and e.field == "quantization_config.zero_point" and "model.safetensors" in e.file


def test_symmetric_written_with_explicit_zeros(tmp_path):
    codes = (np.arange(64) % 16).reshape(8, 8).astype(np.uint8)
    t = QuantizedTensor("l.weight", (OUT, IN), codes, np.full((8, 1), 0.5, np.float16),
                        QuantScheme(4, False, ZeroPoint.NONE, "F16"), GroupMap.per_group(8))
    back, d = write_read([t], tmp_path)
    raw = load_file(str(d / "model.safetensors"))
    assert (raw["l.qzeros"].view(np.uint32) == 0x88888888).all()
    assert json.loads((d / "config.json").read_text())["quantization_config"]["zero_point"] is True
    assert np.array_equal(back["l.weight"].dequantize(), t.dequantize())


def test_signed_compressed_tensors_style_scheme(tmp_path):
    rng = np.random.default_rng(1)
    codes = rng.integers(-8, 8, (16, 32)).astype(np.int8)
    scales = rng.uniform(0.01, 1, (16, 2)).astype(np.float16)
    sym = QuantizedTensor("a.weight", (OUT, IN), codes, scales, QuantScheme(4, True, ZeroPoint.NONE, "F16"),
                          GroupMap.per_group(16))
    asym = QuantizedTensor("b.weight", (OUT, IN), codes, scales, QuantScheme(4, True, ZeroPoint.INTEGER, "F16"),
                           GroupMap.per_group(16), zero_points=rng.integers(-8, 8, (16, 2)).astype(np.int16))
    back, _ = write_read([sym, asym], tmp_path)
    for t in (sym, asym):
        r = back[t.name]
        assert r.scheme == U4
        assert np.array_equal(r.codes, (t.codes.astype(np.int16) + 8).astype(np.uint8))
        assert np.array_equal(r.dequantize(), t.dequantize())


def test_float_bias_exact_and_inexact(tmp_path):
    codes = (np.arange(64) % 16).reshape(8, 8).astype(np.uint8)
    s = np.full((8, 1), 0.5, np.float16)
    fscheme = QuantScheme(4, False, ZeroPoint.FLOAT, "F16")
    exact = QuantizedTensor("l.weight", (OUT, IN), codes, s, fscheme, GroupMap.per_group(8),
                            zero_points=np.full((8, 1), -3.0, np.float16))  # z = 6
    back, _ = write_read([exact], tmp_path)
    assert np.array_equal(back["l.weight"].zero_points, np.full((8, 1), 6))
    assert np.array_equal(back["l.weight"].dequantize(), exact.dequantize())
    inexact = exact.replace(zero_points=np.full((8, 1), -3.1, np.float16))
    with pytest.raises(NotRepresentableError):
        write_read([inexact], tmp_path, "bad")


# -- GEMV read ---------------------------------------------------------------------------------
def _gemv(O=64, I=256, G=128, pad_scale=0.0, pad_zero=0):
    rng = np.random.default_rng(3)
    nG = I // G
    codes = rng.integers(0, 16, (O, I)).astype(np.uint8)
    zeros = rng.integers(0, 16, (O, nG)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (O, nG)).astype(np.float16)
    zw = 1  # calculate_zeros_width(256, 128) = ceil(2 / 8) = 1
    zpad = np.full((O, zw * 8), pad_zero, np.uint8)
    zpad[:, :nG] = zeros
    spad = np.full((O, zw * 8), pad_scale, np.float16)
    spad[:, :nG] = scales
    arr = {"l.qweight": seq_pack_rows(codes), "l.qzeros": seq_pack_rows(zpad), "l.scales": spad}
    return arr, codes, zeros, scales


def test_gemv_read(tmp_path):
    arr, codes, zeros, scales = _gemv()
    assert arr["l.qweight"].shape == (64, 32) and arr["l.qzeros"].shape == (64, 1) and arr["l.scales"].shape == (64, 8)
    ck = load(make_dir(tmp_path / "v", arr, qc(version="gemv")))
    t = ck["l.weight"]
    assert t.shape == (64, 256)
    assert np.array_equal(t.codes, codes) and np.array_equal(t.zero_points, zeros)
    assert np.array_equal(t.scales, scales)
    expected = (codes.astype(np.float32) - np.repeat(zeros, 128, 1)) * np.repeat(scales.astype(np.float32), 128, 1)
    assert np.array_equal(t.dequantize(), expected)
    # GEMV -> GEMM write keeps the values
    get("awq").write(ck, tmp_path / "gemm")
    assert np.array_equal(load(tmp_path / "gemm")["l.weight"].dequantize(), expected)


@pytest.mark.parametrize("kw,tensor", [({"pad_scale": 1.0}, "l.scales"), ({"pad_zero": 3}, "l.qzeros")])
def test_gemv_nonzero_padding(tmp_path, kw, tensor):
    arr, *_ = _gemv(**kw)
    ck = load(make_dir(tmp_path / "v", arr, qc(version="gemv")))
    with pytest.raises(FormatError) as ei:
        ck["l.weight"]
    assert ei.value.tensor == tensor and ei.value.field == "padding"


def test_gemv_scales_shape_checked(tmp_path):
    arr, *_ = _gemv()
    arr["l.scales"] = arr["l.scales"][:, :2].copy()  # unpadded [O, nG]
    with pytest.raises(FormatError) as ei:
        load(make_dir(tmp_path / "v", arr, qc(version="gemv")))
    assert ei.value.tensor == "l.scales" and ei.value.expected == [64, 8]


# -- bad input -------------------------------------------------------------------------------------
def _good_gemm():
    codes = np.zeros((8, 256), np.uint8)
    return gemm_arrays(codes, np.full((8, 2), 8), np.ones((8, 2), np.float16))


def test_gemv_fast_refused(tmp_path):
    with pytest.raises(UnsupportedError) as ei:
        load(make_dir(tmp_path / "f", _good_gemm(), qc(version="gemv_fast")))
    assert "gemv_fast" in str(ei.value) and ei.value.field == "quantization_config.version"


def test_bits_other_than_4_refused(tmp_path):
    with pytest.raises(UnsupportedError) as ei:
        load(make_dir(tmp_path / "b", _good_gemm(), qc(bits=8)))
    assert ei.value.field == "quantization_config.bits" and ei.value.found == 8


@pytest.mark.parametrize("drop,missing",
                         [("l.scales", "l.scales"), ("l.qzeros", "l.qzeros"), ("l.qweight", "l.qweight")])
def test_missing_partner(tmp_path, drop, missing):
    arr = _good_gemm()
    del arr[drop]
    with pytest.raises(MissingTensorError) as ei:
        load(make_dir(tmp_path / "m", arr, qc()))
    assert ei.value.tensor == missing and "model.safetensors" in ei.value.file


def test_group_size_contradicts_scales(tmp_path):
    with pytest.raises(FormatError) as ei:
        load(make_dir(tmp_path / "g", _good_gemm(), qc(group_size=64)))
    e = ei.value
    assert e.tensor == "l.scales" and e.field == "shape" and e.expected == [4, 8] and e.found == [2, 8]


def test_in_features_not_multiple_of_group(tmp_path):
    arr = gemm_arrays(np.zeros((8, 200), np.uint8), np.full((8, 2), 8), np.ones((8, 2), np.float16))
    with pytest.raises(FormatError) as ei:
        load(make_dir(tmp_path / "g", arr, qc(group_size=128)))
    assert ei.value.field == "quantization_config.group_size" and ei.value.tensor == "l.qweight"


def test_gptq_layout_labelled_awq_fails(tmp_path):
    """Square layer I = O = 64: GPTQ qweight [I/8, O] = (8, 64) read as AWQ gives I=8, and scales [1, 64] mismatch."""
    arr = {"l.qweight": np.zeros((8, 64), np.int32), "l.qzeros": np.zeros((1, 8), np.int32),
           "l.scales": np.ones((1, 64), np.float16)}
    with pytest.raises(FormatError):
        load(make_dir(tmp_path / "g", arr, qc(group_size=64)))


# -- writer refusals -------------------------------------------------------------------------------
def _t(**kw):
    base = dict(name="l.weight", axes=(OUT, IN), codes=np.zeros((8, 16), np.uint8),
                scales=np.ones((8, 2), np.float16), scheme=U4, group_map=GroupMap.per_group(8),
                zero_points=np.full((8, 2), 8, np.int16))
    base.update(kw)
    return QuantizedTensor(**base)


@pytest.mark.parametrize("t,needle", [
    (lambda: _t(scheme=QuantScheme(8, False, ZeroPoint.INTEGER, "F16"), codes=np.zeros((8, 16), np.uint8)), "4-bit"),
    (lambda: _t(scales=np.ones((8, 2), np.float32), scheme=QuantScheme(4, False, ZeroPoint.INTEGER, "F32")), "float16"),
    (lambda: _t(group_map=GroupMap.per_group(8, g_idx=np.array([1, 0] * 8))), "g_idx"),
    (lambda: _t(codes=np.zeros((4, 16), np.uint8), scales=np.ones((4, 2), np.float16),
                zero_points=np.full((4, 2), 8, np.int16)), "multiple of 8"),
    (lambda: _t(codes=np.zeros((8, 12), np.uint8)), "in_features % group_size"),
    (lambda: _t(scheme=QuantScheme(4, False, ZeroPoint.NONE, "F16", codebook=tuple(range(16))), zero_points=None),
     "codebook"),
])
def test_check_target_reasons(t, needle):
    reason = awq.check_target(spec_of(t()))
    assert reason and needle in reason


def test_check_target_accepts_representable():
    assert awq.check_target(spec_of(_t())) is None
    assert awq.check_target(spec_of(_t(scheme=QuantScheme(4, True, ZeroPoint.NONE, "F16"),
                                       codes=np.zeros((8, 16), np.int8), zero_points=None))) is None
    assert awq.check_target(spec_of(_t(group_map=GroupMap.per_channel(OUT), scales=np.ones((8, 1), np.float16),
                                       zero_points=np.full((8, 1), 8, np.int16)))) is None


def test_writer_refuses_before_writing(tmp_path):
    with pytest.raises(NotRepresentableError) as ei:
        write_read([_t(group_map=GroupMap.per_group(8, g_idx=np.array([1, 0] * 8)))], tmp_path)
    assert ei.value.tensor == "l.weight"
    assert not (tmp_path / "out").exists()


def test_writer_mixed_group_sizes_refused(tmp_path):
    a = _t()
    b = _t(name="m.weight", codes=np.zeros((8, 32), np.uint8), group_map=GroupMap.per_group(16))
    with pytest.raises(NotRepresentableError) as ei:
        write_read([a, b], tmp_path)
    assert ei.value.field == "quantization_config.group_size"


def test_writer_version_gemv_refused(tmp_path):
    with pytest.raises(UnsupportedError):
        get("awq").write(Checkpoint.from_tensors([_t()]), tmp_path / "x", version="gemv")


def test_modules_to_not_convert_kept_or_given(tmp_path):
    arr = _good_gemm()
    arr["lm_head.weight"] = np.ones((4, 8), np.float16)
    d = make_dir(tmp_path / "m", arr, qc(modules_to_not_convert=["lm_head"]))
    get("awq").write(load(d), tmp_path / "kept")
    assert json.loads((tmp_path / "kept" / "config.json").read_text())["quantization_config"][
        "modules_to_not_convert"] == ["lm_head"]
    get("awq").write(load(d), tmp_path / "given", modules_to_not_convert=["x"])
    assert json.loads((tmp_path / "given" / "config.json").read_text())["quantization_config"][
        "modules_to_not_convert"] == ["x"]
    assert np.array_equal(load(tmp_path / "kept")["lm_head.weight"].data, arr["lm_head.weight"])


# -- conformance (tests/formats/conformance.py) ------------------------------------------------------
from tests.formats.conformance import QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance  # noqa: E402
from tests.conftest import SAMPLES as _SAMPLES  # noqa: E402


class TestAWQConformance(QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance):
    FORMAT = "awq"
    SAMPLES = ((_SAMPLES / "awq_gemm_w4_g128_zp", _SAMPLES / "awq_gemm_w4_g128_zp" / "reference_dequant.safetensors"),)
