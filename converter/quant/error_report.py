"""Error report of a requantization (``schemas/error-report.schema.json``).

Per tensor, against the source's dequantized weights and (optionally) against the float original:
MSE, RMSE, max abs error, relative Frobenius error, SQNR (dB), fraction of elements changed
(:func:`converter.kernels.metrics.error_stats`), the worst output channel and the worst target group
(index and MSE), and the output-space error ``||W'x - Wx|| / ||Wx||`` on a fixed-seed random batch.
The metadata cost before and after (theoretical bytes and bits per weight,
:func:`converter.ops.audit.theoretical_bytes`) is stated per tensor and overall. Tensors are listed
worst first (largest relative Frobenius error against the source).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from converter.ops.audit import SCALE_BYTES, theoretical_bytes, zero_point_bytes
from converter.tensor import spec_of
from converter.kernels.metrics import error_stats, output_error, worst_channel, worst_group

N_INPUTS = 8
SEED = 0


#: Elements per block of the fused comparison (rows x in).
_BLOCK = 1 << 17
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
    granularity : ``"tensor" | "channel" | "group"``: the groups of the worst-group figure.
    group_size : group size along ``in`` (``"group"`` only).
    """

    #: chunk of a row summed in float32 when the groups are whole rows
    CHUNK = 128

    def __init__(self, rows: int, n: int, granularity: str, group_size: int | None = None) -> None:
        self.rows, self.n, self.g = rows, n, granularity
        self.G = int(group_size) if granularity == "group" else n
        self.C = self.G if granularity == "group" else min(n, self.CHUNK)
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
        r1 = r0 + A.shape[0]
        y = self._products(A)
        self.row_orf[r0:r1] = np.einsum("ij,ij->i", y, y)
        self.row_sr[r0:r1] = self._chunk_squares(A).sum(axis=1)
        if B is None:
            return
        e = np.subtract(B, A, out=E)  # float32, as error_stats forms it
        if self.large:
            dy = (e @ self.x32).astype(np.float64)
        else:
            dy = B.astype(np.float64) @ self.x
            dy -= y
        self.row_oe[r0:r1] = np.einsum("ij,ij->i", dy, dy)
        self.changed += int(np.count_nonzero(e != 0))
        if e.size:
            self.max_abs = max(self.max_abs, float(e.max()), -float(e.min()))
        se = self._chunk_squares(e)
        self.grp_se[r0:r1] = se if self.g == "group" else se.sum(axis=1, keepdims=True)

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

    def figures(self) -> dict[str, Any]:
        """The ``vs_source`` figures (:func:`figures_from_sums`)."""
        return figures_from_sums(self.grp_se, self.g, self.G, self.n, sr=float(self.row_sr.sum()),
                                 max_abs=self.max_abs, changed=self.changed, out_sq_err=float(self.row_oe.sum()),
                                 out_sq_ref=float(self.row_orf.sum()))


def blocked_applicable(group_map, axes, shape) -> bool:
    """Whether :class:`ErrorSums` covers a comparison: 2-D ``(out, in)``, non-empty, groups per
    tensor, per ``out`` channel or along ``in`` without ``g_idx``."""
    g = group_map.granularity.value
    return (tuple(axes) == ("out", "in") and len(shape) == 2 and int(np.prod(shape)) > 0
            and (g == "tensor" or (g == "channel" and group_map.axis == "out")
                 or (g == "group" and group_map.axis == "in" and group_map.g_idx is None)))


