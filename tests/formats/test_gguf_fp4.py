"""GGUF ``MXFP4`` / ``NVFP4``: hand-made blocks, llama.cpp's own quantizer bytes, and exact repacks of the real
compressed-tensors / ModelOpt FP4 samples.

Expected values come from hand computation (E2M1 codes x E8M0 / E4M3 scales), from llama.cpp's C reference
functions (``tests/data/gguf_fp4/reference.safetensors``, PROVENANCE.json there), from gguf-py 0.19's
``gguf.quants`` and from the producing tools' own decodes (``reference_dequant.safetensors`` of the samples).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import gguf
import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file

from converter.cli import main
from converter.codebooks import E2M1_VALUES
from converter.errors import CorruptFileError, FormatError, NotRepresentableError, QuantizationError
from converter.formats.gguf.block_fp4 import FP4_CODECS
from converter.formats.gguf.fp4 import fp4_fields, fp4_match
from converter.formats.registry import load
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor, spec_of
from tests.conftest import SAMPLES

DATA = Path(__file__).resolve().parents[1] / "data"
REF = load_file(str(DATA / "gguf_fp4" / "reference.safetensors"))
E2M1 = np.array(E2M1_VALUES, dtype=np.float32)
MX_SAMPLE, NV_SAMPLE, MO_SAMPLE = (SAMPLES / "ct_mxfp4_smollm2", SAMPLES / "ct_nvfp4_smollm2",
                                   SAMPLES / "modelopt_nvfp4_smollm2tiny")


def _gguf(path: Path, tensors: dict) -> Path:
    """A GGUF file (gguf-py GGUFWriter, arch ``unknownarch``: names kept) of ``{name: (array, ggml type)}``."""
    w = gguf.GGUFWriter(path, "unknownarch")
    for name, (a, t) in tensors.items():
        if t in ("MXFP4", "NVFP4"):
            w.add_tensor(name, a, raw_dtype=gguf.GGMLQuantizationType[t])
        else:
            w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _raw_safetensors(path: Path) -> dict:
    """``{name: (dtype, shape, bytes)}`` of a safetensors file (bf16 included)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in head.items() if k != "__metadata__"}


def _bf16(path: Path, name: str) -> np.ndarray:
    dt, shape, b = _raw_safetensors(path)[name]
    assert dt == "BF16"
    return np.frombuffer(b, np.uint16).view(ml_dtypes.bfloat16).reshape(shape).astype(np.float32)


# -- hand-computed blocks ---------------------------------------------------------------------

def test_mxfp4_block_by_hand_split_nibble_order(tmp_path):
    # e = 128 (scale 2.0); byte j = code(j) | code(j + 16) << 4 with code(j) = j % 16, code(j + 16) = 15 - j
    qs = np.array([(j % 16) | ((15 - j) << 4) for j in range(16)], dtype=np.uint8)
    row = np.concatenate([[128], qs]).astype(np.uint8).reshape(1, 17)
    t = load(_gguf(tmp_path / "mx.gguf", {"w.weight": (row, "MXFP4")}))["w.weight"]
    codes = np.array([j % 16 for j in range(16)] + [15 - j for j in range(16)])
    assert t.shape == (1, 32) and np.array_equal(t.codes[0], codes)
    assert t.scales.dtype == ml_dtypes.float8_e8m0fnu and float(t.scales[0, 0]) == 2.0
    expected = 2.0 * E2M1[codes]  # element 1: code 1 = 0.5 -> 1.0; element 16: code 15 = -6 -> -12
    assert np.array_equal(t.dequantize(), expected[None])
    assert t.dequantize()[0, 1] == 1.0 and t.dequantize()[0, 16] == -12.0
    # the even-low order (compressed-tensors) would put code 15 - 0 at element 1: a different tensor
    even_low = np.stack([qs & 15, qs >> 4], axis=1).ravel()
    assert not np.array_equal(even_low, codes)
    # ggml's own decode (gguf-py 0.19, the port of dequantize_row_mxfp4) agrees value for value
    assert np.array_equal(gguf.quants.dequantize(row, gguf.GGMLQuantizationType.MXFP4), expected[None])


