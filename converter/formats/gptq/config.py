"""GPTQ ``quantization_config``: the checkpoint format (v1 / v2) and GPTQModel's per-module ``dynamic``
rules, as read; what the writer emits is in :mod:`converter.formats.gptq.writer`.
"""

from __future__ import annotations

import re
from typing import Any, Mapping
from converter.errors import FormatError, UnsupportedError
from converter.formats.gptq.layout import V1, V2


# -- config ----------------------------------------------------------------------------------------
def checkpoint_format_of(qcfg: Mapping[str, Any], *, file: Any = None) -> str:
    """``checkpoint_format`` / ``format`` of a GPTQ config; missing means v1 (AutoGPTQ 0.7.1 writes neither)."""
    a, b = qcfg.get("checkpoint_format"), qcfg.get("format")
    if a is not None and b is not None and a != b:
        raise FormatError("'checkpoint_format' and 'format' disagree", file=file, field="quantization_config.format",
                          expected=a, found=b)
    fmt = a if a is not None else (b if b is not None else V1)
    if fmt not in (V1, V2):
        raise UnsupportedError("GPTQ checkpoint format not supported (kernel-tiled or planar layout)", file=file,
                               field="quantization_config.checkpoint_format", expected=[V1, V2], found=fmt,
                               hint="only 'gptq' (v1) and 'gptq_v2' are read; convert through the producing tool")
    return fmt


def dynamic_rule(qcfg: Mapping[str, Any], module: str) -> dict | None:
    """GPTQModel ``dynamic`` overrides for ``module``: first matching pattern wins (``re.match``).

    Returns ``None`` when the module is skipped (``"-:regex"``), else the override dict (may be empty).
    """
    dyn = qcfg.get("dynamic") or {}
    for pattern, override in dyn.items():
        if pattern.startswith("-:"):
            if re.match(pattern[2:], module):
                return None
            continue
        pat = pattern[2:] if pattern.startswith("+:") else pattern
        if re.match(pat, module):
            return dict(override or {})
    return {}


def as_bool(v: Any, default: bool) -> bool:
    return default if v is None else bool(v)
