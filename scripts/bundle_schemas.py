"""Write schemas/bundled/<name>.schema.json: each schema with the schemas it refers to embedded
(converter.schemas.bundled_schema), for users who validate with plain jsonschema.

    python scripts/bundle_schemas.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from converter.schemas import bundled_schema

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a bundled copy is stale")
    args = ap.parse_args()
    stale = []
    for f in sorted(SCHEMAS.glob("*.schema.json")):
        name = f.name.removesuffix(".schema.json")
        text = json.dumps(bundled_schema(name), indent=2) + "\n"
        out = SCHEMAS / "bundled" / f.name
        if not out.exists() or out.read_text() != text:
            stale.append(out.name)
            if not args.check:
                out.parent.mkdir(exist_ok=True)
                out.write_text(text)
    for n in stale:
        print(f"{'stale' if args.check else 'wrote'}: schemas/bundled/{n}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
