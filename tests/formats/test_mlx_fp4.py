"""MLX ``mxfp4`` / ``nvfp4`` (with and without ``global_scale``) on the genuine mlx 0.32.4 / mlx-lm 0.32.2
samples (scripts/make_mlx_fp4_samples.py): decode against mx.dequantize's own output (stored for k/v_proj,
sha256 of every quantized weight in PROVENANCE.json), writer round trips against the mlx-written bytes,
exact repacks with compressed-tensors and ModelOpt proven by read-back, typed refusals, and the validator
on these files (the subnormal-scale false alarm)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from converter.errors import FormatError, MissingTensorError, NotRepresentableError, UnsupportedError
from converter.formats.registry import load
from converter.formats.source import Source
from converter.ops.convert import convert_exact
from converter.validate import validate
from tests.conftest import SAMPLES

MX4, NV4, NVG = "mlx_mxfp4_smollm2tiny", "mlx_nvfp4_smollm2tiny", "mlx_nvfp4_global_smollm2"
MLX_SAMPLES = (MX4, NV4, NVG)
K, V = "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj"
DOWN = "model.layers.0.mlp.down_proj"
SUBSET = ("model.layers.0.self_attn.q_proj", K, V, DOWN)


def _stored(path: Path) -> dict:
    """Every array of a safetensors file as stored (F8 via ml_dtypes)."""
    src = Source(path)
    return {k: np.asarray(src.read(k)) for k in src.tensor_names()}


def _bits(x: np.ndarray, dtype: str) -> bytes:
    """The decode's bytes as mx.dequantize returned them: bf16 (RNE of our float32) or float32."""
    return x.astype(ml_dtypes.bfloat16).view(np.uint16).tobytes() if dtype == "bfloat16" else \
        x.astype(np.float32).tobytes()


def _model_arrays(d: Path) -> dict:
    return _stored(d / "model.safetensors")


# -- decode == mx.dequantize ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MLX_SAMPLES)
def test_decode_is_mx_dequantize_bit_for_bit(name):
    d = SAMPLES / name
    ck = load(d)
    prov = json.loads((d / "PROVENANCE.json").read_text())["reference"]["sha256_of_every_quantized_weight"]
    assert sorted(prov) == sorted(s.name for s in ck.specs() if s.kind == "quantized")
    ref = load_file(str(d / "reference_dequant.safetensors"))
    assert sorted(ref) == [K + ".weight", V + ".weight"]
    for tensor, h in prov.items():
        ours = ck[tensor].dequantize()
        assert list(ours.shape) == h["shape"]
        assert hashlib.sha256(_bits(ours, h["dtype"])).hexdigest() == h["sha256"], tensor
        if tensor in ref:
            theirs = ref[tensor]
            assert theirs.dtype.name == h["dtype"]
            wide = np.uint16 if h["dtype"] == "bfloat16" else np.uint32
            assert np.array_equal(np.frombuffer(_bits(ours, h["dtype"]), wide).reshape(theirs.shape),
                                  theirs.view(wide)), tensor


