"""Streaming write path: workers, row blocks, packed-word fast paths and blocked kernels.

Functional only (no timings): every fast path must give the bytes / values the plain path gives.
"""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from converter import load
from converter.cli import main
from converter.errors import FormatError, QuantizationError
from converter.formats import registry
from converter.groups import GroupMap
from converter.runtime import parse_size, run_options
from converter.write.engine import collect_results, run_tasks, task_result
from converter.write.progress import Progress
from converter.layout import IN, OUT, AxisMap, PackedCodes, equal_transposed, transpose_2d
from converter.quant import quantize as Q
from converter.kernels.blocked import dequantize_blocked, quantize_blocked
from converter.scheme import QuantScheme, ZeroPoint
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
    from converter import tensor as tensor_mod
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
    assert not equal_transposed(a, b[:, :-1]) and not equal_transposed(a, b.view(np.uint8)) and not equal_transposed(a, a)


# -- kernels ----------------------------------------------------------------------------------------
def _reference_quantize(x, s, gm):
    x = np.asarray(x, np.float32)
    sc, z = Q.choose_params(x, s, gm, (OUT, IN))
    if z is not None:
        z = z.astype(s.code_dtype)
    return sc, z, Q.codes_for(x, sc, z, s, gm, (OUT, IN))


@pytest.mark.parametrize("bits,signed,zp", [(b, sg, z) for b, sg, z in itertools.product(
    [2, 4, 8], [True, False], [ZeroPoint.NONE, ZeroPoint.INTEGER])])
def test_blocked_quantize_is_bit_exact(bits, signed, zp):
    rng = np.random.default_rng(bits)
    for shape, sd, gm in [((37, 300), "F16", GroupMap.per_group(128)), ((9, 64), "BF16", GroupMap.per_channel()),
                          ((70, 1000), "F32", GroupMap.per_group(32))]:
        s = QuantScheme(bits, signed, zp, sd)
        x = (rng.standard_normal(shape) * rng.choice([1e-3, 1.0, 300.0])).astype(np.float32)
        x[1] = 0
        x[2, :7] = 0
        for xin in (x, x.astype(np.float16)):
            want = _reference_quantize(xin, s, gm)
            got = quantize_blocked(xin, s, gm, (OUT, IN))
            assert np.array_equal(got[0].view(np.uint8), want[0].view(np.uint8))
            assert (got[1] is None) == (want[1] is None)
            if got[1] is not None:
                assert got[1].dtype == want[1].dtype and np.array_equal(got[1], want[1])
            assert got[2].dtype == want[2].dtype and np.array_equal(got[2], want[2])


@pytest.mark.parametrize("signed,zp,rounding", [(True, ZeroPoint.NONE, "half_even"), (False, ZeroPoint.NONE, "half_away"),
                                                 (False, ZeroPoint.INTEGER, "half_even"), (True, ZeroPoint.INTEGER, "half_away")])
def test_blocked_quantize_clips_where_a_rounded_scale_is_too_small(signed, zp, rounding):
    """Scales in fp16's subnormal range can round well below max/qmax: codes then exceed the range
    and must be clipped, in the blocks (rows) that need it and only there."""
    tiny = float(np.finfo(np.float16).smallest_subnormal)
    s, gm = QuantScheme(4, signed, zp, "F16", rounding=rounding), GroupMap.per_group(64)
    levels = 7 if zp is ZeroPoint.NONE else 15
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((200, 256)) * 0.05).astype(np.float32)
    top = np.float32(1.49 * tiny * levels)  # top / levels rounds down to 1 subnormal step: codes ~1.5x too big
    low = -1 if zp is ZeroPoint.NONE else 0  # asymmetric: range [0, top], zero point 0
    x[150:, :64] = top * rng.uniform(low, 1, (50, 64)).astype(np.float32)
    x[150:, 0], x[150:, 1] = top, low * top
    want = _reference_quantize(x, s, gm)
    got = quantize_blocked(x, s, gm, (OUT, IN))
    assert np.array_equal(got[0].view(np.uint16), want[0].view(np.uint16))
    assert np.array_equal(got[2], want[2])
    assert want[2][150:, 0].max() == s.qmax  # the clip did act


def test_blocked_quantize_defers_errors_to_the_whole_array_path():
    x = np.ones((4, 256), np.float32)
    x[2, 7] = np.nan
    s, gm = QuantScheme(4, True, ZeroPoint.NONE, "F16"), GroupMap.per_group(128)
    assert quantize_blocked(x, s, gm, (OUT, IN)) is None
    with pytest.raises(QuantizationError):
        Q.quantize(x, s, gm)
    x[2, 7] = -np.inf  # the integer max of |x| bit patterns sees inf (and NaN) above every finite value
    assert quantize_blocked(x, s, gm, (OUT, IN)) is None
    zeros = np.zeros((3, 256), np.float32)
    zeros[1, :128] = -0.0
    stats: dict = {}
    got = quantize_blocked(zeros, s, gm, (OUT, IN), stats=stats)
    assert stats["degenerate_groups"] == 6 and not got[2].any() and (got[0] == 1).all()
    big = np.full((2, 128), 1e9, np.float32)
    with pytest.raises(QuantizationError, match="overflows"):
        Q.quantize(big, s, gm)


