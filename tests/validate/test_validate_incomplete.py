"""`validate` says "clean" only when every quantized tensor was checked (issue 18 item 2): a GGUF with
Q8_1 / Q8_K tensors (types qckpt lists but neither it nor gguf-py decodes; IQ* / TQ* are checked now,
tests/formats/test_gguf_fallback.py) beside a Q8_0 weight has 2 of 3 quantized
tensors unchecked, so its verdict is "incomplete", and `--strict` fails it."""

from __future__ import annotations

import json

from click.testing import CliRunner

from converter.cli import main
from converter.schemas import validate_document
from tests.conftest import SAMPLES
from tests.formats.test_gguf import _opaque_file


def _validate(*args):
    return CliRunner().invoke(main, ["validate", *map(str, args)])


def test_unchecked_tensors_make_the_verdict_incomplete(tmp_path):
    path = _opaque_file(tmp_path)
    r = _validate(path, "--json")
    doc = json.loads(r.output)
    validate_document(doc, "validation-report")
    s = doc["summary"]
    assert (s["tensors_checked"], s["tensors_unchecked"], s["verdict"]) == (1, 2, "incomplete")
    assert sorted(s["unchecked"]) == ["model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.up_proj.weight"]
    assert r.exit_code == 0  # nothing wrong was found ...
    assert _validate(path, "--strict").exit_code == 1  # ... but a strict gate does not pass what it did not check
    text = _validate(path).output
    flat = " ".join(text.split())
    assert "-> clean (" not in flat and "2 tensors not checked (not clean)" in flat


def test_a_fully_checked_file_is_clean():
    r = _validate(SAMPLES / "gptq_w4_g128_sym", "--json", "--strict")
    s = json.loads(r.output)["summary"]
    assert r.exit_code == 0 and (s["tensors_checked"], s["tensors_unchecked"], s["verdict"]) == (7, 0, "clean")
