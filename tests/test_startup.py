"""Start-up (issue 18 item 13): ``import converter.cli``, ``qckpt --help`` and ``qckpt --version`` import no
numpy, ml_dtypes (0.1 s to import with ml_dtypes 0.6, 0.5-0.7 s with 0.7.0), rich, jsonschema or the formats layer.

Not timed (benchmarks/bench_startup.py measures the wall times): each check runs in a fresh interpreter and
reads ``sys.modules``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("numpy", "ml_dtypes", "rich", "jsonschema", "converter.formats", "converter.ops", "converter.validate",
         "converter.report", "converter.tensor", "converter.quant")


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter has imported after running ``code``."""
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, check=True,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _heavy(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_import_converter_cli_is_light():
    assert _heavy(_modules_after("import converter.cli")) == []


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["inspect", "--help"], ["convert", "--help"]])
def test_help_and_version_are_light(args):
    code = ("from converter.cli import main\n"
            f"try:\n    main({args!r}, prog_name='qckpt')\n"
            "except SystemExit as exc:\n    assert exc.code == 0, exc.code")
    assert _heavy(_modules_after(code)) == []


def test_import_converter_is_light_and_the_public_api_still_resolves():
    mods = _modules_after("import converter")
    assert _heavy(mods) == []
    # the lazy names are the real objects, and `from converter import <submodule>` still imports the submodule
    mods = _modules_after("import converter\nfrom converter.scheme import QuantScheme\n"
                          "assert converter.QuantScheme is QuantScheme\nfrom converter import tensor\n"
                          "assert converter.Checkpoint is tensor.Checkpoint\n"
                          "assert set(converter.__all__) <= set(dir(converter))")
    assert "converter.tensor" in mods


def test_every_public_name_resolves():
    import converter
    for name in converter.__all__:
        assert getattr(converter, name) is not None, name
    with pytest.raises(AttributeError):
        converter.no_such_name  # noqa: B018
