"""Float element codebooks: the value of every code of a small float format, by name.

A float-quantized weight (FP8, FP4) is a codebook scheme (:class:`converter.scheme.QuantScheme`
with ``codebook``): the code is the element's raw bit pattern (uint8) and its value is
``codebook[code] * scale``. The tables come from ``ml_dtypes`` (its casts implement the OCP 8-bit
floating point and MX specifications and the AMD/Graphcore ``fnuz`` variants), so every format
that stores the same element type shares one table:

========== ================================ ======================= =====================
name       element                          safetensors dtype       largest finite value
========== ================================ ======================= =====================
e4m3       FP8 E4M3 (``float8_e4m3fn``)      ``F8_E4M3``             448 (0x7F, 0xFF NaN)
e5m2       FP8 E5M2 (``float8_e5m2``)        ``F8_E5M2``             57344 (inf, NaN)
e4m3fnuz   FP8 E4M3 fnuz (ROCm)              ``F8_E4M3FNUZ``         240 (0x80 NaN)
e5m2fnuz   FP8 E5M2 fnuz (ROCm)              ``F8_E5M2FNUZ``         57344 (0x80 NaN)
e2m1       FP4 E2M1 (MXFP4 / NVFP4)          ``F4`` (packed)         6
========== ================================ ======================= =====================

Code ``i`` of an 8-bit element is the byte ``i`` read as that type; E2M1 code ``i`` is the 4-bit
field ``i`` (sign in bit 3).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class FloatElement:
    """One float element type usable as a codebook.

    Attributes
    ----------
    name : str
        ``e4m3``, ``e5m2``, ``e4m3fnuz``, ``e5m2fnuz`` or ``e2m1``.
    bits : int
        Bits per code (8 or 4).
    storage_dtype : str
        safetensors dtype string of the stored codes (``F8_E4M3`` ...; ``F4`` for E2M1).
    numpy : numpy.dtype or None
        The ``ml_dtypes`` dtype of one element (None for E2M1, stored packed).
    values : tuple of float
        ``2^bits`` values indexed by code (NaN / inf where the format has them).
    max_finite : float
        Largest finite magnitude (the saturation bound of an absmax quantizer).
    """

    name: str
    bits: int
    storage_dtype: str
    numpy: np.dtype | None
    values: tuple[float, ...]
    max_finite: float


def _table(dtype) -> tuple[float, ...]:
    return tuple(float(v) for v in np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32))


def _element(name: str, dtype, storage: str) -> FloatElement:
    values = _table(dtype)
    return FloatElement(name, 8, storage, np.dtype(dtype), values, float(ml_dtypes.finfo(dtype).max))


#: FP4 E2M1 values by 4-bit code (OCP MX spec section 5.3.3; ``ml_dtypes.float4_e2m1fn``):
#: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives (code | 8).
E2M1_VALUES = tuple(float(v) for v in np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn)
                    .astype(np.float32))

ELEMENTS: dict[str, FloatElement] = {
    "e4m3": _element("e4m3", ml_dtypes.float8_e4m3fn, "F8_E4M3"),
    "e5m2": _element("e5m2", ml_dtypes.float8_e5m2, "F8_E5M2"),
    "e4m3fnuz": _element("e4m3fnuz", ml_dtypes.float8_e4m3fnuz, "F8_E4M3FNUZ"),
    "e5m2fnuz": _element("e5m2fnuz", ml_dtypes.float8_e5m2fnuz, "F8_E5M2FNUZ"),
    "e2m1": FloatElement("e2m1", 4, "F4", None, E2M1_VALUES, 6.0),
}

#: FP8 E4M3 (fn) values by code: the codebook of every E4M3 weight (0x7F / 0xFF are NaN).
E4M3 = ELEMENTS["e4m3"].values
#: FP4 E2M1 values by code.
E2M1 = ELEMENTS["e2m1"].values

_BY_BYTES = {np.asarray(e.values, dtype=np.float64).tobytes(): e for e in ELEMENTS.values()}
_BY_STORAGE = {e.storage_dtype: e for e in ELEMENTS.values() if e.numpy is not None}


def element_of(codebook) -> FloatElement | None:
    """The float element whose table ``codebook`` is (bit for bit, NaNs included), or None
    (an NF4 or other learned codebook)."""
    if codebook is None:
        return None
    return _BY_BYTES.get(np.asarray(codebook, dtype=np.float64).tobytes())


def element_for_storage(dtype: str) -> FloatElement | None:
    """The 8-bit float element stored as safetensors ``dtype`` (``F8_E4M3`` -> e4m3), or None."""
    return _BY_STORAGE.get(dtype)


def element(name: str) -> FloatElement:
    """The element called ``name``; KeyError names the known ones."""
    try:
        return ELEMENTS[name]
    except KeyError:
        raise KeyError(f"unknown float element {name!r}; known: {sorted(ELEMENTS)}") from None
