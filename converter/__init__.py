"""qckpt: read, convert, validate and audit quantized checkpoints through an explicit, checked layout.

Public API::

    import converter
    ckpt = converter.load("path/to/checkpoint")      # auto-detects the format
    w = ckpt["model.layers.0.mlp.up_proj.weight"]     # QuantizedTensor or DenseTensor
    x = w.dequantize()                                # float32, logical (out, in)
    converter.save(ckpt, "out.safetensors", format="native")
    converter.quantize_codes([[2, 6], [4, 8]], [2, 4], axis="in")   # -> [[1, 2], [2, 2]]

    # the commands, one call each, returning the report the CLI renders (converter.api)
    converter.inspect(path); converter.audit(path, what_if=True); converter.validate(path, strict=True)
    converter.convert(src, dst, to="compressed-tensors"); converter.diff(a, b)
    converter.quantize(src, dst, bits=4, group_size=128, to="gptq"); converter.dequantize(src, dst, dtype="bf16")
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from converter.errors import ConverterError

if TYPE_CHECKING:
    from converter.groups import Granularity, GroupMap
    from converter.layout import EXPERT, IN, OUT, AxisMap
    from converter.quant.quantize import quantize_codes
    from converter.quant.requant import Target
    from converter.scheme import QuantScheme, ZeroPoint
    from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor

__all__ = ["load", "save", "quantize_codes", "quantize", "dequantize", "Checkpoint", "QuantizedTensor",
           "DenseTensor", "QuantScheme", "ZeroPoint", "GroupMap", "Granularity", "AxisMap", "ConverterError",
           "OUT", "IN", "EXPERT", "Target", "inspect", "audit", "validate", "convert", "diff"]

# The public names, imported on first use (PEP 562 module __getattr__): `import converter` runs for every
# converter.* import (the CLI, worker processes), and the model layer pulls in numpy and ml_dtypes
# (0.1 s with ml_dtypes < 0.7, 0.5-0.7 s with 0.7.0), which `qckpt --help` never needs (issue 18).
_LAZY = {name: module for module, names in (
    ("converter.groups", ("Granularity", "GroupMap")),
    ("converter.layout", ("EXPERT", "IN", "OUT", "AxisMap")),
    ("converter.quant.quantize", ("quantize_codes",)),
    ("converter.quant.requant", ("Target",)),
    ("converter.api", ("inspect", "audit", "convert", "diff")),
    ("converter.scheme", ("QuantScheme", "ZeroPoint")),
    ("converter.tensor", ("Checkpoint", "DenseTensor", "QuantizedTensor"))) for name in names}


def __getattr__(name: str) -> Any:
    if name == "validate":  # the subpackage, callable as the one-call function (converter/validate/__init__.py)
        return importlib.import_module("converter.validate")
    module = _LAZY.get(name)
    if module is None:  # AttributeError lets `from converter import tensor` fall back to the submodule
        raise AttributeError(f"module 'converter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def load(path: str | Path, *, format: str | None = None) -> Checkpoint:
    """Read a checkpoint (file or model directory), auto-detecting its format.

    Raises
    ------
    ConverterError
        Missing, corrupt, unknown/ambiguous or inconsistent input (a typed subclass).
    """
    # lazy: `import converter` runs for every converter.* import (worker processes, the model layer alone)
    # and must not load the formats and ops layers
    from converter.formats.registry import load as _load
    return _load(path, format=format)


def save(ckpt: Checkpoint, path: str | Path, *, format: str | None = None, overwrite: bool = False,
         **options: Any) -> dict:
    """Write ``ckpt`` in ``format`` (a registered format name; ``None``: qckpt's native format,
    :data:`converter.formats.native.FORMAT`), atomically.

    Raises
    ------
    ConverterError
        Unknown format, a tensor the format cannot hold, or an existing ``path`` without ``overwrite``.
    """
    from converter.formats.native import FORMAT as NATIVE  # lazy: as in load()
    from converter.formats.registry import get  # lazy: as in load()
    from converter.ops.convert import plan_exact  # lazy: as in load()
    format = NATIVE if format is None else format
    handler = get(format)
    plan_exact(ckpt, format)
    return handler.write(ckpt, Path(path), overwrite=overwrite, **options)


def quantize(*args: Any, **kwargs: Any) -> Any:
    """Two uses, told apart by the first argument:

    - ``quantize(values, scheme, group_map, name=...)``: an array quantized into a
      :class:`QuantizedTensor` (:func:`converter.quant.quantize.quantize`);
    - ``quantize(src, dst, bits=..., ...)`` with paths: the ``qckpt quantize`` command, returning its
      report (:func:`converter.api.quantize`).
    """
    if args and isinstance(args[0], (str, os.PathLike)):
        from converter.api import quantize as command
        return command(*args, **kwargs)
    from converter.quant.quantize import quantize as op
    return op(*args, **kwargs)


def dequantize(*args: Any, **kwargs: Any) -> Any:
    """Two uses, told apart by the first argument:

    - ``dequantize(tensor)``: a :class:`QuantizedTensor`'s float32 values in logical shape
      (:func:`converter.quant.quantize.dequantize`);
    - ``dequantize(src, dst, dtype=...)`` with paths: the ``qckpt dequantize`` command, returning its
      report (:func:`converter.api.dequantize`).
    """
    if args and isinstance(args[0], (str, os.PathLike)):
        from converter.api import dequantize as command
        return command(*args, **kwargs)
    from converter.quant.quantize import dequantize as op
    return op(*args, **kwargs)
