"""Under --json, errors are JSON too (issue 18 item 14): one object on stdout
(schemas/error.schema.json) with the same exit status as the one-line error, nothing on stderr."""

from __future__ import annotations

import json
import subprocess
import sys

from converter.schemas import validate_document
from tests.conftest import REPO, SAMPLES


def _run(*args):
    return subprocess.run([sys.executable, "-m", "converter", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True)


def test_unreadable_input_under_json(tmp_path):
    r = _run("inspect", tmp_path / "missing", "--json")
    assert r.returncode == 3 and r.stderr == ""
    doc = json.loads(r.stdout)
    validate_document(doc, "error")
    assert doc["error"] == "InputNotFoundError" and doc["exit_code"] == 3
    assert doc["file"] == str(tmp_path / "missing") and doc["message"] == "no such file or directory"
    plain = _run("inspect", tmp_path / "missing")
    assert plain.returncode == 3 and plain.stdout == "" and plain.stderr.startswith("qckpt: error: ")


def test_usage_error_under_json(tmp_path):
    r = _run("convert", SAMPLES / "gptq_w4_g128_sym", tmp_path / "o", "--to", "nosuch", "--json")
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    validate_document(doc, "error")
    assert doc["error"] == "UsageError" and "unknown format" in doc["message"] and not (tmp_path / "o").exists()


def test_refusal_under_json_names_the_field(tmp_path):
    dst = tmp_path / "o"
    dst.mkdir()
    r = _run("dequantize", SAMPLES / "gptq_w4_g128_sym", dst, "--json")
    assert r.returncode == 2
    doc = json.loads(r.stdout)
    validate_document(doc, "error")
    assert doc["error"] == "OutputExistsError" and doc["hint"] == "pass --overwrite to replace it"
    assert (doc["expected"], doc["found"]) == ("a new path", "existing")


def test_quantize_of_a_non_finite_weight_names_the_source_file(tmp_path):
    """A NaN in a float weight: quantize refuses naming the file, the tensor and the field (the requantize
    path of convert named the file already; quantize printed only the tensor)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(SAMPLES / "minilm_fp16.safetensors"))
    name = "encoder.layer.0.attention.self.query.weight"
    w = tensors[name].copy()
    w[3, 4] = np.nan
    tensors[name] = w
    src = tmp_path / "nan.safetensors"
    save_file(tensors, str(src))
    r = _run("quantize", src, tmp_path / "q.safetensors", "--bits", "4", "--group-size", "128", "--json")
    assert r.returncode == 3 and r.stderr == "", r.stderr
    doc = json.loads(r.stdout)
    validate_document(doc, "error")
    assert (doc["error"], doc["file"], doc["tensor"], doc["field"]) == ("QuantizationError", str(src), name, "values")
    plain = _run("quantize", src, tmp_path / "q2.safetensors", "--bits", "4", "--group-size", "128")
    assert plain.returncode == 3 and plain.stderr.startswith(f"qckpt: error: {src}: tensor '{name}'"), plain.stderr
    assert not (tmp_path / "q.safetensors").exists() and not (tmp_path / "q2.safetensors").exists()
