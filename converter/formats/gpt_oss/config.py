"""gpt-oss ``quantization_config`` (``quant_method: "mxfp4"``): parse, match ``modules_to_not_convert``, emit.

transformers 5.24 ``utils/quantization_config.py`` ``Mxfp4Config.to_dict`` writes exactly
``{"quant_method": "mxfp4", "modules_to_not_convert": [...]}``; the list the released checkpoints carry is the one
``models/gpt_oss/convert_gpt_oss_weights_to_hf.py`` ``write_model(mxfp4=True)`` sets (:data:`DEFAULT_NOT_CONVERTED`:
attention, router, embeddings, head stay BF16). A name is "not converted" when a pattern matches it as
``quantizers/quantizers_utils.py`` ``should_convert_module`` does: a regex from the start up to a module boundary,
or a plain suffix.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from converter.errors import ErrorKind, FormatError

QUANT_METHOD = "mxfp4"
#: ``convert_gpt_oss_weights_to_hf.py`` (``mxfp4=True``).
DEFAULT_NOT_CONVERTED = ("model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head")
_BOUNDARY = r"(?:(?<=\.)|(?=\.|$))"


def is_mxfp4(qc: Mapping[str, Any] | None) -> bool:
    return isinstance(qc, Mapping) and qc.get("quant_method") == QUANT_METHOD


def not_converted(qc: Mapping[str, Any], *, file: Any = None) -> tuple[str, ...] | None:
    """``modules_to_not_convert`` as a tuple of patterns (None when absent).

    Raises
    ------
    FormatError
        Not a list of strings, or a pattern that is not a valid regular expression.
    """
    raw = qc.get("modules_to_not_convert")
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise FormatError("modules_to_not_convert must be a list of module names / patterns", file=file,
                          field="quantization_config.modules_to_not_convert", expected="list of str",
                          found=repr(raw)[:80], kind=ErrorKind.CONFIG_MISMATCH)
    for p in raw:
        try:
            re.compile(p)
        except re.error as exc:
            raise FormatError(f"modules_to_not_convert pattern is not a regular expression ({exc})", file=file,
                              field="quantization_config.modules_to_not_convert", expected="a regex",
                              found=p, kind=ErrorKind.CONFIG_MISMATCH) from None
    return tuple(raw)


def kept_dense(module: str, patterns: tuple[str, ...] | None) -> bool:
    """Whether transformers leaves ``module`` unconverted (``should_convert_module`` negated)."""
    if not patterns:
        return False
    return any(re.match(rf"(?:{p}){_BOUNDARY}", module) or module.endswith(p) for p in patterns)


def emit(patterns: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The ``quantization_config`` to write (``Mxfp4Config.to_dict``)."""
    return {"quant_method": QUANT_METHOD,
            "modules_to_not_convert": list(DEFAULT_NOT_CONVERTED if patterns is None else patterns)}
