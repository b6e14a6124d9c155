"""Imports every built-in format module so each registers itself (one line per format)."""

from . import native, plain  # noqa: F401
from . import gptq  # noqa: F401
