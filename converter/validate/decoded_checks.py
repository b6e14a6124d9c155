"""Checks of a tensor read through another decoder (``TensorSpec.decoded_by``: GGUF IQ* / TQ* by gguf-py).

Such a tensor has values but no codes or scales qckpt models: what applies is that its stored bytes decode
(the reader's structural checks already bound the block count), that its block scales are finite where the
format can read them (:attr:`~converter.formats.registry.ValidationHooks.block_scales`) and that every value
is finite.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.errors import ConverterError
from converter.formats import registry
from converter.formats.source import Source
from converter.tensor import Checkpoint, TensorSpec
from converter.validate import reader_errors
from converter.validate.findings import Finding, finding

__all__ = ["check_decoded"]


def check_decoded(ckpt: Checkpoint, source: Source, spec: TensorSpec,
                  hooks: registry.ValidationHooks) -> tuple[list[Finding], dict[str, Any] | None]:
    """``(findings, stats)`` of decoded tensor ``spec``; stats None when it could not be read (unchecked)."""
    try:
        values = np.asarray(ckpt[spec.name].data)
    except ConverterError as exc:
        return [reader_errors.error_finding(exc, tensor=spec.name)], None
    out: list[Finding] = []
    stats: dict[str, Any] = {"shape": list(spec.shape), "type": spec.dtype, "decoded_by": spec.decoded_by}
    scales = None
    if hooks.block_scales is not None:
        try:
            scales = registry.guarded(hooks.block_scales, source.path, "block-scale hook")(source, spec)
        except ConverterError as exc:
            out.append(reader_errors.error_finding(exc, tensor=spec.name))
    if scales is not None:
        bad = np.flatnonzero(~np.isfinite(scales))
        stats["blocks"] = int(scales.size)
        stats["scales_checked"] = True
        if bad.size:
            out.append(finding("scale-nonfinite", spec.name,
                               f"{bad.size} of {scales.size} {spec.dtype} block scales (d) are NaN or infinite",
                               blocks=[int(i) for i in bad[:8]], values=[str(float(scales[i])) for i in bad[:8]]))
    else:
        stats["scales_checked"] = False
    nonfinite = int(np.count_nonzero(~np.isfinite(values)))
    stats["nonfinite_values"] = nonfinite
    if nonfinite and not any(f.code == "scale-nonfinite" for f in out):
        out.append(finding("scale-nonfinite", spec.name, f"{nonfinite} decoded values are NaN or infinite "
                           f"({spec.dtype}: only a non-finite block scale makes one)", count=nonfinite))
    return out, stats
