"""The write engine sits below the formats: nothing in converter/write (or runtime.py) imports a
layer above it, at module level or inside a function."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "converter"
ABOVE_WRITE = ("converter.formats", "converter.quant", "converter.ops", "converter.validate", "converter.cli",
               "converter.report")


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "write").glob("*.py")), ids=lambda p: p.name)
def test_write_imports_only_downwards(path):
    bad = sorted(m for m in _imports(path) if m.startswith(ABOVE_WRITE))
    assert not bad, f"{path.name} imports {bad}"


def test_runtime_imports_only_errors():
    mods = {m for m in _imports(ROOT / "runtime.py") if m.startswith("converter")}
    assert mods <= {"converter.errors"}, mods
