"""The model and the kernels import only downward (issue 13's layering), at module level only.

Kernels: numpy, ml_dtypes, threadpoolctl, zlib-ng (optional), the standard library, ``converter.errors`` /
``converter.runtime`` and other kernels. The model (flat modules): the same plus the kernels and
other model modules. A function-level import of ``converter`` is refused too (they hid cycles).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "converter"
BOTTOM = {"converter.errors", "converter.runtime"}
MODEL = {f"converter.{m}" for m in ("dtypes", "codebooks", "layout", "groups", "row_groups", "scheme", "spec",
                                    "double_quant", "tensor", "tensor_rows", "values", "global_scales", "rows",
                                    "vocabulary", "sizes")}
#: (zlib_ng: optional, the fast extra, in kernels/crc32.py)
THIRD_PARTY = {"numpy", "ml_dtypes", "threadpoolctl", "zlib_ng"}


def _imports(path: Path) -> list[tuple[str, bool]]:
    """``(module, at module level)`` of every import in ``path`` (TYPE_CHECKING blocks skipped)."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.extend((a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module, top))
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    visit(tree, True)
    return found


def _allowed(module: str, extra: set[str]) -> bool:
    root = module.split(".")[0]
    if root != "converter":
        return root in THIRD_PARTY or root in sys.stdlib_module_names or root == "__future__"
    return module in BOTTOM or module in extra or module.startswith("converter.kernels")


@pytest.mark.parametrize("path", sorted((ROOT / "kernels").glob("*.py")), ids=lambda p: p.name)
def test_kernels_import_only_kernels_errors_runtime(path):
    bad = [(m, top) for m, top in _imports(path) if not _allowed(m, set()) or (m.startswith("converter") and not top)]
    assert not bad, bad


#: model modules the CLI reads at start-up: their model imports are inside the functions that use them, so
#: `qckpt --help` loads no numpy (issue 18 item 13; tests/test_startup.py)
STARTUP_LAZY = {"converter.vocabulary"}


@pytest.mark.parametrize("name", sorted(MODEL))
def test_model_imports_only_model_kernels_errors(name):
    path = ROOT / (name.split(".")[1] + ".py")
    lazy_ok = name in STARTUP_LAZY
    bad = [(m, top) for m, top in _imports(path)
           if not _allowed(m, MODEL) or (m.startswith("converter") and not top and not lazy_ok)]
    assert not bad, bad


@pytest.mark.parametrize("path", sorted((ROOT / "quant").glob("*.py")), ids=lambda p: p.name)
def test_quant_imports_only_itself_and_below(path):
    """quant/ sits on the model: it never imports ops, validate, formats, write, cli or report."""
    def ok(m: str) -> bool:
        return _allowed(m, MODEL) or m.startswith("converter.quant")
    bad = [(m, top) for m, top in _imports(path) if not ok(m) or (m.startswith("converter") and not top)]
    assert not bad, bad
