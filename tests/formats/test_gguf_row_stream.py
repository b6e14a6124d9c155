"""A GGUF K-quant write from the format quantizer streams each tensor in row blocks, never whole.

The requantizing view offers the tensors the format's quantizer makes from rows as row blocks
(:meth:`converter.tensor.Checkpoint.row_blocks`); the GGUF writer encodes and pwrites each block at its offset
(:func:`converter.formats.gguf.tensor_plan.encode_rows`). The references: the same convert with the row blocks
turned off (every tensor requantized, encoded and digested whole, as before the stream existed) must give the
same bytes and the same report; and while a streamed tensor is written, the Python allocations in flight stay
below one byte per element (the whole tensor's codes alone are one byte per element), measured with tracemalloc.
"""

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import converter
from converter.formats.gguf import file_write
from converter import rows
from converter.kernels import rtn
from converter.quant import format_quant
from converter.runtime import run_options
from converter.tensor import Checkpoint
from tests.synthetic import Shape, build_gptq

SHAPE = Shape(1, 512, 1408, 4000)  # embedding / head 4000 x 512 (float16), the layers GPTQ 4-bit


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("gptq") / "src"
    build_gptq(src, SHAPE)
    return src


def _convert(src: Path, dst: Path, monkeypatch, *, stream: bool) -> dict:
    if not stream:
        monkeypatch.setattr(Checkpoint, "row_blocks", lambda self, name, **_: None)
    with run_options(workers=1):
        doc = converter.convert(src, dst, to="gguf", target={"quant_type": "Q4_K_M"})
    monkeypatch.undo()
    return json.loads(json.dumps(doc, default=str))


def test_streamed_write_equals_whole_write(source, tmp_path, monkeypatch):
    streamed = _convert(source, tmp_path / "rows.gguf", monkeypatch, stream=True)
    whole = _convert(source, tmp_path / "whole.gguf", monkeypatch, stream=False)
    assert (tmp_path / "rows.gguf").read_bytes() == (tmp_path / "whole.gguf").read_bytes()
    for doc in (streamed, whole):
        doc.pop("destination")
    assert streamed == whole
    assert all(r["readback_bit_exact"] for r in streamed["tensors"])


def test_streamed_tensor_is_never_whole_in_memory(source, tmp_path, monkeypatch):
    with run_options(workers=1):  # (first: the lazy imports and compiled kernels, loaded once per process)
        converter.convert(source, tmp_path / "warm.gguf", to="gguf", target={"quant_type": "Q4_K_M"})
    # blocks of 8 rows of 512 (the working set per block, a few tens of bytes per element, does not grow with
    # the tensor: small blocks, so that what does grow shows)
    monkeypatch.setattr(format_quant, "STREAM_ELEMENTS", 1 << 12)
    monkeypatch.setattr(rtn, "QUANT_BLOCK_ELEMENTS", 1 << 12)
    monkeypatch.setattr(rows, "SUPER_ELEMENTS", 1 << 12)  # (a GPTQ source's rows dequantized on demand)
    seen: dict[str, int] = {}
    real = file_write.encode_rows

    def measured(blocks, p):  # Python's allocations while this tensor is made, encoded and written
        tracemalloc.start()
        try:
            yield from real(blocks, p)
            seen[p.name] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    monkeypatch.setattr(file_write, "encode_rows", measured)
    with run_options(workers=1):
        converter.convert(source, tmp_path / "out.gguf", to="gguf", target={"quant_type": "Q4_K_M"})
    numel = {"model.embed_tokens.weight": SHAPE.vocab * SHAPE.hidden, "lm_head.weight": SHAPE.vocab * SHAPE.hidden,
             "model.layers.0.mlp.gate_proj.weight": SHAPE.mlp * SHAPE.hidden}
    assert set(numel) <= set(seen), sorted(seen)  # the large tensors went through the stream
    for name, n in numel.items():
        # one byte per element is the whole tensor's codes alone (Q4_K / Q6_K: plus scales, bytes, float values);
        # what stays: the error sums per group (8 bytes per 16 or 32 elements) and per row
        assert seen[name] < n, (name, seen[name], n)


def test_reader_row_blocks_are_the_whole_tensors_rows(source, tmp_path, monkeypatch):
    # the read-back proof digests a GGUF block-type tensor from the reader's row blocks: the blocks must be
    # the rows of the tensor loaded whole (same codes, scales, biases, values), so the digest is the same
    from converter.formats import registry
    from converter.formats.gguf import read_rows
    from converter.ops.readback import _row_digest, digest
    with run_options(workers=1):
        converter.convert(source, tmp_path / "out.gguf", to="gguf", target={"quant_type": "Q4_K_M"})
    monkeypatch.setattr(read_rows, "ROW_BLOCK_ELEMENTS", 1 << 16)  # several blocks per tensor
    out = registry.load(tmp_path / "out.gguf")
    offered = []
    for name in out.names():
        blocks = out.row_blocks(name)
        whole = out[name]
        if blocks is None:
            continue
        offered.append(name)
        parts = list(blocks)
        assert [r0 for r0, _ in parts] == list(np.cumsum([0] + [b.shape[0] for _, b in parts[:-1]]))
        assert np.array_equal(np.concatenate([b.codes for _, b in parts]), whole.codes)
        assert np.array_equal(np.concatenate([b.dequantize() for _, b in parts]), whole.dequantize())
        assert _row_digest(out, name) == digest(whole)
    assert "lm_head.weight" in offered and "model.embed_tokens.weight" in offered
    # q/k rows are stored permuted (llama.cpp's order): read whole, un-permuted
    assert out.row_blocks("model.layers.0.self_attn.q_proj.weight") is None
    assert out.row_blocks("model.norm.weight") is None  # dense


