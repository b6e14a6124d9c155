"""Requantize planning benchmark (qckpt issue 18 item 9): the time to find the one complete command line
of a refused ``convert --to T`` (:func:`converter.ops.target_plan.complete_target`, headers only), with
tensors checked once per class (scheme, groups, shape) against a baseline that checks every tensor.

Run from a checkout::

    python benchmarks/bench_target_plan.py                                  # the MiniLM Q4_K_M sample
    python benchmarks/bench_target_plan.py /work/shared/real/smollm2_135m_instruct_Q4_1.gguf
    python benchmarks/bench_target_plan.py --requant /path/to/gptq-checkpoint   # requantize planning only

Both runs must find the same plan (checked before any figure is printed).

``--requant SRC`` (qckpt issue 19): the planning of ``convert SRC --per-channel --bits 8``
(:func:`converter.ops.requantize_model.requantize_checkpoint`: every tensor's requantized spec, headers
only), time and peak traced memory (``tracemalloc``, which sees numpy's allocations), against the
old planning that built each spec from a zero-filled full-size probe tensor (reproduced here as the
baseline). Both must give the same specs. Measured 2026-12-06 (2 cores, load ~4), 4 Llama-7B-shaped
GPTQ layers (``tests/synthetic.py``, 28 quantized tensors): shapes only 7.9 ms, 0.0 MiB traced; full
probes 252.9 ms, 43.1 MiB traced (the largest code array, 11008 x 4096 int8).

Measured 2026-12-06 on the 2-core dev VM (shared with a test run), SmolLM2-135M-Instruct Q4_1
(211 quantized tensors, 4-5 classes)::

    gptq                 0.34 s  (per tensor   4.1 s, x12)   --asym
    mlx                  1.38 s  (per tensor  24.0 s, x17)   --scale-dtype f16

(the MLX time is the 504 candidates x ~3.5 classes of target specs: every candidate passes, so each
is also classified exact or lossy).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from converter.formats import registry  # noqa: E402
from converter.ops import target_plan  # noqa: E402
from converter.ops.command_line import target_words  # noqa: E402
from converter.ops.module_policy import apply_module_policy  # noqa: E402
from converter.quant.target import Target  # noqa: E402

SAMPLE = Path(__file__).resolve().parent.parent / "sample_checkpoints" / "gguf" / "minilm_llamacpp_Q4_K_M.gguf"


def _timed(view, handler):
    t = time.perf_counter()
    plan = target_plan.complete_target(view, handler, Target(), require_change=True)
    return time.perf_counter() - t, plan


def _probe_spec(spec, target, fmt=None):
    """The old planning step (before issue 19): ``spec_of`` a zero-filled full-size probe tensor."""
    import numpy as np

    from converter.groups import GroupMap
    from converter.quant.requant import resolve
    from converter.scheme import ZeroPoint
    from converter.tensor import QuantizedTensor, spec_of
    scheme, gm = resolve(spec.scheme, spec.group_map, target, fmt)
    if spec.act_order and target.granularity is None:
        n = spec.shape[list(spec.axes).index(gm.axis)]
        gm = GroupMap.per_group(gm.group_size, gm.axis, g_idx=np.arange(n, dtype=np.int32) // gm.group_size)
    ps = gm.param_shape(spec.shape, spec.axes)
    zp = None
    if scheme.zero_point is ZeroPoint.INTEGER:
        zp = np.zeros(ps, scheme.code_dtype)
    elif scheme.zero_point is ZeroPoint.FLOAT:
        zp = np.zeros(ps, scheme.scale_np_dtype)
    fill = scheme.center if scheme.codebook is None and not scheme.signed else 0
    return spec_of(QuantizedTensor(spec.name, tuple(spec.axes), np.full(spec.shape, fill, scheme.code_dtype),
                                   np.ones(ps, scheme.scale_np_dtype), scheme, gm, zero_points=zp, stored={}))


def _requant_planning(src: str) -> int:
    """Time and peak traced memory of requantize planning, shapes only vs the old full-size probes."""
    import tracemalloc

    from converter.ops import requantize_model as rm
    ckpt = registry.load(src)
    target = Target(bits=8, granularity="channel")

    def run():
        tracemalloc.start()
        t = time.perf_counter()
        view, _ = rm.requantize_checkpoint(ckpt, target)
        dt = time.perf_counter() - t
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return dt, peak, [(s.name, s.shape, s.stored, s.scheme, s.act_order) for s in view.specs()]
    run()  # warm-up (imports, caches)
    new = run()
    saved = rm.target_spec
    rm.target_spec = _probe_spec
    try:
        old = run()
    finally:
        rm.target_spec = saved
    if new[2] != old[2]:
        print("the two plannings disagree", file=sys.stderr)
        return 1
    n = len(ckpt.quantized_names())
    print(f"requantize planning of {src} ({n} quantized tensors) -> 8-bit per channel:")
    print(f"  shapes only   {new[0] * 1e3:8.1f} ms   peak traced {new[1] / 2**20:8.1f} MiB")
    print(f"  full probes   {old[0] * 1e3:8.1f} ms   peak traced {old[1] / 2**20:8.1f} MiB   "
          f"(x{old[0] / max(new[0], 1e-9):.0f} time)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=str(SAMPLE))
    ap.add_argument("--to", nargs="*", default=["gptq", "awq", "compressed-tensors", "mlx", "gguf"])
    ap.add_argument("--requant", metavar="SRC", help="measure requantize planning of this checkpoint instead")
    args = ap.parse_args()
    if args.requant:
        return _requant_planning(args.requant)
    ckpt = registry.load(args.src)
    print(f"{args.src}: {len(ckpt.quantized_names())} quantized tensors")
    per_class = target_plan._Checker._signature
    for to in args.to:
        handler = registry.check_writable(to)
        view, _ = apply_module_policy(handler.arrange(ckpt) if handler.arrange else ckpt, handler)
        fast, plan = _timed(view, handler)
        target_plan._Checker._signature = staticmethod(lambda s: (s.name,) + per_class(s))  # one class per tensor
        try:
            slow, plan_slow = _timed(view, handler)
        finally:
            target_plan._Checker._signature = staticmethod(per_class)
        same = (plan is None and plan_slow is None) or (plan is not None and plan_slow is not None
                                                         and plan.target == plan_slow.target)
        if not same:
            print(f"{to}: the two runs disagree", file=sys.stderr)
            return 1
        line = " ".join(target_words(plan.target)) if plan else "(none)"
        print(f"{to:18} {fast:6.2f} s  (per tensor {slow:5.1f} s, x{slow / max(fast, 1e-9):.0f})   {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
