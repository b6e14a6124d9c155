"""Human reports fit the terminal (issue 18 item 11): `COLUMNS` sets the width, cells wrap instead of
being cut to an ellipsis (a cut name makes `.bias` and `.weight` rows look alike; a cut number is a
wrong one), and byte counts print in full, never in scientific notation (item 3)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.report.render import fmt_bytes
from tests.conftest import SAMPLES


@pytest.mark.parametrize("width", [80, 100, 160])
@pytest.mark.parametrize("cmd", [["inspect", "ct_nvfp4_smollm2"], ["audit", "gptq_w4_g128_sym"],
                                 ["audit", "--what-if", "ct_nvfp4_smollm2"], ["validate", "gptq_w4_g128_sym"]])
def test_tables_fit_the_width_and_nothing_is_cut(monkeypatch, width, cmd):
    monkeypatch.setenv("COLUMNS", str(width))
    r = CliRunner().invoke(main, [*cmd[:-1], str(SAMPLES / cmd[-1])])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(line) for line in lines) <= width
    assert "…" not in r.output
    # every table row is closed by its right border: nothing cropped at the edge
    for line in lines:
        if line.startswith(("│", "┃")):
            assert line.rstrip().endswith(("│", "┃")), line
    # the folded first column, read down the table, spells the tensor names in full
    names = "".join(m.group(1).strip() for m in re.finditer(r"^│ ([^│]*)│", r.output, re.M))
    if cmd[0] == "audit" and "--what-if" not in cmd:
        assert "encoder.layer.0.attention.output.dense.bias" in names
        assert "encoder.layer.0.attention.output.dense.weight" in names


def test_byte_counts_in_full():
    assert fmt_bytes(966080.0) == "966,080"
    assert fmt_bytes(988416) == "988,416"
    assert fmt_bytes(10.375) == "10.375"
    assert fmt_bytes(None) == "-"
    # GPTQ w4 g128 sym, 1,916,928 weights: N*4/8 = 958,464 payload + 14,976 groups x 2 bytes (fp16 scale)
    r = CliRunner().invoke(main, ["audit", str(SAMPLES / "gptq_w4_g128_sym")])
    assert "e+0" not in r.output and "988,416 bytes" in r.output
