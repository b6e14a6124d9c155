"""``qckpt diff A B``: two checkpoints, in any formats, compared tensor by tensor in the logical model.

A is the reference: every figure is B's error against A. Tensors are matched by logical name (a GGUF's
llama.cpp names are already mapped to Hugging Face names by its reader), dequantized to float32 in
row blocks (:class:`~converter.rows.Rows`: a quantized ``(out, in)`` tensor is never whole in memory)
and compared with the error report's own kernel (:func:`converter.kernels.error_sums.compare_rows`):

- ``rel_frobenius`` ``||B - A||_F / ||A||_F``; ``sqnr_db`` ``10 log10(sum A^2 / sum (B - A)^2)`` (None when
  identical); ``max_abs`` ``max |B - A|``; ``worst_channel`` the output row (``out`` index) with the
  largest mean squared error;
- ``output_rel_error`` ``||B X - A X||_F / ||A X||_F`` on a seeded batch: ``X`` of shape ``(in, 8)``,
  standard normal from ``numpy.random.default_rng(0)`` (:mod:`converter.kernels.metrics`); leading axes
  (``expert``) are rows. Only for tensors of two or more axes (a bias or norm has no input space).

A head stored on one side only is compared with the other side's token embedding when that side ties them
(``tied_to``; a writer stores a tied head once). A tensor stored in a type qckpt cannot decode is listed
``not-compared`` with the reason (the verdict is then not "identical").

A tensor is ``identical`` when every value is bit-identical (``-0.0`` and ``0.0`` compare equal, as floats
do), ``within_tolerance`` when ``rel_frobenius <= tolerance`` (an all-zero A: when B is all zero too).
The command's verdict: identical within the tolerance when every tensor of either side is in both, with
the same logical shape, and within the tolerance.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from converter.formats import registry
from converter.formats.modules import token_embedding_name
from converter.formats.ties import HEAD
from converter.kernels.error_sums import compare_rows
from converter.rows import Rows
from converter.tensor import QuantizedTensor, opaque_reason

__all__ = ["SCHEMA", "diff"]

SCHEMA = "qckpt.diff-report/1"


def _describe(t) -> str:
    """What a side stores: the scheme and groups of a quantized tensor, else the dense dtype."""
    if isinstance(t, QuantizedTensor):
        return f"{t.scheme.describe()}, {t.group_map.describe()}"
    return t.dtype


def _rows_source(t) -> "Rows | np.ndarray":
    """``t``'s float32 values as 2-D rows (leading axes flattened; a vector is one row)."""
    if isinstance(t, QuantizedTensor) and len(t.shape) == 2:
        return Rows(t)
    v = np.asarray(t.dequantize(), dtype=np.float32)
    return v.reshape(1, -1) if v.ndim < 2 else v.reshape(-1, v.shape[-1])


def _compare(name: str, a, b, tolerance: float) -> dict[str, Any]:
    row: dict[str, Any] = {"name": name, "shape": list(a.shape), "a": _describe(a), "b": _describe(b)}
    if tuple(a.shape) != tuple(b.shape):
        return {**row, "shape_b": list(b.shape), "status": "shape-mismatch"}
    if int(np.prod(a.shape)) == 0:
        return {**row, "status": "identical", "rel_frobenius": 0.0, "sqnr_db": None, "max_abs": 0.0,
                "worst_channel": None, "output_rel_error": None, "sse": 0.0, "ssr": 0.0}
    fig = compare_rows(_rows_source(a), _rows_source(b))
    has_input_space = len(a.shape) >= 2
    rel = fig.rel_frobenius
    if rel is None:  # A all zero
        rel = 0.0 if fig.sse == 0 else math.inf
    status = "identical" if fig.exact else ("within-tolerance" if rel <= tolerance else "different")
    return {**row, "status": status, "rel_frobenius": rel if math.isfinite(rel) else None,
            "sqnr_db": fig.sqnr_db, "max_abs": fig.max_abs,
            "worst_channel": fig.worst_channel if has_input_space and not fig.exact else None,
            "output_rel_error": fig.output_rel_error if has_input_space else None,
            "sse": fig.sse, "ssr": fig.ssr}


