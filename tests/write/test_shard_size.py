"""Sharded output by default (issue 17): every model-directory writer shards at 5 GB (Hugging Face's
convention, decimal GB), ``--max-shard-size`` takes human sizes on convert / quantize / dequantize, 0 writes
one file."""

import json

import pytest
from click.testing import CliRunner
from safetensors import safe_open

from converter.cli import main
from converter.errors import FormatError
from converter.runtime import DEFAULT_MAX_SHARD_SIZE, current, parse_shard_size, run_options
from tests.conftest import SAMPLES

GPTQ = SAMPLES / "gptq_w4_g128_sym"
FP16 = SAMPLES / "minilm_fp16.safetensors"
INDEX = "model.safetensors.index.json"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.parametrize("text, expected", [("5GB", 5_000_000_000), ("500MB", 500_000_000), ("2GiB", 2 * 2**30),
                                            ("300KB", 300_000), ("1000000", 1_000_000), ("0", 0), (" 0 ", 0)])
def test_parse_shard_size(text, expected):
    assert parse_shard_size(text) == expected


@pytest.mark.parametrize("text", ["five", "5XB", "-1", ""])
def test_parse_shard_size_refuses(text):
    with pytest.raises(FormatError) as e:
        parse_shard_size(text)
    assert e.value.field == "--max-shard-size"


def test_the_default_is_huggingface_5gb():
    assert DEFAULT_MAX_SHARD_SIZE == 5 * 10**9 and current().max_shard_size == 5 * 10**9
    with run_options(max_shard_size="0"):
        assert current().max_shard_size == 0


def _shards(d):
    idx = json.loads((d / INDEX).read_text())
    files = sorted(set(idx["weight_map"].values()))
    sizes, modules = {}, {}
    for f in files:
        with safe_open(str(d / f), "np") as fh:
            sizes[f] = sum(fh.get_tensor(k).nbytes for k in fh.keys())
            modules[f] = {k.rsplit(".", 1)[0] for k in fh.keys()}
    return idx, files, sizes, modules


def _within(limit, sizes, modules):
    """Every shard holds at most ``limit`` bytes, or one module's arrays alone (a tensor is never split)."""
    return all(s <= limit or len(modules[f]) == 1 for f, s in sizes.items())


def test_convert_shards_at_the_given_size_and_one_file_below_the_default(tmp_path):
    small = tmp_path / "small"
    assert run("convert", GPTQ, small, "--to", "compressed-tensors").exit_code == 0
    assert (small / "model.safetensors").exists() and not (small / INDEX).exists()
    out = tmp_path / "sharded"
    r = run("convert", GPTQ, out, "--to", "compressed-tensors", "--max-shard-size", "300KB")
    assert r.exit_code == 0, r.output
    idx, files, sizes, modules = _shards(out)
    assert len(files) >= 3 and not (out / "model.safetensors").exists()
    assert _within(300_000, sizes, modules) and sum(s <= 300_000 for s in sizes.values()) >= 2
    assert idx["metadata"]["total_size"] == sum(sizes.values())
    assert files == [f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)]
    one = tmp_path / "one"
    assert run("convert", GPTQ, one, "--to", "compressed-tensors", "--max-shard-size", "0").exit_code == 0
    assert (one / "model.safetensors").exists() and not (one / INDEX).exists()


def test_quantize_and_dequantize_take_human_sizes(tmp_path):
    q = tmp_path / "q"
    r = run("quantize", FP16, q, "--bits", "4", "--group-size", "128", "--to", "gptq", "--max-shard-size", "1MB")
    assert r.exit_code == 0, r.output
    _, files, sizes, modules = _shards(q)
    assert len(files) >= 2 and _within(1_000_000, sizes, modules)
    d = tmp_path / "d"
    assert run("dequantize", GPTQ, d, "--max-shard-size", "2MB").exit_code == 0
    _, files, sizes, modules = _shards(d)
    assert len(files) >= 2 and _within(2_000_000, sizes, modules)


def test_bad_size_is_a_usage_error(tmp_path):
    r = run("convert", GPTQ, tmp_path / "x", "--to", "compressed-tensors", "--max-shard-size", "5XB")
    assert r.exit_code == 2 and "--max-shard-size" in r.output and "5GB" in r.output
    assert not (tmp_path / "x").exists()


def test_gguf_output_is_one_file_unless_a_size_is_given(tmp_path):
    assert run("convert", GPTQ, tmp_path / "m.gguf", "--to", "gguf").exit_code == 0  # the default applies to folders
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]
    r = run("convert", GPTQ, tmp_path / "s.gguf", "--to", "gguf", "--max-shard-size", "1MB")  # llama.cpp's split
    assert r.exit_code == 0, r.output
    parts = sorted(p.name for p in tmp_path.glob("s-*.gguf"))
    assert len(parts) >= 2 and parts[0] == f"s-00001-of-{len(parts):05d}.gguf" and not (tmp_path / "s.gguf").exists()
