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


def test_narrow_tables_print_records_with_whole_names(monkeypatch, tmp_path):
    """Inspect, convert's error table, validate's findings, diff and the dry-run plan: a table wider than
    the terminal prints one record per row: the tensor name whole on its own line, then its cells as
    ``header: value`` pairs (none split across lines), every line within the width."""
    from converter.report.fit import SEP

    monkeypatch.setenv("COLUMNS", "80")
    run = CliRunner().invoke
    src = str(SAMPLES / "gptq_w4_g128_sym")
    outputs = {
        "inspect": run(main, ["inspect", src]),
        "convert": run(main, ["convert", src, str(tmp_path / "o"), "--to", "compressed-tensors", "--per-channel"]),
        "plan": run(main, ["convert", src, str(tmp_path / "p"), "--to", "compressed-tensors", "--per-channel",
                           "--dry-run"]),
        "diff": run(main, ["diff", src, str(tmp_path / "o")]),
    }
    name = "encoder.layer.0.attention.output.dense.weight"
    for cmd, r in outputs.items():
        assert r.exit_code in (0, 1), (cmd, r.output)
        lines = r.output.splitlines()
        assert max(len(line) for line in lines) <= 80, cmd
        assert name in lines, cmd  # the whole name is a line of its own
        body = lines[lines.index(name) + 1]
        assert body.startswith("  ") and ": " in body, (cmd, body)
    # inspect: every stored array of the weight, in the record under its name
    lines = outputs["inspect"].output.splitlines()
    i = lines.index(name) + 1
    j = next(k for k in range(i, len(lines)) if not lines[k].startswith("  "))
    record = " ".join(line.strip() for line in lines[i:j])
    for part in ("kind: quantized", "shape: 384x384", "codes:I32[48, 384]", "scales:F16[3, 384]", "g_idx:I32[384]",
                 "groups: group(in, 128)"):
        assert part in record, part
    # a pair is never split over two lines: every piece between separators holds a 'header: '
    for line in outputs["convert"].output.splitlines():
        if line.startswith("  "):
            assert all(": " in piece for piece in line.strip().split(SEP)), line
    # wide enough: the table itself (names in one cell)
    monkeypatch.setenv("COLUMNS", "220")
    wide = run(main, ["inspect", src]).output
    assert any(line.startswith("│ " + name) for line in wide.splitlines())
