"""A folder holding two model formats is refused, naming the candidates and --format; a GGUF with its side
files is read as that GGUF (issue 16)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.errors import FormatError, UnknownFormatError
from converter.formats.registry import load
from tests.conftest import SAMPLES

Q8 = SAMPLES / "gguf" / "minilm_gguf_Q8_0.gguf"
FP16 = SAMPLES / "minilm_fp16.safetensors"


@pytest.fixture
def mixed(tmp_path):
    d = tmp_path / "mixed"
    d.mkdir()
    shutil.copy(Q8, d / Q8.name)
    shutil.copy(FP16, d / "model.safetensors")
    return d


def test_gguf_beside_safetensors_model_is_refused(mixed):
    with pytest.raises(UnknownFormatError) as exc:
        load(mixed)
    text = str(exc.value)
    assert "minilm_gguf_Q8_0.gguf" in text and "model.safetensors" in text and "--format" in text
    assert exc.value.file == str(mixed)


@pytest.mark.parametrize("command", [["inspect"], ["audit"], ["validate"], ["dequantize", "DST"],
                                     ["convert", "DST", "--to", "gguf"]])
def test_cli_one_line_naming_the_candidates(mixed, tmp_path, command):
    args = [str(tmp_path / "out") if a == "DST" else a for a in command]
    r = CliRunner().invoke(main, [args[0], str(mixed), *args[1:]])
    lines = r.output.strip().splitlines()
    assert r.exit_code not in (0, 1) and len(lines) == 1, r.output
    assert lines[0].startswith("qckpt: error:") and "--format" in lines[0] and "model.safetensors" in lines[0]
    assert not (tmp_path / "out").exists()


def test_format_option_picks_one(mixed):
    g = load(mixed, format="gguf")
    assert g.format == "gguf" and g.path.endswith("minilm_gguf_Q8_0.gguf")
    p = load(mixed, format="plain")
    assert p.format == "plain" and len(p) == 14
    name = "encoder.layer.0.attention.self.query.weight"
    assert np.array_equal(g[name].dequantize(), load(Q8)[name].dequantize())


def test_cli_format_option_on_every_reading_command(mixed, tmp_path):
    run = lambda *a: CliRunner().invoke(main, [str(x) for x in a])  # noqa: E731
    assert run("inspect", mixed, "--format", "gguf").exit_code == 0
    assert run("validate", mixed, "--format", "gguf").exit_code == 0
    r = run("dequantize", mixed, tmp_path / "d.safetensors", "--format", "gguf", "--json")
    assert r.exit_code == 0, r.output
    r = run("convert", mixed, tmp_path / "c.gguf", "--to", "gguf", "--format", "gguf")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "c.gguf").read_bytes() == Q8.read_bytes()  # the GGUF was the one read
    r = run("quantize", mixed, tmp_path / "q", "--bits", "8", "--per-channel", "--format", "plain")
    assert r.exit_code == 0, r.output


def test_gguf_with_its_reference_side_file_is_the_gguf(tmp_path):
    """sample_checkpoints/gguf layout: X.gguf + X.gguf.reference_dequant.safetensors is one GGUF model."""
    d = tmp_path / "one"
    d.mkdir()
    shutil.copy(Q8, d / Q8.name)
    side = Q8.with_name(Q8.name + ".reference_dequant.safetensors")
    shutil.copy(side, d / side.name)
    ck = load(d)
    assert ck.format == "gguf" and ck.path == str(d / Q8.name)


def test_several_ggufs_name_them():
    with pytest.raises(FormatError, match="pass one .gguf file") as exc:
        load(SAMPLES / "gguf")
    assert "minilm_gguf_Q8_0.gguf" in str(exc.value)