def test_nvfp4_block_by_hand_with_scale_multiplier(tmp_path):
    # four 16-groups: E4M3 0x38 = 1.0, 0x40 = 2.0, 0x01 = 2^-9 (subnormal), 0x7E = 448
    d = np.array([0x38, 0x40, 0x01, 0x7E], dtype=np.uint8)
    codes = np.arange(64) % 16
    qs = np.concatenate([(codes[16 * s:16 * s + 8] | (codes[16 * s + 8:16 * s + 16] << 4)) for s in range(4)])
    row = np.concatenate([d, qs.astype(np.uint8)]).reshape(1, 36)
    path = _gguf(tmp_path / "nv.gguf", {"w.weight": (row, "NVFP4"), "w.scale": (np.array([0.25], np.float32), "F32")})
    ck = load(path)
    assert ck.names() == ["w.weight"]  # the .scale tensor is the weight's global scale, not a tensor
    spec = ck.spec("w.weight")
    assert spec.scheme.global_scale == "multiplier" and spec.group_map.group_size == 16
    t = ck["w.weight"]
    assert np.array_equal(t.codes[0], codes) and float(t.global_scale) == 0.25
    per_group = np.repeat(np.array([1.0, 2.0, 2.0 ** -9, 448.0], np.float32) * np.float32(0.25), 16)
    assert np.array_equal(t.dequantize()[0], per_group * E2M1[codes])
    # without the multiplier, ggml's decode (gguf-py port of dequantize_row_nvfp4) gives e4m3 x e2m1
    assert np.array_equal(gguf.quants.dequantize(row, gguf.GGMLQuantizationType.NVFP4)[0],
                          per_group / np.float32(0.25) * E2M1[codes])


def test_e8m0_extremes_and_nan_byte(tmp_path):
    row = np.zeros((1, 17), np.uint8)
    row[0, 1] = 0x07  # element 0: code 7 (6.0)
    for e, scale in ((0, 2.0 ** -127), (254, 2.0 ** 127)):
        row[0, 0] = e
        t = load(_gguf(tmp_path / f"e{e}.gguf", {"w.weight": (row, "MXFP4")}))["w.weight"]
        assert float(t.scales[0, 0]) == scale
        with np.errstate(over="ignore"):  # 6 * 2^127 is inf in float32, in ggml's decode too
            assert t.dequantize()[0, 0] == np.float32(6.0) * np.float32(scale)
    row[0, 0] = 0xFF
    ck = load(_gguf(tmp_path / "nan.gguf", {"w.weight": (row, "MXFP4")}))
    with pytest.raises(FormatError) as err:
        ck["w.weight"]
    assert err.value.field == "e" and "0xFF" in str(err.value.found) and err.value.tensor == "w.weight"


@pytest.mark.parametrize("byte", [0x7F, 0x80, 0xB8])
def test_ue4m3_bytes_ggml_does_not_decode_as_e4m3_are_refused(tmp_path, byte):
    row = np.zeros((1, 36), np.uint8)
    row[0, 2] = byte
    ck = load(_gguf(tmp_path / "nv.gguf", {"w.weight": (row, "NVFP4")}))
    with pytest.raises(FormatError) as err:
        ck["w.weight"]
    assert err.value.field == "d" and f"0x{byte:02X}" in str(err.value.found)


def test_partial_blocks_are_refused():
    with pytest.raises(CorruptFileError):  # 1.5 MXFP4 blocks in a row
        FP4_CODECS["MXFP4"].decode(np.zeros((1, 17 + 9), np.uint8))
    with pytest.raises(QuantizationError):  # quantize_row_nvfp4_ref asserts k % 64 == 0
        FP4_CODECS["NVFP4"].encode(np.ones((2, 48), np.float32))
    scheme = QuantScheme(4, False, scale_dtype="F8_E8M0", codebook=E2M1_VALUES)
    t = QuantizedTensor("w", (OUT, IN), np.zeros((2, 48), np.uint8), np.ones((2, 2), ml_dtypes.float8_e8m0fnu),
                        scheme, GroupMap.per_group(32, IN))
    typ, why = fp4_match(spec_of(t))
    assert typ is None and "48" in why and "32-element MXFP4 block" in why
    nv = QuantizedTensor("w", (OUT, IN), np.zeros((2, 96), np.uint8), np.ones((2, 6), ml_dtypes.float8_e4m3fn),
                         scheme.replace(scale_dtype="F8_E4M3"), GroupMap.per_group(16, IN))
    typ, why = fp4_match(spec_of(nv))  # whole 16-groups, but not whole 64-element NVFP4 blocks
    assert typ is None and "64-element NVFP4 block" in why


