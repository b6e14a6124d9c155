"""Imports every built-in format module so each registers itself (one line per format)."""

from converter.formats import native, plain  # noqa: F401
from converter.formats import compressed_tensors  # noqa: F401
from converter.formats import awq  # noqa: F401
from converter.formats import mlx  # noqa: F401
from converter.formats import bnb  # noqa: F401
from converter.formats.gptq import format as _gptq  # noqa: F401
from converter.formats.gguf import format as _gguf  # noqa: F401
from converter.formats import modelopt  # noqa: F401
from converter.formats import fp8  # noqa: F401
from converter.formats import gpt_oss  # noqa: F401
