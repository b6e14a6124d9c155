"""Error figures of a 2-D ``(out, in)`` comparison summed over row blocks (:class:`ErrorSums`).

The row kernels (:func:`converter.kernels.rtn.quantize_rows`, the format quantizers' row loops)
feed each block while its values are in cache; the figures are then read once
(:func:`figures_from_sums`), whatever the thread count: sums are kept per row and added in row
order. One caveat on blocking: the float32 products of the output-space figure come from BLAS,
whose per-row results can differ in the last bits with the number of rows in a call, so the
output-space figure depends (at ~1e-9 relative) on the row-block size, which is a constant
(:data:`converter.kernels.rtn.QUANT_BLOCK_ELEMENTS`): 2^17 -> 2^19 values moved
``output_rel_error`` in its 9th significant digit; the numpy and compiled paths use the same
blocks, so their reports stay equal.
"""

from __future__ import annotations

import numpy as np

from converter.kernels.blas import blas_threads
from converter.kernels.metrics import N_INPUTS, SEED, Figures

#: Tensors above this many elements get their output error from float32 products.
LARGE = 1 << 20


class ErrorSums:
    """Running sums of the report figures over row blocks of a 2-D ``(out, in)`` comparison.

    Feed consecutive row blocks with :meth:`add` (reference values ``A`` and approximation ``B``,
    float32 ``(rows, in)``; the error is ``E = B - A`` in float32, as
    :func:`converter.kernels.metrics.error_stats` forms it), then read :meth:`figures`.

    Squares are summed in float32 over chunks of at most a group (128 elements per chunk when the
    groups are whole rows) and the chunk sums in float64: relative precision ~1e-6 on squared
    errors and signal power, at a fraction of the cost of squaring in float64. The maximum
    error and the count of changed elements are exact.

    Output-space error ``||B X - A X|| / ||A X||`` on ``N_INPUTS`` fixed-seed standard normal
    inputs: float64 products for tensors up to ``LARGE`` elements; above, float32 GEMMs of ``A``
    and of ``E`` (so ``B X - A X`` is never a difference of two large products): relative
    precision ~1e-6, far finer than the 8-input estimate itself.

    Parameters
    ----------
    rows, n : shape ``(out, in)`` of the whole matrix.
    group_size : groups of the worst-group figure: this many elements along ``in`` (the last
        possibly partial); None: one group per row.
    per_tensor : the target has one group for the whole matrix (its worst group is the matrix).
    """

    #: chunk of a row summed in float32 when the groups are whole rows
    CHUNK = 128

    def __init__(self, rows: int, n: int, group_size: int | None = None, *, per_tensor: bool = False) -> None:
        self.rows, self.n = rows, n
        self.grouped, self.per_tensor = group_size is not None, per_tensor
        self.G = int(group_size) if group_size is not None else n
        self.C = self.G if group_size is not None else min(n, self.CHUNK)
        self.x = np.random.default_rng(SEED).standard_normal((n, N_INPUTS))
        self.large = rows * n > LARGE
        self.x32 = self.x.astype(np.float32) if self.large else None
        self.max_abs = 0.0
        self.changed = 0
        # per-row sums, added in row order at the end: the figures do not depend on how the rows
        # were split over blocks or threads
        self.row_sr = np.zeros(rows, dtype=np.float64)
        self.row_oe = np.zeros(rows, dtype=np.float64)
        self.row_orf = np.zeros(rows, dtype=np.float64)
        self.grp_se = np.zeros((rows, -(-n // self.G)), dtype=np.float64)

    def _products(self, A: np.ndarray) -> np.ndarray:
        return (A @ self.x32).astype(np.float64) if self.large else A.astype(np.float64) @ self.x

    def _chunk_squares(self, v: np.ndarray) -> np.ndarray:
        """``(rows, chunks)`` float64: sums of squares of ``v`` over chunks of ``C`` along ``in``
        (the last one partial), each summed in float32 (in float64 when float32 squares overflow
        or underflow, e.g. values near 1e21 or 1e-23)."""
        k, n, C = v.shape[0], self.n, self.C
        nfull, full = n // C, (n // C) * C
        out = np.empty((k, nfull + (full < n)), dtype=np.float64)
        for dt in (np.float32, np.float64):  # float64 again when float32 squares over/underflow
            w = v if dt is np.float32 else v.astype(np.float64)
            if nfull:
                v3 = w[:, :full].reshape(k, nfull, C)
                out[:, :nfull] = np.einsum("rci,rci->rc", v3, v3)
            if full < n:
                t = w[:, full:]
                out[:, nfull] = np.einsum("ri,ri->r", t, t)
            if np.isfinite(out).all() and not self._underflows(v, out, nfull, full):
                break
        return out

    def _underflows(self, v: np.ndarray, sums: np.ndarray, nfull: int, full: int) -> bool:
        """Some chunk's sum of squares is 0 while its values are not all 0 (squares below float32's
        range, e.g. values near 1e-23)."""
        zero = sums == 0
        if not zero.any():
            return False
        k, C = v.shape[0], self.C
        if nfull and zero[:, :nfull].any() and np.any(v[:, :full].reshape(k, nfull, C)[zero[:, :nfull]]):
            return True
        return bool(full < self.n and zero[:, nfull].any() and np.any(v[zero[:, nfull], full:]))

    def add(self, r0: int, A: np.ndarray, B: np.ndarray | None = None, E: np.ndarray | None = None) -> None:
        """Rows ``r0 : r0 + len(A)``. ``B=None``: identical to ``A`` (only its own figures).
        ``E``: a float32 buffer of ``A``'s shape to hold ``B - A`` (allocated when omitted)."""
        if B is None:
            self.add_sums(r0, A)
            return
        e = np.subtract(B, A, out=E)  # float32, as error_stats forms it
        self.changed += int(np.count_nonzero(e != 0))
        if e.size:
            self.max_abs = max(self.max_abs, float(e.max()), -float(e.min()))
        self.add_sums(r0, A, B, e)

    def add_sums(self, r0: int, A: np.ndarray, B: np.ndarray | None = None, e: np.ndarray | None = None) -> None:
        """The summed figures of :meth:`add` (per-row and per-group sums) for a caller that formed
        ``e = B - A`` (float32) and counted its changed elements and maximum itself (the compiled
        requantize kernel: :mod:`converter.kernels.compiled.requant`)."""
        r1 = r0 + A.shape[0]
        y = self._products(A)
        self.row_orf[r0:r1] = np.einsum("ij,ij->i", y, y)
        self.row_sr[r0:r1] = self._chunk_squares(A).sum(axis=1)
        if B is None:
            return
        if self.large:
            dy = (e @ self.x32).astype(np.float64)
        else:
            dy = B.astype(np.float64) @ self.x
            dy -= y
        self.row_oe[r0:r1] = np.einsum("ij,ij->i", dy, dy)
        se = self._chunk_squares(e)
        self.grp_se[r0:r1] = se if self.grouped else se.sum(axis=1, keepdims=True)

    def part(self) -> "ErrorSums":
        """Sums for another thread's rows: the same inputs and per-row arrays (rows are disjoint),
        its own scalar sums; fold it back with :meth:`absorb`."""
        p = object.__new__(ErrorSums)
        p.__dict__.update(self.__dict__)
        p.max_abs = 0.0
        p.changed = 0
        return p

    def absorb(self, other: "ErrorSums") -> None:
        """Fold in a :meth:`part`'s count and maximum (its per-row sums are already in place)."""
        self.changed += other.changed
        self.max_abs = max(self.max_abs, other.max_abs)

    def figures(self) -> Figures:
        """The report figures (:func:`figures_from_sums`)."""
        return figures_from_sums(self.grp_se, self.G, self.n, per_tensor=self.per_tensor, sr=float(self.row_sr.sum()),
                                 max_abs=self.max_abs, changed=self.changed, out_sq_err=float(self.row_oe.sum()),
                                 out_sq_ref=float(self.row_orf.sum()))


def figures_from_sums(grp_se: np.ndarray, group_size: int, n_in: int, *, per_tensor: bool = False,
                      sr: float, max_abs: float, changed: int, out_sq_err: float,
                      out_sq_ref: float) -> Figures:
    """The report figures of a 2-D ``(out, in)`` comparison from its sums.

    Parameters
    ----------
    grp_se : ndarray of float64, ``(out, groups)``: squared error per target group (groups of
        ``group_size`` along ``in``, the last one possibly partial; one per row when per channel
        or per tensor).
    group_size : elements per group along ``in`` (``n_in`` when one group per row).
    n_in : length of the ``in`` axis.
    per_tensor : one group for the whole matrix (its worst group is the matrix).
    sr, max_abs, changed : sum of squared reference values, largest ``|error|``, count of
        elements whose value changed.
    out_sq_err, out_sq_ref : ``||W'X - WX||^2`` and ``||WX||^2`` over the random inputs.
    """
    G, n = int(group_size), int(n_in)
    rows, ngr = grp_se.shape
    full = (n // G) * G
    row_se = grp_se.sum(axis=1)  # squared error per output channel
    se = float(row_se.sum())
    numel = rows * n
    mse = se / numel
    exact = changed == 0  # (a squared error can underflow to 0; a changed value cannot hide)
    per_row = row_se / n
    i = int(np.argmax(per_row))
    wc = {"index": [i], "mse": float(per_row[i])}
    if per_tensor:
        wg = {"index": [0, 0], "mse": mse, "elements": numel}
    else:
        counts = np.full(ngr, G, dtype=np.float64)
        if full < n:
            counts[-1] = n - full
        r, c, worst = _worst_group(grp_se, counts)
        wg = {"index": [r, c], "mse": worst, "elements": int(counts[c])}
    out_rel = float(np.sqrt(out_sq_err / out_sq_ref)) if out_sq_ref > 0 else (0.0 if out_sq_err == 0 else None)
    return Figures(numel=numel, mse=mse, rmse=float(np.sqrt(mse)), max_abs=max_abs,
                   rel_frobenius=float(np.sqrt(se / sr)) if sr > 0 else None,
                   sqnr_db=None if exact or sr == 0 or se == 0 else float(10.0 * np.log10(sr / se)),
                   exact=exact, changed_fraction=changed / numel, worst_channel=wc, worst_group=wg,
                   output_rel_error=out_rel, sse=se, ssr=sr, out_sq_err=out_sq_err, out_sq_ref=out_sq_ref)




#: Rows of ``grp_se`` divided by the group sizes at a time in :func:`_worst_group`.
WORST_ROWS = 1 << 10


def _worst_group(grp_se: np.ndarray, counts: np.ndarray) -> tuple[int, int, float]:
    """``(row, group, mse)`` of ``np.argmax(grp_se / counts)`` (the first maximum in row-major order; the first
    NaN when there is one), the quotient formed :data:`WORST_ROWS` rows at a time, never whole."""
    best: tuple[int, int, float] | None = None
    ngr = grp_se.shape[1]
    for r0 in range(0, grp_se.shape[0], WORST_ROWS):
        per = grp_se[r0:r0 + WORST_ROWS] / counts
        k = int(np.argmax(per))
        r, c = divmod(k, ngr)
        v = float(per[r, c])
        if best is None or (not np.isnan(best[2]) and (np.isnan(v) or v > best[2])):
            best = (r0 + r, c, v)
    return best


#: Elements per block of :func:`compare_rows` (rows x in).
COMPARE_BLOCK = 1 << 17


def compare_rows(ref: "np.ndarray", approx: "np.ndarray | None", *, group_size: int | None = None,
                 per_tensor: bool = False) -> Figures:
    """The figures of ``approx`` against ``ref`` in one pass of cache-sized row blocks.

    Parameters
    ----------
    ref, approx : ``(out, in)`` float32 arrays or row sources (``x[r0:r1]`` gives float32 rows);
        ``approx=None``: known identical to ``ref``.
    group_size, per_tensor : the target's groups (see :class:`ErrorSums`).

    Returns
    -------
    Figures
        Squares summed as :class:`ErrorSums` states; sums are formed block by block, so the last
        digits may differ from whole-array formulas.
    """
    rows, n = ref.shape
    sums = ErrorSums(rows, n, group_size, per_tensor=per_tensor)
    step = max(1, COMPARE_BLOCK // n)
    buf = np.empty((step, n), dtype=np.float32)
    with blas_threads():
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            A = np.asarray(ref[r0:r1], dtype=np.float32)
            B = None if approx is None else np.asarray(approx[r0:r1], dtype=np.float32)
            sums.add(r0, A, B, buf[:r1 - r0])
    return sums.figures()
