"""The README's one-call API example (issue 17) runs as written, and each function returns the document the
CLI prints for the same command (``--json``), so the two can never disagree."""

import json
import os
import re
from pathlib import Path

from click.testing import CliRunner

import converter
from converter.cli import main
from converter.validate.report import ValidationReport

REPO = Path(__file__).resolve().parent.parent


def _block() -> str:
    section = (REPO / "README.md").read_text().split("## Python API", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 2 and "converter.diff(" in blocks[1]
    return blocks[1]


def _cli_json(*args):
    r = CliRunner().invoke(main, [str(a) for a in args] + ["--json"])
    return r.exit_code, json.loads(r.output)


def test_the_readme_block_runs_and_prints_what_it_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.symlink(REPO / "sample_checkpoints", tmp_path / "sample_checkpoints")
    block = _block()
    exec(compile(block, "README.md (commands as functions)", "exec"), {})  # noqa: S102 - our own README
    printed = capsys.readouterr().out.split("\n")
    # each print's comment says what it prints (an explanation may follow in parentheses)
    claimed = [line.split("#", 1)[1].split(" (")[0].strip() for line in block.splitlines()
               if line.startswith("print(")]
    assert printed[:len(claimed)] == claimed
    for out in ("minilm-ct", "minilm-w8", "minilm-f32", "minilm-gptq"):
        assert (tmp_path / out / "config.json").is_file(), out


def test_each_function_returns_the_cli_document(tmp_path):
    src = REPO / "sample_checkpoints" / "gptq_w4_g128_sym"
    assert converter.inspect(src) == _cli_json("inspect", src)[1]
    assert converter.audit(src, what_if=True) == _cli_json("audit", src, "--what-if")[1]
    rep = converter.validate(src, strict=True)
    assert isinstance(rep, ValidationReport) and rep.to_json() == _cli_json("validate", src, "--strict")[1]
    a = converter.convert(src, tmp_path / "a", to="awq")
    code, b = _cli_json("convert", src, tmp_path / "b", "--to", "awq")
    assert code == 0 and {k: v for k, v in a.items() if k != "destination"} == \
        {k: v for k, v in b.items() if k != "destination"}
    d = converter.diff(tmp_path / "a", tmp_path / "b")
    assert d == _cli_json("diff", tmp_path / "a", tmp_path / "b")[1] and d["exit_code"] == 0
    f = converter.dequantize(src, tmp_path / "f.safetensors", dtype="bf16")
    code, g = _cli_json("dequantize", src, tmp_path / "g.safetensors", "--dtype", "bf16")
    assert {k: v for k, v in f.items() if k not in ("destination", "files")} == \
        {k: v for k, v in g.items() if k not in ("destination", "files")} and f["tensors"] == 14
    assert (tmp_path / "f.safetensors").read_bytes() == (tmp_path / "g.safetensors").read_bytes()
    fp16 = REPO / "sample_checkpoints" / "minilm_fp16.safetensors"
    q = converter.quantize(fp16, tmp_path / "q", bits=4, group_size=128, to="gptq")
    code, r = _cli_json("quantize", fp16, tmp_path / "r", "--bits", 4, "--group-size", 128, "--to", "gptq")
    assert q["tensors"] == r["tensors"] and q["overall"] == r["overall"]


def test_tensor_level_quantize_and_dequantize_still_work():
    import numpy as np
    w = np.array([[0.1, -0.1], [10.0, -10.0]], np.float32)
    q = converter.quantize(w, converter.QuantScheme(bits=8, signed=True), converter.GroupMap.per_channel("out"))
    assert q.codes.tolist() == [[127, -127], [127, -127]]  # per-row (contract 4)
    assert np.allclose(converter.dequantize(q), w, atol=0.1 / 127)
