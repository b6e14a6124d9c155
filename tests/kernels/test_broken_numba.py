"""A numba that is installed but does not import (found by ``find_spec``, broken at import: e.g. built for
another numpy) is a one-line usage error naming the remedy when a kernel must compile, not a traceback."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "sample_checkpoints" / "gptq_w4_g128_sym"


def test_broken_numba_is_a_one_line_error(tmp_path):
    fake = tmp_path / "site" / "numba"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("numba needs numpy < 2.5")\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(ROOT)]), QCKPT_KERNELS="numba")
    dst = tmp_path / "out"
    out = subprocess.run([sys.executable, "-m", "converter", "convert", str(SAMPLE), str(dst), "--to",
                          "compressed-tensors", "--per-channel", "--bits", "8", "--workers", "1", "--quiet"],
                         env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "numba is installed but does not import" in lines[0]
    assert "numba needs numpy < 2.5" in lines[0] and "QCKPT_KERNELS=numpy" in lines[0]
    assert not dst.exists()
