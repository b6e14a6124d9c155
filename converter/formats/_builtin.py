"""Imports every built-in format module so each registers itself (one line per format)."""

from . import gguf, native, plain  # noqa: F401
