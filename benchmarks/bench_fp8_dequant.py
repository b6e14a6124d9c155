"""FP8 dequantize benchmark (qckpt issue 14): ``qckpt dequantize --dtype bf16`` of a DeepSeek-V3-shaped block-FP8
checkpoint, against plain file I/O of the same bytes, and peak RSS when the layer count doubles.

Run from a checkout::

    python benchmarks/bench_fp8_dequant.py                      # 2 and 4 layers x 8 experts (~1.4 / 2.8 GB FP8)
    python benchmarks/bench_fp8_dequant.py --layers 4 --experts 16 --repeat 3

It builds, in ``--workdir`` (default a temporary directory, removed afterwards), a synthetic
checkpoint in the layout DeepSeek-V3 ships (``quant_method: "fp8"``, ``fmt: "e4m3"``,
``weight_block_size: [128, 128]``; hidden 7168, routed experts of intermediate size 2048): per layer
``--experts`` routed experts ``mlp.experts.<e>.{gate,up}_proj.weight`` ``F8_E4M3 [2048, 7168]`` and
``down_proj.weight`` ``[7168, 2048]``, each with an ``F32 weight_scale_inv`` ``[16, 56]`` / ``[56, 16]``, a BF16
router ``mlp.gate.weight [experts, 7168]`` and norms; one shard per layer, with
``model.safetensors.index.json``. The FP8 bytes are random finite E4M3 codes (the decode's cost does not
depend on the values).

Then, each in a fresh process, with the input in the page cache:

- ``qckpt dequantize SRC DST --dtype bf16 --workers 1 --max-shard-size 2G``: wall time, throughput
  (input and output bytes per second), peak RSS (``VmHWM`` of the process; the tree's sampled RSS too);
- right after it, its baseline: reading every input byte and writing as many bytes as the command wrote
  (plain buffered file I/O + fsync, ``bench_streaming.copy_baseline``), and a plain copy of the input;

and the same on a checkpoint with twice the layers. Printed: the figures, the ratio to the I/O baseline
(target: at most 2x with one worker) and the peak RSS of both sizes (target: at most 512 MiB, flat when
the layers double). Figures are medians of ``--repeat`` runs, each paired with its own baseline (the
write speed of this kind of virtual machine drifts over minutes). Never a timed assert in the tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # its siblings

from bench_streaming import MIB, copy_baseline, data_files, mib, nbytes, run_cmd  # noqa: E402

HIDDEN = 7168
MOE_INTER = 2048
BLOCK = 128
RSS_TARGET = 512 * MIB


def _codes(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Random finite E4M3 codes (0x7F / 0xFF, the NaNs, avoided)."""
    b = rng.integers(0, 0x7F, size=shape, dtype=np.uint8)
    return (b | (rng.integers(0, 2, size=shape, dtype=np.uint8) << 7)).view(ml_dtypes.float8_e4m3fn)