def test_global_scale_is_read_as_the_tensor_amax():
    ck, raw = load(SAMPLES / NVG), _model_arrays(SAMPLES / NVG)
    for p in SUBSET:
        t = ck[p + ".weight"]
        g = raw[p + ".global_scale"]
        assert t.scheme.global_scale == "amax" and t.global_scale.dtype == np.float32 and t.global_scale == g
        # by hand: E2M1 value x (E4M3 scale x fp32(g / 2688)), every product in float32
        e2m1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)
        words = raw[p + ".weight"].view(np.uint32)
        codes = ((words[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF).reshape(words.shape[0], -1)
        s = raw[p + ".scales"].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        eff = s * (np.float32(g) / np.float32(2688))
        want = e2m1[codes] * np.repeat(eff, 16, axis=1)
        assert np.array_equal(t.dequantize().view(np.uint32), want.view(np.uint32)), p


# -- writer: byte-identical with the mlx-written files ------------------------------------------------------
@pytest.mark.parametrize("name", MLX_SAMPLES)
def test_write_round_trip_reproduces_mlx_bytes_and_config(name, tmp_path):
    d, out = SAMPLES / name, tmp_path / "out"
    convert_exact(d, out, "mlx")
    a, b = _model_arrays(d), _model_arrays(out)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes(), k
    qa = json.loads((d / "config.json").read_text())["quantization"]
    qb = json.loads((out / "config.json").read_text())
    assert qb["quantization"] == qa and qb["quantization_config"] == qa


# -- exact repacks ---------------------------------------------------------------------------------------------
def test_ct_mxfp4_to_mlx_keeps_codes_and_e8m0_bytes(tmp_path):
    ct = SAMPLES / "ct_mxfp4_smollm2"
    cfg = json.loads((ct / "config.json").read_text())
    # written by compressed-tensors 0.19.0: the standard E8M0 byte 127 + log2(s) (e8m0_rule: >= 0.14.0), so the
    # MLX bytes are the stored bytes themselves
    assert cfg["quantization_config"]["version"].startswith("0.19")
    out = tmp_path / "mlx"
    convert_exact(ct, out, "mlx")
    src, got = _stored(ct / "model.safetensors"), _model_arrays(out)
    ref = load_file(str(ct / "reference_dequant.safetensors"))  # compressed-tensors' own decode (bf16)
    q = json.loads((out / "config.json").read_text())["quantization"]
    assert (q["mode"], q["group_size"], q["bits"]) == ("mxfp4", 32, 4)
    back = load(out)
    for p in SUBSET:
        assert np.array_equal(got[p + ".scales"], src[p + ".weight_scale"].view(np.uint8)), p
        packed = src[p + ".weight_packed"]  # low nibble = even element
        want = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
        want[:, 0::2], want[:, 1::2] = packed & 0xF, packed >> 4
        words = got[p + ".weight"]
        mine = ((words[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF).reshape(words.shape[0], -1)
        assert np.array_equal(mine, want), p
        ours = back[p + ".weight"].dequantize().astype(ml_dtypes.bfloat16)
        assert np.array_equal(ours.view(np.uint16), ref[p + ".weight"].view(np.uint16)), p


def test_legacy_ct_mxfp4_e8m0_becomes_the_standard_mlx_byte(tmp_path):
    """compressed-tensors 0.13.0 stored ``127 + log2(s) - 2`` (e8m0_rule.py): MLX gets the OCP byte ``127 + log2(s)``,
    i.e. the bytes the real 0.19.0 sample stores, from the legacy file's bytes + 2."""
    from converter.formats.registry import get
    ct = SAMPLES / "ct_mxfp4_smollm2"
    old, out = tmp_path / "old", tmp_path / "mlx"
    get("compressed-tensors").write(load(ct), old, ct_version="0.13.0")
    legacy, standard = _stored(old / "model.safetensors"), _stored(ct / "model.safetensors")
    convert_exact(old, out, "mlx")
    got = _model_arrays(out)
    for p in SUBSET:
        lb = legacy[p + ".weight_scale"].view(np.uint8).astype(np.int32)
        sb = standard[p + ".weight_scale"].view(np.uint8)
        assert np.array_equal(lb + 2, sb), p  # the legacy rule, by hand
        assert np.array_equal(got[p + ".scales"], sb), p


def test_mlx_mxfp4_to_ct_and_back_is_byte_identical(tmp_path):
    ct, back = tmp_path / "ct", tmp_path / "mlx"
    convert_exact(SAMPLES / MX4, ct, "compressed-tensors")
    convert_exact(ct, back, "mlx")
    a, b = _model_arrays(SAMPLES / MX4), _model_arrays(back)
    for p in ("model.layers.0.self_attn.q_proj", K, V, "model.layers.0.self_attn.o_proj", DOWN,
              "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"):
        for part in (".weight", ".scales"):
            assert a[p + part].tobytes() == b[p + part].tobytes(), p + part


def test_modelopt_nvfp4_to_mlx_global_scale_is_2688_times_the_multiplier(tmp_path):
    mo, out = SAMPLES / "modelopt_nvfp4_smollm2tiny", tmp_path / "mlx"
    report = convert_exact(mo, out, "mlx")
    src, got = _stored(mo / "model.safetensors"), _model_arrays(out)
    ref = load_file(str(mo / "reference_dequant.safetensors"))  # NVFP4QTensor.dequantize (bf16)
    back = load(out)
    q = json.loads((out / "config.json").read_text())["quantization"]
    prefixes = [n[: -len(".weight_scale_2")] for n in src if n.endswith(".weight_scale_2")]
    assert len(prefixes) == 7
    for p in prefixes:
        w, g = src[p + ".weight_scale_2"], got[p + ".global_scale"]
        assert g.dtype == np.float32 and g.shape == ()
        assert np.float32(g) / np.float32(2688) == np.float32(w), p  # MLX's s * fp32(g / 2688) is s * w
        assert np.array_equal(got[p + ".scales"], src[p + ".weight_scale"].view(np.uint8)), p
        assert q[p] == {"group_size": 16, "bits": 4, "mode": "nvfp4", "global_scale": True}
        ours = back[p + ".weight"].dequantize().astype(ml_dtypes.bfloat16).view(np.uint16)
        theirs = ref[p + ".weight"].view(np.uint16)
        diff = ours != theirs  # only ModelOpt's +0.0 for code 0x8 (OCP / MLX: -0.0)
        assert np.all(ours[diff] == 0x8000) and np.all(theirs[diff] == 0), p
    assert any("re-expressed as MLX's amax" in n for notes in report["written"]["notes"].values() for n in notes)


def test_ct_nvfp4_to_mlx_refuses_the_936_divisor_up_front(tmp_path):
    out = tmp_path / "mlx"
    with pytest.raises(NotRepresentableError) as info:
        convert_exact(SAMPLES / "ct_nvfp4_smollm2", out, "mlx")
    e = info.value
    assert e.tensor == DOWN + ".weight" and e.field == "global_scale" and "936.0" in str(e) and "amax" in str(e)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_power_of_two_divisor_becomes_an_exact_amax():
    from converter.formats.mlx.fp4 import amax_global_scale
    ck = load(SAMPLES / "ct_nvfp4_smollm2")
    t = ck[K + ".weight"]
    assert t.scheme.global_scale == "divisor" and t.global_scale == 512.0
    g = amax_global_scale(t)
    assert g == np.float32(5.25)  # 2688 / 512, and fp32(5.25 / 2688) == 2^-9 == 1 / 512 exactly
    assert np.float32(5.25) / np.float32(2688) == np.float32(2.0 ** -9)


def test_mlx_nvfp4_to_compressed_tensors_is_exact(tmp_path):
    out = tmp_path / "ct"
    convert_exact(SAMPLES / NV4, out, "compressed-tensors")
    a, b = load(SAMPLES / NV4), load(out)
    for p in SUBSET:
        x, y = a[p + ".weight"], b[p + ".weight"]
        assert np.array_equal(x.codes, y.codes) and np.array_equal(x.scales.view(np.uint8), y.scales.view(np.uint8))
        assert np.array_equal(x.dequantize().view(np.uint32), y.dequantize().view(np.uint32)), p


# -- typed refusals ----------------------------------------------------------------------------------------------
def _copy(tmp_path: Path, name=NVG) -> Path:
    d = tmp_path / name
    shutil.copytree(SAMPLES / name, d)
    return d


def _rewrite(d: Path, edit) -> None:
    arrays = _model_arrays(d)
    edit(arrays)
    save_file(arrays, str(d / "model.safetensors"), metadata={"format": "mlx"})


def test_global_scale_not_float32_scalar_is_a_format_error(tmp_path):
    d = _copy(tmp_path)
    _rewrite(d, lambda a: a.__setitem__(K + ".global_scale", np.array([1.0, 2.0], np.float32)))
    with pytest.raises(FormatError) as info:
        load(d)
    assert info.value.tensor == K + ".global_scale" and info.value.field == "shape"


def test_declared_global_scale_missing_is_a_missing_tensor(tmp_path):
    d = _copy(tmp_path)
    _rewrite(d, lambda a: a.pop(V + ".global_scale"))
    with pytest.raises(MissingTensorError) as info:
        load(d)
    assert info.value.tensor == V + ".global_scale"


def test_global_scale_in_mxfp4_mode_is_refused(tmp_path):
    d = _copy(tmp_path, MX4)
    (d / "model.safetensors.index.json").unlink()  # one file: the tensor set is the file's
    _rewrite(d, lambda a: a.__setitem__(K + ".global_scale", np.array(1.0, np.float32)))
    with pytest.raises(FormatError) as info:
        load(d)
    assert info.value.field == "quantization.mode" and "nvfp4" in str(info.value)


def test_per_expert_global_scales_are_unsupported(tmp_path):
    from converter.formats.mlx.fp4 import plan_fp4  # noqa: F401  (the writer never makes them either)
    d = tmp_path / "moe"
    d.mkdir()
    raw = _model_arrays(SAMPLES / NVG)
    p = "model.layers.0.mlp.switch_mlp.down_proj"
    arrays = {p + part: np.stack([raw[DOWN + part]] * 2) for part in (".weight", ".scales", ".global_scale")}
    save_file(arrays, str(d / "model.safetensors"), metadata={"format": "mlx"})
    cfg = json.loads((SAMPLES / NVG / "config.json").read_text())
    cfg["quantization"] = {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedError) as info:
        load(d)
    assert info.value.tensor == p + ".global_scale" and "per-expert" in str(info.value)


# -- the validator on these files (the false alarm) --------------------------------------------------------------
@pytest.mark.parametrize("name", MLX_SAMPLES)
def test_genuine_mlx_fp4_validates_clean_under_strict(name):
    rep = validate(SAMPLES / name, strict=True)
    assert rep.exit_code == 0 and all(f.severity == "info" for f in rep.findings)
    # mx.quantize nvfp4 (no global scale) writes subnormal E4M3 scales routinely: info, v_proj 2460 of 6912
    subnormal = {f.tensor: f.evidence["count"] for f in rep.findings if f.code == "scale-subnormal"}
    assert (subnormal.get(V + ".weight") == 2460) == (name == NV4)


@pytest.mark.parametrize("name", MLX_SAMPLES)
def test_against_mx_dequantize_no_decode_is_wrong(name):
    d = SAMPLES / name
    rep = validate(d, reference=d / "reference_dequant.safetensors", strict=False)
    assert rep.exit_code == 0
    assert not [f for f in rep.findings if f.severity == "error"]
    for t in (K, V):
        r = rep.tensors[t + ".weight"]["reference"]
        assert r["rms_steps"] < 0.01 and r["matmul_rel_error"] < 0.01  # the tool's own decode: rounding only


def test_reference_check_sees_a_wrong_global_scale(tmp_path):
    """The steps and the matmul prediction are in the decoded (global-scaled) units: a global scale off
    by 2 is a reference-mismatch (with the raw E4M3 scales as steps it passed, 2688 / g times too lenient)."""
    d = _copy(tmp_path)
    _rewrite(d, lambda a: a.__setitem__(V + ".global_scale", np.array(a[V + ".global_scale"] * 2, np.float32)))
    rep = validate(d, reference=SAMPLES / NVG / "reference_dequant.safetensors")
    errors = [(f.code, f.tensor) for f in rep.findings if f.severity == "error"]
    assert errors == [("reference-mismatch", V + ".weight")]
    assert rep.tensors[K + ".weight"]["reference"]["rms_steps"] < 0.01