def test_writer_refuses_scales_gguf_cannot_hold():
    scheme = QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=E2M1_VALUES)
    neg = np.full((1, 4), -1.0, dtype=ml_dtypes.float8_e4m3fn)
    t = QuantizedTensor("w", (OUT, IN), np.zeros((1, 64), np.uint8), neg, scheme, GroupMap.per_group(16, IN))
    with pytest.raises(NotRepresentableError) as err:
        fp4_fields(t, "NVFP4")
    assert err.value.field == "scales" and err.value.tensor == "w"
    mx = QuantizedTensor("w", (OUT, IN), np.zeros((1, 32), np.uint8),
                         np.array([[0xFF]], np.uint8).view(ml_dtypes.float8_e8m0fnu),
                         scheme.replace(scale_dtype="F8_E8M0"), GroupMap.per_group(32, IN))
    with pytest.raises(NotRepresentableError):
        fp4_fields(mx, "MXFP4")


# -- llama.cpp's reference quantizer and dequantizer --------------------------------------------

@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_quantize_is_byte_exact_with_llama_cpp_reference(kind):
    codec = FP4_CODECS[kind.upper()]
    hard = REF[f"{kind}.hard.input"]
    assert np.array_equal(codec.encode(hard), REF[f"{kind}.hard.blocks"])
    real = load_file(str(DATA / "fp4" / "smollm2_fp4_fixture.safetensors"))
    k = real["model.layers.0.self_attn.k_proj.weight.bf16"].view(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(codec.encode(k), REF[f"{kind}.k_proj.blocks"])


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_decode_equals_llama_cpp_dequantize(kind):
    from converter.formats.gguf.schemes import tensor_from_fields
    codec = FP4_CODECS[kind.upper()]
    blocks, want = REF[f"{kind}.hard.blocks"], REF[f"{kind}.hard.dequant"]
    t = tensor_from_fields("w", codec.decode(blocks), want.shape)
    got = t.dequantize()
    assert np.array_equal(got, want)
    # bit for bit except the sign of zero: ggml's int8 kvalues has 0 for code 0x8, E2M1 has -0.0
    differ = got.view(np.uint32) != want.view(np.uint32)
    assert np.all(t.codes[differ] == 8) and np.all(got[differ] == 0)
    assert np.array_equal(codec.pack(codec.decode(blocks)), blocks)
    # gguf-py 0.19's numpy port decodes the same bits as the C function
    qt = gguf.GGMLQuantizationType[kind.upper()]
    assert np.array_equal(gguf.quants.dequantize(blocks, qt).view(np.uint32), want.view(np.uint32))


# -- exact repacks of the real samples --------------------------------------------------------

def _convert(src: Path, dst: Path, *extra: str) -> dict:
    res = CliRunner().invoke(main, ["convert", str(src), str(dst), "--to", "gguf", "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_ct_mxfp4_to_gguf_is_exact_and_round_trips_bit_for_bit(tmp_path):
    dst = tmp_path / "mx.gguf"
    doc = _convert(MX_SAMPLE, dst)
    assert doc["mode"] == "repack" and doc["summary"]["all_exact"] and doc["summary"]["exact"] == 4
    assert set(doc["written"]["types"].values()) == {"MXFP4"}
    src, back = load(MX_SAMPLE), load(dst)
    r = gguf.GGUFReader(dst)
    for name in src.names():
        a, b = src[name], back[name]
        assert np.array_equal(a.codes, b.codes), name
        assert np.array_equal(np.asarray(a.scales).view(np.uint8), np.asarray(b.scales).view(np.uint8)), name
        assert np.array_equal(a.dequantize().view(np.uint32), b.dequantize().view(np.uint32)), name
    # ggml's decode of the written blocks equals compressed-tensors' own decode (bf16) of the source
    names = back.metadata["gguf_names"]
    for t in r.tensors:
        hf = next(k for k, v in names.items() if v == t.name)
        if "attn_q" in t.name or "attn_k" in t.name:
            continue  # LLaMA q/k rows are permuted in GGUF (checked through the reader above)
        ggml = gguf.quants.dequantize(t.data, t.tensor_type).astype(ml_dtypes.bfloat16).astype(np.float32)
        assert np.array_equal(ggml, _bf16(MX_SAMPLE / "reference_dequant.safetensors", hf)), hf
    # and back to compressed-tensors: the very bytes of the source
    out = tmp_path / "ct"
    res = CliRunner().invoke(main, ["convert", str(dst), str(out), "--to", "compressed-tensors"])
    assert res.exit_code == 0, res.output
    a, b = _raw_safetensors(MX_SAMPLE / "model.safetensors"), _raw_safetensors(out / "model.safetensors")
    assert a == b


def test_modelopt_nvfp4_to_gguf_exact_with_scale_tensors(tmp_path):
    dst = tmp_path / "nv.gguf"
    doc = _convert(MO_SAMPLE, dst)
    assert doc["summary"]["quantized"]["exact"] == 7 and doc["summary"]["dense"]["changed"] == 0
    src, back = load(MO_SAMPLE), load(dst)
    r = {t.name: t for t in gguf.GGUFReader(dst).tensors}
    names = back.metadata["gguf_names"]
    for name in src.quantized_names():
        a, b = src[name], back[name]
        assert b.scheme.global_scale == "multiplier"
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales.view(np.uint8), b.scales.view(np.uint8))
        scale = r[names[name].replace(".weight", ".scale")]
        assert scale.tensor_type.name == "F32" and list(scale.shape) == [1]
        assert np.asarray(scale.data).view(np.uint32)[0] == np.asarray(a.global_scale).view(np.uint32)
        assert np.array_equal(a.dequantize().view(np.uint32), b.dequantize().view(np.uint32)), name
    assert "blk.0.attn_q.input_scale" not in r  # activation scales are not written (see the test below)


def test_ct_nvfp4_divisor_global_scale_is_refused(tmp_path):
    dst = tmp_path / "nv.gguf"
    res = CliRunner().invoke(main, ["convert", str(NV_SAMPLE), str(dst), "--to", "gguf"])
    assert res.exit_code != 0 and not dst.exists()
    # the real sample's down_proj weight_global_scale (a divisor) is 936.0: 1/936 is not a float32 multiplier
    assert "936.0" in res.output and "multipl" in res.output and "global_scale" in res.output


@pytest.mark.parametrize("qt", ["MXFP4", "NVFP4"])
def test_quant_type_from_float_is_llama_cpp_bytes(tmp_path, qt):
    f16 = SAMPLES / "gguf" / "minilm_gguf_F16.gguf"
    dst = tmp_path / f"{qt}.gguf"
    doc = _convert(f16, dst, "--quant-type", qt)
    assert doc["target"]["quant_type"] == qt
    rows = [r for r in doc["tensors"] if r["name"].endswith("weight") and "quantizer" in r.get("target", {})]
    assert rows and all(f"quantize_row_{qt.lower()}_ref" in r["target"]["quantizer"] for r in rows)
    srcs = {t.name: t for t in gguf.GGUFReader(f16).tensors}
    back = load(dst)
    names = back.metadata["gguf_names"]
    for t in gguf.GGUFReader(dst).tensors:
        if t.tensor_type.name != qt:
            continue
        x = np.asarray(srcs[t.name].data).astype(np.float32)
        # MXFP4: gguf-py 0.19's own port of quantize_row_mxfp4_ref; gguf-py has no NVFP4 quantizer, so the
        # codec (byte-exact with the C function, test above) stands in
        want = (gguf.quants.quantize(x, t.tensor_type) if qt == "MXFP4"
                else FP4_CODECS[qt].encode(x.reshape(-1, x.shape[-1])).reshape(np.asarray(t.data).shape))
        assert np.array_equal(want, np.asarray(t.data)), t.name
        hf = next(k for k, v in names.items() if v == t.name)
        assert np.array_equal(back[hf].dequantize(), gguf.quants.dequantize(t.data, t.tensor_type)), t.name


def test_per_expert_scale_vector_is_listed_not_decoded(tmp_path):
    row = np.zeros((2, 2, 36), np.uint8).reshape(2, 2, 36)
    ck = load(_gguf(tmp_path / "e.gguf", {"w.weight": (row, "NVFP4"), "w.scale": (np.ones(2, np.float32), "F32")}))
    spec = ck.spec("w.weight")
    assert spec.kind == "opaque" and any("per-expert" in n for n in spec.notes)
    # a .scale of another type is not silently ignored either
    ck = load(_gguf(tmp_path / "f16.gguf", {"w.weight": (row[0], "NVFP4"), "w.scale": (np.ones(1, np.float16), "F16")}))
    assert ck.names() == ["w.weight"] and ck.spec("w.weight").kind == "opaque"


def test_ct_legacy_e8m0_bias_gives_the_same_gguf_exponents(tmp_path):
    """compressed-tensors 0.13.0 stored MXFP4 exponents 2 below OCP E8M0 (:mod:`...e8m0_rule`): the same
    weights written that way must give the same GGUF ``e`` bytes (the true exponents), not bytes 2 too low."""
    import shutil
    from safetensors.numpy import save_file
    legacy = tmp_path / "legacy"
    shutil.copytree(MX_SAMPLE, legacy)
    cfg = json.loads((legacy / "config.json").read_text())
    cfg["quantization_config"]["version"] = "0.13.0"
    (legacy / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(MX_SAMPLE / "model.safetensors"))
    tensors = {k: (v - np.uint8(2) if k.endswith("weight_scale") else v) for k, v in tensors.items()}
    save_file(tensors, str(legacy / "model.safetensors"))
    a, b = _convert(MX_SAMPLE, tmp_path / "std.gguf"), _convert(legacy, tmp_path / "legacy.gguf")
    assert a["summary"]["all_exact"] and b["summary"]["all_exact"]
    std = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(tmp_path / "std.gguf").tensors}
    old = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(tmp_path / "legacy.gguf").tensors}
    assert std == old


