"""compressed-tensors reader/writer: real samples, hand-computed layouts, CASES.md B12/B13/B29, errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from converter.errors import FormatError, MissingTensorError, NotRepresentableError, UnsupportedError
from converter.formats.compressed_tensors.config import ACTORDER_MSG
from converter.formats.registry import detect, get, load
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.quant.quantize import quantize
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, spec_of

ROOT = Path(__file__).resolve().parents[2] / "sample_checkpoints"
SAMPLES = ["ct_pack_w4a16_channel_sym", "ct_pack_w4a16_group128_asym", "ct_pack_w4a16_group128_sym",
           "ct_pack_w8a16_channel_sym"]
CT = get("compressed-tensors")


def _qc(bits=4, strategy="group", group_size=128, symmetric=True, fmt="pack-quantized", version="0.20.1", **w):
    weights = {"dynamic": False, "group_size": group_size, "num_bits": bits, "strategy": strategy,
               "symmetric": symmetric, "type": "int", **w}
    qc = {"config_groups": {"group_0": {"format": fmt, "input_activations": None, "output_activations": None,
                                        "targets": ["Linear"], "weights": weights}},
          "format": fmt, "ignore": [], "quant_method": "compressed-tensors", "quantization_status": "compressed"}
    if version is not None:
        qc["version"] = version
    return qc


def _make(tmp_path: Path, tensors: dict, qc: dict, name="m") -> Path:
    d = tmp_path / name
    d.mkdir()
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "toy", "quantization_config": qc}))
    return d


def _same(a: QuantizedTensor, b: QuantizedTensor) -> None:
    assert a.scheme == b.scheme and a.shape == b.shape
    assert np.array_equal(a.codes, b.codes) and a.codes.dtype == b.codes.dtype
    assert a.scales.dtype == b.scales.dtype and np.array_equal(a.scales.view(np.uint8), b.scales.view(np.uint8))
    if a.zero_points is None:
        assert b.zero_points is None
    else:
        assert np.array_equal(a.zero_points, b.zero_points)
    assert a.group_map.describe() == b.group_map.describe()


# -- real samples ----------------------------------------------------------------------------------
@pytest.mark.parametrize("sample", SAMPLES)
def test_real_sample_decode_equals_reference(sample):
    ckpt = load(ROOT / sample)
    assert ckpt.format == "compressed-tensors"
    ref = load_file(str(ROOT / sample / "reference_dequant.safetensors"))
    for name, want in ref.items():
        t = ckpt[name]
        got = t.dequantize().astype(np.float16) if isinstance(t, QuantizedTensor) else t.data
        # fp16 bit-exact: s * (q - zp) with |q - zp| <= 255 is exact in float32, one rounding to fp16
        # as compressed-tensors' fp16 decompress does.
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), name


@pytest.mark.parametrize("sample", SAMPLES)
def test_real_sample_round_trip_byte_identical(sample, tmp_path):
    src = ROOT / sample
    ckpt = load(src)
    CT.write(ckpt, tmp_path / "out")
    orig = load_file(str(src / "model.safetensors"))
    new = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(orig) == sorted(new)
    for k in orig:
        assert orig[k].dtype == new[k].dtype and orig[k].shape == new[k].shape, k
        assert orig[k].tobytes() == new[k].tobytes(), k
    want_cfg = json.loads((src / "config.json").read_text())
    got_cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert got_cfg["quantization_config"] == want_cfg["quantization_config"]
    assert {k: v for k, v in got_cfg.items() if k != "quantization_config"} == \
        {k: v for k, v in want_cfg.items() if k != "quantization_config"}
    again = load(tmp_path / "out")
    for name in ckpt.quantized_names():
        _same(ckpt[name], again[name])


def test_detect_real_sample():
    d = detect(Source(ROOT / SAMPLES[0]))
    assert d.format == "compressed-tensors" and d.confidence == 90


# -- hand-computed layouts ---------------------------------------------------------------------------
def test_packing_word_lsb_first_unsigned_fields(tmp_path):
    # FORMATS.md 3.4: word 0x37aa7756 holds stored fields [6,5,7,7,10,10,7,3] = q + 8.
    word = np.array([[0x37AA7756]], dtype=np.uint32).view(np.int32)
    d = _make(tmp_path, {"l.weight_packed": word, "l.weight_shape": np.array([1, 8], dtype=np.int64),
                         "l.weight_scale": np.array([[1.0]], dtype=np.float16)},
              _qc(strategy="channel", group_size=None))
    t = load(d)["l.weight"]
    assert t.codes.tolist() == [[-2, -3, -1, -1, 2, 2, -1, -5]]
    assert t.dequantize().tolist() == [[-2, -3, -1, -1, 2, 2, -1, -5]]
    CT.write(load(d), tmp_path / "w")
    assert load_file(str(tmp_path / "w" / "model.safetensors"))["l.weight_packed"].view(np.uint32)[0, 0] == 0x37AA7756


def test_asym_zero_points_packed_along_out(tmp_path):
    rng = np.random.default_rng(0)
    O, I, G = 24, 256, 128
    scheme = QuantScheme(4, signed=True, zero_point=ZeroPoint.INTEGER, scale_dtype="F16")
    t = quantize(rng.normal(size=(O, I)).astype(np.float32) + 0.3, scheme, GroupMap.per_group(G), name="l.weight")
    zp = np.tile(np.arange(-8, 8, dtype=np.int8), 4)[:O * 2].reshape(2, O).T.copy()  # distinct per row
    t = t.replace(zero_points=zp)
    CT.write(Checkpoint.from_tensors([t]), tmp_path / "w")
    arrays = load_file(str(tmp_path / "w" / "model.safetensors"))
    z = arrays["l.weight_zero_point"]
    assert z.dtype == np.int32 and z.shape == (3, 2)  # ceil(24*4/32) words per group column
    fields = (z.view(np.uint32)[0, 0] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    assert fields.tolist() == (zp[:8, 0].astype(int) + 8).tolist()  # rows 0..7, LSB first, stored zp + 8
    assert arrays["l.weight_packed"].shape == (24, 32) and arrays["l.weight_scale"].shape == (24, 2)
    _same(t, load(tmp_path / "w")["l.weight"])


@pytest.mark.parametrize("bits,dense,padded", [(3, 48, 52), (5, 80, 86), (6, 96, 103), (7, 112, 128)])
def test_b29_version_dependent_widths(tmp_path, bits, dense, padded):
    rng = np.random.default_rng(bits)
    scheme = QuantScheme(bits, signed=True, zero_point=ZeroPoint.INTEGER, scale_dtype="F16")
    t = quantize(rng.normal(size=(12, 512)).astype(np.float32), scheme, GroupMap.per_group(128), name="l.weight")
    ck = Checkpoint.from_tensors([t])
    for version, width in (("0.20.1", dense), ("0.18.0", dense), ("0.17.1", padded), ("0.12.2", padded)):
        out = tmp_path / version
        CT.write(ck, out, ct_version=version)
        arrays = load_file(str(out / "model.safetensors"))
        assert arrays["l.weight_packed"].shape == (12, width)
        zwidth = -(-12 * bits // 32) if width == dense else -(-12 // (32 // bits))
        assert arrays["l.weight_zero_point"].shape == (zwidth, 4)
        _same(t, load(out)["l.weight"])
    # version missing: the padded width is recognised; a dense width cannot be told apart -> error
    for version, ok in (("0.17.1", True), ("0.20.1", False)):
        cfg_path = tmp_path / version / "config.json"
        cfg = json.loads(cfg_path.read_text())
        del cfg["quantization_config"]["version"]
        cfg_path.write_text(json.dumps(cfg))
        if ok:
            _same(t, load(tmp_path / version)["l.weight"])
        else:
            with pytest.raises(FormatError, match="version"):
                load(tmp_path / version)


def test_b29_version_contradicting_width(tmp_path):
    codes = np.zeros((2, 512), dtype=np.uint8)
    from converter.layout import AxisMap
    packed = AxisMap(("out", "in"), "in", 3, "I32", packing="padded").to_stored(codes, ("out", "in"))
    d = _make(tmp_path, {"l.weight_packed": packed, "l.weight_shape": np.array([2, 512], dtype=np.int64),
                         "l.weight_scale": np.ones((2, 4), np.float16)}, _qc(bits=3, version="0.20.1"))
    with pytest.raises(FormatError, match="padded") as ei:
        load(d)
    assert ei.value.tensor == "l.weight_packed" and ei.value.expected.startswith("48")


def test_b13_partial_final_group(tmp_path):
    # Row codes (q - z) = [2,-1,3,1,4,-2], I=6, G=4 -> ceil(6/4) = 2 groups, scales [0.1, 0.5].
    q = np.array([[2, -1, 3, 1, 4, -2]])
    word = np.bitwise_or.reduce((q[0] + 8).astype(np.uint32) << (4 * np.arange(6, dtype=np.uint32)))
    d = _make(tmp_path, {"l.weight_packed": np.array([[word]], dtype=np.uint32).view(np.int32),
                         "l.weight_shape": np.array([1, 6], dtype=np.int64),
                         "l.weight_scale": np.array([[0.1, 0.5]], dtype=np.float32)}, _qc(group_size=4))
    ck = load(d)
    assert any("partial final group" in n for n in ck.spec("l.weight").notes)
    got = ck["l.weight"].dequantize()[0]
    want = np.array([0.2, -0.1, 0.3, 0.1, 2.0, -1.0], dtype=np.float32)
    assert np.allclose(got, want, rtol=0, atol=1e-7)  # float32(0.1) * k vs float32(0.1 * k): last-bit at most
    assert not np.allclose(got, [0.2, -0.1, 0.3, 0.1, 0.4, -0.2])  # the I//G bug
    out = tmp_path / "w"
    summary = CT.write(ck, out)
    assert any("partial final group" in n for n in summary["notes"]["l.weight"])
    _same(ck["l.weight"], load(out)["l.weight"])


def test_b12_actorder_on_channel_refused(tmp_path):
    d = _make(tmp_path, {"l.weight_packed": np.zeros((2, 1), np.int32), "l.weight_shape": np.array([2, 4]),
                         "l.weight_scale": np.ones((2, 1), np.float16)},
              _qc(strategy="channel", group_size=None, actorder="static"))
    with pytest.raises(FormatError, match=ACTORDER_MSG) as ei:
        load(d)
    assert ei.value.field.endswith("weights.actorder") and ei.value.file.endswith("config.json")


def _g_idx_dir(tmp_path, g_idx, name="g"):
    q = np.array([[1, 2, 3, 4], [-1, -2, -3, -4]])
    words = np.bitwise_or.reduce((q + 8).astype(np.uint32) << (4 * np.arange(4, dtype=np.uint32)), axis=1)
    return _make(tmp_path, {"l.weight_packed": words.reshape(2, 1).view(np.int32),
                            "l.weight_shape": np.array([2, 4], dtype=np.int64),
                            "l.weight_scale": np.array([[1.0, 10.0], [2.0, 20.0]], np.float16),
                            "l.weight_g_idx": np.asarray(g_idx, np.int32)},
                 _qc(group_size=2, actorder="group", version="0.12.2"), name=name)


def test_legacy_g_idx_honoured(tmp_path):
    ck = load(_g_idx_dir(tmp_path, [1, 0, 1, 0]))
    assert ck.spec("l.weight").act_order
    assert ck["l.weight"].dequantize().tolist() == [[10, 2, 30, 4], [-20, -4, -60, -8]]
    col = load(_g_idx_dir(tmp_path, [-1, -1, -1, -1], name="col"))["l.weight"]
    assert col.group_map.g_idx is None
    assert col.dequantize().tolist() == [[1, 2, 30, 40], [-2, -4, -60, -80]]
    # legacy layout round trip; 0.20 cannot hold a g_idx
    CT.write(ck, tmp_path / "w", ct_version="0.12.2")
    back = load(tmp_path / "w")["l.weight"]
    assert back.group_map.g_idx.tolist() == [1, 0, 1, 0] and np.array_equal(back.codes, ck["l.weight"].codes)
    assert json.loads((tmp_path / "w" / "config.json").read_text())["quantization_config"][
        "config_groups"]["group_0"]["weights"]["actorder"] == "group"
    with pytest.raises(NotRepresentableError, match="g_idx"):
        CT.write(ck, tmp_path / "w2")


def test_int_quantized_write_and_read(tmp_path):
    ck = load(ROOT / "ct_pack_w8a16_channel_sym")
    CT.write(ck, tmp_path / "w", ct_format="int-quantized")
    arrays = load_file(str(tmp_path / "w" / "model.safetensors"))
    name = "encoder.layer.0.attention.self.query"
    assert arrays[name + ".weight"].dtype == np.int8 and arrays[name + ".weight"].shape == (384, 384)
    assert name + ".weight_shape" not in arrays
    back = load(tmp_path / "w")
    assert json.loads((tmp_path / "w" / "config.json").read_text())["quantization_config"]["format"] == "int-quantized"
    for n in ck.quantized_names():
        _same(ck[n], back[n])


def test_unsigned_schemes_accepted_exactly(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 64)).astype(np.float32)
    gptq = quantize(x, QuantScheme(4, signed=False, zero_point=ZeroPoint.INTEGER), GroupMap.per_group(32),
                    name="a.weight")
    sym = quantize(x, QuantScheme(4, signed=False), GroupMap.per_group(32), name="b.weight")
    # MLX-style float bias that is exactly -z*s with integer z
    s = np.full((8, 2), 0.25, np.float16)
    z = rng.integers(0, 16, size=(8, 2))
    mlx = QuantizedTensor("c.weight", ("out", "in"), rng.integers(0, 16, (8, 64)).astype(np.uint8), s,
                          QuantScheme(4, signed=False, zero_point=ZeroPoint.FLOAT), GroupMap.per_group(32),
                          zero_points=(-z * 0.25).astype(np.float16))
    dense = DenseTensor("d.weight", x.astype(np.float16))
    CT.write(Checkpoint.from_tensors([gptq, sym, mlx, dense]), tmp_path / "w")
    back = load(tmp_path / "w")
    for t in (gptq, sym, mlx):
        assert back[t.name].scheme.signed
        assert np.array_equal(back[t.name].dequantize(), t.dequantize()), t.name
    qc = json.loads((tmp_path / "w" / "config.json").read_text())["quantization_config"]
    assert qc["ignore"] == ["d"]
    # two weight-arg sets (asym, sym) -> explicit module targets
    targets = sorted(tuple(g["targets"]) for g in qc["config_groups"].values())
    assert targets == [("a", "c"), ("b",)]
    bad = mlx.replace(zero_points=np.full((8, 2), 0.1, np.float16))
    with pytest.raises(NotRepresentableError, match="bias"):
        CT.write(Checkpoint.from_tensors([bad]), tmp_path / "w2")


def test_check_target_reasons():
    nf4 = QuantScheme(4, signed=False, codebook=tuple(np.linspace(-1, 1, 16)))
    t = QuantizedTensor("a.weight", ("out", "in"), np.zeros((2, 64), np.uint8), np.ones(2, np.float16), nf4,
                        GroupMap("flat_block", group_size=64))
    assert "codebook" in CT.check_target(spec_of(t))
    u = QuantizedTensor("a.weight", ("out", "in"), np.zeros((2, 64), np.uint8), np.ones(2, np.float16),
                        QuantScheme(4, signed=False), GroupMap("flat_block", group_size=64))
    assert "flat" in CT.check_target(spec_of(u))
    ok = quantize(np.ones((2, 8), np.float32), QuantScheme(4, signed=True), GroupMap.per_channel())
    assert CT.check_target(spec_of(ok)) is None


# -- bad input --------------------------------------------------------------------------------------
def _good(tmp_path, qc=None, drop=(), extra=None, name="m"):
    t = {"l.weight_packed": np.zeros((4, 1), np.int32), "l.weight_shape": np.array([4, 8], dtype=np.int64),
         "l.weight_scale": np.ones((4, 1), np.float16), "l.bias": np.zeros(4, np.float16)}
    t.update(extra or {})
    for k in drop:
        del t[k]
    return _make(tmp_path, t, qc or _qc(strategy="channel", group_size=None), name=name)


def test_config_format_contradicts_tensors(tmp_path):
    d = _make(tmp_path, {"l.weight": np.zeros((4, 8), np.int8), "l.weight_scale": np.ones((4, 1), np.float16)},
              _qc(strategy="channel", group_size=None, bits=8))
    with pytest.raises(FormatError, match="pack-quantized.*int8 'weight'") as ei:
        load(d)
    assert ei.value.tensor == "l.weight"


@pytest.mark.parametrize("missing", ["l.weight_scale", "l.weight_shape"])
def test_missing_partner(tmp_path, missing):
    with pytest.raises(MissingTensorError) as ei:
        load(_good(tmp_path, drop=[missing]))
    assert ei.value.tensor == missing


def test_asym_without_zero_point(tmp_path):
    with pytest.raises(MissingTensorError) as ei:
        load(_good(tmp_path, qc=_qc(strategy="channel", group_size=None, symmetric=False)))
    assert ei.value.tensor == "l.weight_zero_point"


def test_transposed_scales(tmp_path):
    d = _good(tmp_path, qc=_qc(group_size=4), extra={"l.weight_scale": np.ones((2, 4), np.float16)})
    with pytest.raises(FormatError, match="weight_scale shape") as ei:
        load(d)
    assert ei.value.expected == [4, 2] and ei.value.found == [2, 4]


def test_symmetric_zero_points(tmp_path):
    ck = load(_good(tmp_path, extra={"l.weight_zero_point": np.zeros((4, 1), np.int8)}))
    assert ck["l.weight"].zero_points is None  # all-zero: tolerated and dropped
    d = _good(tmp_path, extra={"l.weight_zero_point": np.ones((4, 1), np.int8)}, name="bad")
    with pytest.raises(FormatError, match="not all zero"):
        load(d)["l.weight"]


@pytest.mark.parametrize("fmt", ["mxfp8-quantized", "mxfp6-pack-quantized", "marlin-24"])
def test_refused_formats_named(tmp_path, fmt):
    with pytest.raises(UnsupportedError, match=fmt):
        load(_good(tmp_path, qc=_qc(strategy="channel", group_size=None, fmt=fmt)))


def test_block_strategy_refused(tmp_path):
    with pytest.raises(UnsupportedError, match="block"):
        load(_good(tmp_path, qc=_qc(strategy="block", group_size=None, block_structure=[2, 2])))


def test_ignored_module_with_quantized_tensors(tmp_path):
    qc = _qc(strategy="channel", group_size=None)
    qc["ignore"] = ["re:.*l$"]
    with pytest.raises(FormatError, match="no config group"):
        load(_good(tmp_path, qc=qc))


@pytest.mark.parametrize("fmt", ["pack-quantized", "int-quantized"])
@pytest.mark.parametrize("zp", [ZeroPoint.NONE, ZeroPoint.INTEGER])
def test_tensor_strategy_round_trip(tmp_path, fmt, zp):
    x = np.random.default_rng(5).normal(size=(5, 12)).astype(np.float32) + 0.2
    t = quantize(x, QuantScheme(8, signed=True, zero_point=zp, scale_dtype="BF16"), GroupMap.per_tensor(),
                 name="l.weight")
    CT.write(Checkpoint.from_tensors([t]), tmp_path / "w", ct_format=fmt)
    arrays = load_file(str(tmp_path / "w" / "model.safetensors")) if zp is ZeroPoint.NONE else None
    back = load(tmp_path / "w")["l.weight"]
    _same(t, back)
    qc = json.loads((tmp_path / "w" / "config.json").read_text())["quantization_config"]
    assert qc["config_groups"]["group_0"]["weights"]["strategy"] == "tensor"
    if arrays is not None:
        assert arrays["l.weight_scale"].shape == (1,)


@pytest.mark.parametrize("dtype", [np.int16, np.int32])
def test_wide_unpacked_zero_points_range_checked_before_narrowing(tmp_path, dtype):
    # int-quantized 8-bit asym, channel: zero points stored as I16/I32. 200 used to wrap to -56.
    qc = _qc(bits=8, strategy="channel", group_size=None, symmetric=False, fmt="int-quantized")
    base = {"l.weight": np.arange(-16, 16, dtype=np.int8).reshape(4, 8), "l.weight_scale": np.ones((4, 1), np.float16)}
    ok = _make(tmp_path, {**base, "l.weight_zero_point": np.array([[-128], [0], [5], [127]], dtype)}, qc, name="ok")
    t = load(ok)["l.weight"]
    assert t.zero_points.tolist() == [[-128], [0], [5], [127]]
    assert t.dequantize()[2].tolist() == list(np.arange(0, 8) - 5.0)  # codes 0..7 of row 2 minus z = 5
    bad = _make(tmp_path, {**base, "l.weight_zero_point": np.array([[0], [200], [5], [-3]], dtype)}, qc, name="bad")
    with pytest.raises(FormatError) as ei:
        load(bad)["l.weight"]
    e = ei.value
    assert (e.tensor, e.field, e.expected, e.found) == ("l.weight_zero_point", "weight_zero_point", "[-128, 127]",
                                                        "[-3, 200]")
    assert str(bad / "model.safetensors") in str(e)


# -- conformance (tests/formats/conformance.py) ------------------------------------------------------
from tests.formats.conformance import QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance  # noqa: E402
from tests.conftest import SAMPLES as _SAMPLES  # noqa: E402


class TestCompressedTensorsConformance(QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance):
    FORMAT = "compressed-tensors"
    SAMPLES = tuple((_SAMPLES / d, _SAMPLES / d / "reference_dequant.safetensors")
                    for d in ("ct_pack_w4a16_channel_sym", "ct_pack_w4a16_group128_asym", "ct_pack_w4a16_group128_sym",
                              "ct_pack_w8a16_channel_sym"))
