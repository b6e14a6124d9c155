"""Split GGUF files: the parts llama.cpp's ``gguf-split`` writes, read as one checkpoint.

``tools/gguf-split/gguf-split.cpp`` (``split_strategy``) names part ``i`` (0-based) of ``n``
``<prefix>-%05d-of-%05d.gguf`` with ``i + 1`` (``llama_split_path``); the first part holds every key/value of
the model, every part holds ``split.no`` (u16, ``i``), ``split.count`` (u16, ``n``) and
``split.tensors.count`` (i32, the tensors of all parts together); each tensor is in exactly one part.
``gguf-split --merge`` writes ``split.count = 0`` into the merged file: a file with a count below 2 is not split.

Here: the parts are found from the first part's name and ``split.count``; each must exist, carry the same count
and total and its own ``split.no``; together they must hold ``split.tensors.count`` tensors, no name twice.
The ``split.*`` keys describe the files, not the model: they are left out of the checkpoint's key/values
(``metadata["gguf_split"]`` keeps them), so a GGUF written from the parts is one whole file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from converter.errors import FormatError, InputNotFoundError
from converter.formats.folder import SPLIT_NAME

__all__ = ["SPLIT_KEYS", "split_count", "part_paths", "check_part", "check_total"]

SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")


def split_count(kv: Mapping[str, Any]) -> int:
    """``split.count`` when it makes the file a part of a split set (>= 2), else 0."""
    n = kv.get("split.count")
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n >= 2 else 0


def part_paths(path: Path, kv: Mapping[str, Any]) -> list[Path]:
    """The paths of every part (part order) of the split set whose part ``path`` has key/values ``kv``.

    Raises
    ------
    FormatError
        ``path`` is not named ``<prefix>-NNNNN-of-MMMMM.gguf`` with ``MMMMM`` = ``split.count`` and ``NNNNN`` =
        ``split.no + 1``.
    InputNotFoundError
        A part is absent (named).
    """
    n = split_count(kv)
    m = SPLIT_NAME.match(path.name)
    no = kv.get("split.no")
    want = f"<prefix>-{(no if isinstance(no, int) else 0) + 1:05d}-of-{n:05d}.gguf"
    if m is None or int(m.group("count")) != n or not isinstance(no, int) or int(m.group("no")) != no + 1:
        raise FormatError("a split GGUF part whose name does not say which part it is (the other parts are found "
                          "by name)", file=path, field="split.no", expected=want, found=path.name,
                          hint="keep gguf-split's part names")
    paths = [path.with_name(f"{m.group('prefix')}-{i:05d}-of-{n:05d}.gguf") for i in range(1, n + 1)]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise InputNotFoundError(f"split GGUF part missing: {missing[0].name}"
                                 + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                                 file=missing[0], field="split.count", expected=f"{n} parts",
                                 found=f"{n - len(missing)} on disk")
    return paths


def check_part(path: Path, kv: Mapping[str, Any], index: int, first: Mapping[str, Any]) -> None:
    """Part ``index`` (0-based) of a split set belongs to the set whose first part has key/values ``first``.

    Raises
    ------
    FormatError
        Another ``split.no``, ``split.count`` or ``split.tensors.count`` (a foreign part), or a part after
        the first one carrying another ``general.architecture``.
    """
    expected = {"split.no": index, "split.count": first.get("split.count"),
                "split.tensors.count": first.get("split.tensors.count")}
    for key, want in expected.items():
        if kv.get(key) != want:
            raise FormatError("a split GGUF part that does not belong to this set", file=path, field=key,
                              expected=want, found=kv.get(key))
    arch = kv.get("general.architecture")
    if index and arch is not None and arch != first.get("general.architecture"):
        raise FormatError("a split GGUF part of another model", file=path, field="general.architecture",
                          expected=first.get("general.architecture"), found=arch)


def check_total(first_path: Path, first: Mapping[str, Any], found: int) -> None:
    """The parts hold ``split.tensors.count`` tensors in all.

    Raises
    ------
    FormatError
        Naming the first part and the counts.
    """
    want = first.get("split.tensors.count")
    if want != found:
        raise FormatError("the split GGUF parts hold another number of tensors than the set declares",
                          file=first_path, field="split.tensors.count", expected=want, found=found)
