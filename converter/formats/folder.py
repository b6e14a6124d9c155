"""What a folder holds: its model files by format family, so that a folder with more than one is refused
instead of read from one of them silently (issue 16).

Model files: ``.gguf`` files (a split set ``<name>-00001-of-0000N.gguf``, as llama.cpp's ``gguf-split``
names its parts, counts as one model) and ``.safetensors`` files (or a ``model.safetensors.index.json``).
A ``.safetensors`` file whose name starts with the name of a ``.gguf`` file of the folder followed by a dot
(``model.gguf.reference_dequant.safetensors``, the sample folders' reference decodes) belongs to that GGUF:
a side file, not a model.
"""

from __future__ import annotations

import re
from pathlib import Path

from converter.errors import FormatError, UnknownFormatError

__all__ = ["SPLIT_NAME", "gguf_models", "safetensors_models", "choose_gguf"]

#: llama.cpp ``gguf-split`` part names: ``<prefix>-00001-of-00003.gguf`` (``llama_split_path``: "%s-%05d-of-%05d.gguf")
SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def gguf_models(folder: Path) -> dict[str, list[Path]]:
    """Model name -> its ``.gguf`` files (a split set's parts in part order; a lone file alone)."""
    out: dict[str, list[Path]] = {}
    for p in sorted(folder.glob("*.gguf")):
        m = SPLIT_NAME.match(p.name)
        key = f"{m.group('prefix')}-*-of-{m.group('count')}.gguf" if m else p.name
        out.setdefault(key, []).append(p)
    return out


def safetensors_models(folder: Path, index_name: str) -> list[Path]:
    """The ``.safetensors`` files (and the index) that are a model, not a GGUF's side file."""
    ggufs = [p.name for p in folder.glob("*.gguf")]
    files = [p for p in sorted(folder.glob("*.safetensors"))
             if not any(p.name.startswith(g + ".") for g in ggufs)]
    index = folder / index_name
    return ([index] if index.exists() else []) + files


def choose_gguf(folder: Path, prefer: str | None, index_name: str) -> Path | None:
    """The GGUF file to read for ``folder`` (the first part of a split set), or None to read its safetensors.

    Raises
    ------
    UnknownFormatError
        GGUF and safetensors models side by side and no ``prefer`` (``--format``): the candidates are named.
    FormatError
        Several GGUF models and nothing else: pass one file.
    """
    models = gguf_models(folder)
    if not models or (prefer is not None and prefer != "gguf"):
        return None
    st = safetensors_models(folder, index_name)
    if st and prefer is None:
        names = [k for k in models] + [p.name for p in st]
        raise UnknownFormatError("the folder holds more than one model format", file=folder,
                                 expected="one model format per folder",
                                 found=f"GGUF: {', '.join(list(models)[:4])}; safetensors: "
                                       f"{', '.join(p.name for p in st[:4])}",
                                 hint="pass --format gguf or the safetensors format (e.g. --format plain), or the "
                                      f"file itself ({names[0]})")
    if len(models) > 1:
        raise FormatError("a folder of several GGUF models: pass one .gguf file", file=folder,
                          expected="one GGUF model (or one split set)", found=list(models))
    return next(iter(models.values()))[0]
