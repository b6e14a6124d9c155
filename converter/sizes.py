"""Theoretical byte sizes of a quantized tensor (contract 3): payload ``N * b / 8`` plus
``groups * bytes per group`` (partial final groups counted; no padding, alignment or headers); scales
stored quantized (double quant) at their coded size (:class:`converter.double_quant.ScaleCoding`).
Groups are :meth:`converter.groups.GroupMap.group_count`: for 2-D blocks (FP8 ``weight_block_size``)
``ceil(out / b_out) * ceil(in / b_in)`` per matrix (per expert), partial edge blocks included.

Model-level facts shared by the audit (:mod:`converter.ops.audit`), the quantize report and the
requantize error report (:mod:`converter.quant.error_report`).
"""

from __future__ import annotations

from typing import Sequence

from converter.double_quant import ScaleCoding
from converter.dtypes import DTYPES
from converter.groups import GroupMap
from converter.scheme import QuantScheme, ZeroPoint

#: Bytes per stored scale, by scale dtype name.
SCALE_BYTES = {n: DTYPES[n].bits // 8 for n in ("F32", "F16", "BF16", "F8_E4M3", "F8_E8M0")}


def payload_bytes(numel: int, bits: int) -> float:
    """Theoretical code payload: ``numel * bits / 8`` bytes (may be fractional)."""
    return numel * bits / 8


def metadata_bytes(n_groups: int, scale_bytes: float, zero_bytes: float = 0.0) -> float:
    """Theoretical metadata: ``n_groups * (scale bytes + zero-point bytes)``."""
    return n_groups * (scale_bytes + zero_bytes)


def zero_point_bytes(spec) -> float:
    """Bytes per group of a zero point: ``bits / 8`` (integer), scale size (float), 0 (none).

    Parameters
    ----------
    spec : TensorSpec or QuantizedTensor, or anything with a ``scheme`` (:class:`QuantScheme`).
    """
    return scheme_zero_point_bytes(spec.scheme)


def scheme_zero_point_bytes(scheme: QuantScheme) -> float:
    """Bytes per group of ``scheme``'s zero point (see :func:`zero_point_bytes`)."""
    zp = scheme.zero_point
    if zp is ZeroPoint.INTEGER:
        return scheme.bits / 8
    if zp is ZeroPoint.FLOAT:
        return SCALE_BYTES[scheme.scale_dtype]
    return 0.0


def theoretical_bytes(shape: Sequence[int], axes: Sequence[str], bits: int, group_map: GroupMap,
                      scale_bytes: float, zero_bytes: float, g_idx: bool = False,
                      scale_coding: ScaleCoding | None = None) -> dict[str, float]:
    """Theoretical storage of a quantized tensor (contract 3: payload + groups x bytes per group).

    Parameters
    ----------
    shape, axes : logical shape and its named axes (``g_idx`` costs 4 bytes per ``in`` index).
    bits : bits per code.
    group_map : the tensor's groups (their count, partial groups included).
    scale_bytes, zero_bytes : bytes per group of the scale and of the zero point.
    g_idx : whether an act-order ``g_idx`` is stored.
    scale_coding : scales stored quantized (double quant): their codes, second-level scales and constants
        replace ``groups x (scale_bytes + zero_bytes)`` (:meth:`ScaleCoding.metadata_bytes`).

    Returns
    -------
    dict with ``payload_bytes``, ``metadata_bytes`` (``g_idx`` included), ``groups``,
    ``total_bytes`` and ``bits_per_weight``.
    """
    numel = 1
    for s in shape:
        numel *= int(s)
    groups = group_map.group_count(shape, axes)
    pay = payload_bytes(numel, bits)
    meta = scale_coding.metadata_bytes(groups) if scale_coding else metadata_bytes(groups, scale_bytes, zero_bytes)
    gi = 4 * int(shape[list(axes).index("in")]) if g_idx else 0
    total = pay + meta + gi
    return {"payload_bytes": pay, "metadata_bytes": meta + gi, "groups": groups, "total_bytes": total,
            "bits_per_weight": 8 * total / numel if numel else 0.0}
