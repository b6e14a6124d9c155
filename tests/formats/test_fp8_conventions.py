"""FP8 writers and readers against the real tools' conventions (review B2, S4, S5, S6, S11).

Every expected value is written by hand from the tool's own source:

- transformers 5.24 ``integrations/finegrained_fp8.py``: ``FP8Linear`` holds ``activation_scale`` as a 0-dim
  F32 parameter when ``activation_scheme == "static"``; ``FP8Experts`` allocates a fused ``gate_up_proj``
  scale with ``_alloc_expert_proj(min_sf_out=2)`` (``[E, 2, 1]`` per tensor); every weight is
  ``_FP8_DTYPE = float8_e4m3fn``; ``FineGrainedFP8Config(scale_fmt="float" | "ue8m0",
  weight_block_size=(128, 128))`` (``utils/quantization_config.py``).
- compressed-tensors 0.20.1: a static per-tensor FP8 activation is ``QuantizationArgs(num_bits=8, type="float",
  strategy="tensor", dynamic=False, symmetric=True)`` with ``<p>.input_scale`` ``[1]``
  (``initialize_qparams``); the ``FP8_BLOCK`` preset declares ``input_activations`` dynamic, strategy group,
  group_size 128 (``quantization/quant_scheme.py``).
- ModelOpt 0.47.0 ``export_hf_checkpoint``: FP8 (per-tensor W8A8) stores a 0-dim ``<p>.input_scale``.
- vLLM ``Fp8Config.from_config``: an absent ``weight_block_size`` is None (per tensor).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from converter.errors import ErrorKind, FormatError, NotRepresentableError
from converter.formats import registry
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.ops.convert import convert_exact
from converter.scheme import QuantScheme
from converter.codebooks import ELEMENTS
from converter.tensor import Checkpoint, QuantizedTensor
from tests.formats.test_fp8 import W35, f8, make_dir

P = "model.layers.0.self_attn.q_proj"
# compressed-tensors QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True)
CT_STATIC = {"dynamic": False, "group_size": None, "num_bits": 8, "strategy": "tensor", "symmetric": True,
             "type": "float"}


def _static(tmp_path, act_name="activation_scale", weight_scale="weight_scale_inv"):
    """A per-tensor static fp8 module: weight scale 0.25, activation scale 0.0625 under ``act_name``."""
    return make_dir(tmp_path / "src", {f"{P}.weight": f8(W35), f"{P}.{weight_scale}": np.array(0.25, np.float32),
                                       f"{P}.{act_name}": np.array(0.0625, np.float32)},
                    {"quant_method": "fp8", "weight_block_size": None, "activation_scheme": "static"})


def _qc(d):
    return json.loads((d / "config.json").read_text())["quantization_config"]


# -- B2: activation scales in each target's spelling, declared -------------------------------------------------
@pytest.mark.parametrize("act_name", ["activation_scale", "qscale_act"])
def test_static_activation_scale_to_compressed_tensors(tmp_path, act_name):
    src = _static(tmp_path, act_name, "qscale_weight" if act_name == "qscale_act" else "weight_scale_inv")
    rep = convert_exact(src, tmp_path / "ct", "compressed-tensors")
    st = Source(tmp_path / "ct")
    assert f"{P}.{act_name}" not in st.tensor_names()
    assert st.info(f"{P}.input_scale").shape == (1,) and float(st.read(f"{P}.input_scale")[0]) == 0.0625
    group = _qc(tmp_path / "ct")["config_groups"]["group_0"]
    assert group["input_activations"] == CT_STATIC  # declared static, not weight-only
    row = next(r for r in rep["tensors"] if r["name"] == f"{P}.{act_name}")
    assert row["renamed_to"] == f"{P}.input_scale" and row["bit_exact"]
    notes = rep["written"]["notes"][f"{P}.{act_name}"]
    assert any(n.startswith(f"activation scale renamed {P}.{act_name} -> {P}.input_scale") for n in notes)
    assert "activation scale reshaped [] -> [1] (values exact)" in notes
    # compressed-tensors reads it back as its static activation metadata
    assert registry.load(tmp_path / "ct").metadata["activations"] == {P: "static"}


@pytest.mark.parametrize("act_name", ["activation_scale", "qscale_act"])
def test_static_activation_scale_to_modelopt(tmp_path, act_name):
    # before: refused with "the source has none" although the source spells it activation_scale / qscale_act
    rep = convert_exact(_static(tmp_path, act_name), tmp_path / "mo", "modelopt")
    st = Source(tmp_path / "mo")
    assert st.info(f"{P}.input_scale").shape == () and float(st.read(f"{P}.input_scale")) == 0.0625
    assert _qc(tmp_path / "mo")["quant_algo"] == "FP8"
    assert rep["written"]["renamed"] == {f"{P}.{act_name}": f"{P}.input_scale"}
    assert registry.load(tmp_path / "mo").metadata["activations"] == {P: "static"}


def test_input_scale_to_fp8_is_transformers_activation_scale(tmp_path):
    # compressed-tensors [1] input_scale -> FP8Linear.activation_scale (0-dim), activation_scheme static
    convert_exact(_static(tmp_path), tmp_path / "ct", "compressed-tensors")
    rep = convert_exact(tmp_path / "ct", tmp_path / "fp8", "fp8")
    st = Source(tmp_path / "fp8")
    assert f"{P}.input_scale" not in st.tensor_names()
    assert st.info(f"{P}.activation_scale").shape == () and float(st.read(f"{P}.activation_scale")) == 0.0625
    assert _qc(tmp_path / "fp8")["activation_scheme"] == "static"
    assert rep["written"]["renamed"] == {f"{P}.input_scale": f"{P}.activation_scale"}
    assert "activation scale reshaped [1] -> [] (values exact)" in rep["written"]["notes"][f"{P}.input_scale"]


def test_fp8_reader_declares_dynamic_activations(tmp_path):
    # DeepSeek activation_scheme dynamic: per token group of block_in (act_quant(x, block_size=128)); per token
    # for a per-tensor weight (transformers fp8_linear: activation_scale None -> dynamic per-token)
    w = np.zeros((256, 256), np.float32).astype(ml_dtypes.float8_e4m3fn)
    blk = make_dir(tmp_path / "blk", {f"{P}.weight": w, f"{P}.weight_scale_inv": np.ones((2, 2), np.float32)},
                   {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"})
    ck = registry.load(blk)
    assert ck.metadata["activations"] == {P: "dynamic:group:128"}
    convert_exact(blk, tmp_path / "ct", "compressed-tensors")
    want = {"dynamic": True, "group_size": 128, "num_bits": 8, "strategy": "group", "symmetric": True,
            "type": "float"}  # compressed-tensors FP8_BLOCK preset input_activations
    assert _qc(tmp_path / "ct")["config_groups"]["group_0"]["input_activations"] == want
    assert registry.load(tmp_path / "ct").metadata["activations"] == {P: "dynamic:group:128"}  # and back
    pt = make_dir(tmp_path / "pt", {f"{P}.weight": f8(W35), f"{P}.weight_scale_inv": np.array(0.5, np.float32)},
                  {"quant_method": "fp8", "weight_block_size": None, "activation_scheme": "dynamic"})
    assert registry.load(pt).metadata["activations"] == {P: "dynamic"}
    convert_exact(pt, tmp_path / "ct2", "compressed-tensors")
    acts = _qc(tmp_path / "ct2")["config_groups"]["group_0"]["input_activations"]
    assert (acts["dynamic"], acts["strategy"], acts["type"], acts["num_bits"]) == (True, "token", "float", 8)


# -- S4: fused gate_up_proj per-tensor scale [E, 2, 1] ----------------------------------------------------------
X = "model.layers.0.mlp.experts.gate_up_proj"


def test_gate_up_scale_with_two_halves_reads(tmp_path):
    codes = np.arange(2 * 8 * 4, dtype=np.float32).reshape(2, 8, 4) % 7 - 3
    scale = np.array([[[0.5], [2.0]], [[4.0], [0.25]]], np.float32)  # [E, 2, 1]: gate half, up half
    d = make_dir(tmp_path, {X: codes.astype(ml_dtypes.float8_e4m3fn), X + "_scale_inv": scale},
                 {"quant_method": "fp8", "weight_block_size": None})
    t = registry.load(d)[X]
    want = codes.copy()
    want[:, :4] *= scale[:, :1]  # rows 0..3 are the gate half
    want[:, 4:] *= scale[:, 1:]
    assert np.array_equal(t.dequantize(), want)
    registry.get("fp8").write(registry.load(d), tmp_path / "o")
    st = Source(tmp_path / "o")
    assert st.info(X + "_scale_inv").shape == (2, 2, 1) and np.array_equal(st.read(X + "_scale_inv"), scale)
    assert _qc(tmp_path / "o")["weight_block_size"] is None


def test_gate_up_per_expert_scale_written_with_two_rows(tmp_path):
    el = ELEMENTS["e4m3"]
    codes = (np.arange(2 * 8 * 4) % 50).astype(np.uint8).reshape(2, 8, 4)
    t = QuantizedTensor(X, ("expert", "out", "in"), codes, np.array([[[0.5]], [[3.0]]], np.float32),
                        QuantScheme(8, False, scale_dtype="F32", codebook=el.values), GroupMap.per_tensor())
    registry.get("fp8").write(Checkpoint.from_tensors([t]), tmp_path / "o")
    s = Source(tmp_path / "o").read(X + "_scale_inv")
    assert s.shape == (2, 2, 1) and s.ravel().tolist() == [0.5, 0.5, 3.0, 3.0]  # min_sf_out=2, both halves
    assert np.array_equal(registry.load(tmp_path / "o")[X].dequantize(), t.dequantize())


# -- S5: E5M2 is not written ------------------------------------------------------------------------------------
def test_fp8_writer_refuses_e5m2(tmp_path):
    w = np.asarray(W35, np.float32).astype(ml_dtypes.float8_e5m2)
    d = make_dir(tmp_path / "src", {f"{P}.weight": w, f"{P}.weight_scale_inv": np.array(1.0, np.float32)},
                 {"quant_method": "fp8", "fmt": "e5m2", "weight_block_size": None})
    with pytest.raises(NotRepresentableError, match="float8_e4m3fn"):
        convert_exact(d, tmp_path / "o", "fp8")
    assert not (tmp_path / "o").exists()


# -- S6: scale_fmt -------------------------------------------------------------------------------------------------
def test_scale_fmt_ue8m0_is_carried(tmp_path):
    # DeepSeek-V3.1: F32 power-of-two scales with scale_fmt "ue8m0" in its config
    w = np.zeros((256, 256), np.float32).astype(ml_dtypes.float8_e4m3fn)
    d = make_dir(tmp_path / "src", {f"{P}.weight": w, f"{P}.weight_scale_inv": np.full((2, 2), 0.125, np.float32)},
                 {"quant_method": "fp8", "weight_block_size": [128, 128], "scale_fmt": "ue8m0"})
    convert_exact(d, tmp_path / "o", "fp8")
    assert _qc(tmp_path / "o")["scale_fmt"] == "ue8m0"


def test_unknown_scale_fmt_is_refused(tmp_path):
    d = make_dir(tmp_path, {f"{P}.weight": f8(W35), f"{P}.weight_scale_inv": np.array(1.0, np.float32)},
                 {"quant_method": "fp8", "weight_block_size": None, "scale_fmt": "e5m2"})
    with pytest.raises(FormatError) as info:
        registry.load(d)
    assert info.value.field == "quantization_config.scale_fmt" and info.value.found == "e5m2"


# -- S11: no weight_block_size ---------------------------------------------------------------------------------
def test_absent_block_size_with_a_scalar_scale_is_per_tensor(tmp_path):
    d = make_dir(tmp_path, {f"{P}.weight": f8(W35), f"{P}.weight_scale_inv": np.array([2.0], np.float32)},
                 {"quant_method": "fp8"})
    t = registry.load(d)[f"{P}.weight"]
    assert t.group_map.describe() == "tensor"
    assert np.array_equal(t.dequantize(), np.asarray(W35, np.float32) * 2)


def test_absent_block_size_with_a_grid_is_128_blocks(tmp_path):
    # 200 x 300: ceil(200/128) x ceil(300/128) = 2 x 3 (transformers' default (128, 128))
    w = np.ones((200, 300), np.float32)
    s = np.array([[1.0, 2.0, 4.0], [0.5, 0.25, 8.0]], np.float32)
    d = make_dir(tmp_path, {f"{P}.weight": w.astype(ml_dtypes.float8_e4m3fn), f"{P}.weight_scale_inv": s},
                 {"quant_method": "fp8"})
    t = registry.load(d)[f"{P}.weight"]
    assert t.group_map.block == (("out", 128), ("in", 128))
    got = t.dequantize()
    assert got[0, 0] == 1.0 and got[127, 128] == 2.0 and got[0, 256] == 4.0 and got[128, 0] == 0.5
    assert got[199, 299] == 8.0


def test_absent_block_size_with_another_grid_is_refused(tmp_path):
    w = np.ones((200, 300), np.float32).astype(ml_dtypes.float8_e4m3fn)
    d = make_dir(tmp_path, {f"{P}.weight": w, f"{P}.weight_scale_inv": np.ones((4, 5), np.float32)},
                 {"quant_method": "fp8"})
    with pytest.raises(FormatError) as info:
        registry.load(d)
    e = info.value
    assert e.kind is ErrorKind.SHAPE and e.tensor == f"{P}.weight_scale_inv" and e.found == [4, 5]
    assert e.expected[0] == [2, 3]


# -- S13: the ModelOpt probe quirk is the format's hook ------------------------------------------------------
def test_probe_companions_are_a_format_hook():
    from converter.validate.probes import float_probe_tensor, probe_tensors
    per_tensor, per_channel = float_probe_tensor(13, 40, None), float_probe_tensor(13, 40, "channel")
    mo = registry.get("modelopt")
    extra = probe_tensors(per_tensor, mo)[1:]
    # ModelOpt FP8 is W8A8: a per-tensor layer carries its static 0-dim input_scale
    assert [t.name for t in extra] == [per_tensor.name[: -len(".weight")] + ".input_scale"]
    assert extra[0].data.shape == () and extra[0].data.dtype == np.float32
    assert probe_tensors(per_channel, mo) == [per_channel]
    for name, handler in registry.formats().items():
        if name != "modelopt":
            assert handler.probe_companions is None and probe_tensors(per_tensor, handler) == [per_tensor]