@pytest.mark.parametrize("granularity", ["tensor", "channel", "group", "partial"])
@pytest.mark.parametrize("zp", [ZeroPoint.NONE, ZeroPoint.INTEGER, ZeroPoint.FLOAT])
def test_blocked_dequantize_is_bit_exact(granularity, zp):
    rng = np.random.default_rng(7)
    O, I = 33, 200 if granularity == "partial" else 256
    gm = {"tensor": GroupMap.per_tensor(), "channel": GroupMap.per_channel(),
          "group": GroupMap.per_group(64), "partial": GroupMap.per_group(64)}[granularity]
    pshape = gm.param_shape((O, I), (OUT, IN))
    for bits, signed in [(4, False), (4, True), (8, True), (2, False), (3, False)]:
        s = QuantScheme(bits, signed, zp, "F16")
        codes = rng.integers(s.qmin, s.qmax + 1, size=(O, I)).astype(s.code_dtype)
        scales = (rng.random(pshape) + 0.01).astype(np.float16)
        zps = None
        if zp is ZeroPoint.INTEGER:
            zps = rng.integers(s.qmin, s.qmax + 1, size=pshape).astype(s.code_dtype)
        elif zp is ZeroPoint.FLOAT:
            zps = rng.standard_normal(pshape).astype(np.float16)
        amap = AxisMap((IN, OUT), packed_axis=IN, bits=bits, container="I32")
        packed = PackedCodes(amap.to_stored(codes, (OUT, IN)), amap, (OUT, IN), {OUT: O, IN: I}, signed=signed)
        t_arr = QuantizedTensor("w", (OUT, IN), codes, scales, s, gm, zero_points=zps)
        t_pk = QuantizedTensor("w", (OUT, IN), packed, scales, s, gm, zero_points=zps)
        tensors = [t_arr, t_pk]
        if bits == 4:  # fields stored with the top bit flipped (compressed-tensors' q + 8)
            words = amap.to_stored(codes, (OUT, IN)).view(np.uint32) ^ np.uint32(0x88888888)
            flipped = PackedCodes(words.view(np.int32), amap, (OUT, IN), {OUT: O, IN: I}, signed=signed, flip=True)
            tensors.append(QuantizedTensor("w", (OUT, IN), flipped, scales, s, gm, zero_points=zps))
        c = codes.astype(np.float32) - np.float32(s.center if zp is ZeroPoint.NONE else 0)
        if zp is ZeroPoint.INTEGER:
            c -= gm.expand(zps.astype(np.float32), (O, I), (OUT, IN))
        want = c * gm.expand(scales.astype(np.float32), (O, I), (OUT, IN))
        if zp is ZeroPoint.FLOAT:
            want += gm.expand(zps.astype(np.float32), (O, I), (OUT, IN))
        for t in tensors:
            got = dequantize_blocked(t)
            assert got is not None and np.array_equal(got, want), (bits, signed)
            assert np.array_equal(t.dequantize(), want)


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
    ours = codec.dequantize_raw(raw)
    assert np.array_equal(ours.view(np.uint32), gguf.quants.dequantize(raw, qtype).view(np.uint32))
    assert np.array_equal(ours.view(np.uint32), codec.dequantize(codec.decode(raw)).view(np.uint32))


def test_blocked_comparison_matches_whole_array_formulas():
    from converter.quant import error_report as er
    from converter.kernels.metrics import error_stats, output_error, worst_channel, worst_group
    rng = np.random.default_rng(5)
    a = rng.standard_normal((301, 200)).astype(np.float32)
    b = (a + rng.standard_normal(a.shape).astype(np.float32) * 1e-3).astype(np.float32)
    b[7] = a[7]
    for gm in (GroupMap.per_group(64), GroupMap.per_channel(), GroupMap.per_tensor()):
        got = er._comparison_blocked(a, b, gm, (OUT, IN))
        st = error_stats(a, b)
        # squares are summed in float32 per chunk (ErrorSums): relative precision ~1e-6
        for k in ("mse", "rmse", "rel_frobenius", "sqnr_db"):
            assert got[k] == pytest.approx(getattr(st, k), rel=1e-6), k
        for k in ("max_abs", "changed_fraction"):
            assert got[k] == getattr(st, k), k
        assert got["worst_channel"] == {"index": worst_channel(a, b, (OUT, IN))["index"],
                                        "mse": pytest.approx(worst_channel(a, b, (OUT, IN))["mse"], rel=1e-6)}
        wg = worst_group(a, b, gm, (OUT, IN))
        assert got["worst_group"]["index"] == wg["index"] and got["worst_group"]["elements"] == wg["elements"]
        assert got["worst_group"]["mse"] == pytest.approx(wg["mse"], rel=1e-6)
        assert got["output_rel_error"] == pytest.approx(
            output_error(a, b, (OUT, IN), n_inputs=er.N_INPUTS, seed=er.SEED)["rel_error"], rel=1e-9)


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
