"""Per-layer error tables (issue 18 item 19): ``--csv`` / ``--sort`` / ``--top`` / ``--plot`` on ``convert``
(requantize: error-report; exact: convert-report) and ``validate --reference``. The CSV's rows and order are
checked against the JSON report's own figures; the plot file is checked to be a PNG / SVG."""

from __future__ import annotations

import csv
import json
import math
import sys

import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.errors import MissingExtraError
from converter.formats.layer_roles import layer_index, linear_role
from tests.conftest import SAMPLES

REQUANT = ["--to", "mlx", "--bits", "3", "--group-size", "64"]


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def requantized(gptq_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("tables")
    r = _run("convert", gptq_dir, d / "out", *REQUANT, "--report", d / "r.json", "--csv", d / "all.csv",
             "--sort", "name")
    assert r.exit_code == 0, r.output
    return gptq_dir, d, json.loads((d / "r.json").read_text())


def test_layer_and_role_from_names():
    assert (layer_index("model.layers.12.mlp.up_proj.weight"), linear_role("model.layers.12.mlp.up_proj.weight")) \
        == (12, "up")
    bert = {"query": "q", "key": "k", "value": "v", "attention.output.dense": "o", "intermediate.dense": "up",
            "output.dense": "down"}
    for part, role in bert.items():
        name = ("encoder.layer.3.attention.self." if part in ("query", "key", "value") else "encoder.layer.3.") \
            + part + ".weight"
        assert (layer_index(name), linear_role(name)) == (3, role), name
    assert (layer_index("blk.7.attn_output.weight"), linear_role("blk.7.attn_output.weight")) == (7, "o")
    assert linear_role("blk.0.ffn_down.weight") == "down"
    assert linear_role("model.layers.0.self_attn.o_proj.weight") == "o"
    assert linear_role("model.layers.1.block_sparse_moe.experts.3.w2.weight") == "down"
    assert (layer_index("pooler.dense.weight"), linear_role("pooler.dense.weight")) == (None, None)
    assert layer_index("model.embed_tokens.weight") is None


def test_csv_rows_are_the_json_reports_figures(requantized):
    _, d, doc = requantized
    rows = _csv(d / "all.csv")
    want = sorted((t for t in doc["tensors"]), key=lambda t: t["name"])
    assert [r["name"] for r in rows] == [t["name"] for t in want] and len(rows) == 14  # 2 layers x 7 Linear
    for r, t in zip(rows, want):
        v = t["vs_source"]
        assert float(r["sqnr_db"]) == v["sqnr_db"] and float(r["rel_error"]) == v["rel_frobenius"]
        assert float(r["max_error"]) == v["max_abs"] and r["exact"] == "false"
        assert float(r["output_rel_error"]) == v["output_rel_error"]
        layer = int(t["name"].split(".")[2])
        assert int(r["layer"]) == layer and r["role"] == t["name"].split(".")[-2].removesuffix("_proj")


@pytest.mark.parametrize("key,field,worst_high", [("sqnr", "sqnr_db", False), ("rel_error", "rel_frobenius", True),
                                                  ("max_error", "max_abs", True)])
def test_sort_and_top_order_worst_first(requantized, tmp_path, key, field, worst_high):
    src, _, doc = requantized
    r = _run("convert", src, tmp_path / "o", *REQUANT, "--csv", tmp_path / "t.csv", "--sort", key, "--top", "4")
    assert r.exit_code == 0, r.output
    got = [row["name"] for row in _csv(tmp_path / "t.csv")]
    # the report's own figures, ordered by hand: worst first, ties by name
    ordered = sorted(doc["tensors"], key=lambda t: t["name"])
    ordered = sorted(ordered, key=lambda t: t["vs_source"][field], reverse=worst_high)
    assert got == [t["name"] for t in ordered[:4]]


def test_validate_reference_csv(tmp_path):
    src, ref = SAMPLES / "gptq_w4_g128_sym", SAMPLES / "minilm_fp16.safetensors"
    r = _run("validate", src, "--reference", ref, "--json", "--csv", tmp_path / "v.csv", "--sort", "rel_error")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    rows = _csv(tmp_path / "v.csv")
    figures = {n: t["reference"] for n, t in doc["tensors"].items() if "reference" in t}
    assert len(rows) == len(figures) == 7
    assert [row["name"] for row in rows] == sorted(figures, key=lambda n: -figures[n]["rel_rms"])
    for row in rows:
        f = figures[row["name"]]
        assert float(row["rel_error"]) == f["rel_rms"] and float(row["max_error"]) == f["max_abs_error"]
        assert float(row["sqnr_db"]) == pytest.approx(20 * math.log10(1 / f["rel_rms"]), rel=1e-12)
        assert float(row["matmul_rel_error"]) == f["matmul_rel_error"]
    assert rows[0]["name"] == "encoder.layer.0.output.dense.weight" and rows[0]["role"] == "down"
    pooler = next(row for row in rows if row["name"] == "pooler.dense.weight")
    assert pooler["layer"] == "" and pooler["role"] == ""


def test_exact_convert_csv(tmp_path):
    r = _run("convert", SAMPLES / "gptq_w4_g128_sym", tmp_path / "o", "--to", "awq", "--csv", tmp_path / "c.csv")
    assert r.exit_code == 0, r.output
    rows = _csv(tmp_path / "c.csv")
    assert len(rows) == 7 and all(row["exact"] == "true" and row["sqnr_db"] == "inf" and row["max_error"] == "0.0"
                                  for row in rows)


def test_usage_errors(tmp_path):
    src = SAMPLES / "gptq_w4_g128_sym"
    r = _run("convert", src, tmp_path / "o", "--to", "awq", "--top", "3")
    assert r.exit_code == 2 and "--csv" in r.output and not (tmp_path / "o").exists()
    r = _run("validate", src, "--csv", tmp_path / "v.csv")
    assert r.exit_code == 2 and "--reference" in r.output
    r = _run("convert", src, tmp_path / "o", "--to", "awq", "--plot", tmp_path / "p.pdf")
    assert r.exit_code == 2 and "FILE.png" in r.output and not (tmp_path / "o").exists()
    (tmp_path / "x.csv").write_text("keep")
    r = _run("convert", src, tmp_path / "o", "--to", "awq", "--csv", tmp_path / "x.csv")
    assert r.exit_code == 2 and (tmp_path / "x.csv").read_text() == "keep" and not (tmp_path / "o").exists()


def test_missing_matplotlib_is_one_line_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    from converter.report.plot import check_plot_path
    with pytest.raises(MissingExtraError, match=r"qckpt\[plot\]"):
        check_plot_path(tmp_path / "p.png")
    r = _run("convert", SAMPLES / "gptq_w4_g128_sym", tmp_path / "o", "--to", "awq", "--plot", tmp_path / "p.png")
    assert r.exit_code == 2 and "pip install 'qckpt[plot]'" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not (tmp_path / "o").exists()  # refused before any data moved


@pytest.mark.parametrize("suffix,head", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<svg")])
def test_plot_file_is_produced(requantized, tmp_path, suffix, head):
    pytest.importorskip("matplotlib")  # only the rendering needs the extra (.ci/run installs it)
    src, _, _ = requantized
    out = tmp_path / ("p" + suffix)
    r = _run("convert", src, tmp_path / "o", *REQUANT, "--plot", out)
    assert r.exit_code == 0, r.output
    data = out.read_bytes()
    assert data.startswith(head) if suffix == ".png" else (head in data and data.rstrip().endswith(b"</svg>"))
    if suffix == ".svg":  # one legend entry per role of the 2 x 7 Linear layers
        for role in ("q", "k", "v", "o", "gate", "up", "down"):
            assert f">{role}<".encode() in data or f"<!-- {role} -->".encode() in data
    r = _run("validate", SAMPLES / "gptq_w4_g128_sym", "--reference", SAMPLES / "minilm_fp16.safetensors",
             "--plot", tmp_path / ("v" + suffix))
    assert r.exit_code == 0, r.output
    assert (tmp_path / ("v" + suffix)).read_bytes()[:200].find(head[:4]) >= 0


def test_an_exact_requantize_says_so_instead_of_an_empty_sqnr(tmp_path):
    """Every tensor carried exactly: the overall line read 'SQNR - dB'."""
    r = _run("convert", SAMPLES / "gptq_w4_g128_sym", tmp_path / "o", "--to", "compressed-tensors", "--bits", "4",
             "--group-size", "128", "--quiet")
    assert r.exit_code == 0, r.output
    assert "overall vs source: rel. Frobenius 0, SQNR exact (no error), max |err| 0" in r.output
    assert "SQNR - dB" not in r.output