def _comparison_blocked(ref: np.ndarray, approx: np.ndarray, group_map, axes) -> dict[str, Any] | None:
    """:func:`comparison` in one pass of cache-sized row blocks (:class:`ErrorSums`), or None when
    not applicable. ``approx=None``: known identical to ``ref``.

    The same figures (squares summed as :class:`ErrorSums` states); sums are formed block by
    block, so the last digits may differ from the whole-array formulas (the figures are
    reports, not outputs).
    """
    same = approx is None
    if not blocked_applicable(group_map, axes, ref.shape) or (not same and ref.shape != approx.shape):
        return None
    rows, n = ref.shape
    sums = ErrorSums(rows, n, group_map.granularity.value, group_map.group_size)
    step = max(1, _BLOCK // n)
    buf = np.empty((step, n), dtype=np.float32)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        A = np.asarray(ref[r0:r1], dtype=np.float32)
        B = None if same else np.asarray(approx[r0:r1], dtype=np.float32)
        sums.add(r0, A, B, buf[:r1 - r0])
    return sums.figures()


def figures_from_sums(grp_se: np.ndarray, granularity: str, group_size: int, n_in: int, *,
                      sr: float, max_abs: float, changed: int, out_sq_err: float,
                      out_sq_ref: float) -> dict[str, Any]:
    """The report figures of a 2-D ``(out, in)`` comparison from its sums.

    Parameters
    ----------
    grp_se : ndarray of float64, ``(out, groups)``: squared error per target group (groups of
        ``group_size`` along ``in``, the last one possibly partial; one per row when per channel
        or per tensor).
    granularity : ``"tensor" | "channel" | "group"`` of the target.
    group_size : elements per group along ``in`` (``n_in`` unless ``"group"``).
    n_in : length of the ``in`` axis.
    sr, max_abs, changed : sum of squared reference values, largest ``|error|``, count of
        elements whose value changed.
    out_sq_err, out_sq_ref : ``||W'X - WX||^2`` and ``||WX||^2`` over the random inputs.
    """
    g, G, n = granularity, int(group_size), int(n_in)
    rows, ngr = grp_se.shape
    full = (n // G) * G
    row_se = grp_se.sum(axis=1)  # squared error per output channel
    se = float(row_se.sum())
    numel = rows * n
    mse = se / numel
    exact = changed == 0  # (a squared error can underflow to 0; a changed value cannot hide)
    st = {"numel": numel, "mse": mse, "rmse": float(np.sqrt(mse)), "max_abs": max_abs,
          "rel_frobenius": float(np.sqrt(se / sr)) if sr > 0 else None,
          "sqnr_db": None if exact or sr == 0 or se == 0 else float(10.0 * np.log10(sr / se)),
          "exact": exact, "changed_fraction": changed / numel}
    per_row = row_se / n
    i = int(np.argmax(per_row))
    wc = {"index": [i], "mse": float(per_row[i])}
    if g == "tensor":
        wg = {"index": [0, 0], "mse": mse, "elements": numel}
    else:
        counts = np.full(ngr, G, dtype=np.float64)
        if full < n:
            counts[-1] = n - full
        per = grp_se / counts
        k = int(np.argmax(per))
        r, c = divmod(k, ngr)
        wg = {"index": [r, c], "mse": float(per[r, c]), "elements": int(counts[c])}
    out_rel = float(np.sqrt(out_sq_err / out_sq_ref)) if out_sq_ref > 0 else (0.0 if out_sq_err == 0 else None)
    st.update(worst_channel=wc, worst_group=wg, output_rel_error=out_rel, _sse=se, _ssr=sr,
              _out_sq_err=out_sq_err, _out_sq_ref=out_sq_ref)
    return st


def comparison(ref: np.ndarray, approx: np.ndarray, group_map, axes) -> dict[str, Any]:
    """All error figures of ``approx`` against ``ref`` (both float32, logical shape)."""
    fast = _comparison_blocked(ref, approx, group_map, axes)
    if fast is not None:
        return fast
    from converter.kernels.blocked import Rows
    ref = ref.array() if isinstance(ref, Rows) else ref
    approx = approx.array() if isinstance(approx, Rows) else approx
    st = error_stats(ref, approx).to_json()
    out = output_error(ref, approx, axes, n_inputs=N_INPUTS, seed=SEED)
    r64 = np.asarray(ref, dtype=np.float64).reshape(-1)
    st.update(worst_channel=worst_channel(ref, approx, axes), worst_group=worst_group(ref, approx, group_map, axes),
              output_rel_error=out["rel_error"], _sse=st["mse"] * st["numel"], _ssr=float(r64 @ r64),
              _out_sq_err=out["sq_err"], _out_sq_ref=out["sq_ref"])
    return st


def metadata_cost(spec) -> dict[str, Any]:
    """Theoretical bytes of a quantized spec: payload, metadata (scales, zero points, g_idx), bits/weight."""
    th = theoretical_bytes(spec.shape, spec.axes, spec.scheme.bits, spec.group_map,
                           SCALE_BYTES.get(spec.scheme.scale_dtype, 4), zero_point_bytes(spec), spec.act_order)
    return {"scheme": spec.scheme.describe(), "scale_dtype": spec.scheme.scale_dtype,
            "groups": spec.group_map.describe() + ("+g_idx" if spec.act_order else ""), "n_groups": th["groups"],
            "payload_bytes": th["payload_bytes"], "metadata_bytes": th["metadata_bytes"],
            "total_bytes": th["total_bytes"], "bits_per_weight": th["bits_per_weight"],
            "metadata_bits_per_weight": 8 * th["metadata_bytes"] / spec.numel if spec.numel else 0.0}


def tensor_report(src, out, plan: tuple[str, str], info: dict | None = None,
                  reference: np.ndarray | None = None, src_spec=None) -> dict[str, Any]:
    """The report row of one requantized tensor.

    Parameters
    ----------
    src, out : QuantizedTensor (source, requantized).
    plan : ``(mode, reason)`` from :func:`converter.quant.requant.classify`.
    info : from :func:`converter.quant.requant.requantize` (route, degenerate groups, search totals).
    reference : float32 original weights (logical shape), optional.
    src_spec : the source's TensorSpec (for the stored ``g_idx`` cost); defaults to ``spec_of(src)``.
    """
    from converter.kernels.blocked import Rows
    info = info or {}
    a = info.pop("_values", None)  # the source values requantize() already computed
    identical = info.pop("_identical", False)  # an exact carry, checked value for value
    # values dequantized block by block as the comparison reads them (never whole matrices)
    pre = info.pop("_vs_source", None)  # summed by requantize() in its own blocks
    a = Rows(a if a is not None else src)
    b = a if identical else Rows(out)
    vs_src = pre or (_comparison_blocked(a, None, out.group_map, out.axes) if identical else None) \
        or comparison(a, b, out.group_map, out.axes)
    gm = out.group_map
    partial = gm.partial_tail(out.shape, out.axes)
    n_partial = 0
    if partial:
        n_partial = gm.group_count(out.shape, out.axes) // max(gm.n_groups(out.shape, out.axes), 1) \
            if gm.granularity.value == "group" else 1
    row: dict[str, Any] = {
        "name": src.name, "shape": list(src.shape), "planned": plan[0], "reason": plan[1],
        "route": info.get("route", "requantized"),
        "result": "exact" if vs_src["exact"] else "lossy",
        "source": {"scheme": src.scheme.describe(), "groups": src.group_map.describe()},
        "target": {"scheme": out.scheme.describe(), "groups": out.group_map.describe(),
                   **({"quantizer": info["quantizer"]} if info.get("quantizer") else {})},
        "vs_source": vs_src,
        "degenerate_groups": int(info.get("degenerate_groups", 0)),
        "partial_groups": int(n_partial), "partial_tail": int(partial),
        "metadata": {"before": metadata_cost(src_spec or spec_of(src)), "after": metadata_cost(spec_of(out))},
    }
    if "scale_search" in info:
        s = info["scale_search"]
        gain = None
        if s["search_sse"] > 0 and s["absmax_sse"] > 0:
            gain = 10.0 * math.log10(s["absmax_sse"] / s["search_sse"])
        n = max(src.numel, 1)
        row["scale_search"] = {"method": "mse", "absmax_mse": s["absmax_sse"] / n, "search_mse": s["search_sse"] / n,
                               "gain_db": gain, "ratios_chosen": s["ratios_chosen"]}
    if reference is not None:
        ref = np.asarray(reference, dtype=np.float32)
        if ref.ndim != 2:
            a, b = a.array(), b.array()
        row["vs_reference"] = {"source": comparison(ref, a, src.group_map, src.axes),
                               "target": comparison(ref, b, out.group_map, out.axes)}
    return row


def _agg(rows: list[dict], key) -> dict[str, Any] | None:
    cs = [key(r) for r in rows]
    cs = [c for c in cs if c is not None]
    if not cs:
        return None
    n = sum(c["numel"] for c in cs)
    sse = sum(c["_sse"] for c in cs)
    ssr = sum(c["_ssr"] for c in cs)
    oe = sum(c["_out_sq_err"] for c in cs)
    orf = sum(c["_out_sq_ref"] for c in cs)
    mse = sse / n if n else 0.0
    return {"numel": n, "mse": mse, "rmse": math.sqrt(mse), "max_abs": max(c["max_abs"] for c in cs),
            "rel_frobenius": math.sqrt(sse / ssr) if ssr > 0 else None,
            "sqnr_db": 10 * math.log10(ssr / sse) if sse > 0 and ssr > 0 else None,
            "exact": all(c["exact"] for c in cs),
            "changed_fraction": sum(c["changed_fraction"] * c["numel"] for c in cs) / n if n else 0.0,
            "output_rel_error": math.sqrt(oe / orf) if orf > 0 else None}


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if not k.startswith("_")}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _badness(r: dict) -> float:
    v = r["vs_source"]
    if v["exact"]:
        return -1.0
    return v["rel_frobenius"] if v["rel_frobenius"] is not None else math.inf


def summarize(rows: list[dict], *, source: str | None, source_format: str | None, destination: str | None,
              target_format: str, target: dict, reference: str | None = None,
              passthrough: list[str] | None = None) -> dict[str, Any]:
    """The whole report: rows worst first, overall figures, metadata totals."""
    rows = sorted(rows, key=lambda r: (-_badness(r), r["name"]))
    before = sum(r["metadata"]["before"]["total_bytes"] for r in rows)
    after = sum(r["metadata"]["after"]["total_bytes"] for r in rows)
    mb = sum(r["metadata"]["before"]["metadata_bytes"] for r in rows)
    ma = sum(r["metadata"]["after"]["metadata_bytes"] for r in rows)
    numel = sum(int(np.prod(r["shape"])) for r in rows)
    overall = {
        "tensors": len(rows),
        "planned_exact": sum(r["planned"] == "exact" for r in rows),
        "planned_lossy": sum(r["planned"] == "lossy" for r in rows),
        "exact": sum(r["result"] == "exact" for r in rows),
        "lossy": sum(r["result"] == "lossy" for r in rows),
        "degenerate_groups": sum(r["degenerate_groups"] for r in rows),
        "partial_groups": sum(r["partial_groups"] for r in rows),
        "vs_source": _agg(rows, lambda r: r["vs_source"]),
        "metadata": {
            "before": {"total_bytes": before, "metadata_bytes": mb,
                       "bits_per_weight": 8 * before / numel if numel else 0.0,
                       "metadata_bits_per_weight": 8 * mb / numel if numel else 0.0},
            "after": {"total_bytes": after, "metadata_bytes": ma,
                      "bits_per_weight": 8 * after / numel if numel else 0.0,
                      "metadata_bits_per_weight": 8 * ma / numel if numel else 0.0},
            "note": "theoretical: N*b/8 payload + groups x bytes per group (+ g_idx); no padding or headers"},
    }
    if reference is not None:
        overall["vs_reference"] = {"source": _agg(rows, lambda r: r.get("vs_reference", {}).get("source")),
                                   "target": _agg(rows, lambda r: r.get("vs_reference", {}).get("target"))}
    return {"version": 1, "source": source, "source_format": source_format, "destination": destination,
            "target_format": target_format, "target": target, "reference": reference,
            "output_error_inputs": {"n_inputs": N_INPUTS, "seed": SEED, "distribution": "standard normal"},
            "tensors": _strip(rows), "passthrough": list(passthrough or []), "overall": overall}
