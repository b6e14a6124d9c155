"""Atomic, deterministic, read-only output under hostile conditions: SIGKILL / Ctrl-C mid-way
through a multi-shard write, DST == SRC, existing outputs and reports, corrupt directories."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.write.atomic import sha256_file
from tests.conftest import REPO, SAMPLES

GPTQ = SAMPLES / "gptq_w4_g128_sym"
SHARD = 400_000  # bytes: the f32 dequantized GPTQ sample needs several shards


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def hashes(d: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in sorted(d.iterdir()) if p.is_file()}


def temp_siblings(dst: Path) -> list[Path]:
    return sorted(p for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}.qckpt-tmp-"))


@pytest.fixture
def src(tmp_path):
    s = tmp_path / "src"
    shutil.copytree(GPTQ, s)
    return s


def _start(src: Path, dst: Path, delay: str) -> subprocess.Popen:
    env = {**os.environ, "QCKPT_TEST_SHARD_DELAY": delay, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "converter", "dequantize", str(src), str(dst),
                             "--max-shard-size", str(SHARD)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_first_shard(proc: subprocess.Popen, dst: Path, timeout: float = 60) -> Path:
    """Poll until the first shard is complete inside the temp directory (the hook then sleeps)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        for tmp in temp_siblings(dst):
            if list(tmp.glob("model-00001-of-*.safetensors")):
                return tmp
        time.sleep(0.02)
    proc.kill()
    pytest.fail("no shard appeared")


def test_sigkill_mid_write_leaves_only_a_named_temp_then_next_run_cleans(src, tmp_path):
    before = hashes(src)
    dst = tmp_path / "out"
    proc = _start(src, dst, "30")
    tmp = _wait_first_shard(proc, dst)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not dst.exists()
    left = temp_siblings(dst)
    assert left == [tmp] and tmp.name.startswith(".out.qckpt-tmp-")  # clearly named as temporary
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["src", tmp.name])
    assert hashes(src) == before  # input untouched
    # the next run removes the stale sibling (its pid is dead) and writes a complete output
    r = run("dequantize", src, dst, "--max-shard-size", SHARD)
    assert r.exit_code == 0, r.output
    assert temp_siblings(dst) == []
    files = sorted(p.name for p in dst.iterdir())
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) >= 3
    assert hashes(src) == before


def test_ctrl_c_mid_write_leaves_nothing(src, tmp_path):
    before = hashes(src)
    dst = tmp_path / "out"
    proc = _start(src, dst, "30")
    _wait_first_shard(proc, dst)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted; no partial output left" in err and "Traceback" not in err
    assert not dst.exists() and temp_siblings(dst) == []
    assert hashes(src) == before


@pytest.mark.parametrize("cmd",
                         [["dequantize"], ["convert", "--to", "gptq"], ["quantize", "--bits", "4", "--per-channel"]])
@pytest.mark.parametrize("where", ["same", "inside"])
def test_dst_equal_or_inside_src_refused(src, cmd, where):
    before = hashes(src)
    dst = src if where == "same" else src / "out"
    r = run(cmd[0], src, dst, *cmd[1:], "--overwrite")
    assert r.exit_code == 2, r.output
    assert "destination is" in r.output and "Traceback" not in r.output
    assert hashes(src) == before and not (src / "out").exists()


def test_existing_destination_untouched_without_overwrite(src, tmp_path):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    r = run("dequantize", src, dst)
    assert r.exit_code == 2 and "--overwrite" in r.output
    assert [p.name for p in dst.iterdir()] == ["keep.txt"]
    r = run("dequantize", src, dst, "--overwrite")
    assert r.exit_code == 0 and not (dst / "keep.txt").exists()


def test_convert_report_respects_overwrite_and_src(src, tmp_path):
    report = tmp_path / "report.json"
    report.write_text("old")
    dst = tmp_path / "out"
    r = run("convert", src, dst, "--report", report)
    assert r.exit_code == 2 and report.read_text() == "old" and not dst.exists()  # refused before writing DST
    r = run("convert", src, dst, "--report", src / "config.json", "--overwrite")
    assert r.exit_code == 2 and not dst.exists()
    r = run("convert", src, dst, "--report", report, "--overwrite")
    assert r.exit_code == 0, r.output
    assert json.loads(report.read_text())["summary"]["all_exact"] is True


