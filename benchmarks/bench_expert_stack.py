"""Expert-stack dequantize benchmark (qckpt issue 15): a gpt-oss MXFP4 expert stack dequantized by
``qckpt dequantize`` under two memory budgets, peak RSS and wall time of each.

Run from a checkout::

    python benchmarks/bench_expert_stack.py                    # 32 experts x 1440 x 2880 (float32 531 MB)
    python benchmarks/bench_expert_stack.py --experts 64 --budget 128M

It writes a synthetic gpt-oss checkpoint (random ``gate_up_proj_blocks`` ``[E, O, in/32, 16]`` and E8M0
``_scales`` near 2^0, ``quant_method: "mxfp4"``; gpt-oss-120b's ``gate_up_proj`` is 128 x 5760 x 2880, ~8.5 GB
of float32) into ``--workdir`` and runs ``qckpt --workers 1 dequantize SRC DST --max-memory B`` in a fresh
subprocess for the small ``--budget`` and for a budget larger than the whole float32 stack. The peak RSS is the
kernel's peak resident set of that process (``os.wait4`` ``ru_maxrss``; source pages mapped count). The two
outputs are checked byte-identical before any figure is printed; the streamed run works one block of experts at
a time (``converter/formats/plain.py`` ``_transposed_plan``, ``converter/write/files.py`` row blocks), so its
peak stays near the budget while the whole run holds the stack in float32 (and its ``[E, in, out]`` transpose).

Measured 2026-12-02 on the 2-core dev VM (defaults; shared with other jobs)::

    stack 32 x 1440 x 2880: float32 531 MB, MXFP4 stored 71 MB; outputs byte-identical
    streamed  --max-memory    64M:   4.69 s, peak RSS     226 MB
    whole     --max-memory  2025M:   8.98 s, peak RSS    2843 MB
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from peak_rss import digest_safetensors, qckpt_process  # noqa: E402

from converter.write.safetensors import write_safetensors  # noqa: E402


def build(dst: Path, experts: int, out: int, inp: int) -> None:
    rng = np.random.default_rng(15)
    p = "model.layers.0.mlp.experts.gate_up_proj"
    blocks = rng.integers(0, 256, (experts, out, inp // 32, 16), dtype=np.uint8)
    scales = rng.integers(124, 131, (experts, out, inp // 32), dtype=np.uint8)
    dst.mkdir(parents=True)
    write_safetensors(dst / "model.safetensors", {f"{p}_blocks": blocks, f"{p}_scales": scales}, {"format": "pt"})
    (dst / "config.json").write_text(json.dumps({
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": inp,
        "intermediate_size": out // 2, "num_local_experts": experts, "num_hidden_layers": 1,
        "quantization_config": {"quant_method": "mxfp4"}}))


def run(src: Path, dst: Path, budget: str) -> tuple[float, int]:
    """``(seconds, peak RSS bytes)`` of one ``qckpt dequantize`` subprocess of this checkout."""
    secs, rss, _ = qckpt_process(ROOT, "dequantize", src, dst, "--workers", "1", "--max-memory", budget)
    return secs, rss


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--out", type=int, default=1440)
    ap.add_argument("--in", dest="inp", type=int, default=2880)
    ap.add_argument("--budget", default="64M")
    ap.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="qckpt-experts-"))
    try:
        src = work / "src"
        build(src, a.experts, a.out, a.inp)
        f32 = a.experts * a.out * a.inp * 4
        big = f"{max(4 * f32, 2 ** 30) // 2 ** 20}M"
        rows = []
        for label, budget in (("streamed", a.budget), ("whole", big)):
            secs, rss = run(src, work / label, budget)
            rows.append((label, budget, secs, rss))
        if digest_safetensors(work / "streamed") != digest_safetensors(work / "whole"):
            raise SystemExit("streamed and whole outputs differ")
        print(f"stack {a.experts} x {a.out} x {a.inp}: float32 {f32 / 1e6:.0f} MB, MXFP4 stored "
              f"{a.experts * a.out * a.inp * 17 / 32 / 1e6:.0f} MB; outputs byte-identical")
        for label, budget, secs, rss in rows:
            print(f"{label:9s} --max-memory {budget:>6s}: {secs:6.2f} s, peak RSS {rss / 1e6:7.0f} MB")
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
