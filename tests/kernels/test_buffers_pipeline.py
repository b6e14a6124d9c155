"""Reused code slabs (converter.kernels.buffers) through a whole requantization: the background writer, the
deferred read-back and the next tensor's quantizer all run while earlier codes are queued, so a slab handed out
while still referred to would write another tensor's codes. The sample checkpoints' code arrays are far below
MIN_BYTES, so the slabs are forced here (MIN_BYTES lowered); the reference is the same run with slabs off
(every request a plain ``numpy.empty``), which is the code path from before the slabs existed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from converter.kernels import buffers
from converter.ops.requantize_model import requantize_model
from converter.quant.requant import Target
from converter.runtime import run_options

SRC = Path(__file__).resolve().parents[2] / "sample_checkpoints" / "gptq_w4_g128_sym"


def _run(dst: Path, workers: int) -> tuple[dict[str, bytes], list]:
    with run_options(workers=workers, max_shard_size="300KB", max_memory="16MiB"):
        rep = requantize_model(SRC, dst, Target(bits=8, granularity="channel"), to="compressed-tensors")
    files = {p.name: p.read_bytes() for p in sorted(dst.iterdir())}
    rows = sorted((r["name"], r["readback_bit_exact"], r.get("vs_source")) for r in rep["tensors"])
    return files, rows


@pytest.mark.parametrize("workers", [1, 2])
def test_requantize_with_every_code_array_a_slab_gives_the_same_files(tmp_path, monkeypatch, workers):
    handed = []
    real_empty = buffers.empty

    def spy(shape, dtype):
        a = real_empty(shape, dtype)
        handed.append(a.base is not None and any(a.base is s for s in buffers._SLABS))
        return a
    buffers._forget()
    monkeypatch.setattr(buffers, "MIN_BYTES", 10**12)  # slabs off: the reference
    ref_files, ref_rows = _run(tmp_path / "plain", workers)
    monkeypatch.setattr(buffers, "MIN_BYTES", 1)
    for mod in ("converter.kernels.rtn", "converter.kernels.compiled.rtn_rows"):
        monkeypatch.setattr(f"{mod}.buffers.empty", spy)
    files, rows = _run(tmp_path / "slabs", workers)
    buffers._forget()
    if workers == 1:  # (in worker processes the spy's list is the child's)
        assert sum(handed) >= 4, handed  # slabs were really handed out, several times over
    assert len(ref_files) > 2  # several shards
    assert files == ref_files
    assert rows == ref_rows and all(r[1] for r in rows)


def test_requantize_results_kept_by_a_library_caller_never_change(monkeypatch):
    """converter.quant.requant.requantize returns its codes in a slab (an int8 per-channel target keeps the
    quantizer's array): a caller keeping every result while calling again (several sizes, several targets)
    must find each result's arrays as they were when returned; their copies are the reference."""
    from converter.groups import GroupMap
    from converter.quant.quantize import quantize
    from converter.quant.requant import requantize
    from converter.scheme import QuantScheme, ZeroPoint

    buffers._forget()
    monkeypatch.setattr(buffers, "MIN_BYTES", 1024)
    rng = np.random.default_rng(0)
    sources = [quantize(rng.standard_normal(shape).astype(np.float32),
                        QuantScheme(4, False, zero_point=ZeroPoint.INTEGER), GroupMap.per_group(32))
               for shape in [(300, 96), (64, 128), (512, 256), (1000, 64)]]
    targets = [Target(bits=8, granularity="channel"), Target(bits=4, group_size=32)]
    kept = []
    for _ in range(2):
        for t in sources:
            for target in targets:
                q = requantize(t, target).tensor
                arrays = {k: v for k, v in vars(q).items() if isinstance(v, np.ndarray)}
                kept.append((arrays, {k: v.copy() for k, v in arrays.items()}))
    in_slabs = sum(any(np.shares_memory(v, s) for s in buffers._SLABS) for a, _ in kept for v in a.values())
    buffers._forget()
    assert in_slabs >= 3  # results really live in slabs (the pool holds 3)
    for arrays, copies in kept:
        for k, v in arrays.items():
            assert np.array_equal(v, copies[k]), k