def test_power_of_two_divisor_is_written_as_its_exact_multiplier(tmp_path):
    """A divisor global scale 4.0 (compressed-tensors' direction) is the multiplier 0.25 exactly: written as
    ``w.scale`` = 0.25 and read back with the same effective scales; 3.0 has no exact multiplier: refused."""
    from converter.formats.gguf.format import write_gguf
    from converter.tensor import Checkpoint
    rng = np.random.default_rng(1)
    scheme = QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=E2M1_VALUES, global_scale="divisor")
    scales = rng.uniform(0.01, 400, (2, 8)).astype(ml_dtypes.float8_e4m3fn)
    codes = rng.integers(0, 16, (2, 128)).astype(np.uint8)
    t = QuantizedTensor("w.weight", (OUT, IN), codes, scales, scheme, GroupMap.per_group(16, IN),
                        global_scale=np.array(4.0, np.float32))
    out = tmp_path / "p2.gguf"
    write_gguf(Checkpoint.from_tensors([t]), out, arch="unknownarch")
    r = {x.name: x for x in gguf.GGUFReader(out).tensors}
    assert float(np.asarray(r["w.scale"].data)[0]) == 0.25
    back = load(out)["w.weight"]
    assert back.scheme.global_scale == "multiplier" and np.array_equal(back.codes, codes)
    assert np.array_equal(back.dequantize().view(np.uint32), t.dequantize().view(np.uint32))
    bad = t.replace(global_scale=np.array(3.0, np.float32))
    with pytest.raises(NotRepresentableError) as err:
        write_gguf(Checkpoint.from_tensors([bad]), tmp_path / "p3.gguf", arch="unknownarch")
    assert err.value.field == "global_scale" and err.value.found == 3.0
    assert not (tmp_path / "p3.gguf").exists()