def _scales(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    grid = (-(-shape[0] // BLOCK), -(-shape[1] // BLOCK))
    return rng.uniform(1e-4, 1e-2, size=grid).astype(np.float32)


def build(path: Path, layers: int, experts: int, seed: int = 0) -> None:
    """The synthetic DeepSeek-V3-shaped block-FP8 checkpoint (see the module docstring)."""
    from safetensors.numpy import save_file
    path.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    codes = {s: _codes(rng, s) for s in ((MOE_INTER, HIDDEN), (HIDDEN, MOE_INTER))}  # reused: same bytes per expert
    weight_map = {}
    for layer in range(layers):
        p = f"model.layers.{layer}"
        shard = {f"{p}.input_layernorm.weight": np.ones(HIDDEN, ml_dtypes.bfloat16),
                 f"{p}.post_attention_layernorm.weight": np.ones(HIDDEN, ml_dtypes.bfloat16),
                 f"{p}.mlp.gate.weight": rng.standard_normal((experts, HIDDEN)).astype(ml_dtypes.bfloat16)}
        for e in range(experts):
            for proj, shape in (("gate_proj", (MOE_INTER, HIDDEN)), ("up_proj", (MOE_INTER, HIDDEN)),
                                ("down_proj", (HIDDEN, MOE_INTER))):
                name = f"{p}.mlp.experts.{e}.{proj}.weight"
                shard[name] = codes[shape]
                shard[name + "_scale_inv"] = _scales(rng, shape)
        fname = f"model-{layer + 1:05d}-of-{layers:05d}.safetensors"
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in shard})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": HIDDEN,
           "moe_intermediate_size": MOE_INTER, "n_routed_experts": experts, "num_hidden_layers": layers,
           "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                   "weight_block_size": [BLOCK, BLOCK]}}
    (path / "config.json").write_text(json.dumps(cfg, indent=1))


def measure(src: Path, work: Path, repeat: int, extra: list[str]) -> dict:
    """``repeat`` dequantize runs, each followed by its baselines; medians and per-run figures."""
    dst = work / "deq"
    runs, io, copies = [], [], []
    for _ in range(repeat):
        if dst.exists():
            shutil.rmtree(dst)
        r = run_cmd(["dequantize", str(src), str(dst), "--dtype", "bf16", "--workers", "1", "--quiet",
                     "--max-shard-size", str(2 * 10**9), *extra])
        out_b = nbytes(dst)
        io.append(copy_baseline(data_files(src), work / "io.bin", out_b))
        copies.append(copy_baseline(data_files(src), work / "copy.bin"))
        runs.append({"wall_s": r["wall_s"], "peak_rss_max_process": r["peak_rss_max_process"],
                     "peak_rss_tree": r["peak_rss_tree"], "out_bytes": out_b})
    shards = sorted(p.name for p in dst.iterdir())
    shutil.rmtree(dst)
    in_b = nbytes(src)
    wall = statistics.median(r["wall_s"] for r in runs)
    return {"in_bytes": in_b, "out_bytes": runs[-1]["out_bytes"], "wall_s": wall, "runs_s": [r["wall_s"] for r in runs],
            "io_s": statistics.median(io), "copy_s": statistics.median(copies),
            "ratio_to_io": statistics.median(r["wall_s"] / b for r, b in zip(runs, io)),
            "ratio_to_copy": statistics.median(r["wall_s"] / b for r, b in zip(runs, copies)),
            "peak_rss_max_process": max(r["peak_rss_max_process"] for r in runs),
            "peak_rss_tree": max(r["peak_rss_tree"] for r in runs), "output_files": shards}


def report(label: str, m: dict) -> None:
    print(f"{label}: {m['in_bytes'] / 1e9:.2f} GB FP8 -> {m['out_bytes'] / 1e9:.2f} GB bf16 "
          f"({len([f for f in m['output_files'] if f.endswith('.safetensors')])} shards + index)")
    print(f"  qckpt dequantize --workers 1  {m['wall_s']:7.2f} s  ({m['in_bytes'] / m['wall_s'] / 1e6:.0f} MB/s in, "
          f"{m['out_bytes'] / m['wall_s'] / 1e6:.0f} MB/s out)  runs {', '.join(f'{t:.2f}' for t in m['runs_s'])}")
    print(f"  plain read in + write out       {m['io_s']:7.2f} s   -> ratio x{m['ratio_to_io']:.2f} (target <= 2)")
    print(f"  plain copy of the input         {m['copy_s']:7.2f} s   -> ratio x{m['ratio_to_copy']:.2f}")
    print(f"  peak RSS {mib(m['peak_rss_max_process'])} MiB (largest process, VmHWM; tree sampled "
          f"{mib(m['peak_rss_tree'])} MiB; target <= {mib(RSS_TARGET)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2, help="layers of the first checkpoint (the second has twice)")
    ap.add_argument("--experts", type=int, default=8, help="routed experts per layer")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--max-memory", default=None, help="pass --max-memory to qckpt (default: qckpt's)")
    args = ap.parse_args()
    extra = ["--max-memory", args.max_memory] if args.max_memory else []
    tmp = None
    work = args.workdir or Path(tmp := tempfile.mkdtemp(prefix="qckpt-fp8-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results = {}
    try:
        for layers in (args.layers, 2 * args.layers):
            src = work / f"fp8-{layers}L"
            if not src.exists():
                build(src, layers, args.experts)
            copy_baseline(data_files(src), work / "warm.bin")  # the input in the page cache
            results[layers] = m = measure(src, work, args.repeat, extra)
            report(f"{layers} layers x {args.experts} experts", m)
            shutil.rmtree(src)
        a, b = results[args.layers], results[2 * args.layers]
        print(f"peak RSS {mib(a['peak_rss_max_process'])} -> {mib(b['peak_rss_max_process'])} MiB when the layers "
              f"double (x{b['peak_rss_max_process'] / a['peak_rss_max_process']:.2f}; flat is x1)")
        (work / "results-fp8-dequant.json").write_text(json.dumps(results, indent=1))
        if tmp is None:
            print(f"results: {work / 'results-fp8-dequant.json'}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
