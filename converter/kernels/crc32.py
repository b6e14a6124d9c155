"""CRC-32 with zlib's polynomial (the value ``zlib.crc32`` returns), at memory speed when zlib-ng is installed.

The read-back proof and the parameters digests (:mod:`converter.ops.readback`, :mod:`converter.ops.row_digest`,
:mod:`converter.ops.code_crc`) take a CRC-32 over every byte a conversion writes. CPython's ``zlib.crc32`` (the
system zlib's table-driven CRC) runs at about 4 GB/s on the 2-core dev VM; zlib-ng's (``zlib_ng.zlib_ng.crc32``,
installed with the ``fast`` extra: PCLMULQDQ / ARMv8 CRC instructions) at about 30 GB/s
(``benchmarks/bench_crc32.py``). Both compute CRC-32/ISO-HDLC (reflected polynomial ``0xEDB88320``, initial and
final XOR ``0xFFFFFFFF``), so every digest is the same whichever one ran; both release the GIL on large buffers.
"""

from __future__ import annotations

import zlib
from typing import Callable

__all__ = ["crc32", "implementation"]


def _pick() -> tuple[Callable[..., int], str]:
    try:
        from zlib_ng import zlib_ng
    except ImportError:  # the default install: the standard library's
        return zlib.crc32, "zlib"
    return zlib_ng.crc32, "zlib-ng"


_CRC32, _NAME = _pick()


def crc32(data, value: int = 0) -> int:
    """``zlib.crc32(data, value)``: the CRC-32 of ``data`` continuing ``value``.

    Parameters
    ----------
    data : bytes-like, C-contiguous (bytes, memoryview, a C-contiguous ndarray: its bytes in memory order)
    value : int, the CRC of the bytes before ``data`` (0 to start)

    Returns
    -------
    int, unsigned 32-bit.

    Raises
    ------
    ValueError, TypeError
        As ``zlib.crc32``: a non-contiguous buffer, an object without the buffer protocol.
    """
    return _CRC32(data, value)


def implementation() -> str:
    """``"zlib-ng"`` or ``"zlib"``: which library computes :func:`crc32` in this process."""
    return _NAME
