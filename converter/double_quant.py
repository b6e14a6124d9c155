"""The two-level scale record of GGUF K-quants (:class:`DoubleQuant`), carried by
:class:`converter.tensor.QuantizedTensor` and re-exported there."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class DoubleQuant:
    """Two-level scales (GGUF K-quants): sub-block scales and mins quantized against a super-block scale.

    The effective per-group scale is ``super_scales[sb] * sub_scales[g]`` and the bias
    ``-(super_mins[sb] * sub_mins[g])``, computed in float32 in ggml's order
    (``ggml-quants.c`` ``dequantize_row_q4_K``); those effective values are the tensor's
    ``scales`` / ``zero_points``. This record keeps the stored integers so the encoding is
    represented honestly and can be re-emitted exactly.

    Arrays are in logical orientation: ``super_*`` shape ``(..., out, n_super)`` float16,
    ``sub_*`` shape ``(..., out, n_groups)`` integer.
    """

    kind: str
    super_block: int
    super_scales: np.ndarray
    sub_scales: np.ndarray
    super_mins: np.ndarray | None = None
    sub_mins: np.ndarray | None = None
