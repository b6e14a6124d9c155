"""MLX reader/writer: real mlx 0.32.4 samples, hand-computed cases, CASES.md B15/B20/B27/B31."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from converter.errors import FormatError, MissingTensorError
from converter.formats.mlx import E2M1, check_target, dequantize_like_mlx, read_mlx, write_mlx
from converter.formats.registry import detect, get
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
REAL = ["mlx_affine_g64_b4", "mlx_affine_g32_b8"]
REF_NAMES = ["encoder.layer.0.attention.self.query.weight", "encoder.layer.0.output.dense.weight"]


def make_dir(tmp: Path, tensors: dict, quant: dict | None, **cfg) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "mlx"})
    config = dict(cfg)
    if quant is not None:
        config["quantization"] = quant
        config["quantization_config"] = quant
    (tmp / "config.json").write_text(json.dumps(config))
    return tmp


def pack_stream(codes: np.ndarray, bits: int) -> np.ndarray:
    """Reference packer: each row as one Python big integer, LSB-first (independent of converter)."""
    rows = []
    for row in codes:
        acc = 0
        for k, c in enumerate(row.tolist()):
            acc |= int(c) << (k * bits)
        nwords = -(-len(row) * bits // 32)
        rows.append([(acc >> (32 * w)) & 0xFFFFFFFF for w in range(nwords)])
    return np.array(rows, dtype=np.uint32)


# -- real samples ---------------------------------------------------------------------------------
@pytest.mark.parametrize("sample", REAL)
def test_real_sample_matches_mlx_reference(sample):
    path = SAMPLES / sample
    assert detect(Source(path)).format == "mlx"
    ckpt = read_mlx(Source(path))
    ref = load_file(str(path / "reference_dequant.safetensors"))
    for name in REF_NAMES:
        t = ckpt[name]
        assert t.scheme.zero_point is ZeroPoint.FLOAT and not t.scheme.signed
        assert (t.scales.astype(np.float32) < 0).any()  # MLX scales are negative for many groups: not an error
        # MLX dequantizes in fp16: round(s*q) then round(+b). Emulating that on OUR codes/scales/biases
        # reproduces mx.dequantize bit for bit, so every code, scale and bias was read right.
        assert np.array_equal(dequantize_like_mlx(t), ref[name])
        # Our float32 dequant rounds once; MLX twice. Tolerance: half an fp16 ulp of fp16(s*q) + half an
        # fp16 ulp of the result (that double rounding, and nothing else).
        x = t.dequantize()
        s = t.group_map.expand(t.scales, t.shape, t.axes)
        prod = (t.codes.astype(np.float16) * s).astype(np.float16)
        tol = 0.5 * np.spacing(np.abs(prod)).astype(np.float32) + 0.5 * np.spacing(np.abs(ref[name])).astype(np.float32)
        assert (np.abs(x - ref[name].astype(np.float32)) <= tol).all()
    # Linear .bias coexists with the affine .biases, and passes through dense
    for b in ("encoder.layer.0.attention.self.query.bias", "encoder.layer.0.output.dense.bias"):
        assert ckpt.spec(b).kind == "dense"
        assert np.array_equal(ckpt[b].data, ref[b])


@pytest.mark.parametrize("sample", REAL)
def test_real_round_trip_byte_identical(sample, tmp_path):
    path = SAMPLES / sample
    ckpt = read_mlx(Source(path))
    out = tmp_path / "out"
    summary = write_mlx(ckpt, out)
    assert "model.safetensors" in summary["files"]
    orig = load_file(str(path / "model.safetensors"))
    new = load_file(str(out / "model.safetensors"))
    assert sorted(orig) == sorted(new)
    for k in orig:
        assert orig[k].dtype == new[k].dtype and orig[k].shape == new[k].shape, k
        assert orig[k].tobytes() == new[k].tobytes(), k
    with safe_open(str(out / "model.safetensors"), "np") as fh:
        assert fh.metadata() == {"format": "mlx"}
    cfg = json.loads((out / "config.json").read_text())
    src_cfg = json.loads((path / "config.json").read_text())
    assert cfg["quantization"] == src_cfg["quantization"] == cfg["quantization_config"]
    back = read_mlx(Source(out))
    for name in ckpt.quantized_names():
        a, b = ckpt[name], back[name]
        assert np.array_equal(a.codes, b.codes) and a.scales.tobytes() == b.scales.tobytes()
        assert a.zero_points.tobytes() == b.zero_points.tobytes() and a.scheme == b.scheme


# -- packing -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_stream_packing_hand_reference(bits, tmp_path):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 2 ** bits, size=(3, 64), dtype=np.uint8)
    words = pack_stream(codes, bits)
    assert words.shape == (3, 64 * bits // 32)
    scales = np.array([[0.5, -0.25]] * 3, dtype=np.float16)
    biases = np.array([[1.0, -2.0]] * 3, dtype=np.float16)
    d = make_dir(tmp_path / "m", {"l.weight": words, "l.scales": scales, "l.biases": biases},
                 {"group_size": 32, "bits": bits})
    t = read_mlx(Source(d))["l.weight"]
    assert np.array_equal(t.codes, codes)
    expect = codes.astype(np.float32) * np.repeat(scales, 32, 1).astype(np.float32) + np.repeat(biases, 32, 1)
    assert np.array_equal(t.dequantize(), expect)
    out = tmp_path / "w"
    write_mlx(read_mlx(Source(d)), out)
    assert load_file(str(out / "model.safetensors"))["l.weight"].tobytes() == words.tobytes()


def test_3bit_straddles_words():
    # 32 codes of 3 bits = 96 bits = 3 words; code 10 occupies bits 30..32 (straddles word 0 and 1)
    codes = np.zeros((1, 32), dtype=np.uint8)
    codes[0, 10] = 0b111
    words = pack_stream(codes, 3)
    assert words.tolist() == [[0xC0000000, 0x00000001, 0]]
    from converter.formats.mlx import codes_map
    assert np.array_equal(codes_map((OUT, IN), 3).to_stored(codes, (OUT, IN)), words)


# -- B20 ----------------------------------------------------------------------------------------------
def test_b20_all_zero_group_no_nan(tmp_path):
    # MLX's fix (PR #1028) clamps the scale to 1e-7 (fp16: subnormal); q = 0, bias = 0 -> exact zeros.
    scales = np.array([[np.float16(1e-7), 0.5]], dtype=np.float16)
    biases = np.zeros((1, 2), dtype=np.float16)
    codes = np.zeros((1, 64), dtype=np.uint8)
    codes[0, 32:] = np.arange(32) % 16
    d = make_dir(tmp_path / "m", {"l.weight": pack_stream(codes, 4), "l.scales": scales, "l.biases": biases},
                 {"group_size": 32, "bits": 4})
    x = read_mlx(Source(d))["l.weight"].dequantize()
    assert np.isfinite(x).all()
    assert np.array_equal(x[0, :32], np.zeros(32, np.float32))
    # An all-zero group produced upstream (our RTN quantizer, integer zero) converts to a finite MLX group.
    from converter.quant.quantize import quantize
    vals = np.zeros((2, 32), np.float32)
    vals[1] = np.linspace(-1, 1, 32)
    t = quantize(vals, QuantScheme(4, False, ZeroPoint.INTEGER, "F16"), GroupMap.per_group(32), name="z.weight",
                 axes=(OUT, IN))
    write_mlx(Checkpoint.from_tensors([t]), tmp_path / "w")
    back = read_mlx(Source(tmp_path / "w"))["z.weight"].dequantize()
    assert np.isfinite(back).all() and np.array_equal(back[0], np.zeros(32, np.float32))


# -- B27 ----------------------------------------------------------------------------------------------
def test_b27_ambiguous_packed_shape_detected(tmp_path):
    # Truly in=256, 2-bit, group 64: weight (8, 16) uint32, scales (8, 4). The same shapes fit
    # in=128, 4-bit, group 32, which is what this config claims; hidden_size=256 decides.
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 4, size=(8, 256), dtype=np.uint8)
    tensors = {"l.weight": pack_stream(codes, 2), "l.scales": np.ones((8, 4), np.float16),
               "l.biases": np.zeros((8, 4), np.float16)}
    d = make_dir(tmp_path / "bad", tensors, {"group_size": 32, "bits": 4}, hidden_size=256)
    with pytest.raises(FormatError) as ei:
        read_mlx(Source(d))
    msg = str(ei.value)
    assert "bits=2, group_size=64" in msg and "bits=4, group_size=32" in msg and "l.weight" in msg
    assert "model.safetensors" in msg
    good = make_dir(tmp_path / "good", tensors, {"group_size": 64, "bits": 2}, hidden_size=256)
    assert np.array_equal(read_mlx(Source(good))["l.weight"].codes, codes)


def test_b27_reproducer_shapes_all_fit():
    # packed cols 16, scale cols 4: (128, 4b, g32), (256, 2b, g64), (512, 1b, g128), (64, 8b, g16)
    for i, b, g in [(128, 4, 32), (256, 2, 64), (512, 1, 128), (64, 8, 16)]:
        assert i * b // 32 == 16 and i // g == 4


# -- B31 and fp modes -------------------------------------------------------------------------------------
def test_b31_mxfp8_mode_carried(tmp_path):
    codes = np.zeros((1, 32), np.uint8)
    codes[0, :5] = [0x38, 0x40, 0xB8, 0x00, 0x30]
    words = pack_stream(codes, 8)
    d = make_dir(tmp_path / "m", {"l.weight": words, "l.scales": np.array([[127]], np.uint8)},
                 {"group_size": 32, "bits": 8, "mode": "mxfp8"})
    ckpt = read_mlx(Source(d))
    t = ckpt["l.weight"]
    assert np.array_equal(t.dequantize()[0, :5], np.array([1.0, 2.0, -1.0, 0.0, 0.5], np.float32))
    assert t.scheme.codebook is not None and t.zero_points is None and t.scheme.scale_dtype == "F8_E8M0"
    assert ckpt.metadata["modes"]["l.weight"] == "mxfp8"
    # the same bytes as affine codes would be [56, 64, 184, 0, 48]: the writer keeps the mode (mxfp8),
    # never writing them as affine integers; the round trip gives the same words and E8M0 scale bytes
    assert check_target(ckpt.spec("l.weight")) is None
    write_mlx(ckpt, tmp_path / "w")
    cfg = json.loads((tmp_path / "w" / "config.json").read_text())
    assert cfg["quantization"] == {"group_size": 32, "bits": 8, "mode": "mxfp8"}
    back = read_mlx(Source(tmp_path / "w"))
    assert back.metadata["modes"]["l.weight"] == "mxfp8"
    assert np.array_equal(back["l.weight"].codes, codes) and back["l.weight"].scales.view(np.uint8).tolist() == [[127]]
    # mode lost (config says affine) -> uint8 scales are caught, not read as affine
    bad = make_dir(tmp_path / "lost", {"l.weight": words, "l.scales": np.array([[127]], np.uint8)},
                   {"group_size": 32, "bits": 8})
    with pytest.raises(FormatError, match="uint8 scales mean an mx/nv mode"):
        read_mlx(Source(bad))
    # "Biases must be null for mode mxfp8"
    withb = make_dir(tmp_path / "b", {"l.weight": words, "l.scales": np.array([[127]], np.uint8),
                                      "l.biases": np.zeros((1, 1), np.float16)},
                     {"group_size": 32, "bits": 8, "mode": "mxfp8"})
    with pytest.raises(FormatError, match="biases must be absent"):
        read_mlx(Source(withb))


def test_mxfp4_and_nvfp4(tmp_path):
    codes = np.tile(np.arange(16, dtype=np.uint8), 2)[None, :]  # (1, 32)
    d = make_dir(tmp_path / "mx", {"l.weight": pack_stream(codes, 4), "l.scales": np.array([[128]], np.uint8)},
                 {"group_size": 32, "bits": 4, "mode": "mxfp4"})
    x = read_mlx(Source(d))["l.weight"].dequantize()
    assert np.array_equal(x[0], 2.0 * np.tile(np.array(E2M1, np.float32), 2))  # E8M0 128 -> 2^1
    e4m3 = np.array([[0.5, 3.0]], ml_dtypes.float8_e4m3fn).view(np.uint8)
    d = make_dir(tmp_path / "nv", {"l.weight": pack_stream(codes, 4), "l.scales": e4m3},
                 {"group_size": 16, "bits": 4, "mode": "nvfp4"})
    x = read_mlx(Source(d))["l.weight"].dequantize()
    e = np.array(E2M1, np.float32)
    assert np.array_equal(x[0], np.concatenate([0.5 * e, 3.0 * e]))


# -- config and partner errors -------------------------------------------------------------------------------
def _affine(tmp_path, name="m", **over):
    codes = np.arange(64, dtype=np.uint8).reshape(1, 64) % 16
    t = {"l.weight": pack_stream(codes, 4), "l.scales": np.ones((1, 2), np.float16),
         "l.biases": np.zeros((1, 2), np.float16), "l.bias": np.zeros(1, np.float16)}
    t.update({k: v for k, v in over.items() if v is not None})
    for k, v in over.items():
        if v is None:
            t.pop(k)
    return t


def test_partner_and_config_errors(tmp_path):
    q = {"group_size": 32, "bits": 4}
    with pytest.raises(MissingTensorError, match="l.biases"):
        read_mlx(Source(make_dir(tmp_path / "a", _affine(tmp_path, **{"l.biases": None}), q)))
    with pytest.raises(MissingTensorError, match="l.scales"):
        read_mlx(Source(make_dir(tmp_path / "b", _affine(tmp_path, **{"l.scales": None, "l.biases": None}), q)))
    with pytest.raises(FormatError, match="scales shape contradicts config"):
        read_mlx(Source(make_dir(tmp_path / "c", _affine(tmp_path), {"group_size": 64, "bits": 4})))
    with pytest.raises(FormatError, match="unquantized"):
        read_mlx(Source(make_dir(tmp_path / "d", _affine(tmp_path), {**q, "l": False})))
    with pytest.raises(FormatError, match="no 'quantization'"):
        read_mlx(Source(make_dir(tmp_path / "e", _affine(tmp_path), None)))
    with pytest.raises(FormatError, match="biases must match scales"):
        read_mlx(Source(make_dir(tmp_path / "f", _affine(tmp_path, **{"l.biases": np.zeros((1, 2), np.float32)}), q)))
    # mode absent -> affine; dense layer (I % G != 0, B15) stays dense
    t = _affine(tmp_path, **{"skip.weight": np.ones((2, 4304), np.float16)})
    ck = read_mlx(Source(make_dir(tmp_path / "g", t, q)))
    assert ck.spec("skip.weight").kind == "dense" and ck.spec("l.weight").kind == "quantized"


def test_per_layer_overrides_read_and_write(tmp_path):
    rng = np.random.default_rng(1)
    c4 = rng.integers(0, 16, (4, 128), dtype=np.uint8)
    c8 = rng.integers(0, 256, (4, 128), dtype=np.uint8)
    t = {"a.weight": pack_stream(c4, 4), "a.scales": np.ones((4, 2), np.float16),
         "a.biases": np.zeros((4, 2), np.float16),
         "b.weight": pack_stream(c8, 8), "b.scales": np.ones((4, 4), np.float16),
         "b.biases": np.zeros((4, 4), np.float16)}
    d = make_dir(tmp_path / "m", t, {"group_size": 64, "bits": 4, "mode": "affine", "b": {"group_size": 32, "bits": 8}})
    ck = read_mlx(Source(d))
    assert np.array_equal(ck["a.weight"].codes, c4) and np.array_equal(ck["b.weight"].codes, c8)
    write_mlx(ck, tmp_path / "w")
    cfg = json.loads((tmp_path / "w" / "config.json").read_text())["quantization"]
    assert cfg["b"] == {"group_size": 32, "bits": 8} and cfg["bits"] in (4, 8)
    back = read_mlx(Source(tmp_path / "w"))
    assert np.array_equal(back["b.weight"].codes, c8)


# -- writer conversions --------------------------------------------------------------------------------
def test_write_from_symmetric_and_integer_zero(tmp_path):
    rng = np.random.default_rng(2)
    sym = QuantizedTensor("s.weight", (OUT, IN), rng.integers(-8, 8, (3, 64), dtype=np.int8),
                          np.array([[0.5, -0.125]] * 3, np.float16), QuantScheme(4, True, ZeroPoint.NONE, "F16"),
                          GroupMap.per_group(32))
    asym = QuantizedTensor("a.weight", (OUT, IN), rng.integers(0, 16, (3, 64), dtype=np.uint8),
                           np.array([[0.1, 0.3]] * 3, np.float16), QuantScheme(4, False, ZeroPoint.INTEGER, "F16"),
                           GroupMap.per_group(32), zero_points=np.array([[3, 11]] * 3, np.int16))
    summary = write_mlx(Checkpoint.from_tensors([sym, asym, DenseTensor("n", np.ones(3, np.float16))]), tmp_path / "w")
    assert any("exact up to scale-dtype rounding of biases" in n for n in summary["notes"]["a.weight"])
    back = read_mlx(Source(tmp_path / "w"))
    # symmetric: bias = -8*s is a power-of-two multiple: exact
    assert np.array_equal(back["s.weight"].dequantize(), sym.dequantize())
    # integer zero: bias = -z*s rounded once to fp16 -> error at most half an fp16 ulp of the bias
    bias = np.repeat(-(np.array([[3, 11]], np.float32) * asym.scales[:1].astype(np.float32)), 32, 1)
    tol = 0.5 * np.spacing(np.abs(bias.astype(np.float16))).astype(np.float32)
    assert (np.abs(back["a.weight"].dequantize() - asym.dequantize()) <= tol).all()
    assert np.array_equal(back["a.weight"].codes, asym.codes)


def test_check_target_reasons():
    def spec(shape, gm, scheme, name="x.weight"):
        codes = np.zeros(shape, np.int8 if scheme.signed else np.uint8)
        scales = np.ones(gm.param_shape(shape, (OUT, IN)), scheme.scale_np_dtype)
        zp = np.zeros_like(scales) if scheme.zero_point is ZeroPoint.FLOAT else None
        return Checkpoint.from_tensors([QuantizedTensor(name, (OUT, IN), codes, scales, scheme, gm,
                                                        zero_points=zp)]).spec(name)
    ok = QuantScheme(4, False, ZeroPoint.FLOAT, "F16")
    assert check_target(spec((2, 128), GroupMap.per_group(64), ok)) is None
    assert "B15" in check_target(spec((2, 4304), GroupMap.per_group(64), ok))
    assert "group_size" in check_target(spec((2, 64), GroupMap.per_group(16), ok))
    assert "bits" in check_target(spec((2, 64), GroupMap.per_group(32), QuantScheme(7, False, ZeroPoint.FLOAT, "F16")))
    # per-channel / per-tensor parameters are written as groups of the largest MLX size dividing in
    assert check_target(spec((2, 64), GroupMap.per_channel(), ok)) is None
    assert check_target(spec((2, 96), GroupMap.per_tensor(), ok)) is None
    assert "B15" in check_target(spec((2, 48), GroupMap.per_channel(), ok))
    assert "along 'in'" in check_target(spec((2, 64), GroupMap.per_channel("in"), ok))
    nf4 = QuantScheme(4, False, ZeroPoint.NONE, "F32", codebook=tuple(range(16)))
    assert "codebook" in check_target(spec((2, 64), GroupMap.per_group(32), nf4))
    assert get("mlx").check_target is check_target


def test_transformers5_rope_parameters_become_the_top_level_keys_mlx_lm_reads(tmp_path):
    # issue 12: transformers 5 writes only rope_parameters; mlx-lm 0.32 models/llama.py reads
    # rope_theta (default 10000) and rope_scaling at top level: SmolLM2's 100000 was silently lost
    from converter.formats.mlx import mlx_config
    from converter.groups import GroupMap
    from converter.layout import IN, OUT
    from converter.scheme import QuantScheme, ZeroPoint
    from converter.tensor import Checkpoint, QuantizedTensor
    t = QuantizedTensor("model.layers.0.mlp.up_proj.weight", (OUT, IN), np.zeros((4, 64), np.uint8),
                        np.ones((4, 2), np.float16), QuantScheme(4, False, ZeroPoint.NONE, "F16"),
                        GroupMap.per_group(32))
    plain = {"model_type": "llama", "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0}}
    cfg = mlx_config(Checkpoint.from_tensors([t], config=plain))
    assert cfg["rope_theta"] == 100000.0 and "rope_scaling" not in cfg
    assert cfg["rope_parameters"] == plain["rope_parameters"]  # kept for transformers
    llama3 = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 8192}}
    cfg = mlx_config(Checkpoint.from_tensors([t], config=llama3))
    assert cfg["rope_theta"] == 500000.0
    assert cfg["rope_scaling"] == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    legacy = {"rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 5.0}}
    assert mlx_config(Checkpoint.from_tensors([t], config=legacy))["rope_theta"] == 10000.0  # present: kept


# -- conformance (tests/formats/conformance.py) ------------------------------------------------------
from tests.formats.conformance import QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance  # noqa: E402
from tests.conftest import SAMPLES as _SAMPLES  # noqa: E402


class TestMLXConformance(QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance):
    FORMAT = "mlx"
    SAMPLES = tuple((_SAMPLES / d, _SAMPLES / d / "reference_dequant.safetensors")
                    for d in ("mlx_affine_g32_b8", "mlx_affine_g64_b4"))

    def decode_like_tool(self, t):
        from converter.formats.mlx import dequantize_like_mlx
        return dequantize_like_mlx(t) if isinstance(t, QuantizedTensor) else t.data
