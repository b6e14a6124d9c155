"""``--verbose``: each compiled kernel's first-call compile / cache-load seconds on stderr, in the
process that called it; nothing without the flag or on the numpy path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from converter.kernels import compiled

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_checkpoints" / "gptq_w4_g128_sym"
LINE = re.compile(r"qckpt: compiled kernel converter\.kernels\.compiled\.requant\._(decode_extrema|codes_errors): "
                  r"first call \d+\.\d\d s \(compile or cache load; process \d+\)")


def _convert(tmp_path: Path, kernels: str, *flags: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, QCKPT_KERNELS=kernels, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "converter", "convert", str(SAMPLE), str(tmp_path / f"o{len(flags)}"),
                           "--to", "compressed-tensors", "--per-channel", "--bits", "8", "--quiet", "--workers", "1",
                           *flags], env=env, capture_output=True, text=True, check=True)


@pytest.mark.skipif(not compiled.available(), reason="the fast extra (numba) is not installed")
def test_verbose_prints_each_kernels_first_call_seconds(tmp_path):
    err = _convert(tmp_path, "numba", "--verbose").stderr
    assert sorted(m.group(1) for m in LINE.finditer(err)) == ["codes_errors", "decode_extrema"]
    assert "compiled kernel" not in _convert(tmp_path, "numba").stderr


def test_verbose_on_the_numpy_path_prints_no_kernel_line(tmp_path):
    assert "compiled kernel" not in _convert(tmp_path, "numpy", "--verbose").stderr


@pytest.mark.skipif(not compiled.available(), reason="the fast extra (numba) is not installed")
def test_verbose_says_which_kernel_path_ran(tmp_path):
    """--verbose always ends with one line saying which path this process took (a user cannot otherwise tell
    whether the fast extra is active: small tensors stay on numpy in auto mode)."""
    runs = [tmp_path / d for d in ("a", "b", "c")]
    for d in runs:
        d.mkdir()
    assert "qckpt: kernels: numpy kernels (QCKPT_KERNELS=numpy)" in _convert(runs[0], "numpy", "--verbose").stderr
    assert "compiled kernel(s) called in this process" in _convert(runs[1], "numba", "--verbose").stderr
    assert "qckpt: kernels:" not in _convert(runs[2], "numba").stderr


def test_an_unknown_kernels_word_is_refused_before_any_work(tmp_path):
    """QCKPT_KERNELS is checked up front (it used to surface at the first tensor, blamed on that tensor, and
    not at all on an exact repack)."""
    import os
    import subprocess
    import sys

    from tests.conftest import SAMPLES
    env = dict(os.environ, QCKPT_KERNELS="fortran", PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "converter", "convert", str(SAMPLES / "gptq_w4_g128_sym"),
                        str(tmp_path / "o"), "--to", "compressed-tensors"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "QCKPT_KERNELS: expected one of auto, numpy, numba, found 'fortran'" in r.stderr
    assert "tensor" not in r.stderr and not (tmp_path / "o").exists()
