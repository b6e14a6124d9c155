"""The import layers of ARCHITECTURE.md, enforced: an import may only point down, and the top-level
packages of ``converter`` import each other without cycles.

The contracts live in pyproject.toml (``[tool.importlinter]``) and are checked here with
import-linter's own runner, so ``lint-imports`` on the command line and this test agree. A third
check keeps the contract complete: every top-level module or package of ``converter`` sits in a
layer, so a new module cannot escape the rule by not being listed.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import converter

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"


def _contracts() -> dict[str, dict]:
    cfg = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in cfg["contracts"]}


def _lint(contract_id: str, capsys) -> tuple[bool, str]:
    """Run one contract of pyproject.toml through import-linter; (kept, printed report)."""
    from importlinter import api  # noqa: F401  (configures import-linter's readers)
    from importlinter.application.use_cases import lint_imports
    capsys.readouterr()
    kept = lint_imports(config_filename=str(PYPROJECT), limit_to_contracts=(contract_id,), cache_dir=None,
                        no_logo=True)
    return bool(kept), capsys.readouterr().out


@pytest.mark.parametrize("contract_id", ["layers", "acyclic"])
def test_import_contract_is_kept(contract_id, capsys):
    kept, report = _lint(contract_id, capsys)
    assert kept, f"import contract {contract_id!r} broken:\n{report}"


def test_every_top_level_module_is_in_a_layer():
    layers = _contracts()["layers"]["layers"]
    listed = {name.strip() for layer in layers for name in layer.replace("|", ":").split(":")}
    root = Path(converter.__file__).parent
    top = {f"converter.{p.stem}" for p in root.glob("*.py") if p.stem not in ("__init__", "__main__")}
    top |= {f"converter.{p.name}" for p in root.iterdir() if (p / "__init__.py").exists()}
    assert top - listed == set(), "modules outside every layer: add them to [tool.importlinter] and ARCHITECTURE.md"
    assert listed - top == set(), "layers naming modules that do not exist"


def test_the_layer_order_is_the_documented_one():
    layers = [layer.replace(" ", "") for layer in _contracts()["layers"]["layers"]]
    assert layers[0] == "converter.cli|converter.api" and layers[-1] == "converter.exit_codes"
    assert layers.index("converter.report") < layers.index("converter.ops|converter.validate") \
        < layers.index("converter.formats") < layers.index("converter.quant|converter.write") \
        < layers.index("converter.kernels") < layers.index("converter.runtime") < layers.index("converter.errors")
