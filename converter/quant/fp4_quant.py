"""Quantize float values to FP4 (E2M1): MXFP4 (group 32, E8M0 scales) and NVFP4 (group 16, E4M3
scales and an F32 global scale, a divisor): the typed side of :mod:`converter.kernels.fp4_rtn`.

The result is a codebook :class:`~converter.tensor.QuantizedTensor`
(``QuantScheme(4, False, scale_dtype="F8_E8M0" | "F8_E4M3", codebook=E2M1_VALUES,
global_scale=None | "divisor")``, codes the E2M1 fields as uint8, ``GroupMap.per_group(32 | 16)``
along ``in``). The arithmetic and the two rule sets (``ct`` = compressed-tensors, ``mlx`` = MLX
``mxfp4`` / ``nvfp4``, the latter with ``global_scale=None``) are the kernel's.

The fused global scale (:func:`fused_sets`): llm-compressor's ``model_free_ptq`` for a
``TENSOR_GROUP`` (NVFP4) scheme observes ``q_proj`` / ``k_proj`` / ``v_proj`` of one attention
block together, and ``gate_proj`` / ``up_proj`` of one MLP (also ``w1`` / ``w3``, ``wq_a`` /
``wkv_a_with_mqa``): one absmax, one global scale for the set
(``entrypoints/model_free/microscale.py`` ``DEFAULT_FUSED_MAPPINGS``, ``observers/fusion.py``);
a set missing a partner is not fused for the missing one.
"""

from __future__ import annotations

import re
from typing import Iterable

import ml_dtypes
import numpy as np

from converter.codebooks import E2M1_VALUES
from converter.dtypes import float_dtype
from converter.errors import QuantizationError
from converter.groups import GroupMap
from converter.kernels.error_sums import ErrorSums
from converter.kernels.fp4_rtn import FP4_RULES, MX_GROUP, NV_GROUP, quantize_fp4_rows
from converter.kernels.metrics import Figures
from converter.layout import IN, OUT
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor

__all__ = ["FP4_KINDS", "FP4_RULES", "fp4_scheme", "fp4_group_map", "fused_sets", "quantize_fp4"]

#: FP4 targets: kind -> (group size, scale dtype, global-scale direction).
FP4_KINDS = {"mxfp4": (MX_GROUP, "F8_E8M0", None), "nvfp4": (NV_GROUP, "F8_E4M3", "divisor")}

#: llm-compressor's fused sets (the partner patterns of one primary), as (primary, partners) regexes
#: over tensor names with a shared ``prefix`` / block group.
_FUSED = [
    (r"^(?P<p>.+?)\.(?P<b>attn|attention|self_attn|self_attention)\.q_proj\.weight$",
     ("{p}.{b}.k_proj.weight", "{p}.{b}.v_proj.weight")),
    (r"^(?P<p>.+?)\.(?P<b>attn|attention|self_attn)\.wq_a\.weight$", ("{p}.{b}.wkv_a_with_mqa.weight",)),
    (r"^(?P<p>.+?)\.(?P<b>mlp|feed_forward)\.gate_proj\.weight$", ("{p}.{b}.up_proj.weight",)),
    (r"^(?P<p>.+?)\.w1\.weight$", ("{p}.w3.weight",)),
]


def fp4_scheme(kind: str, rule: str = "ct") -> QuantScheme:
    """``QuantScheme(4, False, scale_dtype, codebook=E2M1_VALUES, global_scale)`` of ``mxfp4`` / ``nvfp4``;
    rule ``mlx`` (MLX nvfp4) has no global scale."""
    if kind not in FP4_KINDS:
        raise QuantizationError("unknown FP4 target", field="fp4", expected=list(FP4_KINDS), found=kind)
    _, sd, gdir = FP4_KINDS[kind]
    return QuantScheme(4, False, scale_dtype=sd, codebook=E2M1_VALUES, global_scale=None if rule == "mlx" else gdir)


def fp4_group_map(kind: str) -> GroupMap:
    """Groups of 32 (MXFP4) or 16 (NVFP4) along ``in``."""
    return GroupMap.per_group(FP4_KINDS[kind][0], axis=IN)


def fused_sets(names: Iterable[str]) -> list[tuple[str, ...]]:
    """The sets of ``names`` that share one NVFP4 global scale (llm-compressor's rule, module
    docstring): each set is the primary followed by its present partners; sets of one are left out."""
    present = set(names)
    out = []
    for n in sorted(present):
        for pat, partners in _FUSED:
            m = re.match(pat, n)
            if m is None:
                continue
            got = tuple(p.format(**m.groupdict()) for p in partners)
            got = tuple(x for x in got if x in present)
            if got:
                out.append((n, *got))
    return out


def quantize_fp4(values, kind: str, *, rule: str = "ct", arith_dtype: str = "F32", global_amax: float | None = None,
                 name: str = "tensor", figures: bool = False) -> tuple[QuantizedTensor, int, Figures | None, int]:
    """Round-to-nearest MXFP4 / NVFP4 quantization of a 2-D ``(out, in)`` matrix.

    Parameters
    ----------
    values : ndarray ``(out, in)`` of float or a :class:`converter.rows.Rows` (read in row blocks).
    kind : ``"mxfp4" | "nvfp4"``.
    rule : ``"ct"`` (compressed-tensors) or ``"mlx"`` (MLX ``mxfp4`` / ``nvfp4``, the latter without a
        global scale).
    arith_dtype : the weight's dtype (BF16 / F16 / F32): the steps compressed-tensors does in it.
    global_amax : NVFP4: absmax of the fused set the global scale comes from (default the tensor's).
    name : tensor name.
    figures : also return the error figures against ``values``.

    Returns
    -------
    (QuantizedTensor, all-zero groups, Figures or None, clipped elements)

    Raises
    ------
    QuantizationError
        Non-finite values, a row length not a multiple of the group, an unknown kind / rule.
    """
    scheme = fp4_scheme(kind, rule)
    gm = fp4_group_map(kind)
    rows, n = values.shape
    sums = ErrorSums(rows, n, gm.group_size) if figures and rows and n else None
    got = quantize_fp4_rows(values, kind, rule=rule, arith=float_dtype(arith_dtype), global_amax=global_amax,
                            tensor=name, compare=sums)
    scales = got.scales.view(ml_dtypes.float8_e8m0fnu) if kind == "mxfp4" else got.scales
    q = QuantizedTensor(name, (OUT, IN), got.codes, np.ascontiguousarray(scales).astype(scheme.scale_np_dtype),
                        scheme, gm, global_scale=got.global_scale)
    return q, got.degenerate_groups, sums.figures() if sums is not None else None, got.clipped
