"""File-level checks of a model directory: the index vs the shards on disk vs the shard headers
(missing, extra, truncated, corrupt or git-LFS-stub shards; a stale index).
"""

from __future__ import annotations

import re
from pathlib import Path


from converter.errors import CorruptFileError
from converter.formats.safetensors_io import read_header
from converter.formats.source import INDEX_NAME, read_json
from converter.validate.findings import Finding, finding

LFS_MAGIC = b"version https://git-lfs"
#: File findings after which the checkpoint can still be read and checked (the rest stop validate).
READABLE_DESPITE = frozenset({"duplicate-tensor", "extra-shard", "checksum-mismatch"})
#: File names that look like weight shards (others, e.g. ``reference_dequant.safetensors``, are ignored).
SHARD_LIKE = re.compile(r"^(model|pytorch_model|diffusion_pytorch_model|adapter_model).*\.safetensors$"
                        r"|-of-\d+\.safetensors$")

# -- files and shards ------------------------------------------------------------------------------
def _is_lfs(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(LFS_MAGIC)) == LFS_MAGIC
    except OSError:
        return False


def _header_finding(path: Path, exc: CorruptFileError) -> Finding:
    size = path.stat().st_size
    if _is_lfs(path):
        return finding("lfs-pointer", path.name, f"{path.name} is a git-LFS pointer stub ({size} bytes), not the "
                       "weights", file=str(path), bytes=size, hint="run `git lfs pull` (or download with LFS)",
                       reader_error=exc.render())
    return finding("shard-corrupt", path.name, f"{path.name} is not valid safetensors: {exc.message}", file=str(path),
                   bytes=size, field=exc.field, expected=exc.expected, found=exc.found, reader_error=exc.render())


def check_files(path: str | Path) -> list[Finding]:
    """File-level checks of a model directory: index vs shards on disk vs shard headers.

    Returns findings (``missing-shard``, ``extra-shard``, ``stale-index``, ``shard-corrupt``,
    ``lfs-pointer``, ``duplicate-tensor``). A lone file returns no findings (its problems are unreadable,
    see module doc).

    Raises
    ------
    CorruptFileError
        The index is not JSON or has no ``weight_map`` object.
    """
    path = Path(path)
    if not path.is_dir():
        return []
    ipath = path / INDEX_NAME
    out: list[Finding] = []
    if not ipath.exists():
        single = path / "model.safetensors"
        cands = [single] if single.exists() else sorted(path.glob("*.safetensors"))
        if len(cands) == 1:
            try:
                read_header(cands[0])
            except CorruptFileError as exc:
                out.append(_header_finding(cands[0], exc))
        return out
    idx = read_json(ipath)
    wm = idx.get("weight_map") if isinstance(idx, dict) else None
    if not isinstance(wm, dict):
        raise CorruptFileError("index has no 'weight_map' object", file=ipath, field="weight_map")
    by_shard: dict[str, list[str]] = {}
    for tname, fname in wm.items():
        by_shard.setdefault(str(fname), []).append(tname)
    headers = {}
    for fname, tensors in by_shard.items():
        f = path / fname
        if "/" in fname or "\\" in fname or fname in ("", ".", ".."):
            out.append(finding("stale-index", fname, "index names a shard outside the checkpoint directory",
                               file=str(ipath), shard=fname))
            continue
        if not f.exists():
            out.append(finding("missing-shard", fname, f"missing shard {fname} ({len(tensors)} tensors)",
                               file=str(ipath), shard=fname, tensors=len(tensors), first_tensors=sorted(tensors)[:5]))
            continue
        try:
            headers[fname] = read_header(f)
        except CorruptFileError as exc:
            out.append(_header_finding(f, exc))
    listed = set(by_shard)
    for f in sorted(path.glob("*.safetensors")):
        if f.name not in listed and SHARD_LIKE.search(f.name):
            out.append(finding("extra-shard", f.name, f"{f.name} looks like a shard but the index does not name it",
                               file=str(f), bytes=f.stat().st_size))
    stored_in: dict[str, list[str]] = {}
    data_bytes = 0
    for fname, h in headers.items():
        for name, info in h.tensors.items():
            stored_in.setdefault(name, []).append(fname)
            data_bytes += int(info.nbytes)
    where = {name: fnames[0] for name, fnames in stored_in.items()}
    out.extend(_duplicates(stored_in, wm, ipath))
    absent = sorted(t for t, fname in wm.items() if fname in headers and t not in where)
    moved = sorted(t for t, fname in wm.items() if t in where and fname not in stored_in[t])
    unlisted = sorted(set(where) - set(wm))
    if absent:
        out.append(finding("stale-index", absent[0], f"{len(absent)} tensors named by the index are absent from "
                           f"their shard", file=str(ipath), tensors=absent[:8], shard=wm[absent[0]]))
    if moved:
        out.append(finding("stale-index", moved[0], f"{len(moved)} tensors are in another shard than the index "
                           f"says", file=str(ipath), tensors=moved[:8], index_says=wm[moved[0]],
                           found_in=where[moved[0]]))
    if unlisted:
        out.append(finding("stale-index", unlisted[0], f"shards hold {len(unlisted)} tensors the index does not "
                           f"list", file=str(ipath), tensors=unlisted[:8]))
    total = (idx.get("metadata") or {}).get("total_size") if isinstance(idx.get("metadata"), dict) else None
    complete = len(headers) == len(by_shard)
    if complete and isinstance(total, int) and total != data_bytes:
        out.append(finding("stale-index", INDEX_NAME, "metadata.total_size differs from the shards' data bytes",
                           severity="warning", file=str(ipath), expected=data_bytes, found=total))
    return out


def _duplicates(stored_in: dict[str, list[str]], wm: dict, ipath: Path) -> list[Finding]:
    """One ``duplicate-tensor`` finding per set of shards that store the same tensors.

    Loaders disagree on which copy wins (the index's shard, the first or the last file opened), so the
    model a user runs depends on the loader; qckpt reads the copy in the shard the index names.
    """
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, fnames in stored_in.items():
        if len(fnames) > 1:
            groups.setdefault(tuple(fnames), []).append(name)
    out = []
    for fnames, names in sorted(groups.items()):
        names.sort()
        indexed = wm.get(names[0])
        out.append(finding("duplicate-tensor", names[0],
                           f"{len(names)} tensor(s) stored in {len(fnames)} shards ({', '.join(fnames)}); the index "
                           f"names {indexed}, which qckpt reads", file=str(ipath), tensors=names[:8], count=len(names),
                           shards=list(fnames), index_says=indexed,
                           hint="remove the stale copies (re-save the shards) so every loader reads the same weights"))
    return out
