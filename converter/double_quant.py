"""Two-level scales: the record of GGUF K-quants (:class:`DoubleQuant`), carried by
:class:`converter.tensor.QuantizedTensor` and re-exported there, and the storage cost of any scales that are
themselves quantized (:class:`ScaleCoding`, carried by a :class:`converter.spec.TensorSpec` for the
theoretical size, :mod:`converter.sizes`)."""

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


@dataclass(frozen=True)
class ScaleCoding:
    """How a tensor's group scales are stored when they are themselves quantized (double quant), for its size.

    Per group: a ``code_bits`` code for the scale (and one more for a float zero point when ``with_min``);
    per ``super_groups`` groups: ``super_bytes`` of second-level parameters; per tensor: ``tensor_bytes`` of
    constants (an offset). Code tables (the codebook a code indexes) are not counted, as headers are not.
    The effective float32 scales a reader decodes are the tensor's ``scales``; this only prices them.

    Examples (bytes per weight N): bitsandbytes double quant, blocksize 64: 8-bit absmax codes, one float32
    nested absmax per 256 blocks and one float32 ``nested_offset``: ``N/2 + N/64 + ceil(N/64/256)*4 + 4``
    (``functional.py`` ``quantize_4bit(compress_statistics=True)``). GGUF Q4_K: 6-bit scale and min per
    32-element group, an fp16 ``d`` and ``dmin`` per 256 (8 groups): 4.5 bits per weight (``ggml-common.h``
    ``block_q4_K``).
    """

    code_bits: int
    super_groups: int
    super_bytes: float
    tensor_bytes: float = 0.0
    with_min: bool = False

    def metadata_bytes(self, n_groups: int) -> float:
        """Bytes of the scale codes, second-level parameters and per-tensor constants of ``n_groups`` groups."""
        codes = n_groups * self.code_bits * (2 if self.with_min else 1) / 8
        return codes + -(-n_groups // self.super_groups) * self.super_bytes + self.tensor_bytes
