"""qckpt validate through click's CliRunner: exit statuses, JSON against the schema, --help lists the codes."""

import json

from click.testing import CliRunner

from converter.cli import main
from converter.schemas import load_schema, validate_document
from converter.validate.findings import CODES, codes_markdown
from tests.conftest import REPO, SAMPLES
from tests.validate.helpers import FP16, QUERY, copy_sample, edit_config


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_clean_sample_exit_0_and_json_conforms():
    r = run("validate", SAMPLES / "gptq_w4_g128_sym", "--reference", FP16, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "validation-report")
    assert doc["findings"] == [] and doc["checks"] == ["files", "structure", "data", "reference"]
    assert doc["tensors"][QUERY]["reference"]["matmul_rel_error"] < 0.2


def test_findings_exit_1_with_json_and_table(tmp_path):
    d = copy_sample("gptq_w4_g128_sym", tmp_path)
    edit_config(d, lambda qc: qc.update(checkpoint_format="gptq_v2", format="gptq_v2"))
    r = run("validate", d, "--json")
    assert r.exit_code == 1
    doc = json.loads(r.output)
    validate_document(doc, "validation-report")
    codes = {f["code"] for f in doc["findings"]}
    assert {"zero-convention", "zero-offset", "config-mismatch"} <= codes
    human = run("validate", d)
    assert human.exit_code == 1 and "zero-convention" in human.output and "FINDINGS" in human.output


def test_strict_turns_warnings_into_exit_1(tmp_path):
    d = copy_sample("gptq_w4_g128_sym", tmp_path)
    from tests.validate.helpers import edit_tensors
    edit_tensors(d, lambda s: [s.pop(k) for k in list(s) if k.endswith(".g_idx")])
    assert run("validate", d).exit_code == 0
    assert run("validate", d, "--strict").exit_code == 1


def test_usage_and_unreadable(tmp_path):
    assert run("validate").exit_code == 2
    assert run("validate", SAMPLES / "gptq_w4_g128_sym", "--reference", tmp_path / "nope").exit_code == 2
    assert run("validate", tmp_path / "missing").exit_code == 3
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json!!}....")
    r = run("validate", bad)
    assert r.exit_code == 3 and "qckpt: error:" in r.output
    (tmp_path / "model.bin").write_bytes(b"pickle")
    assert run("validate", tmp_path / "model.bin").exit_code == 3


def test_help_lists_every_code_and_exit_status():
    h = run("validate", "--help").output
    assert "Exit status" in h and "1  validate: findings" in h
    for code in CODES:
        assert code in h


def test_schema_enum_and_readme_follow_the_one_code_table():
    enum = load_schema("validation-report")["$defs"]["finding"]["properties"]["code"]["enum"]
    assert sorted(enum) == sorted(CODES)
    readme = (REPO / "README.md").read_text()
    assert codes_markdown() in readme


def test_self_test_passes_for_every_writable_format():
    r = run("validate", "--self-test", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "probe-report")
    from converter.formats import registry
    dense_only = {n for n in registry.writable() if not registry.get(n).output.quantized}
    assert dense_only == {"plain"}  # the only writer without quantized tensors; nothing else may skip
    for name in registry.writable():
        want = "skipped (no quantized writer)" if name in dense_only else "pass"
        assert doc["formats"][name] == want, (name, doc["formats"][name])
    assert run("validate", "--self-test").exit_code == 0


def test_reference_figures_are_rendered_from_the_json(monkeypatch):
    """Issue 15: the human output of ``validate --reference`` shows the comparison's figures (relative error, SQNR,
    RMS steps, max |error|, matmul error, the closest alternative), the ones ``--json`` holds."""
    import math

    monkeypatch.setenv("COLUMNS", "250")
    doc = json.loads(run("validate", SAMPLES / "gptq_w4_g128_sym", "--reference", FP16, "--json").output)
    human = run("validate", SAMPLES / "gptq_w4_g128_sym", "--reference", FP16)
    assert human.exit_code == 0
    ref = doc["tensors"][QUERY]["reference"]
    line = next(ln for ln in human.output.splitlines() if QUERY in ln)
    best = min(ref["alternatives_rel_rms"].items(), key=lambda kv: kv[1])
    for figure in (f"{ref['rel_rms']:.4g}", f"{-20 * math.log10(ref['rel_rms']):.1f}", f"{ref['rms_steps']:.4g}",
                   f"{ref['max_abs_error']:.4g}", f"{ref['matmul_rel_error']:.4g}", best[0]):
        assert figure in line, (figure, line)
    n = sum(1 for t in doc["tensors"].values() if t.get("reference"))
    assert f"reference: {n} quantized tensors compared" in human.output
    assert f"for {n} of {n}" in human.output  # the clean sample: the declared decode is the closest everywhere


def test_reference_sqnr_by_hand(capsys, monkeypatch):
    """SQNR = -20 log10(relative RMS error): 0.1 -> 20.0 dB, 0.01 -> 40.0 dB; an exact decode is 'inf'."""
    from converter.report.validation import render_validation

    monkeypatch.setenv("COLUMNS", "250")
    summary = {"verdict": "clean", "tensors_checked": 3, "tensors_unchecked": 0, "error": 0, "warning": 0, "info": 0}
    stats = {"a.weight": 0.1, "b.weight": 0.01, "c.weight": 0.0}
    tensors = {k: {"reference": {"rel_rms": v, "rms_steps": 0.29, "max_abs_error": 0.5,
                                 "alternatives_rel_rms": {"zero +1": 0.05}}} for k, v in stats.items()}
    render_validation({"path": "p", "format": "gptq", "checks": ["reference"], "summary": summary, "findings": [],
                       "reference": "r", "tensors": tensors})
    out = capsys.readouterr().out
    rows = {k: next(ln for ln in out.splitlines() if k in ln and "│" in ln) for k in stats}
    assert "20.0" in rows["a.weight"] and "40.0" in rows["b.weight"] and "inf" in rows["c.weight"]
    # declared closer than 'zero +1' (0.05) for b and c only; the worst is a at 20.0 dB
    assert "for 2 of 3" in out and "max 0.1 (a.weight, SQNR 20.0 dB)" in out
