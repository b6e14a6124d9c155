"""Imports every built-in format module so each registers itself (one line per format)."""

from . import native, plain  # noqa: F401
from . import compressed_tensors  # noqa: F401
from . import awq  # noqa: F401
from . import mlx  # noqa: F401
from . import bnb  # noqa: F401
from . import gptq  # noqa: F401
from . import gguf  # noqa: F401
