"""Error metrics between a reference and a reconstruction (float64 accumulation).

SQNR is ``10 log10(sum(x^2) / sum((x - x_hat)^2))`` in dB; it is reported as ``None`` (JSON
``null``) with ``exact = True`` when the error is zero, since infinity has no JSON form.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from converter.errors import LayoutError
from converter.kernels.blas import blas_threads

#: Random inputs of the output-space error (columns of ``X``) and their seed.
N_INPUTS = 8
SEED = 0


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


@dataclass(frozen=True)
class Figures(ErrorStats):
    """Every error figure of one comparison of ``approx`` against ``ref`` (a report's ``vs_source``
    / ``vs_reference`` entry): the :class:`ErrorStats` fields, then those below.

    Attributes
    ----------
    worst_channel : ``{"index": [...], "mse": float}``: the output row with the largest MSE.
    worst_group : ``{"index": [...], "mse": float, "elements": int}``: the target group with the
        largest MSE (index in parameter shape).
    output_rel_error : ``||W'X - WX|| / ||WX||`` on the fixed-seed inputs (None when ``WX`` is 0
        and the error is not).
    sse, ssr, out_sq_err, out_sq_ref : the sums behind them (squared error, squared reference,
        squared output error and output reference): totals over tensors are formed from these.
        Not part of :meth:`to_json`.
    """

    worst_channel: dict | None
    worst_group: dict | None
    output_rel_error: float | None
    sse: float
    ssr: float
    out_sq_err: float
    out_sq_ref: float

    #: fields written to reports (the sums are not)
    JSON_FIELDS = ("numel", "mse", "rmse", "max_abs", "rel_frobenius", "sqnr_db", "exact", "changed_fraction",
                   "worst_channel", "worst_group", "output_rel_error")

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.JSON_FIELDS}


def error_stats(ref: np.ndarray, approx: np.ndarray) -> ErrorStats:
    """Compute :class:`ErrorStats`; ``rel_frobenius`` is None when ``ref`` is all zero.

    Raises
    ------
    LayoutError
        When ``ref`` and ``approx`` have different shapes.
    """
    r = np.asarray(ref, dtype=np.float32)
    a = np.asarray(approx, dtype=np.float32)
    if r.shape != a.shape:
        raise LayoutError("reference and approximation shapes differ", field="shape", expected=list(r.shape),
                          found=list(a.shape))
    n = int(r.size)
    if n == 0:
        return ErrorStats(0, 0.0, 0.0, 0.0, None, None, True, 0.0)
    e = (a - r).astype(np.float64)
    r64 = r.astype(np.float64).reshape(-1)
    with blas_threads():
        se = float(np.dot(e.reshape(-1), e.reshape(-1)))
        sr = float(np.dot(r64, r64))
    mse = se / n
    exact = se == 0.0
    return ErrorStats(
        numel=n, mse=mse, rmse=float(np.sqrt(mse)), max_abs=float(np.max(np.abs(e))),
        rel_frobenius=float(np.sqrt(se / sr)) if sr > 0 else None,
        sqnr_db=None if exact or sr == 0 else float(10.0 * np.log10(sr / se)),
        exact=exact, changed_fraction=float(np.count_nonzero(e) / n))


def _rows(x: np.ndarray, axes, along: str = "in") -> np.ndarray:
    """``x`` as a 2-D float64 matrix ``(rows, n_along)``: ``along`` moved last, other axes flattened."""
    a = np.asarray(x, dtype=np.float64)
    ax = list(axes).index(along) if along in axes else a.ndim - 1
    a = np.moveaxis(a, ax, -1)
    return a.reshape(-1, a.shape[-1]) if a.size else a.reshape(0, a.shape[-1] if a.ndim else 0)


def worst_channel(ref: np.ndarray, approx: np.ndarray, axes) -> dict | None:
    """The output channel (row; leading axes such as ``expert`` flattened) with the largest MSE.

    Returns ``{"index": [..logical indices of the row..], "mse": float}`` or None when empty.
    """
    e = _rows(approx, axes) - _rows(ref, axes)
    if e.size == 0:
        return None
    per = np.mean(e * e, axis=1)
    i = int(np.argmax(per))
    shape = [n for a, n in zip(axes, np.shape(ref)) if a != "in"]
    return {"index": [int(v) for v in np.unravel_index(i, shape)] if shape else [i], "mse": float(per[i])}


def worst_group(ref: np.ndarray, approx: np.ndarray, group_map, axes) -> dict | None:
    """The quantization group (of ``group_map``) with the largest MSE; index in parameter shape."""
    r = np.asarray(ref, dtype=np.float64)
    e = np.asarray(approx, dtype=np.float64) - r
    if e.size == 0:
        return None
    se = group_map.reduce(e * e, np.add, axes)
    cnt = group_map.reduce(np.ones_like(e), np.add, axes)
    per = se / np.maximum(cnt, 1)
    i = int(np.argmax(per))
    return {"index": [int(v) for v in np.unravel_index(i, per.shape)], "mse": float(per.reshape(-1)[i]),
            "elements": int(cnt.reshape(-1)[i])}


def output_error(ref: np.ndarray, approx: np.ndarray, axes, *, n_inputs: int = 8, seed: int = 0) -> dict:
    """Output-space error on fixed-seed standard-normal inputs: ``||W'X - WX||_F / ||WX||_F``.

    ``X`` has shape ``(in, n_inputs)`` (float64, ``numpy.random.default_rng(seed)``); leading axes
    (``expert``) are flattened into rows. Returns ``{"rel_error": float | None, "sq_err": float,
    "sq_ref": float, "n_inputs": int, "seed": int}`` (None when ``WX`` is zero).
    """
    w, w2 = _rows(ref, axes), _rows(approx, axes)
    x = np.random.default_rng(seed).standard_normal((w.shape[1], n_inputs))
    with blas_threads():
        y, y2 = w @ x, w2 @ x
    sq_err = float(np.sum((y2 - y) ** 2))
    sq_ref = float(np.sum(y * y))
    return {"rel_error": float(np.sqrt(sq_err / sq_ref)) if sq_ref > 0 else (0.0 if sq_err == 0 else None),
            "sq_err": sq_err, "sq_ref": sq_ref, "n_inputs": int(n_inputs), "seed": int(seed)}
