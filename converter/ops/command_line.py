"""The ``qckpt convert`` command line a refusal or a report suggests (:func:`command_line`): a requantize
target's options as the words the CLI parses (:func:`target_words`), the paths shell-quoted, the user's writer
options, ``--format``, ``--reference``, ``--engine`` and ``--overwrite`` kept as given."""

from __future__ import annotations

import shlex
from typing import Any, Mapping

from converter.groups import Granularity
from converter.quant.target import Target
from converter.runtime import current
from converter.vocabulary import writer_option_words

__all__ = ["FIELDS", "field_words", "target_words", "command_line"]

#: The requantize fields a plan fills in or changes (``group_size`` goes with ``granularity``), in command-line order.
FIELDS = ("bits", "granularity", "symmetric", "scale_dtype")


def field_words(target: Target, name: str) -> str:
    """The command-line words of one requantize field of ``target`` ('' when left out)."""
    if name == "bits":
        return f"--bits {target.bits}" if target.bits is not None else ""
    if name == "granularity":
        g = target.granularity
        if g is None:
            return ""
        if g is Granularity.GROUP:
            return f"--group-size {target.group_size}"
        if g is Granularity.BLOCK:
            o, i = target.block
            return f"--block {o or '*'}x{i or '*'}"  # '*': that axis whole (parse_block)
        return f"--per-{g.value}"
    if name == "symmetric":
        return {None: "", True: "--sym", False: "--asym"}[target.symmetric]
    if name == "scale_dtype":
        return f"--scale-dtype {target.scale_dtype.lower()}" if target.scale_dtype is not None else ""
    raise KeyError(name)


def target_words(target: Target) -> list[str]:
    """``target`` as ``qckpt convert`` options (the words of :func:`command_line`)."""
    words = []
    if target.element is not None:
        words += ["--fp8", target.element]
    elif target.quant_type is not None:
        words += ["--quant-type", target.quant_type]
    elif target.types_from is not None:
        words += ["--gguf-types-from", str(target.types_from)]
    for name in FIELDS:
        if target.element is not None and name in ("bits", "symmetric"):
            continue
        words += field_words(target, name).split()
    if target.scale_search != "none":
        words += ["--scale-search", target.scale_search]
    return words


def command_line(src: Any, dst: Any, to: str, target: Target, *, overwrite: bool = False,
                 reference: Any = None, source_format: str | None = None,
                 write_options: Mapping[str, Any] | None = None) -> str:
    """The ``qckpt convert`` command line writing ``src`` as ``to`` at ``dst`` with ``target``
    (paths shell-quoted as given); ``source_format``: the ``--format`` the source was read as, when given;
    ``write_options``: the writer options the user gave (``--gptq-format``, ``--gguf-metadata``), kept. Under
    ``--engine`` (:class:`~converter.runtime.RunOptions` ``engine_words`` / ``overwrite_given``) the line keeps
    the user's ``--engine`` / ``--address`` and gives ``--overwrite`` only when the user did (the engine's own
    call writes a staging directory with overwrite)."""
    opts = current()
    if opts.overwrite_given is not None:
        overwrite = opts.overwrite_given
    words = ["qckpt", "convert", str(src), str(dst), "--to", to, *target_words(target),
             *writer_option_words(write_options)]
    if source_format is not None:
        words += ["--format", source_format]
    if reference is not None:
        words += ["--reference", str(reference)]
    words += list(opts.engine_words)
    if overwrite:
        words.append("--overwrite")
    return " ".join(shlex.quote(w) for w in words)
