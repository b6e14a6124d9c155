"""Streaming write path: workers, row blocks, packed-word fast paths and blocked kernels.

Functional only (no timings): every fast path must give the bytes / values the plain path gives.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from converter import load
from converter.cli import main
from converter.errors import FormatError, QuantizationError
from converter.formats import registry
from converter.runtime import parse_size, run_options
from converter.write.engine import collect_results, run_tasks, task_result
from converter.write.progress import Progress
from converter.layout import IN, OUT, AxisMap, PackedCodes, equal_transposed, transpose_2d
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor

from ..conftest import TINY


def _data_bytes(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.suffix == ".safetensors"}


def _materialised(ckpt):
    """The same checkpoint fully in memory, codes unpacked (the non-streaming path)."""
    tensors = []
    for name in ckpt.names():
        t = ckpt[name]
        if isinstance(t, QuantizedTensor):
            t = t.replace(codes=np.array(t.codes))
            assert t.packed is None
        else:
            t = DenseTensor(name, np.array(t.data))
        tensors.append(t)
    return Checkpoint.from_tensors(tensors, format=ckpt.format, config=ckpt.config, metadata=ckpt.metadata)


# -- the write path ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["compressed-tensors", "plain", "native", "gptq", "mlx"])
def test_streaming_equals_in_memory(gptq_dir, tmp_path, fmt):
    ckpt = load(gptq_dir)
    with run_options(workers=1):
        registry.get(fmt).write(ckpt, tmp_path / "stream", overwrite=True)
        registry.get(fmt).write(_materialised(ckpt), tmp_path / "memory", overwrite=True)
    a, b = tmp_path / "stream", tmp_path / "memory"
    if a.is_dir():
        assert _data_bytes(a) == _data_bytes(b)
    else:
        assert a.read_bytes() == b.read_bytes()


@pytest.mark.parametrize("fmt", ["compressed-tensors", "plain", "native", "gptq"])
def test_workers_give_identical_files(gptq_dir, tmp_path, fmt):
    ckpt = load(gptq_dir)
    outs = []
    for n in (1, 2):
        with run_options(workers=n):
            registry.get(fmt).write(ckpt, tmp_path / f"w{n}", overwrite=True)
        outs.append(tmp_path / f"w{n}")
    if outs[0].is_dir():
        assert _data_bytes(outs[0]) == _data_bytes(outs[1])
    else:
        assert outs[0].read_bytes() == outs[1].read_bytes()


@pytest.mark.parametrize("fmt", ["compressed-tensors", "plain", "native", "mlx"])
def test_row_blocks_equal_whole_tensors(gptq_dir, tmp_path, fmt):
    ckpt = load(gptq_dir)
    with run_options(workers=1, max_memory=1 << 30):
        registry.get(fmt).write(ckpt, tmp_path / "whole", overwrite=True)
    # 20 kB: every tensor larger than that (all weights, the embeddings) goes in blocks of rows
    with run_options(workers=2, max_memory=40_000):
        registry.get(fmt).write(ckpt, tmp_path / "rows", overwrite=True)
    a, b = tmp_path / "whole", tmp_path / "rows"
    if a.is_dir():
        assert _data_bytes(a) == _data_bytes(b)
    else:
        assert a.read_bytes() == b.read_bytes()


def test_row_blocks_are_used(gptq_dir, tmp_path, monkeypatch):
    from converter import tensor_rows as tensor_mod
    calls = []
    real = tensor_mod.take_rows
    monkeypatch.setattr(tensor_mod, "take_rows", lambda t, a, b: calls.append((t.name, a, b)) or real(t, a, b))
    with run_options(workers=1, max_memory=40_000):
        registry.get("plain").write(load(gptq_dir), tmp_path / "p", overwrite=True)
    blocks = [c for c in calls if c[0] == "model.embed_tokens.weight"]
    assert len(blocks) > 1 and blocks[0][1] == 0 and blocks[-1][2] == TINY.vocab


def test_cli_options_same_output_and_json(gptq_dir, tmp_path):
    r = CliRunner()
    docs = []
    for i, opts in enumerate((["--workers", "1"], ["--workers", "2", "--max-memory", "50k", "--quiet"])):
        res = r.invoke(main, ["convert", str(gptq_dir), str(tmp_path / f"c{i}"), "--to", "compressed-tensors",
                              "--json", *opts])
        assert res.exit_code == 0, res.output
        docs.append(res.output)
    assert _data_bytes(tmp_path / "c0") == _data_bytes(tmp_path / "c1")
    assert '"all_exact": true' in docs[1]
    res = r.invoke(main, ["dequantize", str(gptq_dir), str(tmp_path / "d.safetensors"), "--max-memory", "lots"])
    assert res.exit_code == 2 and "--max-memory" in res.output


def test_worker_errors_keep_their_fields():
    def boom(i):
        if i == 3:
            raise QuantizationError("bad scale", tensor="t3", field="scales", expected=1, found=2)
        return i
    with pytest.raises(QuantizationError) as ei:
        run_tasks(6, boom, workers=2, on_result=lambda i, r: None)
    assert ei.value.tensor == "t3" and ei.value.field == "scales" and "expected 1, found 2" in str(ei.value)


@pytest.mark.parametrize("workers", [1, 2])
def test_run_tasks_meanwhile_runs_once_in_the_parent(workers):
    import os
    parent = os.getpid()
    seen = []
    results = {}

    def task(i):
        return i, os.getpid()
    run_tasks(4, task, workers=workers, on_result=lambda i, r: results.__setitem__(i, r),
              meanwhile=lambda: seen.append(os.getpid()))
    assert seen == [parent] and sorted(results) == [0, 1, 2, 3]
    assert (workers == 1) == all(pid == parent for _, pid in results.values())


@pytest.mark.parametrize("workers", [1, 2])
def test_task_results_come_back_to_the_collector(workers):
    def task(i):
        task_result("sq", f"k{i}", i * i)
        return i
    with collect_results() as got:
        run_tasks(5, task, workers=workers, on_result=lambda i, r: None)
        task_result("sq", "outside", -1)  # outside a task: delivered at once
    assert got == {**{("sq", f"k{i}"): i * i for i in range(5)}, ("sq", "outside"): -1}
    task_result("sq", "late", 0)  # no collector open: dropped
    assert ("sq", "late") not in got


def test_parse_size():
    assert parse_size("512M") == 512 * 2**20
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("1.5k") == 1536
    assert parse_size("1000") == 1000
    for bad in ("", "12Q", "-1M", "0"):
        with pytest.raises(FormatError):
            parse_size(bad)


def test_progress_draws_on_its_stream_only():
    buf = io.StringIO()
    with run_options(quiet=False):
        p = Progress("writing", 2, 2000, delay=0.0, stream=buf, enabled=True)
        p.advance(1, 1000)
        p.advance(1, 1000)
        p.close()
    out = buf.getvalue()
    assert "2/2 tensors" in out and "GB/s" in out and out.endswith("\n")
    assert not Progress("x", 1, 1).enabled  # library default: quiet


# -- packed words -----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(bits=st.sampled_from([2, 3, 4, 8]), container=st.sampled_from(["U8", "U16", "I32", "U32"]),
       src_t=st.booleans(), dst_t=st.booleans(), signed=st.booleans(), flip=st.booleans(),
       packing=st.sampled_from(["stream", "padded"]), rows=st.integers(1, 9), cols=st.integers(1, 70),
       seed=st.integers(0, 2**16))
def test_packed_fast_path_equals_unpack_and_pack(bits, container, src_t, dst_t, signed, flip, packing, rows, cols,
                                                 seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 1 << bits, size=(rows, cols), dtype=np.uint8)
    sa = AxisMap((IN, OUT) if src_t else (OUT, IN), packed_axis=IN, bits=bits, container=container, packing=packing)
    da = AxisMap((IN, OUT) if dst_t else (OUT, IN), packed_axis=IN, bits=bits, container=container, packing=packing)
    words = sa.to_stored(codes, (OUT, IN))
    pc = PackedCodes(words, sa, (OUT, IN), {OUT: rows, IN: cols}, signed=signed, flip=flip)
    logical = pc.unpack()
    assert logical.dtype == (np.int8 if signed else np.uint8)
    want = da.to_stored(logical, (OUT, IN))
    got = da.store_codes(pc, (OUT, IN))
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert np.array_equal(pc.shifted().unpack().view(np.uint8) & ((1 << bits) - 1),
                          (logical.view(np.uint8) ^ (1 << (bits - 1))) & ((1 << bits) - 1))
    sub = pc.rows(1, rows)
    assert sub is not None and np.array_equal(sub.unpack(), logical[1:])
    # equal_stored: the in-place comparison agrees with comparing to_stored's result
    same = pc.equal_stored(da, (OUT, IN), want)
    if same is not None:
        assert same and src_t != dst_t and not flip
        bad = want.copy()
        bad.reshape(-1)[seed % bad.size] ^= 1
        assert pc.equal_stored(da, (OUT, IN), bad) is False


def test_awq_order_fast_path_needs_same_order():
    codes = np.arange(64, dtype=np.uint8).reshape(4, 16) % 16
    awq = AxisMap((IN, OUT), packed_axis=OUT, bits=4, container="I32", order=(0, 2, 4, 6, 1, 3, 5, 7))
    plain = AxisMap((IN, OUT), packed_axis=OUT, bits=4, container="I32")
    pc = PackedCodes(awq.to_stored(codes, (OUT, IN)), awq, (OUT, IN), {OUT: 4, IN: 16}, signed=False)
    assert pc.to_stored(plain, (OUT, IN)) is None  # different in-word order: unpack instead
    assert np.array_equal(plain.store_codes(pc, (OUT, IN)), plain.to_stored(codes, (OUT, IN)))
    assert np.array_equal(awq.store_codes(pc, (OUT, IN)), awq.to_stored(codes, (OUT, IN)))


def test_transpose_2d():
    a = np.arange(300 * 517, dtype=np.int32).reshape(300, 517)
    assert np.array_equal(transpose_2d(a), a.T)
    assert np.array_equal(transpose_2d(a[:5, :3]), a[:5, :3].T)
    wide = np.arange(3 * 30001, dtype=np.int32).reshape(3, 30001)  # fewer rows than a tile, a partial column tile
    assert np.array_equal(transpose_2d(wide), wide.T) and np.array_equal(transpose_2d(wide.T), wide)


def test_equal_transposed_compares_bits():
    a = np.arange(70 * 517, dtype=np.int32).reshape(70, 517)  # 70 rows: stripes of 32, 32, 6
    b = np.ascontiguousarray(a.T)
    assert equal_transposed(a, b) and equal_transposed(a, b.view(np.uint32)) and equal_transposed(a, b.view(np.float32))
    for r, c in [(0, 0), (69, 516), (33, 100)]:  # a changed word in each stripe is found
        bad = b.copy()
        bad.view(np.uint32)[c, r] ^= np.uint32(1 << 31)
        assert not equal_transposed(a, bad)
    nan = np.full((3, 2), np.nan, np.float32)
    assert equal_transposed(nan, np.ascontiguousarray(nan.T))  # bits, not float equality
    assert not equal_transposed(a, b[:, :-1])
    assert not equal_transposed(a, b.view(np.uint8))
    assert not equal_transposed(a, a)


# -- GGUF legacy fast paths ---------------------------------------------------------------------------
@pytest.mark.parametrize("type_name", ["Q4_0", "Q8_0"])
def test_gguf_fast_paths_bit_exact_with_gguf_py(type_name):
    gguf = pytest.importorskip("gguf")
    from converter.formats.gguf.blocks import codec_for
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((40, 512)) * 0.05).astype(np.float32)
    x[0, :32] = 0.0                        # all-zero block
    x[1, :32] = -0.0                       # all negative zero
    x[2, :32] = 0.0
    x[2, 5], x[2, 9] = -3.0, 3.0           # magnitude tie: the first wins (-3)
    x[3, 32:64] = 1.0
    x[3, 40] = -1.0                        # tie, positive first
    x[4] = np.round(x[4] * 1000)           # many exact ties
    qtype = getattr(gguf.GGMLQuantizationType, type_name)
    codec = codec_for(type_name)
    raw = codec.encode(x)
    assert np.array_equal(raw, gguf.quants.quantize(x, qtype))
    from converter.formats.gguf.schemes import tensor_from_fields
    ours = tensor_from_fields("t", codec.decode(raw), x.shape).dequantize()  # the product's decode path
    assert np.array_equal(ours.view(np.uint32), gguf.quants.dequantize(raw, qtype).view(np.uint32))


def test_gguf_write_identical_for_any_workers(gptq_dir, tmp_path):
    """GGUF goes through write_at_offsets (offsets fixed after the header): same bytes for 1 or 2 workers."""
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    outs = []
    for n in (1, 2):
        with run_options(workers=n):
            requantize_model(gptq_dir, tmp_path / f"w{n}.gguf", Target(bits=4, granularity="group", group_size=32),
                             to="gguf", overwrite=True)
        outs.append((tmp_path / f"w{n}.gguf").read_bytes())
    assert outs[0] == outs[1]
    back = load(tmp_path / "w2.gguf")
    assert back.format == "gguf" and len(back.quantized_names()) == 2 * 7


def test_gguf_write_in_chunks_gives_the_same_bytes(gptq_dir, tmp_path, monkeypatch):
    """Large arrays go to write_at_offsets' background writer in chunks, their mapped pages
    released after each: the file is the same as when every array goes whole."""
    from converter.write import files
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    outs = []
    for chunk in (1 << 40, 4096):
        monkeypatch.setattr(files, "_MAPPED_CHUNK", chunk)
        with run_options(workers=1):
            requantize_model(gptq_dir, tmp_path / f"c{chunk}.gguf", Target(bits=4, granularity="group", group_size=32),
                             to="gguf", overwrite=True)
        outs.append((tmp_path / f"c{chunk}.gguf").read_bytes())
    assert outs[0] == outs[1] and len(outs[0]) > 10 * 4096


def test_large_dense_copies_are_spread_among_the_other_tasks():
    """task_order: every task once; the large dense tensors (plain copies) neither first nor bunched, the
    other tasks in their own order (the file's layout does not depend on it: test_workers_give_identical_files)."""
    from types import SimpleNamespace

    from converter.write.files import SPREAD_BYTES, task_order

    kinds = ["dense", "dense"] + ["quantized"] * 9 + ["dense"]  # two big copies first (embed, head), a small norm
    sizes = [SPREAD_BYTES, 4 * SPREAD_BYTES] + [SPREAD_BYTES] * 9 + [100]
    specs = {f"t{i}": SimpleNamespace(kind=k) for i, k in enumerate(kinds)}
    ckpt = SimpleNamespace(spec=specs.__getitem__)
    plans = [SimpleNamespace(source=f"t{i}", nbytes=n) for i, n in enumerate(sizes)]
    order = task_order(plans, ckpt)
    assert sorted(order) == list(range(12))
    # 10 others (the small norm among them), 2 copies: one after each stretch of 10 / 3 others, i.e. after
    # the 4th and the 7th
    assert order == [2, 3, 4, 5, 0, 6, 7, 8, 1, 9, 10, 11]
    only_compute = [SimpleNamespace(source=f"t{i}", nbytes=SPREAD_BYTES) for i in range(2, 6)]
    assert task_order(only_compute, ckpt) == [0, 1, 2, 3]


@pytest.mark.parametrize("workers,expected", [(1, 96), (2, 48), (8, 32)])
def test_workers_share_the_bytes_in_flight(gptq_dir, tmp_path, monkeypatch, workers, expected):
    """Each worker process queues its own arrays for its background writer: write_plans gives each the default
    (96 MiB) divided by the workers, at least 32 MiB, so their peak memory does not grow with their number."""
    from converter.write.safetensors import SafetensorsWriter
    seen = []
    real = SafetensorsWriter.limit_in_flight
    monkeypatch.setattr(SafetensorsWriter, "limit_in_flight", lambda self, n: (seen.append(n), real(self, n)))
    ckpt = load(gptq_dir)
    assert len(ckpt.names()) >= 8  # (so that 8 workers are 8)
    with run_options(workers=workers):
        registry.get("compressed-tensors").write(ckpt, tmp_path / "o", overwrite=True)
    assert seen == [expected * 2**20]
