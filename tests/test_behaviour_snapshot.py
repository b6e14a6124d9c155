"""``scripts/behaviour_snapshot.py compare`` on two tiny hand-written snapshots.

The record step runs the whole CLI matrix (minutes) and is not part of the test suite; these tests
check the comparison logic that decides "behaviour unchanged". Every expected line below is
written by hand from the two snapshots built here.
"""

import json
import subprocess
import sys

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "behaviour_snapshot.py"


def _run(rid, stdout="", exit_code=0, outputs=None, argv=None):
    return {"id": rid, "argv": argv or ["qckpt", *rid.split("/")[:1]], "exit_code": exit_code,
            "stdout": stdout, "stderr": "", "outputs": outputs or {}, "seconds": 0.1}


def _st_file(sha, tensor_sha):
    return {"bytes": 100, "sha256": sha,
            "safetensors": {"metadata": {"format": "pt"}, "tensors": {"w": ["F16", [2, 2], tensor_sha],
                                                                      "b": ["F16", [2], "bb"]}}}


def _snapshot(path, runs, seconds=1.0):
    path.write_text(json.dumps({"snapshot_format": 1, "meta": {"git_head": "abc", "elapsed_s": seconds},
                                "runs": runs}))
    return path


def _compare(a, b, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), "compare", str(a), str(b), *extra],
                          capture_output=True, text=True, timeout=60)


def base_runs():
    return [_run("inspect/x/text", "x  format: gptq\nline two\n"),
            _run("dequantize/x/f32", "dequantized 2 tensors\n", outputs={"model.safetensors": _st_file("s1", "t1")})]


def test_identical_snapshots(tmp_path):
    a = _snapshot(tmp_path / "a.json", base_runs(), seconds=1.0)
    b = _snapshot(tmp_path / "b.json", base_runs(), seconds=9.0)   # meta and seconds are not compared
    r = _compare(a, b)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["identical  inspect/x/text", "identical  dequantize/x/f32",
                                     "2 runs: 2 identical, 0 differ"]


def test_differing_snapshots(tmp_path):
    a = _snapshot(tmp_path / "a.json", base_runs())
    runs = base_runs()
    runs[0]["stdout"] = "x  format: gptq\nline 2\n"
    runs[1]["exit_code"] = 3
    runs[1]["outputs"]["model.safetensors"] = _st_file("s2", "t2")
    runs.append(_run("audit/x/json", "{}\n"))
    b = _snapshot(tmp_path / "b.json", runs)
    r = _compare(a, b)
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert out[-1] == "3 runs: 0 identical, 3 differ"
    assert "differs    inspect/x/text" in out
    assert "    -line two" in out and "    +line 2" in out
    assert "differs    dequantize/x/f32" in out
    assert "  exit code: 0 -> 3" in out
    assert "  output model.safetensors: differs (100 -> 100 bytes)" in out
    assert "    tensor w: bytes differ" in out
    assert not any("tensor b:" in line for line in out)    # the unchanged tensor is not named
    assert "differs    audit/x/json" in out and "  only in B" in out


def test_one_run_differs_only_differing(tmp_path):
    a = _snapshot(tmp_path / "a.json", base_runs())
    runs = base_runs()
    runs[1]["outputs"] = {}
    b = _snapshot(tmp_path / "b.json", runs)
    r = _compare(a, b, "--only-differing")
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["differs    dequantize/x/f32", "  output model.safetensors: only in A",
                                     "2 runs: 1 identical, 1 differ"]


def test_not_a_snapshot(tmp_path):
    a = _snapshot(tmp_path / "a.json", base_runs())
    bad = tmp_path / "bad.json"
    bad.write_text('{"runs": []}')
    r = _compare(a, bad)
    assert r.returncode == 2 and "not a behaviour snapshot" in r.stderr


def test_normaliser_placeholders(tmp_path):
    """Temporary names and absolute paths become placeholders; the rest of the text is kept."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("behaviour_snapshot", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["behaviour_snapshot"] = mod     # its dataclass looks itself up there
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules["behaviour_snapshot"]
    norm = mod.Normaliser(tmp_path)
    text = (f"qckpt: error: {tmp_path}/out/a/.model.qckpt-tmp-4242-0123456789ab: disk full; "
            f"{mod.REPO}/sample_checkpoints/x inside qckpt-probe-k3_j9x")
    assert norm.text(text) == ("qckpt: error: <WORK>/out/a/.model.qckpt-tmp-<PID>-<RAND>: disk full; "
                               "<REPO>/sample_checkpoints/x inside qckpt-probe-<RAND>")
    assert norm.json({"destination": f"{tmp_path}/out", "n": 3}) == {"destination": "<WORK>/out", "n": 3}