def test_quant_type_of_the_source_type_keeps_it_as_is(tmp_path):
    """As llama-quantize copies a tensor already of the target type: CT MXFP4 under --quant-type MXFP4 is
    carried, not requantized (llama.cpp's quantizer would pick +0 where compressed-tensors wrote -0).
    ModelOpt NVFP4 has a global scale, which llama.cpp's NVFP4 quantizer has not: requantized, and the file
    read back is what was computed (regression: the carried tensor's .scale was once dropped)."""
    doc = _convert(MO_SAMPLE, tmp_path / "nv.gguf", "--quant-type", "NVFP4")
    rows = [r for r in doc["tensors"] if r["name"].endswith("proj.weight")]
    assert len(rows) == 7 and all(r["route"] == "requantized" and r["readback_bit_exact"] for r in rows)
    assert not any(t.name.endswith(".scale") for t in gguf.GGUFReader(tmp_path / "nv.gguf").tensors)
    doc = _convert(MX_SAMPLE, tmp_path / "q.gguf", "--quant-type", "MXFP4")
    rows = [r for r in doc["tensors"] if r["name"].endswith("proj.weight")]
    assert len(rows) == 4 and all(r["route"] == "carried" and r["readback_bit_exact"] for r in rows)
    src, back = load(MX_SAMPLE), load(tmp_path / "q.gguf")
    for name in src.names():
        assert np.array_equal(src[name].codes, back[name].codes)
        assert np.array_equal(src[name].scales.view(np.uint8), back[name].scales.view(np.uint8))


