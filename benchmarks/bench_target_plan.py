"""Requantize planning benchmark (qckpt issue 18 item 9): the time to find the one complete command line
of a refused ``convert --to T`` (:func:`converter.ops.target_plan.complete_target`, headers only), with
tensors checked once per class (scheme, groups, shape) against a baseline that checks every tensor.

Run from a checkout::

    python benchmarks/bench_target_plan.py                                  # the MiniLM Q4_K_M sample
    python benchmarks/bench_target_plan.py /work/shared/real/smollm2_135m_instruct_Q4_1.gguf

Both runs must find the same plan (checked before any figure is printed).

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
from converter.ops.module_policy import apply_module_policy  # noqa: E402
from converter.quant.target import Target  # noqa: E402

SAMPLE = Path(__file__).resolve().parent.parent / "sample_checkpoints" / "gguf" / "minilm_llamacpp_Q4_K_M.gguf"


def _timed(view, handler):
    t = time.perf_counter()
    plan = target_plan.complete_target(view, handler, Target(), require_change=True)
    return time.perf_counter() - t, plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", default=str(SAMPLE))
    ap.add_argument("--to", nargs="*", default=["gptq", "awq", "compressed-tensors", "mlx", "gguf"])
    args = ap.parse_args()
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
        line = " ".join(target_plan.target_words(plan.target)) if plan else "(none)"
        print(f"{to:18} {fast:6.2f} s  (per tensor {slow:5.1f} s, x{slow / max(fast, 1e-9):.0f})   {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
