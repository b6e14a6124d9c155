"""Write plans: what to write, known (name, dtype, shape) before any data moves.

A writer turns each source tensor into a :class:`TensorPlan` from its spec alone (shape
arithmetic); :mod:`converter.write.files` then produces the arrays one source tensor per task and
streams them into planned files, so memory stays bounded by the largest tensor (zarr-style codecs
that compute output shapes first; DESIGN.md section 6). Plans are split into shards here and into
row blocks when a tensor exceeds the memory budget (:class:`RowSplit`, :func:`block_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from converter.dtypes import DTYPES, lookup
from converter.groups import Granularity


@dataclass(frozen=True)
class RowSplit:
    """How a plan's outputs can be produced for a block of rows of its tensor.

    A plan that carries one may be encoded on ``take_rows(tensor, r0, r1)`` (the outermost
    logical axis: ``out`` for a weight) and its blocks written at ``offset + r0 * row_bytes``,
    so a tensor larger than the memory budget never has to be materialised whole.

    Attributes
    ----------
    rows : tuple of str
        Outputs whose leading stored axis is the tensor's outermost logical axis, one stored row
        per logical row (codes packed along ``in``, per-row scales, dense data ...).
    once : tuple of str
        Outputs that do not depend on the rows (``g_idx`` ...): written from the first block.
    fixed : dict of str -> ndarray
        Outputs whose value is known from the spec (compressed-tensors ``weight_shape``): written
        as given, whatever the blocks return for them.
    values : bool
        The outputs are the tensor's values (a dequantize): any row block will do. A 2-D
        block-tiled tensor's rows come back grouped per row (:func:`converter.tensor_rows.take_rows`),
        which only such a plan can write; others work on block-tiled tensors whole.

    Formats whose stored arrays put ``out`` on a later axis (GPTQ / AWQ ``[in, out]``) or pack
    along ``out`` declare no split: their tensors are worked on whole (a transposed block
    would need one strided write per stored row).
    """

    rows: tuple[str, ...]
    once: tuple[str, ...] = ()
    fixed: Mapping[str, np.ndarray] = field(default_factory=dict)
    values: bool = False


@dataclass
class TensorPlan:
    """How one source tensor becomes output arrays.

    Attributes
    ----------
    source : str
        Name of the tensor in the source checkpoint.
    outputs : list of (name, dtype, shape)
        Arrays the encoder will return, with safetensors dtype strings.
    encode : callable(tensor) -> dict name -> ndarray
    notes : list of str
        What the writer does (for reports): "exact repack", "scales rounded to fp16" ..., known
        when planning (an encoder returns arrays only).
    row_split : RowSplit, optional
        Set when the outputs can be produced in blocks of rows (see :class:`RowSplit`).
    """

    source: str
    outputs: list[tuple[str, str, tuple[int, ...]]]
    encode: Callable[[Any], Mapping[str, np.ndarray]]
    notes: list[str] = field(default_factory=list)
    row_split: RowSplit | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of every output array."""
        total = 0
        for _, dt, shape in self.outputs:
            n = int(np.prod(shape, dtype=np.int64)) if shape else 1
            total += (n * lookup(dt).bits + 7) // 8
        return total


def rows_plan(plan: TensorPlan, *, once: Sequence[str] = (), fixed: Mapping[str, np.ndarray] | None = None,
              rows: Sequence[str] | None = None, values: bool = False) -> TensorPlan:
    """``plan`` marked row-splittable: every output not in ``once`` / ``fixed`` is a rows output
    (``values``: see :class:`RowSplit`)."""
    fixed = dict(fixed or {})
    if rows is None:
        rows = [o[0] for o in plan.outputs if o[0] not in once and o[0] not in fixed]
    plan.row_split = RowSplit(tuple(rows), tuple(once), fixed, values)
    return plan


def work_bytes(plan: TensorPlan, spec) -> int:
    """Estimated peak working set of encoding ``plan`` whole: bytes read + bytes written, plus
    float32 values for quantized tensors (dequantize / requantize work in float32)."""
    read = sum(int(a.nbytes) for a in spec.stored) if spec is not None else 0
    extra = 4 * spec.numel if spec is not None and spec.kind == "quantized" else 0
    return read + plan.nbytes + extra


def block_rows(plan: TensorPlan, spec, budget: int) -> int | None:
    """Rows per block when ``plan`` (its tensor's ``spec``) must be split to fit ``budget`` bytes
    of working memory, else None (worked on whole)."""
    if plan.row_split is None or spec is None or not spec.shape or spec.shape[0] < 2:
        return None
    gm = getattr(spec, "group_map", None)
    if (gm is not None and gm.granularity is Granularity.BLOCK and gm.extent("out") not in (None, 1)
            and tuple(spec.axes) == ("out", "in") and not plan.row_split.values):
        return None  # row blocks of a block-tiled matrix carry per-row scales: only a values plan takes them
    est = work_bytes(plan, spec)
    if est <= budget:
        return None
    rows = int(spec.shape[0])
    return max(1, min(rows, rows * budget // max(est, 1)))


def shard_plans(plans: Sequence[TensorPlan], max_shard_bytes: int | None) -> list[list[TensorPlan]]:
    """Split plans into shards of at most ``max_shard_bytes`` (a tensor's arrays stay together)."""
    if not max_shard_bytes:
        return [list(plans)]
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for p in plans:
        if shards[-1] and size + p.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(p)
        size += p.nbytes
    return shards


def _contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` C-contiguous with its own shape (``np.ascontiguousarray`` turns a 0-d scalar into shape (1,))."""
    return np.ascontiguousarray(a).reshape(a.shape)


def dense_plan(spec, name: str | None = None) -> TensorPlan:
    """Pass a dense tensor through bit-exact."""
    out = name or spec.name
    plan = TensorPlan(spec.name, [(out, spec.dtype, tuple(spec.shape))],
                      lambda t, out=out: {out: _contiguous(t.data)}, ["passed through"])
    if spec.shape and DTYPES.get(spec.dtype) is not None and DTYPES[spec.dtype].numpy is not None:
        rows_plan(plan)
    return plan
