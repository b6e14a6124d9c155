"""The qckpt command through click's CliRunner: the main job on the real sample, JSON schemas,
exit statuses, and one clear line for bad input with no output left behind."""

import json
import os
import struct

import pytest
from click.testing import CliRunner

import converter
from converter.cli import main
from converter.errors import ConverterError
from converter.schemas import validate_document
from tests.conftest import SAMPLES

FP16 = str(SAMPLES / "minilm_fp16.safetensors")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    dst = tmp_path_factory.mktemp("q") / "minilm-w4g128.safetensors"
    r = run("quantize", FP16, dst, "--bits", 4, "--group-size", 128, "--json")
    assert r.exit_code == 0, r.output
    return dst, json.loads(r.output)


def test_quantize_report(quantized):
    dst, doc = quantized
    validate_document(doc, "quantize-report")
    assert doc["overall"]["quantized_tensors"] == 7 and doc["overall"]["ideal_compression_vs_fp32"] == 8
    big = next(t for t in doc["tensors"] if t["name"] == "encoder.layer.0.output.dense.weight")
    assert big["n_groups"] == 384 * 12 and big["shape"] == [384, 1536]
    # an independent check of one tensor's MSE from the written file
    import numpy as np
    import converter
    from safetensors.numpy import load_file
    ref = load_file(FP16)["encoder.layer.0.output.dense.weight"].astype(np.float32)
    deq = converter.load(dst)["encoder.layer.0.output.dense.weight"].dequantize()
    assert big["mse"] == pytest.approx(float(np.mean((deq.astype(np.float64) - ref) ** 2)), rel=1e-9)
    assert big["max_abs_error"] == pytest.approx(float(np.abs(deq - ref).max()), rel=1e-6)


def test_inspect_json(quantized):
    dst, _ = quantized
    r = run("inspect", dst, "--json")
    assert r.exit_code == 0
    doc = json.loads(r.output)
    validate_document(doc, "inspect")
    row = next(t for t in doc["tensors"] if t["name"] == "encoder.layer.0.output.dense.weight")
    assert row["group_map"]["n_groups"] == 12 and row["scheme"]["bits"] == 4 and row["axes"] == ["out", "in"]


def test_audit_total_equals_file_size(quantized):
    dst, _ = quantized
    r = run("audit", dst, "--what-if", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.output)
    validate_document(doc, "audit")
    assert doc["totals"]["accounted_bytes"] == os.path.getsize(dst) == doc["totals"]["file_bytes"]
    roles = doc["totals"]["bytes_by_role"]
    # 1,916,928 4-bit weights = 958,464 bytes of codes; 14,976 groups x 2 bytes of fp16 scales
    assert roles["codes"] == 958464 and roles["scales"] == 29952 and roles["padding"] == 0
    assert doc["totals"]["quantized_bits_per_weight"] == pytest.approx(8 * (958464 + 29952) / 1916928)


def test_human_output_and_help(quantized):
    dst, _ = quantized
    assert run("audit", dst).exit_code == 0
    assert run("inspect", dst).exit_code == 0
    h = run("--help")
    assert "Exit status" in h.output and "3  input cannot be read" in h.output


def test_help_lists_every_exit_status_and_errors_use_them():
    from converter import errors, exit_codes
    h = run("--help").output
    for code, text in exit_codes.TABLE:
        assert f"  {code}  {text}" in h
    assert [c for c, _ in exit_codes.TABLE] == [0, 1, 2, 3, 130]
    assert errors.ConverterError.exit_code == exit_codes.UNREADABLE == 3
    assert errors.OutputExistsError.exit_code == exit_codes.USAGE == 2


def test_dequantize_round_trip(quantized, tmp_path):
    dst, _ = quantized
    out = tmp_path / "deq.safetensors"
    r = run("dequantize", dst, out, "--dtype", "f16")
    assert r.exit_code == 0, r.output
    import numpy as np
    import converter
    a = converter.load(out)["pooler.dense.weight"].data
    assert a.dtype == np.float16 and a.shape == (384, 384)


def _bad(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _header(obj):
    h = json.dumps(obj).encode()
    return struct.pack("<Q", len(h)) + h


BAD_INPUTS = {
    "not_safetensors": b"this is not a checkpoint at all",
    "truncated": _header({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}) + b"\0" * 8,
    "offsets_mismatch": _header({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}) + b"\0" * 12,
    "unknown_dtype": _header({"w": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 16]}}) + b"\0" * 16,
    "lfs_pointer": b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n",
}


@pytest.mark.parametrize("kind", sorted(BAD_INPUTS))
def test_bad_input_one_line_exit_3_no_output(tmp_path, kind):
    src = _bad(tmp_path, f"{kind}.safetensors", BAD_INPUTS[kind])
    dst = tmp_path / "out.safetensors"
    r = CliRunner().invoke(main, ["quantize", str(src), str(dst), "--bits", "4", "--per-channel"])
    assert r.exit_code == 3
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("qckpt: error: ") and str(src) in lines[0]
    assert "Traceback" not in r.output
    assert not dst.exists() and [p.name for p in tmp_path.iterdir()] == [src.name]


