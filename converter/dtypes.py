"""Storage dtypes, as one table.

Each safetensors dtype string maps to a :class:`StorageDType`: its numpy dtype (``None`` when numpy
has no matching itemsize, as for the packed 4- and 6-bit floats), its size in bits, its kind and its
alignment rank.

Sources: safetensors 0.8.0 ``src/tensor.rs`` ``enum Dtype`` (variant order = increasing alignment,
``Dtype::bitsize``); ml_dtypes for BF16 and the 8-bit floats.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from converter.errors import FormatError


@dataclass(frozen=True)
class StorageDType:
    """One storage dtype.

    Attributes
    ----------
    name : str
        The safetensors dtype string (``"F16"``, ``"BF16"`` ...).
    numpy : numpy.dtype or None
        Little-endian numpy dtype of one element; ``None`` for sub-byte packed types (F4, F6_*),
        which are read as raw ``uint8`` bytes.
    bits : int
        Bits per element (``Dtype::bitsize``).
    kind : str
        ``"bool"``, ``"int"``, ``"uint"``, ``"float"`` or ``"complex"``.
    rank : int
        Position in the Rust ``Dtype`` enum; the safetensors writer (``prepare``) orders tensors by
        descending rank, then by name.
    """

    name: str
    numpy: np.dtype | None
    bits: int
    kind: str
    rank: int


def _e8m0() -> np.dtype:
    """``float8_e8m0fnu`` when ml_dtypes has it, else a raw ``uint8`` view."""
    return np.dtype(getattr(ml_dtypes, "float8_e8m0fnu", np.uint8))


def _opt(attr: str) -> np.dtype | None:
    """An ml_dtypes dtype by attribute name, or ``None`` if this ml_dtypes lacks it."""
    t = getattr(ml_dtypes, attr, None)
    return None if t is None else np.dtype(t)


# (name, numpy dtype, bits, kind) in the Rust enum's order (increasing alignment).
_ROWS: tuple[tuple[str, np.dtype | None, int, str], ...] = (
    ("BOOL", np.dtype(np.bool_), 8, "bool"),
    ("F4", None, 4, "float"),
    ("F6_E2M3", None, 6, "float"),
    ("F6_E3M2", None, 6, "float"),
    ("U8", np.dtype(np.uint8), 8, "uint"),
    ("I8", np.dtype(np.int8), 8, "int"),
    ("F8_E5M2", np.dtype(ml_dtypes.float8_e5m2), 8, "float"),
    ("F8_E4M3", np.dtype(ml_dtypes.float8_e4m3fn), 8, "float"),
    ("F8_E8M0", _e8m0(), 8, "float"),
    ("F8_E4M3FNUZ", _opt("float8_e4m3fnuz"), 8, "float"),
    ("F8_E5M2FNUZ", _opt("float8_e5m2fnuz"), 8, "float"),
    ("I16", np.dtype("<i2"), 16, "int"),
    ("U16", np.dtype("<u2"), 16, "uint"),
    ("F16", np.dtype("<f2"), 16, "float"),
    ("BF16", np.dtype(ml_dtypes.bfloat16), 16, "float"),
    ("I32", np.dtype("<i4"), 32, "int"),
    ("U32", np.dtype("<u4"), 32, "uint"),
    ("F32", np.dtype("<f4"), 32, "float"),
    ("C64", np.dtype("<c8"), 64, "complex"),
    ("F64", np.dtype("<f8"), 64, "float"),
    ("I64", np.dtype("<i8"), 64, "int"),
    ("U64", np.dtype("<u8"), 64, "uint"),
)

#: safetensors dtype string -> :class:`StorageDType`.
DTYPES: dict[str, StorageDType] = {
    name: StorageDType(name, dt, bits, kind, rank) for rank, (name, dt, bits, kind) in enumerate(_ROWS)
}


def _reverse_table() -> dict[np.dtype, str]:
    """numpy dtype -> dtype string; the first row wins (so ``uint8`` maps to ``U8``)."""
    out: dict[np.dtype, str] = {}
    for entry in DTYPES.values():
        if entry.numpy is not None and entry.numpy not in out:
            out[entry.numpy] = entry.name
    return out


_BY_NUMPY = _reverse_table()


def lookup(name: str) -> StorageDType:
    """The table row for a dtype string.

    Raises
    ------
    FormatError
        Unknown name; the message lists the known ones.
    """
    try:
        return DTYPES[name]
    except (KeyError, TypeError):
        raise FormatError("unknown dtype", field="dtype", expected=f"one of {sorted(DTYPES)}",
                          found=repr(name)) from None


def name_for_numpy(dtype: np.dtype) -> str:
    """The safetensors dtype string for a numpy dtype (byte order ignored).

    Raises
    ------
    FormatError
        numpy dtype with no safetensors equivalent (``float128``, ``object``, strings ...).
    """
    dt = np.dtype(dtype)
    if dt.byteorder == ">":
        dt = dt.newbyteorder("<")
    try:
        return _BY_NUMPY[dt]
    except KeyError:
        raise FormatError("numpy dtype has no safetensors equivalent", field="dtype",
                          expected=f"one of {sorted(str(k) for k in _BY_NUMPY)}", found=str(dt)) from None


def storage_nbytes(bits: int, n_elements: int) -> int | None:
    """Bytes for ``n_elements`` of ``bits`` each, or ``None`` if not a whole number of bytes.

    Python ints, so no overflow (safetensors ``Metadata::validate``: ``MisalignedSlice``).
    """
    total = n_elements * bits
    return None if total % 8 else total // 8


def float_dtype(name: str) -> np.dtype:
    """numpy dtype of a float storage dtype (``F32``, ``F16``, ``BF16``, ``F8_*``, ``F64``).

    Raises
    ------
    FormatError
        Not a float dtype with a numpy equivalent.
    """
    entry = lookup(name)
    if entry.kind != "float" or entry.numpy is None:
        raise FormatError("not a float dtype", field="dtype",
                          expected=[k for k, v in DTYPES.items() if v.kind == "float" and v.numpy is not None],
                          found=name)
    return entry.numpy


#: Alias used by the tensor model.
dtype_name = name_for_numpy
