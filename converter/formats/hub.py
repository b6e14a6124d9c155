"""Hugging Face cache snapshots and repo ids, read offline; the symlink policy of model directories.

The cache ``huggingface_hub`` writes (``hf download``; ``$HF_HUB_CACHE``, default
``~/.cache/huggingface/hub``) keeps one folder per repository::

    models--org--name/
        blobs/<sha256 or git sha1>          file contents, named by their hash
        refs/main                           the commit a branch or tag points at
        snapshots/<commit>/config.json      -> ../../blobs/<hash>   (relative symlinks)

Symlink policy (issue 17): a link inside a checkpoint directory is followed when it resolves inside
that directory or, for a cache snapshot, inside that repository's ``blobs/``; any other link is
refused by name before a byte of its target is read (a crafted link to a secret file must not end up
in an output).

A repo id (``org/name`` or ``org/name@revision``) names a snapshot in the local cache; it is looked up
with ``huggingface_hub.snapshot_download(..., local_files_only=True)``: nothing is downloaded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from converter.errors import InputNotFoundError, UnsafeFormatError

__all__ = ["REPO_ID", "cache_repo_dir", "cache_dir", "link_roots", "check_link", "resolve_repo_id"]

#: ``org/name`` with an optional ``@revision`` (branch, tag or commit), as the Hub spells repo ids.
REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95})(?:@(?P<rev>[\w./-]{1,255}))?$")
_REPO_DIR_PREFIXES = ("models--", "datasets--", "spaces--")


def cache_repo_dir(path: Path) -> Path | None:
    """The cache repository folder (``.../models--org--name``) when ``path`` lies in one of its snapshots.

    Judged on the path as given (made absolute, links not resolved: a snapshot's files are links
    into ``blobs/``), by the cache's own layout ``<repo folder>/snapshots/<commit>/...``.
    """
    parts = Path(os.path.abspath(path)).parts
    for i in range(len(parts) - 2, 0, -1):
        if parts[i] == "snapshots" and parts[i - 1].startswith(_REPO_DIR_PREFIXES):
            return Path(*parts[:i])
    return None


def link_roots(directory: Path) -> tuple[Path, ...]:
    """Where links of a checkpoint ``directory`` may lead: the directory, and its cache repo's ``blobs/``."""
    roots = [directory.resolve()]
    repo = cache_repo_dir(directory)
    if repo is not None:
        roots.append((repo / "blobs").resolve())
    return tuple(roots)


def check_link(path: Path, roots: tuple[Path, ...], *, what: str, tensor: str | None = None,
               field: str | None = None) -> None:
    """Refuse ``path`` when it resolves outside every root (see the module's symlink policy).

    Raises
    ------
    UnsafeFormatError
        Naming the link, where it leads, and the allowed roots.
    """
    target = path.resolve()
    if any(target == r or r in target.parents for r in roots):
        return
    raise UnsafeFormatError(f"{what} leads outside the checkpoint directory", file=path, tensor=tensor, field=field,
                            expected="a file inside " + " or ".join(str(r) for r in roots), found=str(target),
                            hint="copy the file into the checkpoint directory instead of linking it")


def cache_dir() -> Path:
    """The hub cache folder, from the environment at call time: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``,
    else ``~/.cache/huggingface/hub`` (huggingface_hub's own rule, re-read so a changed environment counts)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return Path(home).expanduser() / "hub"


def resolve_repo_id(text: str) -> Path | None:
    """The local cache snapshot of repo id ``text`` (``org/name[@revision]``), or None if ``text`` is no repo id.

    Offline: ``huggingface_hub`` finds the snapshot of ``revision`` (default ``main``) in the cache
    (``$HF_HUB_CACHE`` / ``$HF_HOME`` honoured) and never downloads.

    Raises
    ------
    InputNotFoundError
        ``text`` has the form of a repo id but the cache holds no snapshot of it (the hint says how to
        download it).
    """
    m = REPO_ID.match(text)
    if m is None:
        return None
    from huggingface_hub import snapshot_download  # lazy: only for repo ids
    from huggingface_hub.errors import LocalEntryNotFoundError
    cache = cache_dir()
    try:
        return Path(snapshot_download(m["repo"], revision=m["rev"], local_files_only=True, cache_dir=cache))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        rev = f" at revision {m['rev']}" if m["rev"] else ""
        revision = f" --revision {m['rev']}" if m["rev"] else ""
        raise InputNotFoundError(
            f"no such file or directory, nor a snapshot of Hugging Face repo {m['repo']!r}{rev} in the local cache "
            f"({cache})", file=text,
            hint=f"download it first (`hf download {m['repo']}{revision}`); qckpt reads the cache offline") from None
