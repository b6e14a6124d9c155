"""Tests for converter.formats.safetensors_io: one crafted-bytes test per header error, round trips
through the safetensors library, determinism, streaming order, and a mutation property test."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load_file

from converter.dtypes import DTYPES, name_for_numpy
from converter.errors import ConverterError, CorruptFileError, FormatError, MissingTensorError
from converter.formats.safetensors_io import MAX_HEADER_SIZE, open_safetensors, read_header, read_tensor
from converter.write.safetensors import SafetensorsWriter, write_safetensors

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ helpers

def st_bytes(header: dict | bytes | str, data: bytes = b"", n: int | None = None) -> bytes:
    """Build safetensors bytes by hand: ``N`` (or the given ``n``), header, data."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header) if n is None else n) + header + data


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


@pytest.fixture
def put(tmp_path):
    """Write bytes to a file and return its path."""
    def _put(raw: bytes, name: str = "x.safetensors") -> Path:
        p = tmp_path / name
        p.write_bytes(raw)
        return p
    return _put


def corrupt(put, raw: bytes) -> CorruptFileError:
    with pytest.raises(CorruptFileError) as info:
        read_header(put(raw))
    return info.value


# ------------------------------------------------------------------------------------------ reader errors

def test_file_shorter_than_8_bytes(put):
    err = corrupt(put, b"\x01\x02\x03")
    assert err.field == "header_length" and "too short" in str(err) and "3 bytes" in str(err)


def test_header_length_over_cap(put):
    err = corrupt(put, struct.pack("<Q", MAX_HEADER_SIZE + 1) + b"{}")
    assert err.field == "header_length" and "exceeds the cap" in str(err)
    assert str(MAX_HEADER_SIZE + 1) in str(err)


def test_git_lfs_pointer_stub(put):
    stub = b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n"
    err = corrupt(put, stub)
    assert "git-LFS pointer" in str(err) and "git lfs pull" in str(err) and err.field == "header_length"


def test_header_past_end_of_file(put):
    err = corrupt(put, st_bytes(b"{}", n=100))
    assert err.field == "header_length" and "past the end" in str(err)


def test_header_not_utf8(put):
    err = corrupt(put, st_bytes(b'{"\xff": 1}'))
    assert err.field == "header" and "UTF-8" in str(err)


def test_header_not_json(put):
    err = corrupt(put, st_bytes(b'{"a": '))
    assert err.field == "header" and "not valid JSON" in str(err)


def test_header_nan_is_not_json(put):
    err = corrupt(put, st_bytes(b'{"a": NaN}'))
    assert "not valid JSON" in str(err)


def test_header_not_object(put):
    err = corrupt(put, st_bytes(b"[1, 2]"))
    assert err.field == "header" and "not an object" in str(err) and "list" in str(err)


def test_duplicate_tensor_key(put):
    head = '{"w": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, ' \
           '"w": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}'
    err = corrupt(put, st_bytes(head, b"\0\0"))
    assert err.tensor == "w" and "duplicate key" in str(err)


def test_entry_not_object(put):
    err = corrupt(put, st_bytes({"w": [1, 2]}))
    assert err.tensor == "w" and "not an object" in str(err)


def test_entry_unknown_field(put):
    e = entry("U8", [1], 0, 1) | {"extra": 1}
    err = corrupt(put, st_bytes({"w": e}, b"\0"))
    assert err.tensor == "w" and "wrong fields" in str(err) and "extra" in str(err)


def test_entry_missing_field(put):
    err = corrupt(put, st_bytes({"w": {"dtype": "U8", "shape": [1]}}, b"\0"))
    assert err.tensor == "w" and "wrong fields" in str(err)


def test_unknown_dtype_lists_known(put):
    err = corrupt(put, st_bytes({"w": entry("F13", [1], 0, 1)}, b"\0"))
    assert err.tensor == "w" and err.field == "dtype" and "F13" in str(err)
    assert "'BF16'" in str(err) and "'F8_E4M3'" in str(err)


