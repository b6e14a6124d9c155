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
