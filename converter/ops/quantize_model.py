"""``qckpt quantize``: float checkpoint -> native quantized checkpoint, with an error report.

Streams tensor by tensor: each selected weight is quantized when the writer asks for it (in the
write's worker task), its error statistics reported as that task's result
(:func:`converter.write.engine.task_result`, kind :data:`RESULT_KIND`), and it is released before
the next one. :func:`quantize_model` collects the statistics the write returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converter.sizes import SCALE_BYTES, theoretical_bytes, zero_point_bytes
from converter.errors import FormatError
from converter.formats.native import FORMAT as NATIVE, write_native
from converter.groups import GroupMap
from converter.write.engine import collect_results, task_result
from converter.layout import IN, OUT
from converter.kernels.metrics import error_stats
from converter.quant.quantize import quantize
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, spec_of
from converter.vocabulary import group_map_for

DEFAULT_EXCLUDE = r"(embed|norm|lm_head|wte|wpe)"
#: The kind of the per-tensor results the quantizing loader reports (name -> statistics row).
RESULT_KIND = "quantize"


@dataclass(frozen=True)
class QuantizeOptions:
    """Target of ``qckpt quantize``: bits, granularity, symmetry and scale dtype."""

    bits: int
    granularity: str  # "tensor" | "channel" | "group"
    group_size: int | None = None
    symmetric: bool = True
    scale_dtype: str = "F16"
    include: str | None = None
    exclude: str | None = DEFAULT_EXCLUDE

    def scheme(self) -> QuantScheme:
        if self.symmetric:
            return QuantScheme(self.bits, signed=True, zero_point=ZeroPoint.NONE, scale_dtype=self.scale_dtype)
        return QuantScheme(self.bits, signed=False, zero_point=ZeroPoint.INTEGER, scale_dtype=self.scale_dtype)

    def group_map(self) -> GroupMap:
        if self.granularity == "group" and not self.group_size:
            raise FormatError("group granularity needs a group size", field="group_size")
        return group_map_for(self.granularity, self.group_size)


def selected(spec: TensorSpec, opts: QuantizeOptions) -> bool:
    """Quantize 2-D float ``*.weight`` tensors, minus ``exclude``, or those matching ``include``."""
    if spec.kind != "dense" or spec.dtype not in ("F32", "F16", "BF16", "F64") or len(spec.shape) != 2:
        return False
    if spec.numel == 0:
        return False
    if opts.include:
        return re.search(opts.include, spec.name) is not None
    if not spec.name.endswith("weight"):
        return False
    return not (opts.exclude and re.search(opts.exclude, spec.name))


def quantize_checkpoint(src: Checkpoint, opts: QuantizeOptions) -> Checkpoint:
    """A lazily quantized view of ``src``.

    Loading a selected tensor quantizes it and reports its statistics row
    (:func:`_tensor_stats`) as the running task's result ``(RESULT_KIND, name)``.
    """
    scheme, gm = opts.scheme(), opts.group_map()
    specs: dict[str, TensorSpec] = {}
    for spec in src.specs():
        if selected(spec, opts):
            probe = QuantizedTensor(spec.name, (OUT, IN), np.zeros(spec.shape, scheme.code_dtype),
                                    np.ones(gm.param_shape(spec.shape, (OUT, IN)), scheme.scale_np_dtype),
                                    scheme, gm, zero_points=None if scheme.symmetric else
                                    np.zeros(gm.param_shape(spec.shape, (OUT, IN)), scheme.code_dtype))
            specs[spec.name] = spec_of(probe)
        else:
            specs[spec.name] = spec

    def load(name: str):
        t = src[name]
        if specs[name].kind == "dense":
            return t
        values = t.dequantize()
        q = quantize(values, scheme, gm, name=name, axes=(OUT, IN))
        task_result(RESULT_KIND, name, _tensor_stats(values, q))
        return q

    return Checkpoint(specs, load, format="memory", path=src.path, config=src.config,
                      metadata=dict(src.metadata), files=(), extra_files=src.extra_files,
                      side_files=src.side_files)


def quantize_model(src: Checkpoint, dst: str | Path, opts: QuantizeOptions, *,
                   overwrite: bool = False) -> dict[str, dict]:
    """Quantize ``src`` into a native file at ``dst``; return the per-tensor statistics rows.

    Returns
    -------
    dict of tensor name -> statistics row
        As the write's tasks returned them (the input of :func:`summarize`).
    """
    view = quantize_checkpoint(src, opts)
    with collect_results() as got:
        write_native(view, dst, overwrite=overwrite)
    return {name: row for (kind, name), row in got.items() if kind == RESULT_KIND}


def _tensor_stats(values: np.ndarray, q: QuantizedTensor) -> dict[str, Any]:
    err = error_stats(values, q.dequantize())
    s32 = q.scales.astype(np.float32)
    spec = spec_of(q)
    theo = theoretical_bytes(q.shape, q.axes, q.scheme.bits, q.group_map, SCALE_BYTES[q.scheme.scale_dtype],
                             zero_point_bytes(spec))
    return {"name": q.name, "shape": list(q.shape), "bits": q.scheme.bits, "scheme": q.scheme.describe(),
            "groups": q.group_map.describe(), "n_groups": theo["groups"],
            "mse": err.mse, "max_abs_error": err.max_abs, "sqnr_db": err.sqnr_db, "exact": err.exact,
            "scale_min": float(np.abs(s32).min()), "scale_max": float(np.abs(s32).max()),
            "ideal_compression_vs_fp32": 32 / q.scheme.bits,
            "compression_vs_fp32_with_metadata": (4 * q.numel) / theo["total_bytes"] if theo["total_bytes"] else None,
            "theoretical_bytes": theo["total_bytes"], "bits_per_weight": theo["bits_per_weight"]}


def summarize(stats: dict[str, dict], opts: QuantizeOptions, src_path: str | None, dst: Path) -> dict[str, Any]:
    """The quantize report (``schemas/quantize-report.schema.json``), worst SQNR first."""
    rows = sorted(stats.values(), key=lambda r: (r["sqnr_db"] is None, r["sqnr_db"] if r["sqnr_db"] is not None else 0))
    numel = sum(int(np.prod(r["shape"])) for r in rows)
    sse = sum(r["mse"] * int(np.prod(r["shape"])) for r in rows)
    theo = sum(r["theoretical_bytes"] for r in rows)
    return {"source": src_path, "destination": str(dst), "format": NATIVE,
            "target": {"bits": opts.bits, "granularity": opts.granularity, "group_size": opts.group_size,
                       "symmetric": opts.symmetric, "scale_dtype": opts.scale_dtype},
            "tensors": rows,
            "overall": {"quantized_tensors": len(rows), "quantized_weights": numel,
                        "mse": sse / numel if numel else 0.0,
                        "max_abs_error": max((r["max_abs_error"] for r in rows), default=0.0),
                        "ideal_compression_vs_fp32": 32 / opts.bits,
                        "theoretical_bytes": theo,
                        "compression_vs_fp32_with_metadata": (4 * numel / theo) if theo else None}}
