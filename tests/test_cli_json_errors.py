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