def test_quantized_rows_without_figures_are_the_same_blocks():
    # the q/k proof reads the view's blocks with values_only (no error sums): the same codes and parameters
    from converter.formats.gguf.requant import GGUF_QUANTIZER, named_type
    from converter.layout import IN, OUT
    x = (np.random.default_rng(3).standard_normal((300, 512)) * 0.02).astype(np.float32)
    scheme, gm = named_type("Q4_K")
    full = format_quant.QuantizedRows(GGUF_QUANTIZER, x, scheme, gm, axes=(OUT, IN), name="w")
    bare = format_quant.QuantizedRows(GGUF_QUANTIZER, x, scheme, gm, axes=(OUT, IN), name="w", figures=False)
    a, b = list(full), list(bare)
    assert [r0 for r0, _ in a] == [r0 for r0, _ in b]
    for (_, p), (_, q) in zip(a, b):
        assert np.array_equal(p.codes, q.codes) and np.array_equal(p.scales, q.scales)
        assert np.array_equal(p.zero_points, q.zero_points)
    assert full.result().vs_source.numel == x.size
    with pytest.raises(ValueError, match="without figures"):
        bare.result()


def test_non_finite_value_in_a_streamed_tensor_is_the_same_error(source, tmp_path, monkeypatch):
    # a NaN in the float16 head: the streamed write refuses it with the error the whole write gives, and
    # leaves nothing at the destination
    import shutil
    import struct

    from converter.errors import ConverterError
    bad = tmp_path / "nan"
    shutil.copytree(source, bad)
    data = bytearray((bad / "model.safetensors").read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    start = json.loads(data[8:8 + n])["lm_head.weight"]["data_offsets"][0]
    at = 8 + n + start + 2 * (2500 * SHAPE.hidden + 7)  # row 2500, column 7
    data[at:at + 2] = np.array([np.nan], np.float16).tobytes()
    (bad / "model.safetensors").write_bytes(bytes(data))
    errors = []
    for stream in (True, False):
        if not stream:
            monkeypatch.setattr(Checkpoint, "row_blocks", lambda self, name, **_: None)
        with pytest.raises(ConverterError) as exc, run_options(workers=1):
            converter.convert(bad, tmp_path / "out.gguf", to="gguf", target={"quant_type": "Q4_K_M"})
        errors.append((type(exc.value), exc.value.render()))
        assert not (tmp_path / "out.gguf").exists()
    assert errors[0] == errors[1]
    assert "lm_head.weight" in errors[0][1] and "not finite" in errors[0][1]


@pytest.mark.malformed_ok
def test_foreign_exception_while_reading_row_blocks_is_a_converter_error(monkeypatch):
    # the registry's safety net (only ConverterError escapes a reader) covers the reader's row blocks as it
    # covers its loader: an unexpected exception raised while a later block is read names the file and tensor
    from converter.errors import MalformedInputError
    from converter.formats import registry
    from converter.formats.gguf import read_rows
    path = Path(__file__).resolve().parents[2] / "sample_checkpoints" / "gguf" / "minilm_llamacpp_Q6_K.gguf"
    name = "encoder.layer.0.intermediate.dense.weight"  # (1536, 384) Q8_0 (Q6_K's fallback for 384 columns)
    monkeypatch.setattr(read_rows, "ROW_BLOCK_ELEMENTS", 384 * 512)  # three blocks
    calls = []
    real = read_rows.tensor_from_fields

    def second_fails(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise IndexError("index 7 is out of bounds")
        return real(*args, **kwargs)

    monkeypatch.setattr(read_rows, "tensor_from_fields", second_fails)
    blocks = registry.load(path).row_blocks(name)
    assert blocks is not None
    assert next(blocks)[0] == 0
    with pytest.raises(MalformedInputError) as exc:
        next(blocks)
    assert exc.value.tensor == name and str(path) in str(exc.value.file) and "IndexError" in str(exc.value)


def test_error_while_making_a_tensors_row_blocks_names_the_tensor(source, tmp_path, monkeypatch):
    # making the row blocks runs the source's loader and the target's checks before the first block: an error
    # there names the tensor being written, as the whole write's errors do (file_write adds the context)
    from converter.errors import ConverterError, NotRepresentableError
    from converter.ops import requantize_model
    name = "model.layers.0.mlp.gate_proj.weight"
    real = requantize_model.format_rows_target

    def refuse(t, target, fmt):
        if t.name == name:
            raise NotRepresentableError("refused for the test", field="scheme")
        return real(t, target, fmt)

    monkeypatch.setattr(requantize_model, "format_rows_target", refuse)
    with pytest.raises(ConverterError) as exc, run_options(workers=1):
        converter.convert(source, tmp_path / "out.gguf", to="gguf", target={"quant_type": "Q4_K_M"})
    assert exc.value.tensor == name and "refused for the test" in str(exc.value)
    assert not (tmp_path / "out.gguf").exists()
