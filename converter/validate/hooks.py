"""Per-format validation hooks: the few format quirks a validator needs, registered by the format module.

The validator stays format-agnostic: it asks :func:`hooks_for` and calls what is there. A format
module registers, next to its reader (for example ``converter/formats/gptq.py``)::

    register_hooks("gptq", zero_convention=zero_convention_evidence, always_stored=("g_idx",))

Hooks
-----
zero_convention : callable(source, spec) -> dict or None
    Evidence about the zero-point convention read from the stored arrays: ``{"claimed": str,
    "inferred": str or None, ...}``. A finding ``zero-convention`` is raised when ``inferred`` is
    set and differs from ``claimed`` (GPTQ v1 ``z - 1`` vs v2 ``z``, CASES.md B01).
always_stored : tuple of str
    Roles (``"g_idx"`` ...) the format's writers always store for a quantized tensor; an absent one
    is reported (``missing-tensor``; an error when the tensor declares act-order).
negative_scales : bool
    The format's scales may be negative (MLX affine, GGUF ``d``); otherwise a negative scale is a
    ``scale-negative`` finding.

This module imports nothing from the rest of the package, so format modules can import it freely.
"""

from __future__ import annotations

from typing import Any

_HOOKS: dict[str, dict[str, Any]] = {}
KNOWN = ("zero_convention", "always_stored", "negative_scales")


def register_hooks(format_name: str, **hooks: Any) -> None:
    """Register (or extend) the validation hooks of ``format_name``; unknown hook names raise."""
    bad = sorted(set(hooks) - set(KNOWN))
    if bad:
        raise ValueError(f"unknown validation hooks {bad}; known: {list(KNOWN)}")
    _HOOKS.setdefault(format_name, {}).update(hooks)


def hooks_for(format_name: str | None) -> dict[str, Any]:
    """The hooks of ``format_name`` (empty when none are registered)."""
    return dict(_HOOKS.get(format_name or "", {}))
