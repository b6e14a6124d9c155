"""Imports every built-in format module so each registers itself (one line per format)."""

from . import compressed_tensors, native, plain  # noqa: F401
