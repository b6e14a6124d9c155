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
