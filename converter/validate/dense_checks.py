"""Dense (float) tensors: every stored value finite (``value-nonfinite``).

A validator that reports *clean* must have looked at every tensor, not only the quantized ones: a NaN or an
infinity in a bias, a norm weight or an embedding is passed through unchanged by every converter (qckpt's too) and
makes the model compute NaN. :func:`check_dense` reads a dense tensor's values block by block (never a full-size
temporary) and names the first non-finite one. Integer tensors (position ids, masks) are always finite.
"""

from __future__ import annotations

import numpy as np

from converter.runtime import drop_pages
from converter.validate.findings import Finding, finding

__all__ = ["check_dense", "BLOCK_VALUES"]

#: Values tested per block (the boolean mask of a block is the only temporary).
BLOCK_VALUES = 1 << 22


def _floating(dtype: np.dtype) -> bool:
    """float16/32/64, complex, and the ml_dtypes floats (bfloat16, float8_*: numpy kind ``V``, with ``isfinite``)."""
    if dtype.kind in "fc":
        return True
    try:
        np.isfinite(np.zeros(1, dtype=dtype))
    except TypeError:
        return False
    return dtype.kind == "V"


def check_dense(name: str, values: np.ndarray) -> list[Finding]:
    """``value-nonfinite`` when ``values`` (a dense tensor's stored array, any shape and dtype; a memory map is
    read block by block, its pages released after each) holds NaN or infinite values: their count, the first one's
    index (in the stored shape) and value; no finding otherwise (and for integer dtypes)."""
    values = np.asarray(values)
    if values.size == 0 or not _floating(values.dtype):
        return []
    flat = values.reshape(-1)
    bad, first = 0, None
    for i in range(0, flat.size, BLOCK_VALUES):
        block = flat[i:i + BLOCK_VALUES]
        finite = np.isfinite(block)
        drop_pages(values)  # a memory map's pages released block by block (a 32000 x 4096 embedding: 256 MiB)
        if finite.all():
            continue
        if first is None:
            j = int(np.argmin(finite))
            first = (i + j, float(block[j]))
        bad += block.size - int(np.count_nonzero(finite))
    if not bad:
        return []
    index = [int(k) for k in np.unravel_index(first[0], values.shape)]
    return [finding("value-nonfinite", name, f"{bad} of {values.size} values are NaN or infinite (first at {index}: "
                    f"{first[1]}); every converter passes a dense tensor through, and the model computes NaN",
                    count=bad, first_index=index, first_value=first[1], dtype=str(values.dtype))]
