"""Cache-blocked 2-D transposes of stored words: a copy (:func:`transpose_2d`) and a bitwise
comparison that never materialises the transpose (:func:`equal_transposed`)."""

from __future__ import annotations

import numpy as np

__all__ = ["transpose_2d", "equal_transposed"]

#: Tile of the blocked 2-D transpose: :data:`_TILE_ROWS` source rows by :data:`_TILE_COLS` columns. Few rows per
#: tile matter when a row is a power-of-two number of bytes apart (GPTQ words of a 4096-wide layer: 16 KiB): 64 such
#: rows share a handful of cache sets and evict each other. int32 words, ns per word on the 2-core dev VM
#: (best of 15; ``(512, 4096)`` / ``(1376, 4096)`` / ``(512, 11008)``): 64 x 64 tiles 3.0 / 3.1 / 1.7, 16 x 512
#: tiles 1.1 / 1.2 / 1.6-1.8, numpy's whole-array ``ascontiguousarray(a.T)`` 2.9 / 4.8 / 1.1.
_TILE_ROWS = 16
_TILE_COLS = 512


def transpose_2d(a: np.ndarray) -> np.ndarray:
    """C-contiguous transpose of a 2-D array, copied in cache-sized tiles.

    Parameters
    ----------
    a : ndarray, shape ``(R, C)``, any dtype (a read-only memory map is fine)

    Returns
    -------
    ndarray, shape ``(C, R)``, same dtype, C-contiguous.
    """
    a = a.view(np.ndarray) if isinstance(a, np.memmap) else a  # plain views: no per-tile memmap objects
    out = np.empty(a.shape[::-1], dtype=a.dtype)
    rows, cols = a.shape
    if rows * cols <= 1 << 16:
        out[...] = a.T
        return out
    for r in range(0, rows, _TILE_ROWS):
        block = a[r:r + _TILE_ROWS]
        for c in range(0, cols, _TILE_COLS):
            out[c:c + _TILE_COLS, r:r + _TILE_ROWS] = block[:, c:c + _TILE_COLS].T
    return out


#: Rows of ``a`` per stripe in :func:`equal_transposed` (a 32-row stripe of a 4096- or 11008-word
#: matrix is compared with the matching columns in cache: about 1.5x faster than transposing).
_STRIPE = 32


def equal_transposed(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``b`` is ``a`` transposed, bit for bit, without materialising ``a.T``.

    Parameters
    ----------
    a : ndarray, shape ``(R, C)``
    b : ndarray, shape ``(C, R)``, same itemsize as ``a`` (any dtype: bits are compared, so
        float NaNs and signed / unsigned views compare by their bytes)

    Returns
    -------
    bool
        False also when the shapes or itemsizes do not fit.

    Notes
    -----
    ``a`` is read in stripes of :data:`_STRIPE` rows and compared with the matching columns of
    ``b``, so each stripe's strided reads stay in cache (a read-only memory map is fine).
    """
    if a.ndim != 2 or b.ndim != 2 or b.shape != a.shape[::-1] or a.dtype.itemsize != b.dtype.itemsize:
        return False
    a = a.view(np.ndarray) if isinstance(a, np.memmap) else a  # plain views: no per-stripe memmap objects
    b = b.view(np.ndarray) if isinstance(b, np.memmap) else b
    bits = np.dtype(f"u{a.dtype.itemsize}")
    ua, ub = a.view(bits), b.view(bits)
    for r in range(0, a.shape[0], _STRIPE):
        if not np.array_equal(ua[r:r + _STRIPE].T, ub[:, r:r + _STRIPE]):
            return False
    return True
