"""Bundled schemas (issue 18 item 16): a user's plain `jsonschema.validate` of qckpt's JSON, with no
qckpt registry, resolves every `$ref` through schemas/bundled/, which stay in step with schemas/."""

from __future__ import annotations

import json

import jsonschema
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.schemas import bundled_schema, schema_dir
from tests.conftest import REPO, SAMPLES


def _inspect_json() -> dict:
    r = CliRunner().invoke(main, ["inspect", "--json", str(SAMPLES / "ct_nvfp4_smollm2")])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def test_plain_jsonschema_validates_against_the_shipped_bundle():
    doc = _inspect_json()
    shipped = json.loads((REPO / "schemas" / "bundled" / "inspect.schema.json").read_text())
    jsonschema.validate(doc, shipped)  # no registry: every $ref resolves inside the document
    with pytest.raises(Exception, match="Unresolvable"):  # what a user met with the unbundled file
        jsonschema.validate(doc, json.loads((REPO / "schemas" / "inspect.schema.json").read_text()))
    bad = dict(doc, tensors=[dict(doc["tensors"][0], scheme=dict(doc["tensors"][0]["scheme"], bits="four"))])
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, shipped)  # the embedded layout schema is applied, not skipped


def test_bundled_copies_are_current():
    for f in sorted(schema_dir().glob("*.schema.json")):
        name = f.name.removesuffix(".schema.json")
        shipped = REPO / "schemas" / "bundled" / f.name
        assert json.loads(shipped.read_text()) == bundled_schema(name), f"run scripts/bundle_schemas.py ({name})"