def test_messages_name_tensor_and_field(tmp_path):
    src = _bad(tmp_path, "x.safetensors", BAD_INPUTS["unknown_dtype"])
    r = run("inspect", src)
    assert r.exit_code == 3 and "'w'" in r.output and "dtype" in r.output and "Q9" in r.output
    src = _bad(tmp_path, "y.safetensors", BAD_INPUTS["offsets_mismatch"])
    r = run("inspect", src)
    assert r.exit_code == 3 and "'w'" in r.output and "expected" in r.output and "found" in r.output


def test_missing_path_and_pickle(tmp_path):
    r = run("inspect", tmp_path / "nope")
    assert r.exit_code == 3 and "no such file" in r.output
    p = _bad(tmp_path, "pytorch_model.bin", b"\x80\x02}q\x00.")
    r = run("inspect", p)
    assert r.exit_code == 3 and "pickle" in r.output and "safetensors" in r.output


def test_existing_destination_is_usage_error(quantized, tmp_path):
    dst = tmp_path / "exists.safetensors"
    dst.write_bytes(b"x")
    r = run("quantize", FP16, dst, "--bits", 4, "--per-channel")
    assert r.exit_code == 2 and dst.read_bytes() == b"x"


def test_dst_equal_src_refused(tmp_path):
    import shutil
    src = tmp_path / "m.safetensors"
    shutil.copy(FP16, src)
    before = src.read_bytes()
    r = run("quantize", src, src, "--bits", 4, "--per-channel", "--overwrite")
    assert r.exit_code == 2 and src.read_bytes() == before


def test_python_dash_m(tmp_path):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "converter", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "qckpt" in r.stdout


@pytest.mark.parametrize("cmd", ["quantize", "convert"])
@pytest.mark.parametrize("flags", [["--per-channel", "--per-tensor"], ["--per-tensor", "--per-channel"],
                                   ["--per-channel", "--group-size", "64"]])
def test_conflicting_granularity_options_are_a_usage_error(tmp_path, cmd, flags):
    # found by a new-user trial: the last of --per-channel / --per-tensor used to win silently
    extra = ["--bits", "4"] if cmd == "quantize" else []
    r = CliRunner().invoke(main, [cmd, FP16 if cmd == "quantize" else str(SAMPLES / "gptq_w4_g128_sym"),
                                  str(tmp_path / "out"), *extra, *flags])
    assert r.exit_code == 2 and "conflicting options" in r.output
    assert not (tmp_path / "out").exists()


def test_missing_granularity_names_the_options(tmp_path):
    r = CliRunner().invoke(main, ["quantize", FP16, str(tmp_path / "o.safetensors"), "--bits", "4"])
    assert r.exit_code == 2 and "missing option" in r.output


def test_dequantize_json_conforms_to_schema(tmp_path):
    r = run("dequantize", SAMPLES / "gptq_w4_g128_sym", tmp_path / "deq", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "dequantize-report")
    assert doc["source_format"] == "gptq" and doc["tensors"] == 14 and "model.safetensors" in doc["files"]


def test_directory_of_gguf_files_says_pass_one_file():
    # found by a new-user trial: `qckpt inspect sample_checkpoints/gguf` said "expected None"
    r = run("inspect", SAMPLES / "gguf")
    assert r.exit_code == 3 and "pass one .gguf file" in r.output and "expected None" not in r.output


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
    r = CliRunner().invoke(main, ["inspect", str(p)], catch_exceptions=False)
    assert r.exit_code == 3 and "Traceback" not in r.output


@pytest.mark.parametrize("args", [["convert", "SRC", "--json"], ["inspect", "x", "--bogus", "--json"],
                                  ["convert", "SRC", "DST", "--max-shard-size", "12XB", "--json"]],
                         ids=["missing-argument", "unknown-option", "bad-value"])
def test_click_usage_errors_are_json_under_json(args, tmp_path):
    """Issue 18 item 14 (a new user's finding): click's own parse errors printed its plain usage text even under
    --json; they are one JSON error object (schemas/error.schema.json) on stdout, exit 2."""
    from converter.schemas import validate_document
    args = [str(SAMPLES / "gptq_w4_g128_sym") if a == "SRC" else str(tmp_path / "o") if a == "DST" else a
            for a in args]
    r = CliRunner().invoke(main, args)
    doc = json.loads(r.output)
    validate_document(doc, "error")
    assert r.exit_code == 2 and doc["error"] == "UsageError" and doc["exit_code"] == 2
    assert not (tmp_path / "o").exists()