@pytest.mark.parametrize("shape", [[-1], [1.0], ["2"], [True], 3, [2**64]])
def test_bad_shape(put, shape):
    err = corrupt(put, st_bytes({"w": entry("U8", [1], 0, 1) | {"shape": shape}}, b"\0"))
    assert err.tensor == "w" and err.field == "shape"


@pytest.mark.parametrize("offsets", [[0], [0, 1, 2], [-1, 0], [0.0, 1], "0,1", None])
def test_bad_offsets(put, offsets):
    err = corrupt(put, st_bytes({"w": entry("U8", [1], 0, 1) | {"data_offsets": offsets}}, b"\0"))
    assert err.tensor == "w" and err.field == "data_offsets" and "two non-negative" in str(err)


def test_offsets_end_before_begin(put):
    err = corrupt(put, st_bytes({"w": entry("U8", [0], 2, 1)}, b"\0\0"))
    assert err.tensor == "w" and err.field == "data_offsets" and "end before begin" in str(err)


def test_metadata_not_object(put):
    err = corrupt(put, st_bytes({"__metadata__": ["a"]}))
    assert err.field == "__metadata__" and "not an object" in str(err)


def test_metadata_non_string_value(put):
    err = corrupt(put, st_bytes({"__metadata__": {"format": 1}}))
    assert err.field == "__metadata__" and "'format'" in str(err) and "int" in str(err)


def test_first_tensor_not_at_zero(put):
    err = corrupt(put, st_bytes({"w": entry("U8", [1], 1, 2)}, b"\0\0"))
    assert err.tensor == "w" and err.field == "data_offsets" and "gap" in str(err)
    assert "begin == 0" in str(err)


