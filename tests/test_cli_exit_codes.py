"""Exit statuses and one-line errors (issue 18 item 5 and 4): `--debug` keeps the documented status,
an unknown `--format` is a usage error like `convert --to`, a message with nothing expected does not
print "expected None", and an unreadable folder is not reported as format "None"."""

from __future__ import annotations

import shutil
import subprocess
import sys

from click.testing import CliRunner

from converter.cli import main
from converter.errors import FormatError
from tests.conftest import REPO, SAMPLES

GPTQ = SAMPLES / "gptq_w4_g128_sym"


def test_debug_prints_the_traceback_and_keeps_the_exit_status(tmp_path):
    missing = tmp_path / "nothing-here"
    plain = subprocess.run([sys.executable, "-m", "converter", "inspect", str(missing)], cwd=REPO,
                           capture_output=True, text=True)
    debug = subprocess.run([sys.executable, "-m", "converter", "--debug", "inspect", str(missing)], cwd=REPO,
                           capture_output=True, text=True)
    assert plain.returncode == debug.returncode == 3
    assert "Traceback" not in plain.stderr and "Traceback" in debug.stderr
    assert debug.stderr.rstrip().splitlines()[-1] == plain.stderr.rstrip()


def test_unknown_format_option_is_a_usage_error():
    for cmd in (["inspect", "--format", "foo", str(GPTQ)], ["audit", "--format", "foo", str(GPTQ)]):
        r = CliRunner().invoke(main, cmd)
        assert r.exit_code == 2, (cmd, r.output)
        assert "unknown format" in r.output and "gptq" in r.output


def test_render_without_an_expected_value():
    assert FormatError("bad byte", field="scale", found=255).render() == "field 'scale': bad byte (found 255)"
    assert FormatError("bad", field="f", expected=4).render() == "field 'f': bad (expected 4)"
    assert FormatError("bad", field="f", expected=4, found=5).render() == "field 'f': bad (expected 4, found 5)"


def test_unreadable_folder_says_format_not_detected(tmp_path):
    d = tmp_path / "broken"
    shutil.copytree(SAMPLES / "ct_mxfp4_smollm2", d)
    (d / "model.safetensors").unlink()
    r = CliRunner().invoke(main, ["validate", str(d)])
    assert r.exit_code == 1 and "format: None" not in r.output and "format: not detected" in r.output


def test_library_error_names_the_argument_and_the_cli_names_the_option(tmp_path):
    import pytest

    import converter
    from converter.errors import OutputExistsError

    dst = tmp_path / "w.safetensors"
    dst.write_bytes(b"x")
    ckpt = converter.load(SAMPLES / "minilm_fp16.safetensors")
    with pytest.raises(OutputExistsError) as ei:
        converter.save(ckpt, dst, format="plain")
    assert "overwrite=True" in ei.value.render() and "--overwrite" not in ei.value.render()
    r = CliRunner().invoke(main, ["quantize", str(SAMPLES / "minilm_fp16.safetensors"), str(dst), "--bits", "4",
                                  "--per-channel"])
    assert r.exit_code == 2 and "pass --overwrite to replace it" in r.output
    assert dst.read_bytes() == b"x"


def test_directory_writer_refuses_a_file_name_as_destination(tmp_path):
    """``--to awq out.safetensors`` made a directory called out.safetensors; now a usage error naming the
    directory to give instead, before anything is written (a single-file writer takes the name)."""
    from click.testing import CliRunner

    from converter.cli import main
    from tests.conftest import SAMPLES

    src = str(SAMPLES / "gptq_w4_g128_sym")
    r = CliRunner().invoke(main, ["convert", src, str(tmp_path / "x.safetensors"), "--to", "awq"])
    assert r.exit_code == 2
    assert "awq writes a model directory" in r.output and f"e.g. {tmp_path / 'x'}" in r.output
    assert not (tmp_path / "x.safetensors").exists()
    r = CliRunner().invoke(main, ["quantize", str(SAMPLES / "minilm_fp16.safetensors"), str(tmp_path / "y.gguf"),
                                  "--bits", "4", "--group-size", "128", "--to", "compressed-tensors"])
    assert r.exit_code == 2 and "compressed-tensors writes a model directory" in r.output
    r = CliRunner().invoke(main, ["convert", src, str(tmp_path / "x.gguf"), "--to", "gguf"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "x.gguf").is_file()


def test_dequantize_refuses_a_gguf_file_name(tmp_path):
    """``dequantize SRC out.gguf`` made a directory called out.gguf; a usage error now, nothing written."""
    from click.testing import CliRunner

    from converter.cli import main
    from tests.conftest import SAMPLES

    r = CliRunner().invoke(main, ["dequantize", str(SAMPLES / "gptq_w4_g128_sym"), str(tmp_path / "out.gguf")])
    assert r.exit_code == 2 and "dequantize writes one .safetensors file or a model directory" in r.output
    assert "qckpt convert SRC DST.gguf --to gguf" in r.output
    assert list(tmp_path.iterdir()) == []


def test_unknown_gguf_quant_type_is_a_usage_error_listing_each_type_once(tmp_path):
    from click.testing import CliRunner

    from converter.cli import main
    from tests.conftest import SAMPLES

    r = CliRunner().invoke(main, ["convert", str(SAMPLES / "gguf" / "minilm_gguf_F16.gguf"), str(tmp_path / "x.gguf"),
                                  "--to", "gguf", "--quant-type", "Q4_K_Z"])
    assert r.exit_code == 2 and "unknown GGUF quantization type" in r.output and "found Q4_K_Z" in r.output
    listed = r.output.split("expected ")[1].split(", found")[0].split(", ")
    assert "Q4_K_M" in listed and "Q6_K" in listed and len(listed) == len(set(listed))
    assert not (tmp_path / "x.gguf").exists()
