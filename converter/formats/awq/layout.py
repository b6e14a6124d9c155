"""AWQ storage facts: names, sizes and the axis maps of the GEMM and GEMV layouts (FORMATS.md section 2).

See :mod:`converter.formats.awq` for the layouts in prose.
"""

from __future__ import annotations

from typing import Any


from converter.errors import UnsupportedError
from converter.layout import IN, OUT, AxisMap


FORMAT = "awq"
BITS = 4
PACK = 32 // BITS
AXES = (OUT, IN)
SCALE_DTYPES = ("F16", "BF16", "F32")
GEMM_VERSIONS = ("gemm", "exllama", "ipex")  # exllama/ipex load the GEMM layout and repack at load time
GEMV_VERSIONS = ("gemv",)
FAST_VERSIONS = ("gemv_fast", "llm-awq", "llm_awq")
WEIGHT_SUFFIX = ".weight"
ROLE_SUFFIXES = {"codes": ".qweight", "zero_points": ".qzeros", "scales": ".scales"}

#: AutoAWQ GEMM interleave (``awq/utils/packing_utils.py`` ``AWQ_ORDER``): nibble ``k`` of a word holds
#: column ``8c + ORDER[k]``.
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)

#: GEMM ``qweight``: ``[I, O/8]`` int32, packed along out with the AWQ interleave.
GEMM_QWEIGHT = AxisMap(stored_axes=(IN, OUT), packed_axis=OUT, bits=BITS, container="I32", order=ORDER)
#: GEMM ``qzeros``: ``[nG, O/8]`` int32 (the ``in`` axis counts groups), same interleave.
GEMM_QZEROS = AxisMap(stored_axes=(IN, OUT), packed_axis=OUT, bits=BITS, container="I32", order=ORDER)
#: GEMM ``scales``: ``[nG, O]``, transposed relative to the logical ``(out, group)``.
GEMM_SCALES = AxisMap(stored_axes=(IN, OUT))
#: GEMV ``qweight``: ``[O, I/8]`` int32, packed along in, sequential.
GEMV_QWEIGHT = AxisMap(stored_axes=(OUT, IN), packed_axis=IN, bits=BITS, container="I32")
#: GEMV ``qzeros``: ``[O, Zw]`` int32, packed sequentially along the (padded) group axis.
GEMV_QZEROS = AxisMap(stored_axes=(OUT, IN), packed_axis=IN, bits=BITS, container="I32")
#: GEMV ``scales``: ``[O, Zw*8]`` (zero-padded beyond nG).
GEMV_SCALES = AxisMap(stored_axes=(OUT, IN))


# -- configuration ------------------------------------------------------------------------------
def layout_version(qc: dict) -> str:
    """The layout name: ``version`` (AutoAWQ) or ``format`` (transformers ``AwqConfig``), default gemm."""
    v = qc.get("version", qc.get("format")) or "gemm"
    return str(v).lower()


def gemv_zeros_width(in_features: int, group_size: int, *, file: Any = None) -> int:
    """``calculate_zeros_width`` of AutoAWQ ``gemv.py``: words of packed zeros per output row.

    ``ceil((I // G) / 8)`` rounded up to a multiple of 1 (G >= 128), 2 (G = 64) or 4 (G = 32).

    Raises
    ------
    UnsupportedError
        For other group sizes (AutoAWQ raises ``NotImplementedError``).
    """
    if group_size >= 128:
        mult = 1
    elif group_size == 64:
        mult = 2
    elif group_size == 32:
        mult = 4
    else:
        raise UnsupportedError("AWQ GEMV supports group sizes 32, 64 or >= 128", file=file,
                               field="quantization_config.group_size", expected="32, 64 or >= 128", found=group_size)
    base = -(-(in_features // group_size) // PACK)
    return -(-base // mult) * mult

