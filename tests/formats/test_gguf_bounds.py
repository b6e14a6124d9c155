"""Bounded GGUF header pre-check: crafted bytes for each error kind, real and GGUFWriter files pass."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from converter.errors import CorruptFileError, InputNotFoundError
from converter.formats.gguf.bounds import check_gguf_bounds
from tests.conftest import SAMPLES

U32, STR, ARR, U8 = 4, 8, 9, 0


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key, vtype, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def tinfo(name, ne, gtype, offset) -> bytes:
    return s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne) \
        + struct.pack("<I", gtype) + struct.pack("<Q", offset)


def build(kvs=(), tensors=(), data=b"", *, version=3, n_tensors=None, n_kv=None, alignment=32, magic=b"GGUF"):
    """GGUF bytes: header, kvs, tensor infos, padding to ``alignment``, ``data``."""
    head = magic + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(tensors)
    pad = (-len(body)) % alignment
    return body + b"\0" * pad + data


def f32_tensor(name="w", ne=(4, 2), offset=0):
    return tinfo(name, ne, 0, offset)


def write(tmp_path, raw: bytes, name="x.gguf"):
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def expect(tmp_path, raw, field, msg, tensor=None):
    with pytest.raises(CorruptFileError) as ei:
        check_gguf_bounds(write(tmp_path, raw))
    e = ei.value
    assert e.field == field, e.render()
    assert msg in e.message, e.render()
    assert e.tensor == tensor
    assert e.file and e.file.endswith("x.gguf")
    return e


def test_minimal_valid(tmp_path):
    raw = build([kv("general.architecture", STR, s("llama"))], [f32_tensor()], b"\0" * 32)
    b = check_gguf_bounds(write(tmp_path, raw))
    assert b.version == 3 and b.alignment == 32 and b.tensors[0].nbytes == 32
    assert b.data_start + 32 == b.file_size


@pytest.mark.parametrize("path", sorted((SAMPLES / "gguf").glob("*.gguf")), ids=lambda p: p.name)
def test_real_samples_pass(path):
    b = check_gguf_bounds(path)
    assert len(b.tensors) == 14
    assert max(t.offset + t.nbytes for t in b.tensors) + b.data_start == b.file_size


def test_gguf_writer_file_passes(tmp_path):
    import gguf
    p = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_custom_alignment(64)
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_tensor("a", np.arange(64, dtype=np.float32).reshape(2, 32))
    q = gguf.quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), gguf.GGMLQuantizationType.Q8_0)
    w.add_tensor("b", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    b = check_gguf_bounds(p)
    assert b.alignment == 64 and [t.type_name for t in b.tensors] == ["F32", "Q8_0"]
    assert [t.ne for t in b.tensors] == [(32, 2), (32, 2)]
    gguf.GGUFReader(p)  # and the library agrees


def test_missing_file(tmp_path):
    with pytest.raises(InputNotFoundError):
        check_gguf_bounds(tmp_path / "nope.gguf")


def test_bad_magic(tmp_path):
    e = expect(tmp_path, build(magic=b"GGUX"), "magic", "bad magic")
    assert e.expected == "b'GGUF'" and e.found == "b'GGUX'"


def test_short_file(tmp_path):
    expect(tmp_path, b"GGUF\x03\0\0\0", "header", "too short")


@pytest.mark.parametrize("version", [1, 4, 0x12345678])
def test_bad_version(tmp_path, version):
    e = expect(tmp_path, build(version=version), "version", "unsupported GGUF version")
    assert e.expected == "2 or 3"


def test_big_endian_version_detected(tmp_path):
    raw = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
    b = check_gguf_bounds(write(tmp_path, raw))
    assert b.byteorder == "big"


def test_huge_tensor_count(tmp_path):
    e = expect(tmp_path, build(n_tensors=2**63), "tensor_count", "exceeds what the file could hold")
    assert e.found == 2**63


def test_huge_kv_count(tmp_path):
    expect(tmp_path, build(n_kv=10**12), "metadata_kv_count", "exceeds what the file could hold")


def test_string_length_past_end(tmp_path):
    raw = build([struct.pack("<Q", 2**40) + b"general.x"])
    expect(tmp_path, raw, "kv[0].key", "string length runs past the end")


def test_key_not_utf8(tmp_path):
    raw = build([kv(b"general.\xff", STR, s("x"))])
    expect(tmp_path, raw, "kv[0].key", "not valid UTF-8")


def test_tensor_name_not_utf8(tmp_path):
    raw = build([], [tinfo(b"w\xfe", (8,), 0, 0)], b"\0" * 32)
    expect(tmp_path, raw, "tensor_info[0].name", "not valid UTF-8")


def test_string_value_bytes_are_not_judged(tmp_path):
    check_gguf_bounds(write(tmp_path,
                            build([kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 1) + s(b"\xff"))])))


def test_array_length_past_end(tmp_path):
    raw = build([kv("tokenizer.ggml.scores", ARR, struct.pack("<IQ", 6, 2**62))])
    expect(tmp_path, raw, "tokenizer.ggml.scores.array_length", "array length exceeds")


def test_string_array_length_past_end(tmp_path):
    raw = build([kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 10**9) + s("a"))])
    expect(tmp_path, raw, "tokenizer.ggml.tokens.array_length", "array length exceeds")


def test_unknown_value_type(tmp_path):
    expect(tmp_path, build([kv("general.x", 13, b"\0" * 8)]), "general.x", "unknown value type")


def test_unknown_array_element_type(tmp_path):
    raw = build([kv("general.x", ARR, struct.pack("<IQ", 99, 1) + b"\0" * 8)])
    expect(tmp_path, raw, "general.x.array_type", "unknown array element type")


def test_deeply_nested_array(tmp_path):
    payload = struct.pack("<IQ", ARR, 1) * 20 + struct.pack("<IQ", U8, 0)
    raw = build([kv("general.x", ARR, payload)])
    expect(tmp_path, raw, "general.x", "nested too deeply")


def test_truncated_value(tmp_path):
    raw = build([kv("general.alignment", U32, b"\x20")], alignment=1)
    expect(tmp_path, raw, "general.alignment", "truncated")


def test_duplicate_key(tmp_path):
    raw = build([kv("general.name", STR, s("a")), kv("general.name", STR, s("b"))])
    e = expect(tmp_path, raw, "general.name", "duplicate metadata key")
    assert e.found == "'general.name' twice"


@pytest.mark.parametrize("align", [0, 3, 48])
def test_alignment_not_power_of_two(tmp_path, align):
    raw = build([kv("general.alignment", U32, struct.pack("<I", align))])
    e = expect(tmp_path, raw, "general.alignment", "power of two")
    assert e.found == align


def test_alignment_wrong_type(tmp_path):
    raw = build([kv("general.alignment", 10, struct.pack("<Q", 32))])
    e = expect(tmp_path, raw, "general.alignment", "wrong type")
    assert e.expected == "UINT32" and e.found == "UINT64"


def test_too_many_dims(tmp_path):
    raw = build([], [tinfo("w", (1, 1, 1, 1, 1), 0, 0)], b"\0" * 32)
    e = expect(tmp_path, raw, "n_dims", "too many dimensions", tensor="w")
    assert e.found == 5


def test_dims_product_overflow(tmp_path):
    raw = build([], [tinfo("w", (2**32, 2**32, 2**32), 0, 0)], b"\0" * 32)
    expect(tmp_path, raw, "ne", "overflows int64", tensor="w")


def test_dims_product_wraps_u64_to_small(tmp_path):
    # 2**32 * 2**32 wraps to 0 in u64 arithmetic; Python ints do not wrap, so it is refused.
    raw = build([], [tinfo("w", (2**32, 2**32), 0, 0)], b"\0" * 32)
    expect(tmp_path, raw, "ne", "overflows int64", tensor="w")


def test_unknown_ggml_type(tmp_path):
    raw = build([], [tinfo("w", (32,), 4, 0)], b"\0" * 32)  # 4 (Q4_2) was removed from ggml
    e = expect(tmp_path, raw, "ggml_type", "unknown ggml type", tensor="w")
    assert e.found == 4


def test_ne0_not_multiple_of_block(tmp_path):
    raw = build([], [tinfo("w", (33, 1), 8, 0)], b"\0" * 64)
    e = expect(tmp_path, raw, "ne", "block size", tensor="w")
    assert e.expected == "multiple of 32 for Q8_0" and e.found == 33


def test_zero_dims_block_type(tmp_path):
    # fuzz finding: GGUFReader raised IndexError (quant_shape_to_byte_shape of an empty shape)
    raw = build([], [tinfo("w", (), 8, 0)], b"\0" * 64)
    expect(tmp_path, raw, "n_dims", "at least one dimension", tensor="w")


def test_zero_dims_f32_scalar_ok(tmp_path):
    b = check_gguf_bounds(write(tmp_path, build([], [tinfo("w", (), 0, 0)], b"\0" * 32)))
    assert b.tensors[0].nbytes == 4


def test_misaligned_offset(tmp_path):
    raw = build([], [f32_tensor(offset=4)], b"\0" * 64)
    e = expect(tmp_path, raw, "offset", "not aligned", tensor="w")
    assert e.found == 4


def test_tensor_data_past_end(tmp_path):
    raw = build([], [f32_tensor()], b"\0" * 31)
    e = expect(tmp_path, raw, "offset", "outside the file", tensor="w")
    assert "32 bytes" in e.expected


def test_tensor_offset_huge(tmp_path):
    raw = build([], [f32_tensor(offset=2**64 - 32)], b"\0" * 32)
    expect(tmp_path, raw, "offset", "outside the file", tensor="w")


def test_overlapping_tensors(tmp_path):
    raw = build([], [f32_tensor("a", (16,)), f32_tensor("b", (8,), 32)], b"\0" * 64)
    expect(tmp_path, raw, "offset", "overlaps", tensor="b")


def test_duplicate_tensor_name(tmp_path):
    raw = build([], [f32_tensor("a"), f32_tensor("a", offset=32)], b"\0" * 64)
    expect(tmp_path, raw, "name", "duplicate tensor name", tensor="a")


def test_truncated_tensor_info(tmp_path):
    raw = build([], [f32_tensor()])[:24 + 8 + 1 + 4 + 16]  # cut inside ne / type
    expect(tmp_path, raw, "ggml_type", "truncated", tensor="w")


def test_data_start_past_end(tmp_path):
    body = b"GGUF" + struct.pack("<IQQ", 3, 1, 0) + tinfo("w", (0,), 0, 0)
    assert len(body) % 32
    expect(tmp_path, body, "data_start", "past the end")
