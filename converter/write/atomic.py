"""Atomic output: write to a hidden sibling, rename into place only on success.

A temporary sibling lives in the destination's directory (so the final rename never crosses a
filesystem) and is named ``.<dstname>.qckpt-tmp-<pid>-<random>``; the pid lets a later run remove
leftovers of a process that died (``kill -9``, power loss) without touching a live writer's files.
Convention follows the write-then-``os.replace`` idiom (POSIX ``rename(2)`` is atomic within a
filesystem).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from converter.errors import ConverterError, OutputExistsError
from converter.runtime import current
from converter.write.dry_run import DryRunPlanned

__all__ = ["atomic_output", "atomic_outputs", "check_not_inside", "refuse_existing", "sha256_file", "temp_sibling",
           "clean_stale_siblings", "staged_output", "retarget_paths"]

_TAG = ".qckpt-tmp-"


def _prefix(dst: Path) -> str:
    """``.<dstname>.qckpt-tmp-``: every temp sibling of ``dst`` starts with this."""
    return f".{dst.name}{_TAG}"


def temp_sibling(dst: Path, suffix: str = "") -> Path:
    """A fresh ``.<dstname>.qckpt-tmp-<pid>-<random><suffix>`` path next to ``dst`` (not created)."""
    return dst.with_name(f"{_prefix(dst)}{os.getpid()}-{secrets.token_hex(6)}{suffix}")


def _pid_alive(pid: int) -> bool:
    """True if a process with ``pid`` exists (``kill(pid, 0)``; EPERM still means alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def _remove(path: Path) -> None:
    """Delete a file, symlink or directory tree; missing is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clean_stale_siblings(dst: Path) -> list[Path]:
    """Remove ``.<dstname>.qckpt-tmp-<pid>-*`` siblings whose ``pid`` is not alive.

    Returns
    -------
    list of Path
        What was removed. Names with an unparsable pid are left alone.
    """
    removed = []
    prefix = _prefix(dst)
    if not dst.parent.is_dir():
        return removed
    for entry in dst.parent.iterdir():
        if not entry.name.startswith(prefix):
            continue
        pid_text = entry.name[len(prefix):].split("-", 1)[0]
        if not pid_text.isdigit():
            continue
        pid = int(pid_text)
        if pid != os.getpid() and not _pid_alive(pid):
            _remove(entry)
            removed.append(entry)
    return removed


def _exists(path: Path) -> bool:
    """``exists`` that also counts a dangling symlink."""
    return path.exists() or path.is_symlink()


def _refuse_existing(dst: Path) -> OutputExistsError:
    return OutputExistsError("destination exists", file=dst, expected="a new path", found="existing",
                             hint="pass overwrite=True to replace it")


def refuse_existing(dst: str | os.PathLike, overwrite: bool) -> None:
    """Raise OutputExistsError if ``dst`` exists and ``overwrite`` is false (an early check; the
    commit in :func:`atomic_output` checks again)."""
    if _exists(Path(dst)) and not overwrite:
        raise _refuse_existing(Path(dst))


def _fsync(path: Path) -> None:
    """Best-effort fsync of a file (flushed before it is renamed into place) or a directory (so a
    rename survives a crash)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit(tmp: Path, dst: Path, overwrite: bool) -> None:
    """Move ``tmp`` to ``dst``.

    Files over files use ``os.replace`` (atomic). When a directory is involved the old ``dst`` is
    first renamed aside (also a temp sibling, so a crash leaves it cleanable), the new one renamed
    in, and the old one deleted; if the second rename fails the old one is put back.
    """
    if not _exists(dst):
        os.rename(tmp, dst)
        return
    if not overwrite:
        raise _refuse_existing(dst)
    if not tmp.is_dir() and not (dst.is_dir() and not dst.is_symlink()):
        os.replace(tmp, dst)
        return
    aside = temp_sibling(dst, ".old")
    os.rename(dst, aside)
    try:
        os.rename(tmp, dst)
    except BaseException:
        os.rename(aside, dst)
        raise
    _remove(aside)


@contextlib.contextmanager
def atomic_output(dst: str | os.PathLike, *, overwrite: bool = False, is_dir: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``dst``; move it into place on success, delete it on failure.

    Parameters
    ----------
    dst : str or PathLike
        Final output path. Its parent directory is created if missing.
    overwrite : bool
        Replace an existing ``dst``.
    is_dir : bool
        The output is a directory: the temp directory is created before yielding. Otherwise the
        yielded path does not exist yet and the body must create a file there.

    Yields
    ------
    Path
        ``.<dstname>.qckpt-tmp-<pid>-<random>`` in ``dst``'s directory.

    Raises
    ------
    DryRunPlanned
        Under ``run_options(dry_run=True)``, before anything is created (the last guard: writers that
        know their byte counts raise it earlier with them, see :mod:`converter.write.dry_run`).
    OutputExistsError
        ``dst`` exists and ``overwrite`` is false (checked before and again at commit).
    ConverterError
        The body finished without creating the output.

    Notes
    -----
    Any exception from the body, ``KeyboardInterrupt`` included, removes the temp and propagates;
    a ConverterError that names the temporary path (or a file inside it) is rewritten to name ``dst``.
    Stale siblings of dead processes are removed on entry.
    """
    if current().dry_run:
        raise DryRunPlanned({"files": [{"name": Path(dst).name, "bytes": None, "tensors": None}], "config": None})
    dst = Path(dst)
    if _exists(dst) and not overwrite:
        raise _refuse_existing(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_siblings(dst)
    tmp = temp_sibling(dst)
    if is_dir:
        tmp.mkdir()
    try:
        yield tmp
        if not _exists(tmp):
            raise ConverterError("nothing was written to the temporary output", file=dst,
                                 expected="an output", found="none")
        if not is_dir:
            _fsync(tmp)
        _commit(tmp, dst, overwrite)
        _fsync(dst.parent)
    except ConverterError as exc:
        _remove(tmp)
        _retarget(exc, tmp, dst)
        raise
    except BaseException:
        _remove(tmp)
        raise


@contextlib.contextmanager
def atomic_outputs(dsts: list[Path], *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary staging directory for a set of sibling files ``dsts``; each is written there under its own
    name and all are moved into place once the body succeeds (deleted on failure).

    For outputs that are several files read as one (a split GGUF: ``<name>-00001-of-0000N.gguf``). Every file is
    complete before any is renamed; the first is renamed last, so a reader that starts from the first file (as
    llama.cpp and qckpt do) never finds it beside a missing or half-written part. A crash between two renames can
    leave some later parts in place without the first; the staging directory (a temp sibling of ``dsts[0]``) is
    removed by :func:`clean_stale_siblings`.

    Raises
    ------
    OutputExistsError
        One of ``dsts`` exists and ``overwrite`` is false (checked before and again at commit).
    ConverterError
        The body did not write one of the files (named).
    """
    dsts = [Path(d) for d in dsts]
    if current().dry_run:
        raise DryRunPlanned({"files": [{"name": d.name, "bytes": None, "tensors": None} for d in dsts],
                             "config": None})
    if not overwrite:
        for d in dsts:
            if _exists(d):
                raise _refuse_existing(d)
    first = dsts[0]
    first.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_siblings(first)
    stage = temp_sibling(first)
    stage.mkdir()
    try:
        yield stage
        for d in dsts:
            if not (stage / d.name).is_file():
                raise ConverterError("nothing was written to the temporary output", file=d,
                                     expected="an output", found="none")
            _fsync(stage / d.name)
        for d in [*dsts[1:], first]:
            _commit(stage / d.name, d, overwrite)
        _fsync(first.parent)
    except ConverterError as exc:
        _remove(stage)
        for d in dsts:
            _retarget(exc, stage / d.name, d)
        raise
    except BaseException:
        _remove(stage)
        raise
    _remove(stage)


@contextlib.contextmanager
def staged_output(dst: str | os.PathLike, *, overwrite: bool = False) -> Iterator[Path]:
    """Stage a command's whole output, to be read back and proven before anything reaches ``dst``.

    Yields ``<stage>/<dst name>``, ``<stage>`` a fresh temporary sibling directory of ``dst``: the command
    writes its output there (a writer's own atomic steps happen inside the stage, on paths nothing else
    sees), reads it back and proves it. When the body returns, every entry of the stage (the output, and
    the other parts of a split GGUF ``<name>-0000i-of-0000N.gguf``) is moved into ``dst``'s directory, the
    entry named like ``dst`` last; an exception (a failed proof included) removes the stage and leaves
    ``dst`` as it was. The brief's rule: outputs are renamed into place only when complete and proven.

    Raises
    ------
    OutputExistsError
        ``dst`` (or a part's final path) exists and ``overwrite`` is false, checked again (every part's
        final path) before anything is renamed.
    """
    dst = Path(dst)
    if _exists(dst) and not overwrite:
        raise _refuse_existing(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_siblings(dst)
    stage = temp_sibling(dst, ".stage")
    stage.mkdir()
    inner = stage / dst.name
    try:
        yield inner
        entries = [p for p in stage.iterdir() if p.name != dst.name]
        if not _exists(inner) and not entries:
            raise ConverterError("nothing was written to the temporary output", file=dst,
                                 expected="an output", found="none")
        # the parts of a split GGUF in reverse (``-00001-of-`` last, as :func:`atomic_outputs`: a reader that starts
        # from the first part never finds it beside a missing one), the entry named like ``dst`` last of all; every
        # final path is checked before the first rename, so a refusal commits nothing
        order = [*sorted(entries, reverse=True), *([inner] if _exists(inner) else [])]
        if not overwrite:
            for p in order:
                if _exists(dst.parent / p.name):
                    raise _refuse_existing(dst.parent / p.name)
        for p in order:
            _commit(p, dst.parent / p.name, overwrite)
        _fsync(dst.parent)
    except ConverterError as exc:
        _remove(stage)
        _retarget(exc, inner, dst)
        _retarget(exc, stage, dst.parent)
        raise
    except BaseException:
        _remove(stage)
        raise
    _remove(stage)


def retarget_paths(doc, staged: Path, dst: Path):
    """``doc`` (a writer's summary: dicts, lists, strings) with every mention of the staged output
    ``staged`` (or a path inside it) rewritten to ``dst``, the path the user named."""
    if isinstance(doc, dict):
        return {k: retarget_paths(v, staged, dst) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return type(doc)(retarget_paths(v, staged, dst) for v in doc)
    if isinstance(doc, (str, Path)) and str(staged) in str(doc):
        out = str(doc).replace(str(staged), str(dst)).replace(str(staged.parent), str(dst.parent))
        return Path(out) if isinstance(doc, Path) else out
    if isinstance(doc, (str, Path)) and str(staged.parent) in str(doc):
        out = str(doc).replace(str(staged.parent), str(dst.parent))
        return Path(out) if isinstance(doc, Path) else out
    return doc


def _retarget(exc: ConverterError, tmp: Path, dst: Path) -> ConverterError:
    """Rewrite mentions of the temporary sibling ``tmp`` (or a path inside it) to ``dst``: the user
    named ``dst`` and ``tmp`` no longer exists once the error propagates. Returns ``exc``."""
    def fix(value):
        if isinstance(value, (str, Path)):
            text = str(value)
            for t in dict.fromkeys((str(tmp), str(tmp.resolve()))):
                text = text.replace(t, str(dst))
            return text if isinstance(value, str) else Path(text)
        return value

    for attr in ("file", "message", "expected", "found", "hint"):
        setattr(exc, attr, fix(getattr(exc, attr)))
    exc.args = (exc.render(),)
    return exc


def _is_within(inner: Path, outer: Path) -> bool:
    """``inner`` equals ``outer`` or lies under it (both already resolved)."""
    return inner == outer or outer in inner.parents


def check_not_inside(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Refuse a destination that would clobber or nest inside the source.

    Raises
    ------
    OutputExistsError
        ``dst`` resolves to ``src`` or to a path inside ``src``; or ``dst`` is an existing directory
        (which an overwrite would replace) containing ``src``. Symlinks are resolved first.
    """
    s, d = Path(src).resolve(), Path(dst).resolve()
    if _is_within(d, s):
        what = "destination is the source" if d == s else "destination is inside the source"
        raise OutputExistsError(what, file=dst, expected=f"a path outside {s}", found=str(d),
                                hint="choose a different output path")
    if d.is_dir() and _is_within(s, d):
        raise OutputExistsError("source is inside the destination directory that would be replaced",
                                file=dst, expected=f"a directory not containing {s}", found=str(d),
                                hint="choose a different output path")


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in ``chunk_size``-byte chunks (constant memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()
