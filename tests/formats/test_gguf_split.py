"""Split GGUF (issue 16): the parts ``gguf-split`` writes are read as one checkpoint.

The parts are made here with gguf-py's GGUFWriter the way llama.cpp's ``tools/gguf-split/gguf-split.cpp``
(``split_strategy``) lays them out: names ``<prefix>-%05d-of-%05d.gguf``; the first part has every key/value
of the model, every part ``split.no`` (u16, 0-based), ``split.count`` (u16) and ``split.tensors.count``
(i32, all tensors); the later parts no other key (not even ``general.architecture``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.errors import FormatError, InputNotFoundError
from converter.formats.registry import load
from converter.validate.run import validate

TENSORS = {  # gguf name -> (type, logical float values); q/k rows as the file stores them (no head count needed)
    "token_embd.weight": "Q8_0", "blk.0.ffn_up.weight": "Q4_0", "blk.0.ffn_down.weight": "TQ2_0",
    "output_norm.weight": "F32",
}


def _data(seed: int = 0, types: dict | None = None) -> dict[str, tuple[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, t in {**TENSORS, **(types or {})}.items():
        x = rng.standard_normal((256,) if t == "F32" else (4, 256)).astype(np.float32)
        out[name] = (t, x if t == "F32" else gguf.quants.quantize(x, gguf.GGMLQuantizationType[t]))
    return out


def _write(path: Path, tensors: dict, kv: dict | None, split: tuple[int, int, int] | None) -> None:
    w = gguf.GGUFWriter(path, "llama")
    if kv is None:  # a later part: only the split keys (gguf_init_empty + the three gguf_set_val_*)
        del w.kv_data[0]["general.architecture"]
    else:
        for k, v in kv.items():
            w.add_uint32(k, v)
    if split is not None:
        no, count, total = split
        w.add_uint16("split.no", no)
        w.add_uint16("split.count", count)
        w.add_int32("split.tensors.count", total)
    for name, (t, arr) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=None if t == "F32" else gguf.GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


KV = {"llama.block_count": 1, "llama.embedding_length": 256}


def _split_set(folder: Path, prefix: str = "model", seed: int = 0, count: int = 2,
               types: dict | None = None) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    data = _data(seed, types)
    names = list(data)
    per = [list(c) for c in np.array_split(names, count)]  # consecutive tensors, as gguf-split's size / count rule
    paths = []
    for i, part in enumerate(per):
        p = folder / f"{prefix}-{i + 1:05d}-of-{count:05d}.gguf"
        _write(p, {n: data[n] for n in part}, KV if i == 0 else None, (i, count, len(names)))
        paths.append(p)
    return paths


@pytest.fixture
def whole(tmp_path):
    p = tmp_path / "whole.gguf"
    _write(p, _data(), KV, None)
    return p


def test_parts_read_as_one_checkpoint(tmp_path, whole):
    parts = _split_set(tmp_path / "s")
    ref = load(whole)
    for given in parts:  # whichever part is named, the set is read
        ck = load(given)
        assert ck.names() == sorted(ck.names(), key=ref.names().index) and set(ck.names()) == set(ref.names())
        assert ck.files == tuple(str(p) for p in parts)
        assert ck.metadata["gguf_split"] == {"split.no": 0, "split.count": 2, "split.tensors.count": 4,
                                             "files": [p.name for p in parts]}
        assert not any(k.startswith("split.") for k in ck.metadata["gguf_kv"])
        assert ck.metadata["gguf_kv"]["llama.block_count"] == 1
        for name in ref.names():
            a, b = ref[name], ck[name]
            va = a.dequantize() if hasattr(a, "dequantize") and not hasattr(a, "data") else np.asarray(a.data)
            vb = b.dequantize() if hasattr(b, "dequantize") and not hasattr(b, "data") else np.asarray(b.data)
            assert np.array_equal(va, vb), name


def test_folder_with_a_split_set_is_one_model(tmp_path):
    parts = _split_set(tmp_path / "s")
    assert load(tmp_path / "s").path == str(parts[0])


def test_missing_part_is_named(tmp_path):
    parts = _split_set(tmp_path / "s", count=3)
    parts[2].unlink()
    with pytest.raises(InputNotFoundError) as exc:
        load(parts[0])
    assert "model-00003-of-00003.gguf" in str(exc.value)


def test_foreign_part_is_named(tmp_path):
    mine = _split_set(tmp_path / "a")
    other = _split_set(tmp_path / "b", seed=1, count=3)  # another set: split.count 3
    shutil.copy(other[1], mine[1])
    with pytest.raises(FormatError) as exc:
        load(mine[0])
    e = exc.value
    assert e.field == "split.count" and e.expected == 2 and e.found == 3 and "model-00002-of-00002.gguf" in str(e.file)


def test_tensor_count_checked(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    data = _data()
    _write(folder / "m-00001-of-00002.gguf", {"token_embd.weight": data["token_embd.weight"]}, KV, (0, 2, 5))
    _write(folder / "m-00002-of-00002.gguf", {"output_norm.weight": data["output_norm.weight"]}, None, (1, 2, 5))
    with pytest.raises(FormatError) as exc:
        load(folder / "m-00001-of-00002.gguf")
    assert (exc.value.field, exc.value.expected, exc.value.found) == ("split.tensors.count", 5, 2)


def test_renamed_part_refused(tmp_path):
    parts = _split_set(tmp_path / "s")
    renamed = parts[0].with_name("model.gguf")
    parts[0].rename(renamed)
    with pytest.raises(FormatError, match="does not say which part"):
        load(renamed)


def test_validate_covers_every_part(tmp_path):
    parts = _split_set(tmp_path / "s")
    rep = validate(parts[0]).to_json()
    assert rep["summary"]["tensors_checked"] == 3 and rep["summary"]["verdict"] == "clean"  # 3 quantized of 4
    # a non-finite TQ2_0 block scale in the second part is found
    raw = bytearray(parts[1].read_bytes())
    r = gguf.GGUFReader(parts[1])
    t = next(t for t in r.tensors if t.name == "blk.0.ffn_down.weight")
    off = int(t.data_offset) + 64  # block 0's d (TQ2_0: qs[64], then d)
    raw[off:off + 2] = np.float16(np.nan).tobytes()
    del r, t
    parts[1].write_bytes(bytes(raw))
    rep = validate(parts[0]).to_json()
    bad = [f for f in rep["findings"] if f["code"] == "scale-nonfinite"]
    assert len(bad) == 1 and bad[0]["tensor"] == "model.layers.0.mlp.down_proj.weight"


def test_written_back_as_one_file(tmp_path):
    """GGUF -> GGUF from the parts: one file without split keys, the tensors' bytes those of the whole file
    (TQ2_0 has no exact writer in qckpt, so this set is Q8_0 / Q4_0 / F32 only)."""
    types = {"blk.0.ffn_down.weight": "Q8_0"}
    whole = tmp_path / "whole.gguf"
    _write(whole, _data(0, types), KV, None)
    parts = _split_set(tmp_path / "s", types=types)
    r = CliRunner().invoke(main, ["convert", str(parts[0]), str(tmp_path / "one.gguf"), "--to", "gguf"])
    assert r.exit_code == 0, r.output
    out = gguf.GGUFReader(tmp_path / "one.gguf")
    assert "split.count" not in out.fields and len(out.tensors) == 4
    src = {t.name: np.asarray(t.data).tobytes() for t in gguf.GGUFReader(whole).tensors}
    assert {t.name: np.asarray(t.data).tobytes() for t in out.tensors} == src
