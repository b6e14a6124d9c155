"""ModelOpt NVFP4: the real nvidia-modelopt 0.47.0 export (NVFP4_DEFAULT_CFG) against ModelOpt's own decode, hand-built
layouts, the writer (exact repack, the global scale re-expressed as ModelOpt's multiplier or refused), bad inputs.

Reference: sample_checkpoints/modelopt_nvfp4_smollm2tiny/reference_dequant.safetensors, written by ModelOpt's
``NVFP4QTensor.dequantize`` (bf16, computed in float32 and rounded once). ModelOpt's E2M1 table decodes code 0x8 as
+0.0 where the OCP table has -0.0: those zeros (and only those) differ in their sign bit.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from converter import codebooks
from converter.cli import main
from converter.errors import FormatError, MissingTensorError, NotRepresentableError
from converter.formats.registry import get, load
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.layout import IN
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, spec_of
from tests.conftest import SAMPLES

MO = get("modelopt")
D = SAMPLES / "modelopt_nvfp4_smollm2tiny"
E4M3 = ml_dtypes.float8_e4m3fn
Q = "model.layers.0.self_attn.q_proj"
LINEARS = [f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"] + [f"model.layers.0.mlp.{p}_proj"
                                                                     for p in ("gate", "up", "down")]
#: mismatches FP_MANIFEST.json's own numpy check counted (all signed zeros), per tensor
MANIFEST_ZEROS = {"q": 20341, "k": 7047, "v": 5375, "o": 13850, "gate": 31035, "up": 30327, "down": 31463}


def load_file(path: str) -> dict:
    """Every stored array of a safetensors file, as stored (F8 through ml_dtypes)."""
    src = Source(Path(path))
    return {k: np.asarray(src.read(k)) for k in src.tensor_names()}


def _codes(packed: np.ndarray) -> np.ndarray:
    """E2M1 codes of a ModelOpt ``weight`` by hand: element 2j in the low nibble of byte j."""
    out = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 0x0F, packed >> 4
    return out


# -- the real export ------------------------------------------------------------------------------------------
def test_real_export_decodes_like_modelopt_except_the_sign_of_zero():
    ck, ref, raw = load(D), load_file(str(D / "reference_dequant.safetensors")), load_file(str(D / "model.safetensors"))
    assert ck.metadata["modelopt_quant_algo"] == "NVFP4" and sorted(ref) == sorted(p + ".weight" for p in LINEARS)
    total = 0
    for p in LINEARS:
        ours = ck[p + ".weight"].dequantize().astype(ml_dtypes.bfloat16).view(np.uint16)
        theirs = ref[p + ".weight"].view(np.uint16)
        diff = ours != theirs
        # every difference is a zero: -0.0 here (OCP E2M1 code 0x8), +0.0 in ModelOpt's table; and every code 0x8 is one
        assert np.all(ours[diff] == 0x8000) and np.all(theirs[diff] == 0x0000), p
        assert np.array_equal(diff, _codes(raw[p + ".weight"]) == 0x8), p
        assert diff.sum() == MANIFEST_ZEROS[p.rsplit(".", 1)[1][:-5]], p
        total += int(diff.sum())
    assert total == 139438  # of 3538944 elements; all other bits identical


def test_real_export_read_as_stored():
    ck, raw = load(D), load_file(str(D / "model.safetensors"))
    t = ck[Q + ".weight"]
    assert t.scheme == QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=codebooks.E2M1_VALUES,
                                   global_scale="multiplier")
    assert t.group_map.describe() == "group(in, 16)" and t.shape == (576, 576)
    assert np.array_equal(t.codes, _codes(raw[Q + ".weight"]))
    assert t.scales.dtype == E4M3 and t.scales.tobytes() == raw[Q + ".weight_scale"].tobytes()
    assert t.global_scale.shape == () and t.global_scale == raw[Q + ".weight_scale_2"]  # 0.001953125
    spec = ck.spec(Q + ".weight")
    assert [a.role for a in spec.stored] == ["codes", "scales", "global_scale"]
    act = ck.spec(Q + ".input_scale")
    assert act.kind == "dense" and [a.role for a in act.stored] == ["activation_scale"] and act.shape == ()
    assert ck.metadata["activations"][Q] == "nvfp4" and "4-bit NVFP4" in ck.metadata["input_activations"]
    for dense in ("model.embed_tokens.weight", "model.norm.weight"):
        assert ck.spec(dense).kind == "dense"


def test_round_trip_byte_identical_with_modelopt_configs(tmp_path):
    MO.write(load(D), tmp_path / "out")
    a, b = Source(D), Source(tmp_path / "out")
    assert sorted(a.tensor_names()) == sorted(b.tensor_names())
    for k in a.tensor_names():
        assert (a.info(k).dtype, tuple(a.info(k).shape)) == (b.info(k).dtype, tuple(b.info(k).shape)), k
        assert np.asarray(a.read(k)).tobytes() == np.asarray(b.read(k)).tobytes(), k
    for f in ("hf_quant_config.json", "config.json"):  # as ModelOpt 0.47.0 wrote them
        assert json.loads((tmp_path / "out" / f).read_text()) == json.loads((D / f).read_text()), f


def test_cli_convert_proves_the_repack(tmp_path):
    r = CliRunner().invoke(main, ["convert", str(D), str(tmp_path / "mo"), "--to", "modelopt", "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.output)["summary"]
    assert s["all_exact"] and s["changed"] == 0 and s["quantized"]["tensors"] == 7
    r = CliRunner().invoke(main, ["inspect", str(D)])
    assert r.exit_code == 0 and "e2m1 float (global scale: multiplier)" in r.output


# -- hand-built -------------------------------------------------------------------------------------------------
def _make(tmp_path: Path, tensors: dict, quant: dict | None, qc: dict | None = None, name="m") -> Path:
    d = tmp_path / name
    d.mkdir()
    save_file({k: np.array(v) for k, v in tensors.items()}, str(d / "model.safetensors"))  # np.array keeps 0-dim
    cfg = {"model_type": "toy", **({"quantization_config": qc} if qc is not None else {})}
    (d / "config.json").write_text(json.dumps(cfg))
    if quant is not None:
        (d / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"},
                                                            "quantization": quant}))
    return d


NV = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": []}


def _layer(prefix="l", rows=1, **over):
    # row 0: codes 1, 2, ..., 15, 0 then 8, 9 (-0.0, -0.5) ...: bytes (hi << 4) | lo
    codes = np.tile(np.array([1, 2, 3, 4, 5, 6, 7, 0, 8, 9, 10, 11, 12, 13, 14, 15] * 2, np.uint8), (rows, 1))
    t = {f"{prefix}.weight": (codes[:, 1::2] << 4 | codes[:, 0::2]).astype(np.uint8),
         f"{prefix}.weight_scale": np.array([[2.0, 0.25]] * rows, np.float32).astype(E4M3),
         f"{prefix}.weight_scale_2": np.array(0.5, np.float32), f"{prefix}.input_scale": np.array(0.125, np.float32)}
    t.update(over)
    return {k: v for k, v in t.items() if v is not None}


def test_by_hand(tmp_path):
    ck = load(_make(tmp_path, _layer(), NV))
    v = ck["l.weight"].dequantize()[0]
    # group 0: e2m1 * (2 * 0.5), group 1: e2m1 * (0.25 * 0.5)
    e2m1 = [0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]
    assert v[:16].tolist() == [x * 1.0 for x in e2m1] and v[16:].tolist() == [x * 0.125 for x in e2m1]
    assert np.signbit(v[8]) and not np.signbit(v[7])


def test_config_json_only_and_mixed_precision(tmp_path):
    qc = {"config_groups": {}, "ignore": [], "quant_algo": "NVFP4", "quant_method": "modelopt"}
    assert load(_make(tmp_path, _layer(), None, qc, "cfg"))["l.weight"].dequantize()[0, 0] == 0.5
    mixed = {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
             "quantized_layers": {"l": {"quant_algo": "NVFP4", "group_size": 16},
                                  "f": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}}}
    t = _layer() | {"f.weight": np.array([[1.0, 2.0]], np.float32).astype(E4M3),
                    "f.weight_scale": np.array([0.5], np.float32)}
    ck = load(_make(tmp_path, t, mixed, name="mixed"))
    assert ck["l.weight"].scheme.global_scale == "multiplier" and ck["f.weight"].dequantize().tolist() == [[0.5, 1.0]]
    MO.write(ck, tmp_path / "w")
    hf = json.loads((tmp_path / "w" / "hf_quant_config.json").read_text())["quantization"]
    assert hf["quantized_layers"] == {"l": {"quant_algo": "NVFP4", "group_size": 16},
                                      "f": {"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"}}
    back = load(tmp_path / "w")
    assert np.array_equal(back["l.weight"].dequantize(), ck["l.weight"].dequantize())


@pytest.mark.parametrize("over,err,field", [
    ({"l.weight_scale": np.ones((1, 4), np.float32).astype(E4M3)}, FormatError, "shape"),
    ({"l.weight_scale": np.ones((1, 2), np.float32)}, FormatError, "dtype"),
    ({"l.weight_scale_2": None}, MissingTensorError, None),
    ({"l.weight_scale_2": np.array([0.5], np.float32)}, FormatError, "shape"),
    ({"l.weight": np.zeros((1, 16), np.int8)}, FormatError, "dtype"),
])
def test_bad_layouts(tmp_path, over, err, field):
    with pytest.raises(err) as ei:
        load(_make(tmp_path, _layer(**over), NV))
    assert ei.value.tensor is not None and ei.value.tensor.startswith("l.")
    if field:
        assert ei.value.field == field


def test_group_size_other_than_16(tmp_path):
    with pytest.raises(FormatError) as ei:
        load(_make(tmp_path, _layer(), {**NV, "group_size": 32}))
    assert (ei.value.field, ei.value.expected, ei.value.found) == ("quantization.group_size", 16, 32)


def test_excluded_module_with_nvfp4_arrays(tmp_path):
    with pytest.raises(FormatError, match="config does not quantize it"):
        load(_make(tmp_path, _layer(), {**NV, "exclude_modules": ["l"]}))


# -- writing from other NVFP4 sources: the global scale's direction ---------------------------------------------
def _nvfp4(direction: str | None, g: float | None, name="l.weight") -> QuantizedTensor:
    src = load_file(str(D / "model.safetensors"))
    codes = _codes(src[Q + ".weight"])[:32]
    scales = src[Q + ".weight_scale"][:32]
    scheme = QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=codebooks.E2M1_VALUES, global_scale=direction)
    return QuantizedTensor(name, ("out", "in"), codes, scales, scheme, GroupMap.per_group(16, IN),
                           global_scale=None if g is None else np.array(g, np.float32))


ACT = DenseTensor("l.input_scale", np.array(0.25, np.float32))


@pytest.mark.parametrize("direction,g,want", [("divisor", 512.0, 1 / 512), ("amax", 2688.0 * 3, 3.0),
                                              (None, None, 1.0), ("multiplier", 0.001953125, 0.001953125)])
def test_global_scale_re_expressed_exactly(tmp_path, direction, g, want):
    t = _nvfp4(direction, g)
    MO.write(Checkpoint.from_tensors([t, ACT]), tmp_path / "w")
    raw = load_file(str(tmp_path / "w" / "model.safetensors"))
    assert raw["l.weight_scale_2"].shape == () and raw["l.weight_scale_2"] == np.float32(want)
    assert raw["l.weight_scale"].tobytes() == t.scales.tobytes() and np.array_equal(_codes(raw["l.weight"]), t.codes)
    back = load(tmp_path / "w")["l.weight"]
    assert back.dequantize().view(np.uint32).tobytes() == t.dequantize().view(np.uint32).tobytes()
    assert raw["l.input_scale"].shape == () and raw["l.input_scale"] == np.float32(0.25)


def test_inexact_global_scale_refused_up_front(tmp_path):
    t = _nvfp4("divisor", 936.0)  # compressed-tensors' 448 * 6 / amax on the real down_proj
    with pytest.raises(NotRepresentableError) as ei:
        MO.write(Checkpoint.from_tensors([t, ACT]), tmp_path / "w")
    assert (ei.value.tensor, ei.value.field, ei.value.found) == ("l.weight", "global_scale", 936.0)
    assert not (tmp_path / "w").exists()


def test_writer_refusals(tmp_path):
    with pytest.raises(NotRepresentableError) as ei:  # W4A4: the activation global scale is needed
        MO.write(Checkpoint.from_tensors([_nvfp4("multiplier", 0.5)]), tmp_path / "w")
    assert ei.value.field == "input_scale" and not (tmp_path / "w").exists()
    t = _nvfp4("multiplier", 0.5)
    mx = t.replace(scales=np.ones((32, 18), ml_dtypes.float8_e8m0fnu), group_map=GroupMap.per_group(32, IN),
                   scheme=t.scheme.replace(scale_dtype="F8_E8M0", global_scale=None), global_scale=None)
    assert "E8M0" in MO.check_target(spec_of(mx))
    g32 = t.replace(scales=np.ones((32, 18), E4M3), group_map=GroupMap.per_group(32, IN))
    assert "groups of 16" in MO.check_target(spec_of(g32))
