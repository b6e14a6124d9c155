"""JSON Schemas of every JSON document qckpt reads or emits (``schemas/*.schema.json``).

The schema files live in the repository's ``schemas/`` folder (also shipped inside the package
as ``converter/_schemas`` when installed non-editable).
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource

from converter.errors import FormatError

_CANDIDATES = (Path(__file__).resolve().parent.parent / "schemas", Path(__file__).resolve().parent / "_schemas")


def schema_dir() -> Path:
    for d in _CANDIDATES:
        if d.is_dir():
            return d
    raise FileNotFoundError("qckpt schemas folder not found")


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict[str, Any]:
    """The schema ``schemas/<name>.schema.json`` as a dict."""
    return json.loads((schema_dir() / f"{name}.schema.json").read_text())


@lru_cache(maxsize=None)
def _registry() -> Registry:
    """Every schema in the folder, by ``$id``, so ``$ref`` between them resolves offline."""
    resources = []
    for f in sorted(schema_dir().glob("*.schema.json")):
        doc = json.loads(f.read_text())
        resources.append((doc["$id"], Resource.from_contents(doc)))
    return Registry().with_resources(resources)


def validate_document(doc: Any, name: str, *, file: str | Path | None = None, tensor: str | None = None) -> None:
    """Validate ``doc`` against schema ``name``.

    Raises
    ------
    FormatError
        With the JSON path of the first violation.
    """
    validator = jsonschema.Draft202012Validator(load_schema(name), registry=_registry())
    err = next(iter(sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))), None)
    if err is not None:
        path = "/".join(str(p) for p in err.absolute_path) or "(root)"
        raise FormatError(f"does not conform to {name}.schema.json: {err.message}", file=file, tensor=tensor,
                          field=path)


def _external_refs(node: Any) -> set[str]:
    """File names of the other schemas ``node`` refers to (``"x.schema.json#/..."`` refs)."""
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and not ref.startswith("#"):
            found.add(ref.split("#", 1)[0])
        for v in node.values():
            found |= _external_refs(v)
    elif isinstance(node, list):
        for v in node:
            found |= _external_refs(v)
    return found


def bundled_schema(name: str) -> dict[str, Any]:
    """Schema ``name`` as one self-contained document (JSON Schema 2020-12 bundling): every schema it
    refers to, transitively, is embedded under ``$defs`` with its own ``$id``, so a plain
    ``jsonschema.validate(doc, bundled_schema(name))`` resolves every ``$ref`` offline, without
    qckpt's registry. The shipped copies are ``schemas/bundled/<name>.schema.json``."""
    root = json.loads(json.dumps(load_schema(name)))
    todo, embedded = sorted(_external_refs(root)), {f"{name}.schema.json"}
    while todo:
        ref = todo.pop(0)
        if ref in embedded:
            continue
        embedded.add(ref)
        sub = load_schema(ref.removesuffix(".schema.json"))
        sub = {k: v for k, v in sub.items() if k != "$schema"}  # one dialect: the root's
        root.setdefault("$defs", {})[f"bundled:{ref}"] = sub
        todo += sorted(_external_refs(sub) - embedded)
    return root
