"""Error metrics between a reference and a reconstruction (float64 accumulation).

SQNR is ``10 log10(sum(x^2) / sum((x - x_hat)^2))`` in dB; it is reported as ``None`` (JSON
``null``) with ``exact = True`` when the error is zero, since infinity has no JSON form.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class ErrorStats:
    """Error of ``approx`` against ``ref`` (both float32, same shape)."""

    numel: int
    mse: float
    rmse: float
    max_abs: float
    rel_frobenius: float | None
    sqnr_db: float | None
    exact: bool
    changed_fraction: float

    def to_json(self) -> dict:
        return asdict(self)


def error_stats(ref: np.ndarray, approx: np.ndarray) -> ErrorStats:
    """Compute :class:`ErrorStats`; ``rel_frobenius`` is None when ``ref`` is all zero."""
    r = np.asarray(ref, dtype=np.float32)
    a = np.asarray(approx, dtype=np.float32)
    if r.shape != a.shape:
        raise ValueError(f"shapes differ: {r.shape} vs {a.shape}")
    n = int(r.size)
    if n == 0:
        return ErrorStats(0, 0.0, 0.0, 0.0, None, None, True, 0.0)
    e = (a - r).astype(np.float64)
    se = float(np.dot(e.reshape(-1), e.reshape(-1)))
    r64 = r.astype(np.float64).reshape(-1)
    sr = float(np.dot(r64, r64))
    mse = se / n
    exact = se == 0.0
    return ErrorStats(
        numel=n, mse=mse, rmse=float(np.sqrt(mse)), max_abs=float(np.max(np.abs(e))),
        rel_frobenius=float(np.sqrt(se / sr)) if sr > 0 else None,
        sqnr_db=None if exact or sr == 0 else float(10.0 * np.log10(sr / se)),
        exact=exact, changed_fraction=float(np.count_nonzero(e) / n))
