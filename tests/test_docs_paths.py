"""Every path and module the top-level docs name exists, so README.md and ARCHITECTURE.md cannot rot.

Checked in both files:

- ``converter/...`` paths (relative to the repository root);
- dotted names ``converter.x.y[.attr]``: the longest prefix that is a module of the tree is
  imported and the rest must be attributes of it (``converter.load``,
  ``converter.runtime.run_options``, ``converter.formats.gguf.bounds.check_gguf_bounds``);
- package-relative paths ``write/plan.py``, ``kernels/``, ``formats/gguf/`` ... (under
  ``converter/``) and ``tests/...``, ``benchmarks/...``, ``scripts/...``, ``fuzz/...``,
  ``interop/...``, ``schemas/...`` (under the root);
- bare module file names (``cli.py``, ``registry.py``, ``errors.py`` in the layout blocks): some
  file of that name exists under ``converter/``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "converter"
DOCS = ("README.md", "ARCHITECTURE.md")
#: files the docs name that a run makes (not in the repository)
GENERATED = {"interop/results/RESULTS.md", "interop/results/results.json"}

_CONVERTER_PATH = re.compile(r"(?<![\w/.])converter/[\w/.]*[\w/]")
_DOTTED = re.compile(r"(?<![\w/.])converter(?:\.[A-Za-z_]\w*)+")
_PKG_RELATIVE = re.compile(r"(?<![\w/.])(?:formats|quant|write|kernels|ops|validate|report)/(?:[\w/.]*[\w/])?")
_ROOT_RELATIVE = re.compile(r"(?<![\w/.])(?:tests|benchmarks|scripts|fuzz|interop|schemas)/(?:[\w/.-]*[\w/])?")
_BARE_PY = re.compile(r"(?<![\w/.])\w+\.py\b")


def _text(name: str) -> str:
    return (ROOT / name).read_text()


def _found(pattern: re.Pattern, name: str) -> list[str]:
    return sorted(set(m.rstrip(".") for m in pattern.findall(_text(name))))


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        module = ".".join(parts[:n])
        rel = Path(*parts[:n])
        if (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file():
            obj = importlib.import_module(module)
            for attr in parts[n:]:
                if not hasattr(obj, attr):
                    return False
                obj = getattr(obj, attr)
            return True
    return False


@pytest.mark.parametrize("doc", DOCS)
def test_converter_paths_exist(doc):
    paths = _found(_CONVERTER_PATH, doc)
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_dotted_module_names_resolve(doc):
    names = _found(_DOTTED, doc)
    missing = [n for n in names if not _resolves(n)]
    assert not missing, f"{doc} names modules or attributes that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_package_and_repository_relative_paths_exist(doc):
    missing = [p for p in _found(_PKG_RELATIVE, doc) if not (PKG / p).exists()]
    missing += [p for p in _found(_ROOT_RELATIVE, doc) if not (ROOT / p).exists() and p not in GENERATED]
    assert not missing, f"{doc} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_bare_module_file_names_exist(doc):
    known = {p.name for p in PKG.rglob("*.py")} | {p.name for p in ROOT.glob("*/*.py")}
    missing = [n for n in _found(_BARE_PY, doc) if n not in known]
    assert not missing, f"{doc} names module files that do not exist: {missing}"


def test_the_checks_see_the_docs():
    """The patterns find what the docs name (a pattern that matched nothing would pass vacuously)."""
    assert "converter/kernels/" in _found(_CONVERTER_PATH, "README.md")
    assert "converter.runtime.run_options" in _found(_DOTTED, "README.md")
    assert "write/plan.py" in _found(_PKG_RELATIVE, "README.md")
    assert "cli.py" in _found(_BARE_PY, "ARCHITECTURE.md")
    assert not _resolves("converter.no_such_module") and not _resolves("converter.runtime.no_such_name")