def test_outputs_are_deterministic(src, tmp_path):
    for i in (1, 2):
        assert run("dequantize", src, tmp_path / f"d{i}", "--max-shard-size", SHARD).exit_code == 0
        assert run("convert", src, tmp_path / f"c{i}", "--to", "gptq", "--report",
                   tmp_path / f"r{i}.json").exit_code == 0
        assert run("quantize", SAMPLES / "minilm_fp16.safetensors", tmp_path / f"q{i}.safetensors", "--bits", 4,
                   "--group-size", 128).exit_code == 0
    assert hashes(tmp_path / "d1") == hashes(tmp_path / "d2")
    assert hashes(tmp_path / "c1") == hashes(tmp_path / "c2")
    assert sha256_file(tmp_path / "q1.safetensors") == sha256_file(tmp_path / "q2.safetensors")
    r1 = json.loads((tmp_path / "r1.json").read_text())
    r2 = json.loads((tmp_path / "r2.json").read_text())
    assert {k: v for k, v in r1.items() if k != "destination"} == {k: v for k, v in r2.items() if k != "destination"}


def test_b34_missing_shard_through_cli(src, tmp_path):
    dst = tmp_path / "sharded"
    assert run("dequantize", src, dst, "--max-shard-size", SHARD).exit_code == 0
    second = sorted(dst.glob("model-00002-of-*.safetensors"))[0]
    second.unlink()
    r = run("inspect", dst)
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 3 and len(lines) == 1 and "Traceback" not in r.output
    assert f"missing shard {second.name}" in lines[0] and "weight_map" in lines[0]


def test_extra_file_symlink_outside_refused_by_name_not_copied(src, tmp_path):
    # issue 17's symlink policy: refused by name (it used to be left out silently, losing the tokenizer)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy")
    (src / "tokenizer.json").symlink_to(secret)
    (src / "special_tokens_map.json").write_text("{}")
    dst = tmp_path / "out"
    r = run("dequantize", src, dst)
    assert r.exit_code == 3 and "tokenizer.json" in r.output and "leads outside the checkpoint directory" in r.output
    assert not dst.exists()


@pytest.mark.parametrize("src_name,to", [("gptq_w4_g128_sym", "awq"), ("gptq_w4_g128_sym", "mlx"),
                                         ("gptq_w4_g128_sym", "compressed-tensors"),
                                         ("gguf/minilm_gguf_Q4_0.gguf", "gguf")])
def test_every_writer_is_deterministic(tmp_path, src_name, to):
    src = SAMPLES / src_name
    outs = []
    for i in (1, 2):
        dst = tmp_path / (f"o{i}.gguf" if to == "gguf" else f"o{i}")
        r = run("convert", src, dst, "--to", to)
        assert r.exit_code == 0, r.output
        outs.append(hashes(dst) if dst.is_dir() else sha256_file(dst))
    assert outs[0] == outs[1]