def test_gap_between_tensors(put):
    head = {"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 3, 5)}
    err = corrupt(put, st_bytes(head, b"\0" * 5))
    assert err.tensor == "b" and "gap" in str(err) and "begin == 2" in str(err)


def test_overlapping_tensors(put):
    head = {"a": entry("U8", [2], 0, 2), "b": entry("U8", [2], 1, 3)}
    err = corrupt(put, st_bytes(head, b"\0" * 3))
    assert err.tensor == "b" and "overlaps" in str(err)


def test_sub_byte_misaligned(put):
    err = corrupt(put, st_bytes({"w": entry("F4", [3], 0, 2)}, b"\0\0"))
    assert err.tensor == "w" and err.field == "shape" and "whole number of bytes" in str(err)
    assert "3 x 4 bits" in str(err)


def test_size_mismatch(put):
    err = corrupt(put, st_bytes({"w": entry("F32", [2], 0, 4)}, b"\0" * 4))
    assert err.tensor == "w" and err.field == "data_offsets" and "8 bytes" in str(err)


def test_hostile_shape_is_bounded(put):
    # 1000 dims of 2**63: an unbounded product would be a 63,000-bit integer per tensor.
    err = corrupt(put, st_bytes({"w": entry("U8", [2**63] * 1000, 0, 4)}, b"\0" * 4))
    assert err.tensor == "w" and err.field == "shape" and "overflows" in str(err)


def test_trailing_bytes(put):
    err = corrupt(put, st_bytes({"w": entry("U8", [1], 0, 1)}, b"\0\0"))
    assert err.field == "data_offsets" and "trailing bytes" in str(err)


def test_truncated_data(put):
    err = corrupt(put, st_bytes({"w": entry("U8", [4], 0, 4)}, b"\0\0"))
    assert "truncated" in str(err) and "4 data bytes" in str(err)


# ------------------------------------------------------------------------------------------ reader ok

def test_leading_whitespace_and_padding_tolerated(put):
    head = ' {"w": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}   '
    h = read_header(put(st_bytes(head, b"\x07\x09")))
    assert list(h.tensors) == ["w"] and h.data_start == 8 + len(head)
    assert read_tensor(h, "w").tolist() == [7, 9]


def test_entries_out_of_file_order_are_sorted(put):
    head = {"b": entry("U8", [1], 1, 2), "a": entry("U8", [1], 0, 1), "__metadata__": {"k": "v"}}
    h = read_header(put(st_bytes(head, b"\x01\x02")))
    assert list(h.tensors) == ["a", "b"] and h.metadata == {"k": "v"}


def test_empty_header(put):
    h = read_header(put(st_bytes(b"{}")))
    assert h.tensors == {} and h.file_size == 10


def test_missing_tensor(put):
    f = open_safetensors(put(st_bytes({"w": entry("U8", [1], 0, 1)}, b"\0")))
    with pytest.raises(MissingTensorError) as info:
        f.get("nope")
    assert info.value.tensor == "nope" and "'w'" in str(info.value)
    assert isinstance(info.value, KeyError)


def test_sub_byte_read_as_raw_bytes(put):
    h = read_header(put(st_bytes({"w": entry("F4", [2, 3], 0, 3)}, b"\x12\x34\x56")))
    arr = read_tensor(h, "w")
    assert arr.dtype == np.uint8 and arr.shape == (3,) and arr.tolist() == [0x12, 0x34, 0x56]


def test_read_tensor_is_read_only(put):
    h = read_header(put(st_bytes({"w": entry("F32", [2], 0, 8)}, np.array([1.5, -2], "<f4").tobytes())))
    arr = read_tensor(h, "w")
    assert arr.tolist() == [1.5, -2.0]
    with pytest.raises(ValueError):
        arr[0] = 3


# ------------------------------------------------------------------------------------------ writer

def sample_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {
        "f32": rng.standard_normal((5, 7)).astype(np.float32),
        "f16": rng.standard_normal((3, 11)).astype(np.float16),
        "bf16": rng.standard_normal((13,)).astype(ml_dtypes.bfloat16),
        "f64": rng.standard_normal((2, 3)),
        "i8": rng.integers(-128, 128, (4, 5), dtype=np.int8),
        "u8": rng.integers(0, 256, (17,), dtype=np.uint8),
        "i32": rng.integers(-2**31, 2**31, (3,), dtype=np.int32),
        "i64": np.array(-42, dtype=np.int64),  # 0-d scalar
        "u16": np.arange(6, dtype=np.uint16).reshape(2, 3),
        "bool": np.array([True, False, True]),
        "empty": np.zeros((0, 4), np.float32),
        "f8": rng.standard_normal((9,)).astype(ml_dtypes.float8_e4m3fn),
        "transposed": np.arange(12, dtype=np.int32).reshape(3, 4).T,  # not C-contiguous
        "bigendian": np.arange(3, dtype=">f4"),
    }


def test_round_trip_through_safetensors_library(tmp_path):
    tensors = sample_tensors()
    path = tmp_path / "out.safetensors"
    write_safetensors(path, tensors, {"format": "pt"})
    # safetensors.numpy cannot build F8 arrays (it looks for np.float8_e4m3fn); ours is checked below.
    del tensors["f8"]
    write_safetensors(tmp_path / "lib.st", tensors)
    loaded = load_file(tmp_path / "lib.st")
    assert set(loaded) == set(tensors)
    for name, arr in tensors.items():
        got = loaded[name]
        assert got.shape == arr.shape, name
        assert got.dtype == arr.dtype.newbyteorder("=") or name == "bigendian", name
        np.testing.assert_array_equal(got.astype(np.float64), arr.astype(np.float64), err_msg=name)
    with safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        for name in tensors:
            if name == "bf16":
                continue
            np.testing.assert_array_equal(f.get_tensor(name), tensors[name], err_msg=name)
    ours = open_safetensors(path)
    for name, arr in sample_tensors().items():
        np.testing.assert_array_equal(ours.get(name).astype(np.float64), arr.astype(np.float64))


def test_layout_matches_library_order(tmp_path):
    tensors = {k: v for k, v in sample_tensors().items() if k not in {"bf16", "f8", "bigendian"}}
    from safetensors.numpy import save_file
    save_file(tensors, tmp_path / "lib.safetensors")
    write_safetensors(tmp_path / "ours.safetensors", tensors)
    lib = read_header(tmp_path / "lib.safetensors").tensors
    ours = read_header(tmp_path / "ours.safetensors").tensors
    assert [(t.name, t.begin, t.end) for t in lib.values()] == [(t.name, t.begin, t.end) for t in ours.values()]


def test_header_is_padded_to_8(tmp_path):
    write_safetensors(tmp_path / "a.st", {"x": np.zeros(3, np.uint8)})
    h = read_header(tmp_path / "a.st")
    assert h.header_len % 8 == 0 and h.data_start % 8 == 0


def test_deterministic_across_runs_and_processes(tmp_path):
    tensors = sample_tensors()
    write_safetensors(tmp_path / "a.st", tensors, {"b": "2", "a": "1"})
    write_safetensors(tmp_path / "b.st", dict(reversed(list(tensors.items()))), {"a": "1", "b": "2"})
    a = (tmp_path / "a.st").read_bytes()
    assert a == (tmp_path / "b.st").read_bytes()
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from tests.formats.test_safetensors_io import sample_tensors;"
        "from converter.write.safetensors import write_safetensors;"
        "write_safetensors(sys.argv[2], sample_tensors(), {'a': '1', 'b': '2'})"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    subprocess.run([sys.executable, "-c", script, str(REPO), str(tmp_path / "c.st")], check=True, env=env)
    assert a == (tmp_path / "c.st").read_bytes()


def test_shuffled_write_order_identical(tmp_path):
    tensors = sample_tensors()
    entries = [(n, name_for_numpy(a.dtype), a.shape) for n, a in tensors.items()]
    outputs = []
    for seed in (1, 2, 3):
        names = list(tensors)
        random.Random(seed).shuffle(names)
        path = tmp_path / f"s{seed}.st"
        with SafetensorsWriter(path, entries, {"format": "pt"}) as w:
            for n in names:
                w.write(n, tensors[n])
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]


