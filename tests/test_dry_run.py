"""``--dry-run`` on convert / quantize / dequantize (issue 17): the plan, and nothing written. Each plan is
checked against the real run of the same command: the same files, the same tensor bytes per file (read from
the written safetensors headers), the same quantization_config, the same exact / lossy split."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from safetensors import safe_open

from converter.cli import main
from converter.schemas import validate_document
from tests.conftest import SAMPLES

GPTQ = SAMPLES / "gptq_w4_g128_sym"
FP16 = SAMPLES / "minilm_fp16.safetensors"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _data_bytes(f: Path) -> int:
    with safe_open(str(f), "np") as fh:
        return sum(fh.get_tensor(k).nbytes for k in fh.keys())


CASES = [
    ("convert", [GPTQ, "{dst}", "--to", "compressed-tensors"]),
    ("convert", [GPTQ, "{dst}", "--to", "mlx", "--bits", "8", "--per-channel", "--max-shard-size", "1MB"]),
    ("quantize", [FP16, "{dst}", "--bits", "4", "--group-size", "128", "--to", "gptq"]),
    ("dequantize", [GPTQ, "{dst}", "--max-shard-size", "3MB"]),
]


@pytest.mark.parametrize("command, args", CASES, ids=["repack", "requantize-sharded", "quantize", "dequantize"])
def test_plan_matches_the_real_run_and_writes_nothing(tmp_path, command, args):
    planned = tmp_path / "planned"
    r = run(command, *[str(a).format(dst=planned) for a in args], "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    validate_document(plan, "plan")
    assert plan["dry_run"] is True and plan["command"] == command
    assert not planned.exists() and list(tmp_path.iterdir()) == []  # no output, no temporary sibling
    real = tmp_path / "real"
    r = run(command, *[str(a).format(dst=real) for a in args], "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    data = {f.name: _data_bytes(f) for f in real.glob("*.safetensors")}
    assert {f["name"]: f["bytes"] for f in plan["files"] if f["name"].endswith(".safetensors")} == data
    assert (real / "model.safetensors.index.json").exists() == any(f["name"].endswith(".json") for f in plan["files"])
    cfg = json.loads((real / "config.json").read_text())
    if plan["config"] and "quantization_config" in plan["config"]:
        assert plan["config"]["quantization_config"] == cfg["quantization_config"]
    modes = {t["name"]: t["mode"] for t in plan["tensors"]}
    if command == "convert" and "--bits" not in args:  # repack: every row of the proof is exact
        assert {r_["name"] for r_ in report["tensors"] if r_["kind"] == "quantized"} == \
            {n for n, m in modes.items() if m == "exact"}
    elif command == "convert":  # requantize: the report's planned split
        assert report["overall"]["planned_lossy"] == sum(m == "lossy" for m in modes.values())
    elif command == "quantize":
        assert sorted(n for n, m in modes.items() if m == "lossy") == sorted(t["name"] for t in report["tensors"])
    else:
        assert sum(m == "dequantized" for m in modes.values()) == 7


def test_gguf_plan_names_one_file_and_its_types(tmp_path):
    r = run("convert", GPTQ, tmp_path / "m.gguf", "--to", "gguf", "--quant-type", "Q4_K_M", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert [f["name"] for f in plan["files"]] == ["m.gguf"] and plan["gguf"]["architecture"] == "bert"
    assert list(tmp_path.iterdir()) == []
    r = run("convert", GPTQ, tmp_path / "m.gguf", "--to", "gguf", "--quant-type", "Q4_K_M", "--json")
    assert r.exit_code == 0
    from collections import Counter

    import gguf
    written = Counter(t.tensor_type.name for t in gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors)
    assert Counter(plan["gguf"]["types"].values()) == written  # llama-quantize's Q4_K_M mix, as written
    assert plan["files"][0]["tensors"] == sum(written.values())


def test_dry_run_refuses_the_options_that_write(tmp_path):
    r = run("convert", GPTQ, tmp_path / "o", "--to", "mlx", "--bits", "8", "--per-channel", "--dry-run",
            "--report", tmp_path / "r.json")
    assert r.exit_code == 2 and "--dry-run writes nothing" in r.output and list(tmp_path.iterdir()) == []


def test_human_plan_says_nothing_was_written(tmp_path):
    r = run("dequantize", GPTQ, tmp_path / "d", "--dry-run")
    assert r.exit_code == 0 and "nothing written" in r.output and "would write model.safetensors" in r.output
