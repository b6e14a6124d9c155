"""Writing a split GGUF (issue 16): ``--max-shard-size`` / ``--max-shard-tensors`` with a GGUF target.

The reference is gguf-py 0.19's own split writer: ``GGUFWriter(path, arch, split_max_size=..., split_max_tensors=...)``
(what ``convert_hf_to_gguf.py --split-max-size`` runs), fed the key/values and tensors of qckpt's unsplit file of
the same checkpoint (read with ``GGUFReader``, in file order) through its ordinary ``add_tensor`` /
``write_tensors_to_file`` path. qckpt's parts must equal its parts byte for byte: names, key/values (all in the
first part, ``split.no`` / ``split.count`` / ``split.tensors.count`` in each), tensor sets, offsets and data.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from converter.cli import main
from converter.errors import OutputExistsError
from converter.formats.gguf import split_write
from converter.formats.gguf.format import write_gguf
from converter.formats.registry import load
from converter.runtime import run_options

from ._gguf_arch_data import _config, _tensors

ROOT = Path(__file__).resolve().parents[2]
Q4_K_M = ROOT / "sample_checkpoints" / "gguf" / "minilm_llamacpp_Q4_K_M.gguf"


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def llama_dir(tmp_path) -> Path:
    d = tmp_path / "llama"
    d.mkdir()
    save_file(_tensors("llama"), str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({**_config("llama"), "architectures": ["LlamaForCausalLM"]}))
    return d


def test_cut_rule_by_hand():
    # GGUFWriter.add_tensor_info: a new part before a tensor when the part is not empty and it would exceed the
    # size (unpadded tensor bytes) or already holds max_tensors tensors; an oversized tensor stands alone
    assert split_write.split_parts([10, 10, 10, 25, 5], 20) == [[0, 1], [2], [3], [4]]
    assert split_write.split_parts([10, 10, 10, 25, 5], 0, 2) == [[0, 1], [2, 3], [4]]
    assert split_write.split_parts([10, 10, 10, 25, 5], 30, 2) == [[0, 1], [2], [3, 4]]  # 25 + 5 = 30: fits
    assert split_write.split_parts([10, 10], 0, 0) == [[0, 1]]
    assert split_write.split_parts([10, 10], 20) == [[0, 1]]  # exactly the size: still one part
    assert [p.name for p in split_write.part_paths_for(Path("/x/m.gguf"), 3)] == \
        ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"]
    assert split_write.part_paths_for(Path("/x/m.gguf"), 1) == [Path("/x/m.gguf")]


def _gguf_py_split(whole: Path, out: Path, size: int, tensors: int) -> list[Path]:
    """gguf-py's own split of the GGUF file ``whole`` (its key/values and tensors in file order) at ``out``."""
    r = gguf.GGUFReader(whole)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(out, arch, split_max_size=size, split_max_tensors=tensors)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vt = field.types[0]
        sub = field.types[-1] if vt == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vt, sub_type=sub)
    for t in r.tensors:
        dense = t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        w.add_tensor(t.name, np.array(t.data), raw_dtype=None if dense else t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return w.format_shard_names(out)


@pytest.mark.parametrize("size,tensors", [(40_000, 0), (0, 7), (100_000, 5), (30_000, 0)])
def test_parts_equal_gguf_py_split_writer(tmp_path, llama_dir, size, tensors):
    whole = tmp_path / "whole.gguf"
    write_gguf(load(llama_dir), whole)
    written = write_gguf(load(llama_dir), tmp_path / "mine" / "m.gguf", split_max_size=size,
                         split_max_tensors=tensors)
    (tmp_path / "ref").mkdir()
    ref = _gguf_py_split(whole, tmp_path / "ref" / "m.gguf", size, tensors)
    assert written["files"] == [p.name for p in ref] and len(ref) >= 3
    for p in ref:
        assert (tmp_path / "mine" / p.name).read_bytes() == p.read_bytes(), p.name
    # the layout as llama.cpp's gguf-split documents it: every key in the first part, split keys in every part
    parts = [gguf.GGUFReader(tmp_path / "mine" / name) for name in written["files"]]
    n_total = sum(len(r.tensors) for r in parts)
    assert n_total == 21
    for i, r in enumerate(parts):
        keys = [k for k in r.fields if not k.startswith("GGUF.")]
        assert keys[-3:] == ["split.no", "split.count", "split.tensors.count"]
        assert [r.fields[k].contents() for k in keys[-3:]] == [i, len(parts), n_total]
        assert [r.fields[k].types[0].name for k in keys[-3:]] == ["UINT16", "UINT16", "INT32"]
        assert (len(keys) > 3) == (i == 0)  # metadata and vocabulary in the first part only


def test_read_back_as_one_checkpoint_equal_to_the_unsplit_file(tmp_path):
    src = load(Q4_K_M)
    whole = tmp_path / "whole.gguf"
    write_gguf(src, whole)
    written = write_gguf(src, tmp_path / "q.gguf", split_max_size=200_000)
    assert len(written["files"]) >= 3 and not (tmp_path / "q.gguf").exists()
    a, b = load(whole), load(tmp_path / written["files"][1])  # any part names the set
    assert b.metadata["gguf_split"]["files"] == written["files"]
    assert a.names() == b.names() and a.metadata["ggml_types"] == b.metadata["ggml_types"]
    assert {k: v for k, v in b.metadata["gguf_kv"].items()} == a.metadata["gguf_kv"]
    for n in a.names():
        ta, tb = a[n], b[n]
        if hasattr(ta, "codes"):
            assert np.array_equal(ta.codes, tb.codes) and np.array_equal(ta.scales, tb.scales), n
        else:
            assert np.array_equal(ta.data, tb.data), n
    ref = _gguf_py_split(whole, tmp_path / "ref.gguf", 200_000, 0)  # quantized (raw_dtype) tensors too
    assert [p.name[len("ref"):] for p in ref] == [f[len("q"):] for f in written["files"]]
    for p, f in zip(ref, written["files"]):
        assert (tmp_path / f).read_bytes() == p.read_bytes(), f


def test_everything_in_one_part_is_one_plain_file(tmp_path, llama_dir):
    written = write_gguf(load(llama_dir), tmp_path / "m.gguf", split_max_size=10**9)
    assert written["files"] == ["m.gguf"] and [p.name for p in tmp_path.iterdir() if p.suffix == ".gguf"] == ["m.gguf"]
    assert "split.count" not in gguf.GGUFReader(tmp_path / "m.gguf").fields  # as GGUFWriter: no split keys


def test_atomic_nothing_left_when_a_tensor_fails(tmp_path, llama_dir, monkeypatch):
    from converter.formats.gguf import file_write
    real, calls = file_write.encode, []

    def failing(t, p):
        calls.append(p.gguf_name)
        if len(calls) == 15:  # in a later part, after earlier parts are complete
            raise OutputExistsError("injected", file=tmp_path / "x")
        return real(t, p)
    monkeypatch.setattr(file_write, "encode", failing)
    with pytest.raises(OutputExistsError), run_options(workers=1):
        write_gguf(load(llama_dir), tmp_path / "out" / "m.gguf", split_max_size=40_000)
    assert list((tmp_path / "out").iterdir()) == []  # no part, no staging directory


def test_existing_part_refused_without_overwrite(tmp_path, llama_dir):
    out = tmp_path / "m.gguf"
    first = write_gguf(load(llama_dir), out, split_max_tensors=10)
    assert first["files"] == ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"]
    before = (tmp_path / "m-00002-of-00003.gguf").read_bytes()
    with pytest.raises(OutputExistsError):
        write_gguf(load(llama_dir), out, split_max_tensors=10)
    assert (tmp_path / "m-00002-of-00003.gguf").read_bytes() == before
    assert write_gguf(load(llama_dir), out, split_max_tensors=10, overwrite=True)["files"] == first["files"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".gguf") == first["files"]


def test_cli_split_dry_run_plan_equals_the_run(tmp_path, llama_dir):
    dst = tmp_path / "m.gguf"
    r = run("convert", llama_dir, dst, "--to", "gguf", "--max-shard-size", "40KB", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert list(tmp_path.glob("*.gguf")) == []
    r = run("convert", llama_dir, dst, "--to", "gguf", "--max-shard-size", "40KB", "--json", "--quiet")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["summary"]["all_exact"] and doc["summary"]["tensors"] == 21
    files = doc["written"]["files"]
    assert [f["name"] for f in plan["files"]] == files == sorted(p.name for p in tmp_path.glob("*.gguf"))
    for f in plan["files"]:  # tensor bytes per part as planned
        r = gguf.GGUFReader(tmp_path / f["name"])
        assert f["tensors"] == len(r.tensors) and f["bytes"] == sum(int(t.n_bytes) for t in r.tensors)
        assert f["bytes"] <= 40_000 or f["tensors"] == 1
    r = run("convert", llama_dir, tmp_path / "t.gguf", "--to", "gguf", "--max-shard-tensors", "8", "--quiet")
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.glob("t-*.gguf")) == [f"t-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    r = run("convert", llama_dir, tmp_path / "d", "--to", "mlx", "--max-shard-tensors", "8")
    assert r.exit_code == 2 and "--max-shard-tensors" in r.output


def test_python_api_split_option(tmp_path, llama_dir):
    import converter
    doc = converter.convert(llama_dir, tmp_path / "m.gguf", to="gguf", split_max_tensors=10)
    assert doc["written"]["files"] == ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"]
    assert doc["summary"]["all_exact"] and doc["summary"]["tensors"] == 21
    with pytest.raises(Exception, match="split_max_size"):
        converter.convert(llama_dir, tmp_path / "d", to="mlx", split_max_size=1000)


def test_a_cut_gguf_writer_disagrees_with_is_refused_and_nothing_is_left(tmp_path, llama_dir, monkeypatch):
    from converter.errors import FormatError
    from converter.formats.gguf import format as gguf_format
    # a planner bug: 20 tensors then 1, where GGUFWriter (7 per part) cuts 7 / 7 / 7
    monkeypatch.setattr(gguf_format, "split_parts",
                        lambda nbytes, size, count: [list(range(len(nbytes) - 1)), [len(nbytes) - 1]])
    with pytest.raises(FormatError, match="cut the parts otherwise"):
        write_gguf(load(llama_dir), tmp_path / "out" / "m.gguf", split_max_tensors=7)
    assert list((tmp_path / "out").iterdir()) == []


def test_convert_refused_on_an_existing_later_part_commits_no_part(tmp_path, llama_dir):
    # convert stages the whole output (write.atomic.staged_output): with part 1 gone and parts 2 and 3 still there,
    # a run without --overwrite is refused and must not have renamed a new part 1 in beside the old parts
    out = tmp_path / "out"
    r = run("convert", llama_dir, out / "m.gguf", "--to", "gguf", "--max-shard-tensors", "10", "--quiet")
    assert r.exit_code == 0, r.output
    (out / "m-00001-of-00003.gguf").unlink()
    later = {p.name: p.read_bytes() for p in out.iterdir()}
    r = run("convert", llama_dir, out / "m.gguf", "--to", "gguf", "--max-shard-tensors", "10", "--quiet")
    assert r.exit_code == 2 and "-of-00003.gguf: destination exists" in r.output, r.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == later  # no part 1, no staging directory


def test_staged_split_parts_are_renamed_first_part_last(tmp_path, monkeypatch):
    from converter.write import atomic
    renamed = []
    real = atomic._commit
    monkeypatch.setattr(atomic, "_commit", lambda tmp, dst, ow: (renamed.append(dst.name), real(tmp, dst, ow)))
    with atomic.staged_output(tmp_path / "m.gguf") as inner:
        for i in (1, 2, 3):
            (inner.parent / f"m-0000{i}-of-00003.gguf").write_bytes(b"%d" % i)
    assert renamed == ["m-00003-of-00003.gguf", "m-00002-of-00003.gguf", "m-00001-of-00003.gguf"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(renamed)


@pytest.mark.parametrize("option,value", [("split_max_tensors", -3), ("split_max_size", -1),
                                          ("split_max_tensors", 2.5), ("split_max_size", "ten")])
def test_python_api_bad_split_limit_is_a_typed_error_and_writes_nothing(tmp_path, llama_dir, option, value):
    # a negative count used to cut after every tensor (21 parts); a size string raised a bare ValueError
    import converter
    from converter.errors import FormatError
    with pytest.raises(FormatError) as e:
        converter.convert(llama_dir, tmp_path / "out" / "m.gguf", to="gguf", **{option: value})
    assert e.value.field == option
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_python_api_split_size_as_text_is_read_as_the_cli_reads_it(tmp_path, llama_dir):
    import converter
    doc = converter.convert(llama_dir, tmp_path / "m.gguf", to="gguf", split_max_size="40KB")
    ref = converter.convert(llama_dir, tmp_path / "r.gguf", to="gguf", split_max_size=40_000)
    assert [f[1:] for f in doc["written"]["files"]] == [f[1:] for f in ref["written"]["files"]]
    assert len(doc["written"]["files"]) > 1


def test_the_split_output_names_its_parts_and_the_unsplit_name_points_to_them(tmp_path):
    """A split write's DST name is never a file: the report lists the parts, and opening DST names the first."""
    from click.testing import CliRunner

    from converter.cli import main
    from tests.conftest import SAMPLES

    dst = tmp_path / "t.gguf"
    r = CliRunner().invoke(main, ["convert", str(SAMPLES / "gguf" / "minilm_gguf_F16.gguf"), str(dst), "--to", "gguf",
                                  "--quant-type", "Q8_0", "--max-shard-tensors", "5", "--quiet"])
    assert r.exit_code == 0, r.output
    parts = [tmp_path / f"t-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert all(p.is_file() for p in parts) and not dst.exists()
    assert "written as 3 parts (a split GGUF; open the first)" in r.output and str(parts[0]) in r.output
    r = CliRunner().invoke(main, ["inspect", str(dst)])
    assert r.exit_code == 3 and f"open its first part {parts[0]}" in r.output