def test_non_finite_scales_print_qckpts_findings_not_numpy_warnings(tmp_path):
    """A GPTQ checkpoint with one infinite scale per tensor decodes to NaN / inf: validate names every tensor
    (scale-nonfinite) and a requantize refuses in one line, with no numpy "RuntimeWarning: invalid value encountered"
    lines on stderr (they came from the kernels, in the parent and in the workers); the filter is the command's
    only, not left behind in the calling process."""
    import warnings

    from tests.validate.helpers import copy_sample, with_inf_scales
    d = with_inf_scales(copy_sample("gptq_w4_g128_sym", tmp_path), (0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for args, code in ((["validate", str(d), "--quiet", "--workers", "2"], 1),
                       (["convert", str(d), str(tmp_path / "out"), "--to", "compressed-tensors", "--per-channel",
                         "--bits", "8", "--quiet"], 3)):
        r = subprocess.run([sys.executable, "-m", "converter", *args], capture_output=True, text=True, env=env,
                           cwd=tmp_path)
        assert r.returncode == code, r.stderr
        assert "RuntimeWarning" not in r.stderr and "encountered" not in r.stderr, r.stderr
    assert "scale-nonfinite" in subprocess.run([sys.executable, "-m", "converter", "validate", str(d), "--quiet"],
                                                capture_output=True, text=True, env=env, cwd=tmp_path).stdout
    before = list(warnings.filters)
    CliRunner().invoke(main, ["validate", str(d), "--quiet"])
    assert warnings.filters == before


def test_dequantize_names_the_tensors_it_wrote_with_nan_or_inf(tmp_path):
    """Infinite scales dequantize to inf / NaN (inf * 0): written as decoded, and the report names each tensor with
    its count of non-finite values, equal to the count in the written file (numpy, independently); in row blocks
    (a 1M budget) and two workers the blocks' counts add up. A clean source has no non_finite entry."""
    import numpy as np
    from safetensors.numpy import load_file

    from tests.validate.helpers import copy_sample, with_inf_scales
    d = with_inf_scales(copy_sample("gptq_w4_g128_sym", tmp_path), (0, slice(0, 3)))  # group 0 of output rows 0-2
    for extra in ([], ["--workers", "2", "--max-memory", "1M"]):
        out = tmp_path / f"deq{len(extra)}.safetensors"
        r = CliRunner().invoke(main, ["dequantize", str(d), str(out), "--json", "--quiet", *extra])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        written = load_file(out)
        expected = {k: int(np.count_nonzero(~np.isfinite(v))) for k, v in written.items()}
        assert doc["non_finite"] == {k: n for k, n in sorted(expected.items()) if n}
        assert len(doc["non_finite"]) == 7 and all(n >= 1 for n in doc["non_finite"].values())
    text = CliRunner().invoke(main, ["dequantize", str(d), str(tmp_path / "t.safetensors"), "--quiet"]).output
    assert "7 quantized tensor(s) dequantized to NaN / inf values" in text
    clean = CliRunner().invoke(main, ["dequantize", str(SAMPLES / "gptq_w4_g128_sym"), str(tmp_path / "c.safetensors"),
                                      "--json", "--quiet"])
    assert "non_finite" not in json.loads(clean.stdout)


def _inf_scales_sample(tmp_path, rows=(0, -1)):
    """The GPTQ sample with an infinite scale in group 0 of output rows ``rows`` of every tensor (scales are
    (groups, out)): each such row decodes to inf / NaN (inf * 0) in its first 128 inputs."""
    from tests.validate.helpers import copy_sample, with_inf_scales
    return with_inf_scales(copy_sample("gptq_w4_g128_sym", tmp_path), (0, list(rows)))


def test_dequantize_non_finite_counts_add_up_over_row_blocks(tmp_path, monkeypatch):
    """One row per block (block_rows patched to 1): the infinite rows 0 and last are in different blocks of the same
    task, and the report's count is the sum of both blocks, equal to numpy's count of the written file."""
    import numpy as np
    from safetensors.numpy import load_file

    import converter.write.files as files
    d = _inf_scales_sample(tmp_path)
    monkeypatch.setattr(files, "block_rows", lambda plan, spec, budget: 1 if plan.row_split else None)
    out = tmp_path / "rows.safetensors"
    r = CliRunner().invoke(main, ["dequantize", str(d), str(out), "--json", "--quiet", "--workers", "1"])
    assert r.exit_code == 0, r.output
    written = load_file(out)
    expected = {k: int(np.count_nonzero(~np.isfinite(v))) for k, v in written.items()}
    assert all(np.isfinite(v[1:-1]).all() and not np.isfinite(v[0]).all() and not np.isfinite(v[-1]).all()
               for k, v in written.items() if expected[k])  # two rows, two blocks
    assert json.loads(r.stdout)["non_finite"] == {k: n for k, n in sorted(expected.items()) if n}


def test_dequantize_match_tool_names_non_finite_tensors(tmp_path):
    """--match-tool decodes as GPTQModel does (float16 here): the infinite scales give inf / NaN there too, and the
    report names them as the exact decode's does (it said nothing, and 1ee5b5d hides numpy's RuntimeWarning)."""
    import numpy as np
    from safetensors.numpy import load_file

    d = _inf_scales_sample(tmp_path)
    out = tmp_path / "tool.safetensors"
    r = CliRunner().invoke(main, ["dequantize", str(d), str(out), "--match-tool", "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    written = load_file(out)
    expected = {k: int(np.count_nonzero(~np.isfinite(v))) for k, v in written.items()}
    assert sum(1 for n in expected.values() if n) == 7
    assert json.loads(r.stdout).get("non_finite") == {k: n for k, n in sorted(expected.items()) if n}


def test_dequantize_counts_a_float16_overflow_not_a_float32_one(tmp_path):
    """Finite scales of 60000 (float16) decode to |values| up to 60000 * 8 = 480000: finite in float32 (no
    non_finite), inf in a float16 output (past 65504): counted as numpy counts the written file; bfloat16 holds them
    (its range is float32's): no non_finite."""
    import numpy as np
    from safetensors.numpy import load_file

    from tests.validate.helpers import copy_sample, edit_tensors
    d = copy_sample("gptq_w4_g128_sym", tmp_path)

    def big(tensors):
        for k in tensors:
            if k.endswith(".scales"):
                s = tensors[k].copy()
                s[0, :5] = np.float16(60000)
                tensors[k] = s
    edit_tensors(d, big)
    for dtype, overflows in (("f32", False), ("bf16", False), ("f16", True)):
        out = tmp_path / f"{dtype}.safetensors"
        r = CliRunner().invoke(main, ["dequantize", str(d), str(out), "--dtype", dtype, "--json", "--quiet"])
        assert r.exit_code == 0, r.output
        written = load_file(out)
        expected = {k: int(np.count_nonzero(~np.isfinite(v.astype(np.float32)))) for k, v in written.items()}
        assert bool(any(expected.values())) == overflows
        assert json.loads(r.stdout).get("non_finite", {}) == {k: n for k, n in sorted(expected.items()) if n}