def _row(name: str, ca, cb, a_name: str, b_name: str, tolerance: float) -> dict[str, Any]:
    """The row of tensor ``name``: ``ca[a_name]`` against ``cb[b_name]``, or an uncompared row when either side
    is stored in a type qckpt cannot decode (listed, not fatal)."""
    sa, sb = ca.spec(a_name), cb.spec(b_name)
    undecodable = [s for s in (sa, sb) if s.kind == "opaque" and not s.decoded_by]
    if undecodable:
        return {"name": name, "shape": list(sa.shape), "a": str(sa.dtype), "b": str(sb.dtype),
                "status": "not-compared", "why": opaque_reason(undecodable[0])}
    return _compare(name, ca[a_name], cb[b_name], tolerance)


def _tied_embedding(ckpt) -> str | None:
    """The embedding that serves as ``ckpt``'s output head when it stores none: its config ties them (or says
    nothing, as a GGUF without ``output.weight``), else None."""
    if HEAD in ckpt.names() or (ckpt.config or {}).get("tie_word_embeddings") is False:
        return None
    return token_embedding_name(ckpt.names())


def diff(a: str | Path, b: str | Path, *, tolerance: float = 0.0, format_a: str | None = None,
         format_b: str | None = None) -> dict[str, Any]:
    """Compare checkpoint ``b`` against checkpoint ``a`` (the reference); return the diff report.

    Parameters
    ----------
    a, b : paths (or repo ids) of checkpoints in any readable format.
    tolerance : float
        Largest relative Frobenius error per tensor still counted as the same (0: bit-identical values).
    format_a, format_b : str, optional
        Formats, when detection should not decide.

    Returns
    -------
    dict
        ``schemas/diff-report.schema.json``: per tensor ``name``, ``shape``, ``a`` / ``b`` (what each side
        stores), ``status`` (``identical`` / ``within-tolerance`` / ``different`` / ``shape-mismatch``) and
        the figures of the module docstring; ``only_in_a`` / ``only_in_b``; a summary with the totals
        (``rel_frobenius`` over every compared tensor: ``sqrt(sum sse / sum ssr)``) and ``exit_code``
        (0: identical within the tolerance, 1: not).

    Raises
    ------
    ConverterError
        Either side cannot be read.
    """
    ca, cb = registry.load(a, format=format_a), registry.load(b, format=format_b)
    na, nb = ca.names(), set(cb.names())
    rows = [_row(n, ca, cb, n, n, tolerance) for n in na if n in nb]
    only_a = [n for n in na if n not in nb]
    only_b = sorted(nb - set(na))
    # a head on one side only, where the other side ties it to its embedding (a writer stores a tied head once)
    for head_side, other, only in ((ca, cb, only_a), (cb, ca, only_b)):
        emb = _tied_embedding(other)
        if HEAD in only and emb is not None:
            only.remove(HEAD)
            a_name, b_name = (HEAD, emb) if head_side is ca else (emb, HEAD)
            row = _row(HEAD, ca, cb, a_name, b_name, tolerance)
            row["tied_to"] = f"{emb} ({'B' if head_side is ca else 'A'} ties its head to its embedding)"
            rows.append(row)
    counts = {s: sum(r["status"] == s for r in rows)
              for s in ("identical", "within-tolerance", "different", "shape-mismatch", "not-compared")}
    sse = sum(r.get("sse", 0.0) for r in rows)
    ssr = sum(r.get("ssr", 0.0) for r in rows)
    for r in rows:
        r.pop("sse", None)
        r.pop("ssr", None)
    worst = max((r for r in rows if r["status"] in ("different", "within-tolerance")),
                key=lambda r: r["rel_frobenius"] if r["rel_frobenius"] is not None else math.inf, default=None)
    same = (not only_a and not only_b and counts["different"] == 0 and counts["shape-mismatch"] == 0
            and counts["not-compared"] == 0)  # a tensor not compared is not shown identical
    return {"schema": SCHEMA, "a": str(a), "b": str(b), "format_a": ca.format, "format_b": cb.format,
            "tolerance": tolerance, "tensors": rows, "only_in_a": only_a, "only_in_b": only_b,
            "summary": {"compared": len(rows), **{k.replace("-", "_"): v for k, v in counts.items()},
                        "only_in_a": len(only_a), "only_in_b": len(only_b),
                        "rel_frobenius": math.sqrt(sse / ssr) if ssr > 0 else (0.0 if sse == 0 else None),
                        "sqnr_db": 10 * math.log10(ssr / sse) if sse > 0 and ssr > 0 else None,
                        "worst": worst["name"] if worst else None,
                        "verdict": "identical" if same and counts["within-tolerance"] == 0
                        else ("within-tolerance" if same else "different")},
            "exit_code": 0 if same else 1}