def test_write_wrong_shape(tmp_path):
    with SafetensorsWriter(tmp_path / "a.st", [("w", "F32", (2, 3))]) as w:
        with pytest.raises(FormatError) as info:
            w.write("w", np.zeros((3, 2), np.float32))
        assert info.value.tensor == "w" and info.value.field == "shape" and "[2, 3]" in str(info.value)
        w.write("w", np.zeros((2, 3), np.float32))


def test_write_wrong_dtype(tmp_path):
    with SafetensorsWriter(tmp_path / "a.st", [("w", "BF16", (2,))]) as w:
        with pytest.raises(FormatError) as info:
            w.write("w", np.zeros(2, np.float16))
        assert info.value.field == "dtype" and "BF16" in str(info.value) and "F16" in str(info.value)
        w.write("w", np.zeros(2, ml_dtypes.bfloat16))


def test_write_twice_and_unplanned(tmp_path):
    with SafetensorsWriter(tmp_path / "a.st", [("w", "U8", (1,))]) as w:
        w.write("w", np.zeros(1, np.uint8))
        with pytest.raises(FormatError, match="written twice"):
            w.write("w", np.zeros(1, np.uint8))
        with pytest.raises(FormatError, match="not planned"):
            w.write("v", np.zeros(1, np.uint8))


def test_close_with_missing_tensor(tmp_path):
    w = SafetensorsWriter(tmp_path / "a.st", [("a", "U8", (1,)), ("b", "U8", (1,))])
    w.write("a", np.zeros(1, np.uint8))
    with pytest.raises(FormatError) as info:
        w.close()
    assert info.value.tensor == "b" and "never written" in str(info.value)


