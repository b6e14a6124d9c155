"""The kernels cap BLAS at one thread around their products, for library callers too."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from converter.kernels import blas
from converter.kernels.error_sums import ErrorSums, compare_rows


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_cap_inside_and_restored_after():
    with threadpool_limits(limits=2, user_api="blas"):
        before = _blas_threads()
        with blas.blas_threads():
            assert all(n == 1 for n in _blas_threads())
            with blas.blas_threads():  # nested: still capped, and the outer exit restores
                assert all(n == 1 for n in _blas_threads())
            assert all(n == 1 for n in _blas_threads())
        assert _blas_threads() == before


def test_error_sums_products_run_on_one_blas_thread(monkeypatch):
    seen = []
    real = ErrorSums._products

    def spy(self, A):
        seen.append(_blas_threads())
        return real(self, A)
    monkeypatch.setattr(ErrorSums, "_products", spy)
    a = np.random.default_rng(0).standard_normal((40, 64)).astype(np.float32)
    with threadpool_limits(limits=2, user_api="blas"):  # a library caller's BLAS default
        compare_rows(a, a + np.float32(1e-3), group_size=32)
    assert seen and all(n == 1 for threads in seen for n in threads)


def test_the_cli_starts_openblas_with_one_thread(tmp_path):
    """A qckpt command loads numpy after its options are parsed: the cap must be in place when OpenBLAS starts
    (OPENBLAS_NUM_THREADS), not only applied to a numpy already loaded (limit_blas_threads found none then, and
    OpenBLAS's idle threads spun in the command and in every forked worker). A user's own setting is kept."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import sys; from converter.cli import main\n"
            "try: main(['convert', sys.argv[1], sys.argv[2], '--to', 'compressed-tensors', '--quiet', '--json'],"
            " standalone_mode=False)\n"
            "except SystemExit: pass\n"
            "from threadpoolctl import threadpool_info\n"
            "import os; print(os.environ['OPENBLAS_NUM_THREADS'], "
            "[i['num_threads'] for i in threadpool_info() if i['user_api'] == 'blas'])")
    sample = str(root / "sample_checkpoints" / "gptq_w4_g128_sym")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env["PYTHONPATH"] = str(root)
    out = subprocess.run([sys.executable, "-c", code, sample, str(tmp_path / "a")], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()[-1]
    assert out == "1 [1]"
    env["OPENBLAS_NUM_THREADS"] = "2"
    out = subprocess.run([sys.executable, "-c", code, sample, str(tmp_path / "b")], env=env, capture_output=True,
                         text=True, check=True).stdout.splitlines()[-1]
    assert out.startswith("2 ")
