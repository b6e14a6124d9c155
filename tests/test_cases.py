"""CASES.md reproducers that were missing or only weakly covered elsewhere, each asserted with the
right value from CASES.md through the project's readers, writers, converter, CLI or validator.

Other cases live next to the code they exercise: tests/formats/ (per-format decode), tests/quant/
(requantization numerics), tests/test_cases_convert.py (across conversions) and
tests/validate/test_cases.py (validator findings).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

import converter
from converter.cli import main
from converter.errors import ConverterError, FormatError, LayoutError, NotRepresentableError, QuantizationError
from converter.formats import registry
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.ops.convert import convert_exact
from converter.kernels.packing import unpack_codes
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor
from converter.validate import validate


# -- independent helpers (no converter.kernels.packing) ---------------------------------------------
def lsb_words(fields, bits: int) -> list[int]:
    """One LSB-first bit stream of ``fields`` cut into 32-bit words (pure Python)."""
    acc = 0
    for k, v in enumerate(int(x) for x in fields):
        acc |= (v & ((1 << bits) - 1)) << (k * bits)
    return [(acc >> (32 * w)) & 0xFFFFFFFF for w in range(-(-len(fields) * bits // 32))]


def rows_u32(codes: np.ndarray, bits: int) -> np.ndarray:
    """[r, n] codes -> [r, n*bits/32] uint32 words packed along the row (MLX layout)."""
    return np.array([lsb_words(row, bits) for row in codes], dtype=np.uint64).astype(np.uint32)


def mlx_dir(path: Path, tensors: dict, quant: dict, **cfg) -> Path:
    path.mkdir(parents=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "quantization": quant,
                                                  "quantization_config": quant, **cfg}))
    return path


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# -- B05: no zero-point input means the centre 2^(bits-1); packed nibble zeros are not fp16 -------
B05_RIGHT = [0.0, -4.0, 3.5]  # codes [8, 0, 15], s = 0.5, zero point 8
B05_BUGGY = [4.0, 0.0, 7.5]  # zero point 0


def _b05_tensor():
    q = np.full((8, 32), 8, np.uint8)
    q[0, :3] = [8, 0, 15]
    return QuantizedTensor("model.layers.0.mlp.down_proj.weight", (OUT, IN), q, np.full((8, 1), 0.5, np.float16),
                           QuantScheme(4, False, ZeroPoint.NONE, "F16"), GroupMap.per_group(32))


@pytest.mark.parametrize("fmt", ["native", "gguf", "gptq", "compressed-tensors", "awq", "mlx"])
def test_b05_implicit_zero_point_is_the_centre(tmp_path, fmt):
    t = _b05_tensor()
    assert t.scheme.center == 8 and t.zero_points is None
    assert t.dequantize()[0, :3].tolist() == B05_RIGHT
    dst = tmp_path / ("out.gguf" if fmt == "gguf" else "out.safetensors" if fmt == "native" else "out")
    converter.save(Checkpoint.from_tensors([t], config={"model_type": "llama"}), dst, format=fmt)
    back = converter.load(dst)
    name = next(n for n in back.names() if "down_proj" in n)
    got = back[name].dequantize()[0, :3].tolist()
    assert got == B05_RIGHT and got != B05_BUGGY
    if fmt in ("gptq", "awq"):  # formats that always store zero points must write the centre, not 0
        words = load_file(str(dst / "model.safetensors"))["model.layers.0.mlp.down_proj.qzeros"].view(np.uint32)
        assert (words == 0x88888888).all() if fmt == "awq" else (words[0, 0] & 0xFF) == 0x88


def test_b05_packed_uint8_zero_points_are_nibbles_not_fp16(tmp_path):
    two = np.array([0x83, 0x83], np.uint8)
    assert unpack_codes(two, 4, axis=0, length=4, container=np.uint8).tolist() == [3, 8, 3, 8]
    assert float(two.view(np.float16)[0]) == pytest.approx(-5.36e-05, rel=1e-3)  # the meaningless fp16 reading
    with pytest.raises(LayoutError, match="packed words have the wrong dtype"):
        unpack_codes(two.view(np.float16), 4, axis=0, length=4, container=np.uint16)
    # a GPTQ checkpoint whose qzeros are stored as fp16 is refused, never reinterpreted
    d = tmp_path / "g"
    d.mkdir()
    save_file({"l.qweight": np.zeros((1, 8), np.int32), "l.qzeros": two.view(np.float16).reshape(1, 1),
               "l.scales": np.full((1, 8), 0.5, np.float16), "l.g_idx": np.zeros(8, np.int32)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": -1, "sym": False, "desc_act": False,
        "checkpoint_format": "gptq_v2"}}))
    with pytest.raises(FormatError) as ei:
        converter.load(d)
    assert ei.value.tensor == "l.qzeros" and ei.value.field == "dtype"
    assert [f.code for f in validate(d).findings] == ["dtype"]


# -- B07: blocks along axis 1 are sequential, through the dequantizer and the writers --------------
B07_RIGHT = [8, 8, 14, 14, 18, 18, 20, 20]
B07_BUGGY = [8, 14, 8, 14, 18, 20, 18, 20]


@pytest.mark.parametrize("fmt", [None, "native", "gptq", "compressed-tensors", "awq"])
def test_b07_blocked_dequant_is_sequential(tmp_path, fmt):
    rows = 8 if fmt == "awq" else 2  # AWQ GEMM packs 8 output channels per word
    s = np.tile(np.array([[1, 2], [3, 4]], np.float16), (rows // 2, 1))
    t = QuantizedTensor("m.l.weight", (OUT, IN), np.full((rows, 4), 9, np.uint8), s,
                        QuantScheme(4, False, ZeroPoint.INTEGER, "F16"), GroupMap.per_group(2),
                        zero_points=s.astype(np.int16))  # zero points equal to the scales
    if fmt is not None:
        converter.save(Checkpoint.from_tensors([t]), tmp_path / fmt, format=fmt)
        t = converter.load(tmp_path / fmt)["m.l.weight"]
    got = t.dequantize()[:2].reshape(-1).tolist()
    assert got == B07_RIGHT and got != B07_BUGGY


# -- B12: the writer never serializes actorder for a channel scheme ---------------------------------
@pytest.mark.parametrize("ct_version", [None, "0.12.2"])
def test_b12_channel_scheme_written_without_actorder(tmp_path, ct_version):
    # GPTQModel may save per-channel with desc_act true (g_idx all zero): act-order means nothing here
    q = np.tile(np.array([[8, 12], [5, 8], [15, 0], [8, 9]]), (2, 4))  # stored [I=8, O=8]
    qweight = np.array([lsb_words(q[:, o], 4) for o in range(8)], np.uint64).T.astype(np.uint32).view(np.int32)
    d = tmp_path / "g"
    d.mkdir()
    save_file({"m.l.qweight": np.ascontiguousarray(qweight), "m.l.qzeros": np.array([[0x88888888]], np.uint32).view(np.int32),
               "m.l.scales": np.full((1, 8), 0.5, np.float16), "m.l.g_idx": np.zeros(8, np.int32)},
              str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": -1, "sym": True, "desc_act": True,
        "checkpoint_format": "gptq_v2"}}))
    rep = convert_exact(d, tmp_path / "ct", "compressed-tensors", options={"ct_version": ct_version} if ct_version else None)
    assert rep["summary"]["all_exact"]
    weights = json.loads((tmp_path / "ct" / "config.json").read_text())["quantization_config"]["config_groups"]
    for g in weights.values():
        assert g["weights"]["strategy"] == "channel" and g["weights"].get("actorder") is None
    assert not [f for f in validate(tmp_path / "ct").findings if f.code == "config-mismatch"]
    back = converter.load(tmp_path / "ct")["m.l.weight"]
    assert back.dequantize()[:2, :4].tolist() == [[0, -1.5, 3.5, 0], [2.0, 0, -4.0, 0.5]]


# -- B15: a layer left dense is reported with its legal group sizes and stays at 16 bits -------------
def test_b15_skipped_layer_legal_sizes_and_16_bits(tmp_path):
    assert [4304 % g == 0 for g in (16, 32, 64, 128)] == [True, False, False, False]
    codes = np.arange(128, dtype=np.uint8).reshape(1, 128) % 16
    d = mlx_dir(tmp_path / "m", {"model.layers.0.mlp.up_proj.weight": rows_u32(codes, 4),
                                 "model.layers.0.mlp.up_proj.scales": np.ones((1, 2), np.float16),
                                 "model.layers.0.mlp.up_proj.biases": np.zeros((1, 2), np.float16),
                                 "model.layers.0.mlp.down_proj.weight": np.ones((2, 4304), np.float16)},
                {"group_size": 64, "bits": 4})
    ck = converter.load(d)
    assert ck.spec("model.layers.0.mlp.down_proj.weight").kind == "dense"
    rep = validate(d)
    f = next(f for f in rep.findings if f.code == "group-skip")
    assert f.tensor == "model.layers.0.mlp.down_proj.weight" and f.evidence["legal_group_sizes"] == [16]
    assert rep.exit_code == 0  # info only
    r = cli("audit", d, "--json")
    assert r.exit_code == 0
    row = next(t for t in json.loads(r.output)["tensors"] if t["name"] == "model.layers.0.mlp.down_proj.weight")
    assert row["kind"] == "dense" and row["stored_bytes"] * 8 == 16 * 2 * 4304  # 16 bits per weight


# -- B18: an all-zero group quantizes to zeros, never NaN -------------------------------------------
@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("zp", [ZeroPoint.NONE, ZeroPoint.INTEGER])
def test_b18_all_zero_group_quantizes_to_zero(bits, zp):
    scheme = QuantScheme(bits, zp is ZeroPoint.NONE, zp, "F16")
    t = converter.quantize(np.zeros((1, 4), np.float32), scheme, GroupMap.per_tensor(), name="w")
    s = t.scales.astype(np.float32)
    assert np.isfinite(s).all() and (s != 0).all()
    assert t.dequantize().tolist() == [[0.0, 0.0, 0.0, 0.0]]


# -- B23: an e4m3-subnormal NVFP4 scale decodes exactly, and the bf16/fp16 outputs keep it -----------
B23_RIGHT = [0.001953125, -0.00390625, 0.005859375]  # [0.5, -1, 1.5] * 2^-8


def test_b23_nvfp4_subnormal_e4m3_scale(tmp_path):
    sbyte = np.array([2.0 ** -8], np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert int(sbyte[0]) == 0x02  # subnormal in e4m3 (smallest normal 2^-6)
    codes = np.zeros((1, 16), np.uint8)
    codes[0, :3] = [0b0001, 0b1010, 0b0011]  # E2M1: 0.5, -1.0, 1.5
    d = mlx_dir(tmp_path / "nv", {"model.layers.0.mlp.up_proj.weight": rows_u32(codes, 4),
                                  "model.layers.0.mlp.up_proj.scales": sbyte.reshape(1, 1)},
                {"group_size": 16, "bits": 4, "mode": "nvfp4"})
    t = converter.load(d)["model.layers.0.mlp.up_proj.weight"]
    assert t.dequantize()[0, :3].tolist() == B23_RIGHT
    f = next(f for f in validate(d).findings if f.code == "scale-subnormal")
    assert f.severity == "warning" and f.tensor == "model.layers.0.mlp.up_proj.weight"
    for dt in ("bf16", "f16", "f32"):
        out = tmp_path / f"deq-{dt}.safetensors"
        assert cli("dequantize", d, out, "--dtype", dt).exit_code == 0
        w = load_file(str(out))["model.layers.0.mlp.up_proj.weight"].astype(np.float32)
        assert w[0, :3].tolist() == B23_RIGHT  # not q * 2^-112 ~ 0


# -- B24: exact repacks never narrow bf16 scales [1e-8, 70144, 3e-5] to fp16 [0, inf, 3e-5] -----------
def _b24_source(tmp_path) -> tuple[Path, QuantizedTensor]:
    s = np.array([[1.0e-8], [70144], [3.0e-5]] + [[1.0]] * 5, np.float32).astype(ml_dtypes.bfloat16)
    t = QuantizedTensor("model.layers.0.mlp.up_proj.weight", (OUT, IN), np.full((8, 32), 9, np.uint8), s,
                        QuantScheme(4, False, ZeroPoint.NONE, "BF16"), GroupMap.per_channel(OUT))
    p = tmp_path / "src.safetensors"
    converter.save(Checkpoint.from_tensors([t], config={"model_type": "llama"}), p)
    return p, t


@pytest.mark.parametrize("target", ["gptq", "awq", "gguf"])
def test_b24_fp16_targets_refuse_out_of_range_bf16_scales(tmp_path, target):
    src, _ = _b24_source(tmp_path)
    with np.errstate(over="ignore"):
        naive = np.array([1.0e-8, 70144, 3.0e-5], np.float32).astype(ml_dtypes.bfloat16).astype(np.float32).astype(np.float16)
    assert naive[0] == 0 and np.isinf(naive[1])  # what an unchecked cast would write
    dst = tmp_path / ("out.gguf" if target == "gguf" else "out")
    with pytest.raises((QuantizationError, NotRepresentableError)) as ei:
        convert_exact(src, dst, target)
    assert "model.layers.0.mlp.up_proj.weight" in str(ei.value)
    assert not dst.exists()


@pytest.mark.parametrize("target", ["compressed-tensors", "mlx"])
def test_b24_bf16_targets_keep_the_scales(tmp_path, target):
    src, t = _b24_source(tmp_path)
    rep = convert_exact(src, tmp_path / "out", target)
    assert rep["summary"]["all_exact"]
    back = converter.load(tmp_path / "out")["model.layers.0.mlp.up_proj.weight"]
    assert back.scheme.scale_dtype == "BF16" and np.isfinite(back.dequantize()).all()
    assert np.array_equal(back.dequantize(), t.dequantize())


# -- B25: arithmetic on bf16 parameters happens in float32, narrowing once at the end --------------
def test_b25_bf16_affine_dequant_in_float32(tmp_path):
    bf = ml_dtypes.bfloat16
    w = np.array([3.140625, 0.01171875, -0.3046875], np.float32)  # bf16-exact
    right = [4.140625, 1.01171875, 0.6953125]
    buggy = [4.125, 1.015625, 0.6953125]  # + 1 in bf16
    assert (w.astype(bf) + np.array(1, bf)).astype(np.float32).tolist() == buggy
    # MLX affine: w = s*q + b with q = 1, s = w, b = 1 (bf16 scales and biases)
    codes = np.zeros((3, 32), np.uint8)
    codes[:, 0] = 1
    d = mlx_dir(tmp_path / "m", {"model.layers.0.mlp.up_proj.weight": rows_u32(codes, 4),
                                 "model.layers.0.mlp.up_proj.scales": w.reshape(3, 1).astype(bf),
                                 "model.layers.0.mlp.up_proj.biases": np.ones((3, 1), bf)},
                {"group_size": 32, "bits": 4})
    assert converter.load(d)["model.layers.0.mlp.up_proj.weight"].dequantize()[:, 0].tolist() == right
    for dt in ("f32", "f16"):  # both hold the float32 results exactly
        out = tmp_path / f"{dt}.safetensors"
        assert cli("dequantize", d, out, "--dtype", dt).exit_code == 0
        assert load_file(str(out))["model.layers.0.mlp.up_proj.weight"][:, 0].astype(np.float32).tolist() == right


# -- B27: the other direction: 4-bit/g32 codes labelled 2-bit/g64 --------------------------------------
def test_b27_4bit_g32_labelled_2bit_g64_is_refused(tmp_path):
    codes = np.random.default_rng(27).integers(0, 16, (8, 128)).astype(np.uint8)
    tensors = {"model.layers.0.mlp.up_proj.weight": rows_u32(codes, 4),
               "model.layers.0.mlp.up_proj.scales": np.ones((8, 4), np.float16),
               "model.layers.0.mlp.up_proj.biases": np.zeros((8, 4), np.float16)}
    assert tensors["model.layers.0.mlp.up_proj.weight"].shape == (8, 16)  # same as in=256, 2-bit
    bad = mlx_dir(tmp_path / "bad", tensors, {"group_size": 64, "bits": 2}, hidden_size=128)
    with pytest.raises(FormatError, match=r"bits=4, group_size=32"):
        converter.load(bad)
    assert [f.code for f in validate(bad).findings if f.severity == "error"] == ["config-mismatch"]
    good = mlx_dir(tmp_path / "good", tensors, {"group_size": 32, "bits": 4}, hidden_size=128)
    t = converter.load(good)["model.layers.0.mlp.up_proj.weight"]
    assert t.shape == (8, 128) and np.array_equal(t.codes, codes)


# -- B32 / B33: tied heads ----------------------------------------------------------------------------
E = np.array([[1, 0], [0, 1], [1, 1]], np.float16)
H = np.array([2, 1], np.float32)


def _tied_source(tmp_path, head) -> Path:
    q = QuantizedTensor("model.layers.0.mlp.down_proj.weight", (OUT, IN), np.full((8, 32), 9, np.uint8),
                        np.full((8, 1), 0.5, np.float16), QuantScheme(4, False, ZeroPoint.NONE, "F16"),
                        GroupMap.per_group(32))
    p = tmp_path / "src.safetensors"
    from tests.conftest import write_native_as_is
    cfg = {"model_type": "llama", "tie_word_embeddings": True, "hidden_size": 2, "vocab_size": 3}
    write_native_as_is(p, [q, DenseTensor("model.embed_tokens.weight", E), DenseTensor("lm_head.weight", head)], cfg)
    assert "lm_head.weight" in converter.load(p).names()
    return p


def test_b32_gguf_keeps_a_different_head(tmp_path):
    L = E.copy()
    L[2] = [1.5, 1]
    convert_exact(_tied_source(tmp_path, L), tmp_path / "out.gguf", "gguf")
    out = converter.load(tmp_path / "out.gguf")
    assert (H @ out["lm_head.weight"].dequantize().T).tolist() == [2, 1, 4]  # not the tied [2, 1, 3]


@pytest.mark.parametrize("target", ["gguf", "native"])
def test_b33_identical_head_stored_once_in_every_target(tmp_path, target):
    """README: with tie_word_embeddings true, an lm_head identical to the embedding is stored once.

    llama.cpp falls back to token_embd when output.weight is absent; the native file keeps the config.
    """
    dst = tmp_path / ("out.gguf" if target == "gguf" else "out.safetensors")
    rep = convert_exact(_tied_source(tmp_path, E.copy()), dst, target)
    out = converter.load(dst)
    assert (H @ out["model.embed_tokens.weight"].dequantize().T).tolist() == [2, 1, 3]
    assert "lm_head.weight" not in out.names(), f"{target}: the identical head is stored twice"
    assert next(r for r in rep["tensors"] if r["name"] == "lm_head.weight")["mode"] == "tied"


def test_b32_native_target_unties_a_different_head(tmp_path):
    """A kept, different head under tie_word_embeddings: true is dropped by tie-honouring loaders."""
    L = E.copy()
    L[2] = [1.5, 1]
    dst = tmp_path / "out.safetensors"
    convert_exact(_tied_source(tmp_path, L), dst, "native")
    out = converter.load(dst)
    assert (H @ out["lm_head.weight"].dequantize().T).tolist() == [2, 1, 4]
    assert out.config.get("tie_word_embeddings") is False, "config still ties a head that differs (B32)"
    assert not [f for f in validate(dst).findings if f.code == "tied-embeddings"]


def test_b33_quantized_duplicate_head_cost(tmp_path):
    # Qwen1.5-0.5B: vocab 151936 x hidden 1024, 4-bit / g64, fp16 scales + biases. Here vocab 64 = 151936 / 2374.
    V, Hd = 64, 1024
    rng = np.random.default_rng(33)
    scheme = QuantScheme(4, False, ZeroPoint.FLOAT, "F16")
    e = converter.quantize(rng.normal(size=(V, Hd)).astype(np.float32), scheme, GroupMap.per_group(64),
                           name="model.embed_tokens.weight")
    other = QuantizedTensor("model.layers.0.mlp.x.weight", (OUT, IN), e.codes, e.scales, scheme, e.group_map,
                            zero_points=e.zero_points)
    d = tmp_path / "m"
    converter.save(Checkpoint.from_tensors([e, other], config={"model_type": "qwen2", "tie_word_embeddings": True,
                                                                "hidden_size": Hd, "vocab_size": V}), d, format="mlx")
    raw = load_file(str(d / "model.safetensors"))
    for k in [k for k in raw if k.startswith("model.layers.0.mlp.x.")]:
        raw["lm_head." + k.rsplit(".", 1)[1]] = raw.pop(k)  # an untied copy of the embedding as the head
    save_file(raw, str(d / "model.safetensors"))
    f = next(f for f in validate(d).findings if f.code == "tied-embeddings")
    assert f.severity == "warning" and f.tensor == "lm_head.weight"
    assert f.evidence["duplicate_bytes"] == V * Hd // 2 + 2 * 2 * V * Hd // 64 == 36864
    assert f.evidence["duplicate_bytes"] * (151936 // V) == 77_791_232 + 9_723_904  # ~87.5 MB
    rep = convert_exact(d, tmp_path / "once", "mlx")
    assert rep["written"]["tied_head"]["identical"]
    assert not any(k.startswith("lm_head") for k in load_file(str(tmp_path / "once" / "model.safetensors")))


# -- B36: the LFS stub's "header length" is named, not allocated ------------------------------------
def test_b36_lfs_stub_header_length_reported(tmp_path):
    stub = "version https://git-lfs.github.com/spec/v1\noid sha256:" + "ab" * 32 + "\nsize 9876543210\n"
    p = tmp_path / "model.safetensors"
    p.write_text(stub)
    assert int.from_bytes(b"version ", "little") == 2_336_927_755_350_992_246 and len(stub) == 135
    with pytest.raises(ConverterError) as ei:
        converter.load(p)
    msg = str(ei.value)
    assert "git-LFS pointer" in msg and "2336927755350992246" in msg and ei.value.field == "header_length"
    r = cli("inspect", p)
    assert r.exit_code == 3 and "Traceback" not in r.output


# -- B38: block size 512 re-blocked exactly to a size kernels accept ---------------------------------
@pytest.mark.parametrize("group", [128, 256])
def test_b38_reblock_512_exactly(tmp_path, group):
    K, N, G = 2048, 8, 512
    t = QuantizedTensor("model.layers.0.mlp.down_proj.weight", (OUT, IN), np.full((N, K), 2, np.uint8),
                        np.full((N, K // G), 0.5, np.float16), QuantScheme(4, False, ZeroPoint.INTEGER, "F16"),
                        GroupMap.per_group(G), zero_points=np.full((N, K // G), 3, np.int16))
    src = tmp_path / "g"
    converter.save(Checkpoint.from_tensors([t]), src, format="gptq", checkpoint_format="gptq_v2")
    w = converter.load(src)["model.layers.0.mlp.down_proj.weight"].dequantize()
    assert (w @ np.ones(K, np.float32)).tolist() == [-1024.0] * N  # 2048 * 0.5 * (2 - 3); buggy: 0
    f = next(f for f in validate(src).findings if f.code == "group-size")
    assert f.evidence["group_size"] == 512 and f.evidence["exact_reblock_to"] == 256
    dst = tmp_path / "rb"
    r = cli("convert", src, dst, "--group-size", group, "--to", "gptq", "--json")
    assert r.exit_code == 0, r.output
    assert [row["result"] for row in json.loads(r.output)["tensors"]] == ["exact"]
    back = converter.load(dst)["model.layers.0.mlp.down_proj.weight"]
    assert back.group_map.group_size == group and back.scales.shape == (N, K // group)
    assert np.array_equal(back.dequantize(), w)
    assert (back.dequantize() @ np.ones(K, np.float32)).tolist() == [-1024.0] * N
    assert not [f for f in validate(dst).findings if f.code == "group-size"]