def test_writer_never_drops_a_global_scale_its_spec_did_not_announce(tmp_path):
    """Regression: a tensor carrying a multiplier whose spec (a requantize target's) had none was written
    without its ``.scale`` (values off by the multiplier); now a typed error, nothing written."""
    from converter.formats.gguf.format import write_gguf
    from converter.tensor import Checkpoint
    scheme = QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=E2M1_VALUES)
    plain = QuantizedTensor("w.weight", (OUT, IN), np.zeros((1, 64), np.uint8),
                            np.ones((1, 4), ml_dtypes.float8_e4m3fn), scheme, GroupMap.per_group(16, IN))
    scaled = plain.replace(scheme=scheme.replace(global_scale="multiplier"), global_scale=np.array(2.0, np.float32))
    ck = Checkpoint({"w.weight": spec_of(plain)}, lambda name: scaled, format="memory")
    with pytest.raises(FormatError) as err:
        write_gguf(ck, tmp_path / "x.gguf", arch="unknownarch")
    assert err.value.field == "global_scale" and not (tmp_path / "x.gguf").exists()


def test_stacked_experts_mxfp4_round_trip(tmp_path):
    """(expert, out, in) MXFP4 (gpt-oss style experts): read as 3-D with one E8M0 scale per 32 along in,
    written back byte for byte."""
    from converter.formats.gguf.format import write_gguf
    from converter.tensor import Checkpoint
    rng = np.random.default_rng(3)
    raw = rng.integers(0, 256, (3, 2, 2 * 17), dtype=np.uint8)
    raw.reshape(3, 2, 2, 17)[..., 0] = rng.integers(100, 140, (3, 2, 2))  # finite E8M0 bytes
    src = _gguf(tmp_path / "e.gguf", {"blk.0.ffn_up_exps.weight": (raw, "MXFP4")})
    t = load(src)["blk.0.ffn_up_exps.weight"]
    assert t.shape == (3, 2, 64) and t.axes == ("expert", OUT, IN) and t.scales.shape == (3, 2, 2)
    assert np.array_equal(t.dequantize().reshape(6, 64),
                          gguf.quants.dequantize(raw.reshape(6, 34), gguf.GGMLQuantizationType.MXFP4))
    write_gguf(Checkpoint.from_tensors([t]), tmp_path / "back.gguf", arch="unknownarch")
    back = gguf.GGUFReader(tmp_path / "back.gguf").tensors[0]
    assert back.tensor_type.name == "MXFP4" and np.asarray(back.data).tobytes() == raw.tobytes()


def test_activation_scales_are_not_written_to_gguf_and_the_report_says_so(tmp_path):
    """Regression (interop fp4 group): ModelOpt's 7 static input_scale tensors were written to GGUF as
    F32 [1] tensors, which transformers' GGUF loader cannot load ("cannot reshape array of size 1");
    llama.cpp quantizes activations itself (its convert_hf_to_gguf.py writes <name>.input_scale, which
    llama.cpp 0.3.36 loads and never computes with). They are left out, each row says so, and the
    weights stay exact."""
    import gguf
    from click.testing import CliRunner

    from converter.cli import main
    from tests.conftest import SAMPLES

    for extra in ([], ["--bits", "8", "--group-size", "32", "--sym"]):
        dst = tmp_path / f"o{len(extra)}.gguf"
        r = CliRunner().invoke(main, ["convert", str(SAMPLES / "modelopt_nvfp4_smollm2tiny"), str(dst), "--to", "gguf",
                                      *extra, "--json"])
        assert r.exit_code == 0, r.output
        names = [t.name for t in gguf.GGUFReader(str(dst)).tensors]
        assert not any("input_scale" in n for n in names) and len(names) == len(set(names))
    doc = json.loads(CliRunner().invoke(main, ["convert", str(SAMPLES / "modelopt_nvfp4_smollm2tiny"),
                                               str(tmp_path / "p.gguf"), "--to", "gguf", "--json"]).output)
    rows = {t["name"]: t for t in doc["tensors"]}
    dropped = [n for n, t in rows.items() if t["mode"] == "dropped"]
    assert len(dropped) == 7 and all(n.endswith(".input_scale") for n in dropped)
    assert doc["summary"]["dense"]["dropped"] == 7 and doc["summary"]["quantized"]["exact"] == 7
    assert doc["summary"]["within_rounding"] and not doc["summary"]["all_exact"]  # not "all exact": 7 left out
