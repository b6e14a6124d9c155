"""Index hygiene (issue 17): duplicate JSON keys are refused by name; a tensor stored in two shards is a
``validate`` finding while the rest is checked (it used to stop every command, validate included, with
exit 3), and the other commands refuse it naming both shards.
"""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

import converter
from converter.cli import main
from converter.errors import CorruptFileError, FormatError
from converter.formats.gptq import format as gptq
from converter.formats.source import Source
from converter.validate import validate
from tests.conftest import SAMPLES
from tests.validate.helpers import assert_finding

GPTQ = "gptq_w4_g128_sym"
INDEX = "model.safetensors.index.json"


@pytest.fixture
def sharded(tmp_path):
    d = tmp_path / "sharded"
    gptq.write_gptq(converter.load(SAMPLES / GPTQ), d, checkpoint_format="gptq", max_shard_bytes=300_000)
    return d, sorted(d.glob("model-*.safetensors"))


def _stale_copy(d, shards):
    """Copy one dense tensor of the index's shard into another shard, with other values (a stale copy)."""
    idx = json.loads((d / INDEX).read_text())
    name = next(n for n in idx["weight_map"] if n.endswith(".bias"))
    home = d / idx["weight_map"][name]
    other = next(s for s in shards if s != home)
    good = load_file(str(home))[name]
    tensors = load_file(str(other))
    tensors[name] = (good + 1).astype(good.dtype)
    save_file(tensors, str(other), metadata={"format": "pt"})
    return name, home, other, good


def test_tensor_in_two_shards_is_a_finding_and_every_tensor_is_still_checked(sharded):
    d, shards = sharded
    clean = validate(d)
    name, home, other, good = _stale_copy(d, shards)
    rep = validate(d)
    f = assert_finding(rep, "duplicate-tensor", name)
    assert f.severity == "error" and f.evidence["count"] == 1 and f.evidence["index_says"] == home.name
    assert sorted(f.evidence["shards"]) == sorted([home.name, other.name])
    # not also 'moved to another shard'; the stale copy's bytes do make total_size wrong (a warning)
    assert [(x.code, x.severity) for x in rep.findings] == [("duplicate-tensor", "error"), ("stale-index", "warning")]
    assert "total_size" in rep.findings[1].message
    assert sorted(rep.tensors) == sorted(clean.tensors) and len(rep.tensors) > 0 and rep.unchecked == []
    assert rep.exit_code == 1
    # the copy read is the one the index names
    src = Source(d, tolerate_duplicates=True)
    assert src.file_of(name) == home and np.array_equal(src.read(name), good)
    assert src.duplicates == {name: sorted([home, other], key=lambda p: src.files.index(p))}


def test_tensor_in_two_shards_is_refused_by_the_other_commands_naming_both(sharded):
    d, shards = sharded
    name, home, other, _ = _stale_copy(d, shards)
    with pytest.raises(FormatError, match="tensor present in two shards") as e:
        converter.load(d).names()
    assert e.value.tensor == name and home.name in e.value.found and other.name in e.value.found
    r = CliRunner().invoke(main, ["validate", str(d)])
    assert r.exit_code == 1 and "duplicate-tensor" in r.output


def test_duplicate_key_in_the_index_is_refused_by_name(sharded):
    d, _ = sharded
    raw = (d / INDEX).read_text()
    idx = json.loads(raw)
    first = next(iter(idx["weight_map"]))
    stale = '"weight_map": {' + json.dumps(first) + ': "model-00009-of-00009.safetensors", '
    (d / INDEX).write_text(raw.replace('"weight_map": {', stale, 1))
    with pytest.raises(CorruptFileError) as e:
        converter.load(d).names()
    assert e.value.field == first and e.value.found == "twice" and e.value.file.endswith(INDEX)
    r = CliRunner().invoke(main, ["validate", str(d)])
    assert r.exit_code == 3 and "duplicate key" in r.output and first in r.output


def test_duplicate_key_in_config_json_is_refused_by_name(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    for f in ("model.safetensors", "quantize_config.json"):
        (d / f).write_bytes((SAMPLES / GPTQ / f).read_bytes())
    raw = (SAMPLES / GPTQ / "config.json").read_text()
    (d / "config.json").write_text(raw.replace("{", '{"model_type": "stale", ', 1))
    with pytest.raises(CorruptFileError) as e:
        converter.load(d)
    assert e.value.field == "model_type" and e.value.file.endswith("config.json")
