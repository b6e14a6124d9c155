"""Keep sample_checkpoints/ indexed: add a MANIFEST.json entry for every sample folder that has a
PROVENANCE.json but no entry yet, then rewrite SHA256SUMS over every file except README.md.

    python scripts/index_samples.py          # update in place
    python scripts/index_samples.py --check  # exit 1 if anything would change

A MANIFEST entry copies the provenance fields a reader of the manifest looks for (format, producing
tool, versions, command, source, scheme, reference) and adds the main file's size and sha256; the
full record stays in the folder's PROVENANCE.json, which the entry names."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent.parent / "sample_checkpoints"
FIELDS = ("format", "scheme", "producing_tool", "tool", "versions", "command", "api_calls", "source",
          "reference", "copied_from", "qckpt_check")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def manifest_entry(folder: Path) -> dict:
    prov = json.loads((folder / "PROVENANCE.json").read_text())
    main = folder / "model.safetensors"
    entry = {"file": f"{folder.name}/", "path": f"{folder.name}/", "provenance": f"{folder.name}/PROVENANCE.json"}
    entry.update({k: prov[k] for k in FIELDS if k in prov})
    if main.exists():
        entry.update(file=f"{folder.name}/model.safetensors", path=f"{folder.name}/model.safetensors",
                     bytes=main.stat().st_size, sha256=sha256(main))
    return entry


def sums_text() -> str:
    top = {SAMPLES / "SHA256SUMS", SAMPLES / "README.md"}
    files = sorted(p for p in SAMPLES.rglob("*") if p.is_file() and p not in top)
    return "".join(f"{sha256(p)}  ./{p.relative_to(SAMPLES).as_posix()}\n" for p in files)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    mpath = SAMPLES / "MANIFEST.json"
    manifest = json.loads(mpath.read_text())
    indexed = {e["path"].split("/")[0] for e in manifest["files"]}
    added = [manifest_entry(d) for d in sorted(SAMPLES.iterdir())
             if d.is_dir() and (d / "PROVENANCE.json").exists() and d.name not in indexed]
    if added and not args.check:
        manifest["files"].extend(added)
        mpath.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    sums = sums_text()
    stale = (SAMPLES / "SHA256SUMS").read_text() != sums
    if stale and not args.check:
        (SAMPLES / "SHA256SUMS").write_text(sums)
    for e in added:
        print(f"manifest: {'would add' if args.check else 'added'} {e['path']}")
    if stale:
        print(f"SHA256SUMS: {'stale' if args.check else 'rewritten'}")
    return 1 if args.check and (added or stale) else 0


if __name__ == "__main__":
    sys.exit(main())
