"""``qckpt validate --workers N --max-memory SIZE --quiet`` (issue 18 item 15): the per-tensor checks run in
worker processes, the report is the same for any worker count, the memory budget caps how many tensors are
checked side by side, and the progress bar goes to stderr only (never into ``--json`` stdout)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import converter.validate.run as run_mod
from converter.cli import main
from converter.runtime import run_options
from converter.validate import validate
from tests.conftest import REPO, SAMPLES
from tests.validate.helpers import FP16, copy_sample, edit_config


@pytest.fixture
def used_workers(monkeypatch):
    """The worker count each run_tasks call of the validator was given (the real run_tasks still runs)."""
    seen: list[int] = []
    real = run_mod.run_tasks

    def spy(n, fn, *, workers, on_result, **kw):
        seen.append(workers)
        return real(n, fn, workers=workers, on_result=on_result, **kw)
    monkeypatch.setattr(run_mod, "run_tasks", spy)
    return seen


def _json(*args) -> dict:
    r = CliRunner().invoke(main, ["validate", *map(str, args), "--json"], catch_exceptions=False)
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def _mislabelled_gptq(tmp_path):
    d = copy_sample("gptq_w4_g128_sym", tmp_path)  # v1 zeros labelled v2: findings on every tensor
    edit_config(d, lambda qc: qc.update(checkpoint_format="gptq_v2", format="gptq_v2"))
    return d


CASES = {
    "gptq+reference": lambda tmp: (SAMPLES / "gptq_w4_g128_sym", "--reference", FP16),
    "gptq mislabelled v2 (findings)": lambda tmp: (_mislabelled_gptq(tmp),),
    "awq": lambda tmp: (SAMPLES / "awq_gemm_w4_g128_zp",),
    "mlx affine": lambda tmp: (SAMPLES / "mlx_affine_g64_b4",),
    "compressed-tensors nvfp4": lambda tmp: (SAMPLES / "ct_nvfp4_smollm2",),
    "modelopt fp8": lambda tmp: (SAMPLES / "modelopt_fp8_smollm2tiny",),
    "gguf Q4_K_M + reference": lambda tmp: (SAMPLES / "gguf" / "minilm_llamacpp_Q4_K_M.gguf", "--reference", FP16),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_report_is_the_same_for_one_and_two_workers(case, tmp_path, used_workers):
    args = CASES[case](tmp_path)
    one = _json(*args, "--workers", "1")
    two = _json(*args, "--workers", "2")
    assert used_workers == [1, 2]  # the second run did fork two workers
    assert one == two
    assert one["summary"]["tensors_checked"] > 1


def test_the_mislabelled_sample_has_findings_in_both(tmp_path, used_workers):
    d = _mislabelled_gptq(tmp_path)
    two = _json(d, "--workers", "2")
    assert two["exit_code"] == 1 and "zero-convention" in {f["code"] for f in two["findings"]}


def test_the_memory_budget_caps_the_workers(used_workers):
    # the largest quantized tensor of the MiniLM GPTQ and AWQ samples is 1536 x 384 (intermediate.dense):
    # 589824 elements. GPTQ's words are read by the one-pass word scan: x 2 bytes = 1.125 MiB of working set, so
    # 2 MiB fits one at a time and 2.5 MiB two; AWQ's are not (words along out, interleaved): x 8 bytes = 4.5 MiB,
    # 6 MiB fits one, 10 MiB two; with a reference x 96 = 54 MiB whatever the format, 100 MiB fits one, 120 MiB two
    assert run_mod.BYTES_PER_ELEMENT == (8, 96) and run_mod.WORD_SCAN_BYTES_PER_ELEMENT == 2
    gptq, awq = SAMPLES / "gptq_w4_g128_sym", SAMPLES / "awq_gemm_w4_g128_zp"
    docs = []
    for sample, memory, reference in ((gptq, 2, None), (gptq, 2.5, None), (awq, 6, None), (awq, 10, None),
                                      (gptq, 100, FP16), (gptq, 120, FP16)):
        with run_options(workers=2, max_memory=int(memory * 2**20)):
            docs.append(validate(sample, reference=reference).to_json())
    assert used_workers == [1, 2, 1, 2, 1, 2]
    assert docs[0] == docs[1] and docs[2] == docs[3] and docs[4] == docs[5]



def test_a_permuted_g_idx_without_act_order_is_budgeted_at_8_bytes(tmp_path, used_workers):
    # the GPTQ sample says desc_act false; permuting one 1536 x 384 tensor's stored g_idx makes it load with that
    # g_idx, which the one-pass word scan does not read (the per-check scans run: 8 bytes per element, 4.5 MiB).
    # 2.5 MiB fits two 2-byte working sets (the test above), not one 8-byte one: one worker, as with 6 MiB, and
    # 10 MiB fits two
    from safetensors.numpy import load_file, save_file
    sample = copy_sample("gptq_w4_g128_sym", tmp_path)
    arrays = load_file(str(sample / "model.safetensors"))
    name = next(k for k in arrays if k.endswith("intermediate.dense.g_idx"))
    assert arrays[name].shape == (384,)
    arrays[name] = np.random.default_rng(0).permutation(arrays[name]).astype(np.int32)
    save_file(arrays, str(sample / "model.safetensors"), {"format": "pt"})
    docs = []
    for memory in (2.5, 6, 10):
        with run_options(workers=2, max_memory=int(memory * 2**20)):
            docs.append(validate(sample).to_json())
    assert used_workers == [1, 1, 2]
    assert docs[0] == docs[1] == docs[2]

def test_progress_counts_the_tensors_on_its_stream_only(monkeypatch):
    stream = io.StringIO()

    class Shown(run_mod.Progress):
        def __init__(self, label, items, nbytes, **kw):
            super().__init__(label, items, nbytes, delay=0.0, stream=stream, enabled=True)
    monkeypatch.setattr(run_mod, "Progress", Shown)
    rep = validate(SAMPLES / "gptq_w4_g128_sym")
    n = len(rep.tensors)
    assert "validating" in stream.getvalue() and f"{n}/{n} tensors" in stream.getvalue()


def test_json_stdout_stays_json_with_progress_forced_and_quiet_silences_it():
    env = {**os.environ, "PYTHONPATH": str(REPO), "QCKPT_PROGRESS": "1"}
    cmd = [sys.executable, "-m", "converter", "validate", str(SAMPLES / "gptq_w4_g128_sym"), "--json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["summary"]["verdict"] == "clean"
    quiet = subprocess.run(cmd + ["--quiet"], env=env, capture_output=True, text=True, check=True)
    assert quiet.stderr == "" and json.loads(quiet.stdout) == json.loads(out.stdout)


def test_help_says_how_validate_keeps_to_the_budget():
    text = " ".join(CliRunner().invoke(main, ["validate", "--help"]).output.split())
    assert "--workers" in text and "--quiet" in text and "tensors are checked whole" in text
    assert "row blocks" not in text  # (convert's way, not validate's)
