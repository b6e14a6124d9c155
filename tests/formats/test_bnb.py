"""bitsandbytes reader: real bitsandbytes 0.50.2 samples and hand-computed cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from converter.errors import FormatError, MissingTensorError, UnsupportedError
from converter.formats.bnb import decode_nested_absmax, read_bnb
from converter.formats.registry import detect
from converter.formats.source import Source
from converter.groups import Granularity

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
REF_NAMES = ["encoder.layer.0.attention.self.query.weight", "encoder.layer.0.output.dense.weight"]
NF4 = np.array([-1.0, -0.6961928, -0.52507305, -0.3949175, -0.28444138, -0.18477343, -0.09105004, 0.0,
                0.0795803, 0.1609302, 0.2461123, 0.33791524, 0.44070983, 0.562617, 0.72295684, 1.0], np.float32)


def make_dir(tmp: Path, tensors: dict, qc: dict | None = None) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps({"quantization_config": qc or {"quant_method": "bitsandbytes"}}))
    return tmp


def qs_bytes(obj: dict) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8).copy()


def test_real_int8_matches_reference():
    path = SAMPLES / "bnb_int8"
    assert detect(Source(path)).format == "bitsandbytes"
    ckpt = read_bnb(Source(path))
    ref = load_file(str(path / "reference_dequant.safetensors"))
    for name in REF_NAMES:
        t = ckpt[name]
        assert t.scheme.bits == 8 and t.scheme.signed and t.group_map.granularity is Granularity.CHANNEL
        x = t.dequantize()
        # bitsandbytes computes (w * SCB) * (1/127) in float32 (two roundings); we compute
        # w * fl(SCB * (1/127)) (scale folded, two roundings in another order). Both are within
        # one float32 ulp of the exact w*SCB/127, so they differ by at most 2 ulps (relative 2^-22).
        ref32 = ref[name]
        assert (np.abs(x - ref32) <= 2.0 ** -22 * np.abs(ref32)).all()
        assert not np.array_equal(x, ref32)  # the folding really does change some float32 results
        # ... and the fp16 decode (what a fp16 model uses) is bit-identical on the real sample.
        assert np.array_equal(x.astype(np.float16), ref32.astype(np.float16))
    assert ckpt.spec("pooler.dense.weight").kind == "quantized"
    assert np.array_equal(ckpt["encoder.layer.0.output.dense.bias"].data, ref["encoder.layer.0.output.dense.bias"])


def test_real_nf4_matches_reference():
    path = SAMPLES / "bnb_nf4_bs64"
    assert detect(Source(path)).format == "bitsandbytes"
    ckpt = read_bnb(Source(path))
    ref = load_file(str(path / "reference_dequant.safetensors"))
    for name in REF_NAMES:
        t = ckpt[name]
        assert t.group_map.granularity is Granularity.FLAT_BLOCK and t.group_map.group_size == 64
        assert np.allclose(t.scheme.codebook, NF4)
        assert np.array_equal(t.dequantize().astype(np.float16), ref[name])  # bit-exact in fp16
    assert ckpt.spec("pooler.dense.weight").kind == "quantized"
    assert ckpt["pooler.dense.weight"].shape == (384, 384)


def test_nf4_hand_high_nibble_first_and_blocks_straddle_rows(tmp_path):
    # shape (3, 5): 15 codes, odd -> 8 bytes; blocksize 4 -> 4 blocks, the last partial; blocks straddle rows
    codes = np.array([15, 0, 7, 8, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13], np.uint8)
    padded = np.append(codes, 0)
    packed = ((padded[0::2] << 4) | padded[1::2]).astype(np.uint8).reshape(-1, 1)
    assert packed[0, 0] == 0xF0
    absmax = np.array([2.0, 0.5, 4.0, 1.0], np.float32)
    t = {"l.weight": packed, "l.weight.absmax": absmax, "l.weight.quant_map": NF4,
         "l.weight.quant_state.bitsandbytes__nf4": qs_bytes({"quant_type": "nf4", "blocksize": 4, "dtype": "float16",
                                                             "shape": [3, 5]}),
         "l.bias": np.zeros(3, np.float16)}
    ck = read_bnb(Source(make_dir(tmp_path / "m", t)))
    q = ck["l.weight"]
    assert np.array_equal(q.codes, codes.reshape(3, 5))
    expect = (NF4[codes] * np.repeat(absmax, 4)[:15]).reshape(3, 5)
    assert np.array_equal(q.dequantize(), expect)
    assert q.dequantize()[0, 0] == 2.0 and q.dequantize()[0, 4] == np.float32(0.5) * NF4[1]  # row 0 col 4 in block 1


def test_double_quant_hand_example(tmp_path):
    # 6 blocks of 64 over a (4, 96) tensor; absmax stored as uint8 codes into a 256-entry map
    nqm = np.linspace(-1, 1, 256, dtype=np.float32)
    a_codes = np.array([255, 128, 200, 0, 17, 255], np.uint8)
    nabs = np.array([0.5], np.float32)
    offset = 0.25
    expect_absmax = nqm[a_codes] * np.float32(0.5) + np.float32(0.25)
    assert np.array_equal(decode_nested_absmax(a_codes, nqm, nabs, offset), expect_absmax)
    assert expect_absmax[0] == np.float32(0.75)  # nqm[255] = 1 -> 1*0.5 + 0.25
    codes = (np.arange(384) % 16).astype(np.uint8)
    packed = ((codes[0::2] << 4) | codes[1::2]).astype(np.uint8).reshape(-1, 1)
    t = {"l.weight": packed, "l.weight.absmax": a_codes, "l.weight.quant_map": NF4,
         "l.weight.nested_absmax": nabs, "l.weight.nested_quant_map": nqm,
         "l.weight.quant_state.bitsandbytes__nf4": qs_bytes({"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16",
                                                             "shape": [4, 96], "nested_blocksize": 256,
                                                             "nested_dtype": "float32", "nested_offset": offset})}
    q = read_bnb(Source(make_dir(tmp_path / "m", t)))["l.weight"]
    assert np.array_equal(q.scales, expect_absmax)
    assert np.array_equal(q.dequantize().reshape(-1), NF4[codes] * np.repeat(expect_absmax, 64))


def test_int8_hand_and_errors(tmp_path):
    w = np.array([[127, -127, 0], [64, 1, -128]], np.int8)
    scb = np.array([2.54, 1.27], np.float32)
    base = {"l.weight": w, "l.SCB": scb, "l.weight_format": np.array(0, np.uint8)}
    q = read_bnb(Source(make_dir(tmp_path / "ok", base)))["l.weight"]
    assert np.array_equal(q.codes, w)
    # against the exact rational w * SCB / 127 of the stored float32 SCB: within one float32 ulp
    # (bitsandbytes and we round twice, in different orders; the real sample test pins the tool's own)
    from fractions import Fraction
    x = q.dequantize()
    for (o, i), got in np.ndenumerate(x):
        exact = Fraction(int(w[o, i])) * Fraction(float(scb[o])) / 127
        assert abs(Fraction(float(got)) - exact) <= Fraction(float(np.spacing(np.float32(abs(float(exact)))))), (o, i)
    # SCB = 254 and 63.5: the scales are exactly 2 and 1/2, so every value is exact, computed by hand
    exact = read_bnb(Source(make_dir(tmp_path / "exact", {**base, "l.SCB": np.array([254.0, 63.5], np.float32)})))
    assert exact["l.weight"].dequantize().tolist() == [[254.0, -254.0, 0.0], [32.0, 0.5, -64.0]]
    bad = read_bnb(Source(make_dir(tmp_path / "col", {**base, "l.weight_format": np.array(1, np.uint8)})))
    with pytest.raises(UnsupportedError, match="weight_format"):
        bad["l.weight"]
    with pytest.raises(FormatError, match="SCB must be float32"):
        read_bnb(Source(make_dir(tmp_path / "scb", {**base, "l.SCB": np.ones(3, np.float32)})))
    with pytest.raises(MissingTensorError, match="l.weight"):
        read_bnb(Source(make_dir(tmp_path / "mw", {"l.SCB": scb, "x": np.ones(2, np.float16)})))


def test_4bit_errors(tmp_path):
    qs = {"quant_type": "nf4", "blocksize": 4, "dtype": "float16", "shape": [3, 5]}
    base = {"l.weight": np.zeros((8, 1), np.uint8), "l.weight.absmax": np.ones(4, np.float32),
            "l.weight.quant_map": NF4, "l.weight.quant_state.bitsandbytes__nf4": qs_bytes(qs)}
    read_bnb(Source(make_dir(tmp_path / "ok", base)))
    with pytest.raises(MissingTensorError, match="absmax"):
        read_bnb(Source(make_dir(tmp_path / "a", {k: v for k, v in base.items() if k != "l.weight.absmax"})))
    with pytest.raises(FormatError, match="contradicts quant_state shape"):
        read_bnb(Source(make_dir(tmp_path / "s", {**base, "l.weight.quant_state.bitsandbytes__nf4":
                                                   qs_bytes({**qs, "shape": [4, 5]})})))
    with pytest.raises(FormatError, match="absmax must be"):
        read_bnb(Source(make_dir(tmp_path / "n", {**base, "l.weight.absmax": np.ones(3, np.float32)})))
    with pytest.raises(FormatError, match="nested_offset"):
        read_bnb(Source(make_dir(tmp_path / "d", {**base, "l.weight.absmax": np.ones(4, np.uint8),
                                                  "l.weight.nested_absmax": np.ones(1, np.float32),
                                                  "l.weight.nested_quant_map": np.ones(256, np.float32)})))
