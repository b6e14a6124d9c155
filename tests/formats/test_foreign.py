"""Formats qckpt does not read are refused by name, with what reads them (issue 17, named refusals).

Each input is built here with the producing tool's own signature (config keys and tensor names from
exllamav2 / exllamav3 / transformers' AqlmConfig / HqqConfig / TorchAoConfig / AutoGPTQ / AutoAWQ, the
file suffixes of onnx and coremltools): before, every one of them was "no registered format recognises
this input", a GPTQ-reader message, or, for ONNX and Core ML, a misleading safetensors header error.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from converter.cli import main
from converter.errors import UnsupportedError
from converter.formats import foreign
from converter.formats.registry import load

P = "model.layers.0.self_attn.q_proj"


def _dir(tmp_path, name, qc, tensors, cfg_name="config.json"):
    d = tmp_path / name
    d.mkdir()
    cfg = {"model_type": "llama"}
    if qc is not None:
        cfg = {**cfg, "quantization_config": qc} if cfg_name == "config.json" else qc
    (d / cfg_name).write_text(json.dumps(cfg))
    save_file({k: np.zeros(s, dt) for k, (s, dt) in tensors.items()}, str(d / "model.safetensors"))
    return d


EXL2_T = {f"{P}.q_weight": ((16, 64), np.int32), f"{P}.q_scale": ((4, 8), np.int32),
          f"{P}.q_scale_max": ((8,), np.float16), f"{P}.q_groups": ((4,), np.int16),
          f"{P}.q_invperm": ((64,), np.int16), "model.norm.weight": ((64,), np.float16)}
EXL3_T = {f"{P}.trellis": ((4, 4, 64), np.int16), f"{P}.suh": ((64,), np.float16),
          f"{P}.svh": ((64,), np.float16)}
AQLM_T = {f"{P}.codes": ((64, 8, 1), np.int16), f"{P}.codebooks": ((1, 256, 1, 8), np.float16),
          f"{P}.scales": ((64, 1, 1, 1), np.float16)}
HQQ_T = {f"{P}.W_q": ((32, 64), np.uint8), f"{P}.scale": ((64, 1), np.float16),
         f"{P}.zero": ((64, 1), np.float16)}
TORCHAO_T = {f"{P}._weight_qdata": ((64, 32), np.uint8), f"{P}._weight_scale": ((2, 64), np.float16)}
MARLIN_T = {f"{P}.B": ((4, 128), np.int32), f"{P}.s": ((1, 64), np.float16)}
AWQ_T = {f"{P}.qweight": ((64, 8), np.int32), f"{P}.qzeros": ((1, 8), np.int32), f"{P}.scales": ((1, 64), np.float16)}

BY_CONFIG = [
    ("EXL2", {"quant_method": "exl2", "version": "0.2.3", "bits": 4.0}, EXL2_T, "quantization_config.quant_method"),
    ("EXL3", {"quant_method": "exl3", "version": "0.0.6", "bits": 3.0}, EXL3_T, "quantization_config.quant_method"),
    ("AQLM", {"quant_method": "aqlm", "in_group_size": 8, "nbits_per_codebook": 16}, AQLM_T,
     "quantization_config.quant_method"),
    ("HQQ", {"quant_method": "hqq", "quant_config": {}}, HQQ_T, "quantization_config.quant_method"),
    ("torchao", {"quant_method": "torchao", "quant_type": {}}, TORCHAO_T, "quantization_config.quant_method"),
    ("Marlin-packed GPTQ", {"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"},
     MARLIN_T, "quantization_config.checkpoint_format"),
    ("Marlin-packed AWQ", {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "marlin"}, AWQ_T,
     "quantization_config.version"),
]


@pytest.mark.parametrize("name, qc, tensors, field", BY_CONFIG, ids=[c[0] for c in BY_CONFIG])
def test_config_declared_foreign_format_is_refused_by_name(tmp_path, name, qc, tensors, field):
    d = _dir(tmp_path, "m", qc, tensors)
    with pytest.raises(UnsupportedError) as e:
        load(d)
    fmt = next(f for f in foreign.FOREIGN if f.name == name)
    assert e.value.message.startswith(f"{name} checkpoint")
    assert e.value.field == field and fmt.readers in e.value.hint
    assert e.value.file == str(d)


SIGNATURES = [("EXL2", EXL2_T), ("EXL3", EXL3_T), ("AQLM", AQLM_T), ("HQQ", HQQ_T), ("torchao", TORCHAO_T),
              ("Marlin-packed GPTQ", MARLIN_T)]


@pytest.mark.parametrize("name, tensors", SIGNATURES, ids=[s[0] for s in SIGNATURES])
def test_bare_file_with_a_foreign_tensor_signature_is_refused_by_name(tmp_path, name, tensors):
    f = tmp_path / "model.safetensors"
    save_file({k: np.zeros(s, dt) for k, (s, dt) in tensors.items()}, str(f))
    with pytest.raises(UnsupportedError) as e:
        load(f)
    assert e.value.message.startswith(f"{name} checkpoint") and e.value.field == "tensor names"


def test_autogptq_quantize_config_marlin_is_named(tmp_path):
    d = _dir(tmp_path, "m", {"bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, MARLIN_T,
             cfg_name="quantize_config.json")
    with pytest.raises(UnsupportedError, match="^.*Marlin-packed GPTQ checkpoint"):
        load(d)


def test_onnx_and_coreml_are_named_not_a_safetensors_header_error(tmp_path):
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"\x08\x07\x12\x07pytorch")  # ModelProto: ir_version 7, producer_name
    with pytest.raises(UnsupportedError) as e:
        load(onnx)
    assert e.value.message.startswith("ONNX checkpoint") and "onnxruntime" in e.value.hint
    pkg = tmp_path / "m.mlpackage"
    (pkg / "Data" / "com.apple.CoreML").mkdir(parents=True)
    (pkg / "Manifest.json").write_text("{}")
    with pytest.raises(UnsupportedError, match="Core ML checkpoint"):
        load(pkg)
    with pytest.raises(UnsupportedError, match="Core ML checkpoint"):
        ml = tmp_path / "m.mlmodel"
        ml.write_bytes(b"\x08\x04")
        load(ml)
    # a folder holding only an exported ONNX model (and its external data)
    d = tmp_path / "onnx_dir"
    d.mkdir()
    (d / "model.onnx").write_bytes(b"\x08\x07")
    (d / "model.onnx_data").write_bytes(b"\0" * 8)
    with pytest.raises(UnsupportedError) as e:
        load(d)
    assert e.value.field == "directory contents" and e.value.found == "model.onnx"


def test_lookalikes_are_not_refused(tmp_path):
    # a float model with one tensor that happens to end in '.codes' (no '.codebooks') is read as float
    f = tmp_path / "model.safetensors"
    save_file({"enc.codes": np.ones((2, 2), np.float32), "enc.W": np.ones((2, 2), np.float32)}, str(f))
    ck = load(f)
    assert sorted(ck.names()) == ["enc.W", "enc.codes"]
    # a model directory with an ONNX export beside its safetensors is read from the safetensors
    d = tmp_path / "both"
    d.mkdir()
    save_file({"w": np.ones((2, 2), np.float32)}, str(d / "model.safetensors"))
    (d / "model.onnx").write_bytes(b"\x08\x07")
    assert load(d).names() == ["w"]


def test_cli_one_line_exit_3_and_json_error(tmp_path):
    d = _dir(tmp_path, "m", BY_CONFIG[0][1], EXL2_T)
    r = CliRunner().invoke(main, ["inspect", str(d)])
    assert r.exit_code == 3
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "EXL2 checkpoint" in lines[0] and "exllamav2" in lines[0]
    assert "Traceback" not in r.output
    r = CliRunner().invoke(main, ["inspect", str(d), "--json"])
    doc = json.loads(r.output)
    assert r.exit_code == 3 and doc["field"] == "quantization_config.quant_method" and doc["found"] == "exl2"
