"""Block parameters seen per row: the bridge from a 2-D ``block`` group map to the row-blocked kernels.

A block-tiled ``(out, in)`` tensor's parameters, repeated along ``out`` only, are a per-row
``group(in, extent)`` map (or one scale per row when the block covers ``in`` whole): the same values,
``out x ceil(in / extent)`` parameters, never one per element. :func:`converter.values.dequantize`,
:func:`converter.tensor_rows.take_rows` and :mod:`converter.quant.carry` use it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from converter.errors import LayoutError
from converter.groups import Granularity, GroupMap


def as_row_groups(group_map: GroupMap, params: np.ndarray, shape: Sequence[int], axes: Sequence[str],
                  rows: slice | None = None) -> tuple[GroupMap, np.ndarray]:
    """A ``block`` map of a 2-D ``(out, in)`` tensor as the same values per row: groups of the
    ``in`` extent along ``in`` (or one scale per row when the block covers ``in`` whole), each
    row taking its block row's parameters.

    The parameters grow by the ``out`` extent only (``out x ceil(in / extent)``, never one per
    element), so the row-blocked kernels run on block-quantized tensors unchanged.

    Parameters
    ----------
    group_map : GroupMap of granularity ``block``
    params : ndarray, ``group_map.param_shape(shape, axes)`` (scales or zero points)
    shape, axes : the tensor's logical shape and axes, ``("out", "in")``
    rows : slice of ``out`` rows wanted (default all)

    Returns
    -------
    (GroupMap, ndarray of shape ``(rows, groups)``), dtype of ``params``.
    """
    if group_map.granularity is not Granularity.BLOCK or tuple(axes) != ("out", "in"):
        raise LayoutError("as_row_groups takes a block map of an (out, in) tensor", field="group_map",
                          found=group_map.describe())
    r0, r1, _ = (rows or slice(None)).indices(int(shape[0]))
    bo, bi = group_map.extent("out"), group_map.extent("in")
    idx = np.arange(r0, r1) // bo if bo is not None else np.zeros(max(0, r1 - r0), dtype=np.int64)
    per_row = np.take(params, idx, axis=0)
    if bi is None:
        return GroupMap.per_channel("out"), per_row
    return GroupMap.per_group(bi, axis="in"), per_row