def test_context_manager_exception_skips_validation(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with SafetensorsWriter(tmp_path / "a.st", [("a", "U8", (1,))]):
            raise RuntimeError("boom")


def test_plan_errors(tmp_path):
    with pytest.raises(FormatError, match="planned twice"):
        SafetensorsWriter(tmp_path / "a.st", [("a", "U8", (1,)), ("a", "U8", (1,))])
    with pytest.raises(FormatError) as info:
        SafetensorsWriter(tmp_path / "a.st", [("a", "F13", (1,))])
    assert info.value.tensor == "a" and "F13" in str(info.value)
    with pytest.raises(FormatError, match="whole number of bytes"):
        SafetensorsWriter(tmp_path / "a.st", [("a", "F4", (3,))])
    with pytest.raises(FormatError, match="non-negative"):
        SafetensorsWriter(tmp_path / "a.st", [("a", "U8", (-1,))])
    with pytest.raises(FormatError, match="str to str"):
        SafetensorsWriter(tmp_path / "a.st", [], {"a": 1})
    with pytest.raises(FormatError, match="no safetensors equivalent"):
        write_safetensors(tmp_path / "a.st", {"s": np.array(["x"])})


def test_sub_byte_write_round_trip(tmp_path):
    with SafetensorsWriter(tmp_path / "a.st", [("w", "F4", (2, 3)), ("z", "F32", (1,))]) as w:
        w.write("w", np.array([1, 2, 3], np.uint8))
        w.write("z", np.ones(1, np.float32))
    h = read_header(tmp_path / "a.st")
    assert h.tensors["w"].shape == (2, 3) and read_tensor(h, "w").tolist() == [1, 2, 3]


def test_dtype_table_covers_required():
    for name in ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16", "F32",
                 "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"]:
        assert name in DTYPES
    assert DTYPES["F4"].numpy is None and DTYPES["F4"].bits == 4
    assert DTYPES["BF16"].numpy == np.dtype(ml_dtypes.bfloat16)
    assert name_for_numpy(np.dtype(np.uint8)) == "U8"


# ------------------------------------------------------------------------------------------ property

def _valid_small_file() -> bytes:
    head = {"__metadata__": {"format": "pt"}, "a": entry("F32", [2], 0, 8), "b": entry("F4", [4], 8, 10),
            "c": entry("I8", [0, 3], 10, 10)}
    return st_bytes(head, bytes(range(10)))


_VALID = _valid_small_file()

_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, len(_VALID) - 1), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, len(_VALID) - 1), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, len(_VALID)), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, len(_VALID) - 1), st.just(0)),
)


def _mutate(raw: bytes, ops) -> bytes:
    buf = bytearray(raw)
    for kind, pos, arg in ops:
        pos = min(pos, len(buf))
        if kind == "flip" and pos < len(buf):
            buf[pos] ^= 1 << arg
        elif kind == "truncate":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = bytes([arg])
        elif kind == "delete" and pos < len(buf):
            del buf[pos]
    return bytes(buf)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(_mutation, min_size=1, max_size=4))
def test_mutations_only_raise_converter_errors(tmp_path, ops):
    path = tmp_path / "m.safetensors"
    path.write_bytes(_mutate(_VALID, ops))
    try:
        h = read_header(path)
    except ConverterError:
        return
    for name in h.tensors:  # a header that validates must also read
        read_tensor(h, name)


def test_deeply_nested_json_is_corrupt_not_recursion(put):
    err = corrupt(put, st_bytes(b"[" * 200_000))
    assert err.field == "header" and "not valid JSON" in str(err)


def test_missing_file(tmp_path):
    from converter.errors import InputNotFoundError
    with pytest.raises(InputNotFoundError) as info:
        read_header(tmp_path / "absent.safetensors")
    assert "absent.safetensors" in str(info.value) and isinstance(info.value, FileNotFoundError)
