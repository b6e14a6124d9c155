"""Error report of a requantization (``schemas/error-report.schema.json``).

Per tensor, against the source's dequantized weights and (optionally) against the float original:
MSE, RMSE, max abs error, relative Frobenius error, SQNR (dB), fraction of elements changed
(:func:`converter.kernels.metrics.error_stats`), the worst output channel and the worst target group
(index and MSE), and the output-space error ``||W'x - Wx|| / ||Wx||`` on a fixed-seed random batch.
The metadata cost before and after (theoretical bytes and bits per weight,
:func:`converter.sizes.theoretical_bytes`) is stated per tensor and overall. Tensors are listed
worst first (largest relative Frobenius error against the source).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from converter.groups import Granularity, GroupMap
from converter.kernels.error_sums import compare_rows
from converter.kernels.metrics import N_INPUTS, SEED, Figures, error_stats, output_error, worst_channel, worst_group
from converter.quant.result import RequantResult
from converter.rows import Rows, values_of
from converter.sizes import SCALE_BYTES, theoretical_bytes, zero_point_bytes
from converter.tensor import DenseTensor, QuantizedTensor, TensorSpec, spec_of

__all__ = ["N_INPUTS", "SEED", "comparison", "metadata_cost", "tensor_report", "summarize"]


def _rows_comparison(ref: "np.ndarray | Rows", approx: "np.ndarray | Rows | None", group_map: GroupMap,
                     axes: Sequence[str]) -> Figures | None:
    """:func:`comparison` in one pass of cache-sized row blocks, or None when the groups are not
    row-local. ``approx=None``: known identical to ``ref``."""
    if (len(ref.shape) != 2 or not int(np.prod(ref.shape)) or not group_map.row_local(axes)
            or (approx is not None and ref.shape != approx.shape)):
        return None
    return compare_rows(ref, approx, group_size=group_map.group_size if group_map.granularity is Granularity.GROUP
                        else None, per_tensor=group_map.granularity is Granularity.TENSOR)


def comparison(ref: "np.ndarray | Rows", approx: "np.ndarray | Rows", group_map: GroupMap,
               axes: Sequence[str]) -> Figures:
    """All error figures of ``approx`` against ``ref`` (float32 values of one logical shape, named
    by ``axes``; arrays or :class:`~converter.rows.Rows`) for the target groups ``group_map``.

    Row-local groups: one blocked pass (:func:`converter.kernels.error_sums.compare_rows`); any
    other grouping: the whole-array formulas of :mod:`converter.kernels.metrics`.
    """
    fast = _rows_comparison(ref, approx, group_map, axes)
    if fast is not None:
        return fast
    ref, approx = values_of(ref), values_of(approx)
    st = error_stats(ref, approx)
    out = output_error(ref, approx, axes, n_inputs=N_INPUTS, seed=SEED)
    r64 = np.asarray(ref, dtype=np.float64).reshape(-1)
    return Figures(**st.to_json(), worst_channel=worst_channel(ref, approx, axes),
                   worst_group=worst_group(ref, approx, group_map, axes), output_rel_error=out["rel_error"],
                   sse=st.mse * st.numel, ssr=float(r64 @ r64), out_sq_err=out["sq_err"], out_sq_ref=out["sq_ref"])


def metadata_cost(spec: TensorSpec) -> dict[str, Any]:
    """Theoretical bytes of a quantized spec: payload, metadata (scales, zero points, g_idx), bits/weight."""
    th = theoretical_bytes(spec.shape, spec.axes, spec.scheme.bits, spec.group_map,
                           SCALE_BYTES.get(spec.scheme.scale_dtype, 4), zero_point_bytes(spec), spec.act_order,
                           spec.scale_coding)  # a double-quant source's scales at their coded size
    # NVFP4's second-level scale: one float32 per tensor (ModelOpt weight_scale_2, CT weight_global_scale)
    meta = th["metadata_bytes"] + (4 if spec.scheme.global_scale else 0)
    total = th["payload_bytes"] + meta
    return {"scheme": spec.scheme.describe(), "scale_dtype": spec.scheme.scale_dtype,
            "groups": spec.group_map.describe() + ("+g_idx" if spec.act_order else ""), "n_groups": th["groups"],
            "payload_bytes": th["payload_bytes"], "metadata_bytes": meta, "total_bytes": total,
            "bits_per_weight": 8 * total / spec.numel if spec.numel else 0.0,
            "metadata_bits_per_weight": 8 * meta / spec.numel if spec.numel else 0.0}


def dense_cost(t: DenseTensor) -> dict[str, Any]:
    """:func:`metadata_cost` of a float source tensor: its stored bytes, no quantization metadata."""
    nbytes = int(t.data.nbytes)
    numel = int(np.prod(t.shape, dtype=np.int64))
    return {"scheme": f"{t.dtype} float", "scale_dtype": None, "groups": "none", "n_groups": 0,
            "payload_bytes": nbytes, "metadata_bytes": 0, "total_bytes": nbytes,
            "bits_per_weight": 8 * nbytes / numel if numel else 0.0, "metadata_bits_per_weight": 0.0}


def tensor_report(src: "QuantizedTensor | DenseTensor", result: RequantResult, plan: tuple[str, str],
                  reference: np.ndarray | None = None, src_spec: TensorSpec | None = None) -> dict[str, Any]:
    """The report row of one requantized tensor (figures as :class:`Figures`; :func:`summarize`
    writes them out).

    Parameters
    ----------
    src : QuantizedTensor, the source (or a float DenseTensor a format quantizer quantized).
    result : from :func:`converter.quant.requant.requantize` (the tensor, route, degenerate
        groups, search totals, and the figures or values it already computed).
    plan : ``(mode, reason)`` from :func:`converter.quant.requant.classify`.
    reference : float32 original weights (logical shape), optional.
    src_spec : the source's TensorSpec (for the stored ``g_idx`` cost); defaults to ``spec_of(src)``.
    """
    out = result.tensor
    dense = isinstance(src, DenseTensor)
    # values dequantized block by block as the comparison reads them (never whole matrices)
    a = Rows(result.values if result.values is not None else
             src.data if dense else src)
    streamed = isinstance(out, TensorSpec)  # produced in row blocks, never whole: the figures were summed
    if streamed and (result.vs_source is None or reference is not None):
        raise ValueError(f"{out.name}: a tensor produced in row blocks is reported from its summed figures only")
    b = a if result.identical or streamed else Rows(out)
    vs_src = result.vs_source or (_rows_comparison(a, None, out.group_map, out.axes) if result.identical else None) \
        or comparison(a, b, out.group_map, out.axes)
    gm = out.group_map
    partial = gm.partial_tail(out.shape, out.axes)
    n_partial = 0
    if gm.granularity is Granularity.BLOCK:  # 2-D tiles partial along out, in or both, per matrix
        n_partial = gm.partial_blocks(out.shape, out.axes) * (
            gm.group_count(out.shape, out.axes) // max(gm.n_groups(out.shape, out.axes), 1))
    elif partial:
        n_partial = gm.group_count(out.shape, out.axes) // max(gm.n_groups(out.shape, out.axes), 1) \
            if gm.granularity is Granularity.GROUP else 1
    row: dict[str, Any] = {
        "name": src.name, "shape": list(src.shape), "planned": plan[0], "reason": plan[1],
        "route": result.route,
        **({"note": result.note} if result.note else {}),
        "result": "exact" if vs_src.exact else "lossy",
        "source": ({"scheme": f"{src.dtype} float", "groups": "none"} if dense else
                   {"scheme": src.scheme.describe(), "groups": src.group_map.describe()}),
        "target": {"scheme": out.scheme.describe(), "groups": out.group_map.describe(),
                   **({"quantizer": result.quantizer} if result.quantizer else {})},
        "vs_source": vs_src,
        "degenerate_groups": int(result.degenerate_groups),
        "partial_groups": int(n_partial), "partial_tail": int(partial),
        **({"partial_blocks": int(n_partial)} if gm.granularity is Granularity.BLOCK else {}),
        "metadata": {"before": dense_cost(src) if dense else metadata_cost(src_spec or spec_of(src)),
                     "after": metadata_cost(out if streamed else spec_of(out))},
    }
    if result.scale_search is not None:
        s = result.scale_search
        gain = None
        if s.search_sse > 0 and s.absmax_sse > 0:
            gain = 10.0 * math.log10(s.absmax_sse / s.search_sse)
        n = max(out.numel, 1)
        row["scale_search"] = {"method": "mse", "absmax_mse": s.absmax_sse / n, "search_mse": s.search_sse / n,
                               "gain_db": gain, "ratios_chosen": s.ratios_chosen}
    if reference is not None:
        ref = np.asarray(reference, dtype=np.float32)
        if ref.ndim != 2:
            a, b = values_of(a), values_of(b)
        row["vs_reference"] = {"source": comparison(ref, a, out.group_map if dense else src.group_map,
                                                    out.axes if dense else src.axes),
                               "target": comparison(ref, b, out.group_map, out.axes)}
    return row


def _agg(rows: list[dict], key: Any) -> dict[str, Any] | None:
    """Overall figures of the comparisons ``key(row)`` (:class:`Figures` or None) of every row."""
    cs: list[Figures] = [c for c in (key(r) for r in rows) if c is not None]
    if not cs:
        return None
    n = sum(c.numel for c in cs)
    sse = sum(c.sse for c in cs)
    ssr = sum(c.ssr for c in cs)
    oe = sum(c.out_sq_err for c in cs)
    orf = sum(c.out_sq_ref for c in cs)
    mse = sse / n if n else 0.0
    return {"numel": n, "mse": mse, "rmse": math.sqrt(mse), "max_abs": max(c.max_abs for c in cs),
            "rel_frobenius": math.sqrt(sse / ssr) if ssr > 0 else None,
            "sqnr_db": 10 * math.log10(ssr / sse) if sse > 0 and ssr > 0 else None,
            "exact": all(c.exact for c in cs),
            "changed_fraction": sum(c.changed_fraction * c.numel for c in cs) / n if n else 0.0,
            "output_rel_error": math.sqrt(oe / orf) if orf > 0 else None}


def _json(obj: Any) -> Any:
    """A report row as JSON data (:class:`Figures` written out)."""
    if isinstance(obj, Figures):
        return obj.to_json()
    if isinstance(obj, dict):
        return {k: _json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json(v) for v in obj]
    return obj


def _badness(r: dict) -> float:
    v: Figures = r["vs_source"]
    if v.exact:
        return -1.0
    return v.rel_frobenius if v.rel_frobenius is not None else math.inf


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
            "tensors": _json(rows), "passthrough": list(passthrough or []), "overall": overall}
