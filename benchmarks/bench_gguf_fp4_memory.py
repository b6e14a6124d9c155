"""GGUF FP4 dequantize memory benchmark (qckpt issue 15): peak RSS of ``qckpt dequantize`` on a GGUF ``MXFP4``
and ``NVFP4`` (with llama.cpp's F32 ``<name>.scale``) expert stack against a ``Q4_0`` stack of the same shape,
each under a small ``--max-memory`` and unbounded.

Run from a checkout::

    python benchmarks/bench_gguf_fp4_memory.py                       # [8, 2048, 4096] (float32 268 MB)
    python benchmarks/bench_gguf_fp4_memory.py --experts 4 --budget 32M
    python benchmarks/bench_gguf_fp4_memory.py --root /tmp/base          # another checkout (git archive C | tar -x)

Each file holds one tensor ``blk.0.ffn_up_exps.weight`` of random block bytes written with gguf-py's
``GGUFWriter`` (``raw_dtype``): MXFP4 E8M0 bytes 120..130, NVFP4 UE4M3 bytes 0x20..0x50 and a ``.scale`` of
0.5, Q4_0 float16 ``d`` near 2^-4 (the values do not change the cost). ``qckpt --workers 1 dequantize SRC DST
--max-memory B`` runs in a fresh subprocess; its peak RSS is the kernel's peak resident set of that process
(``os.wait4`` ``ru_maxrss``: the interpreter, the mapped source pages and the working set; the files are built
in another child so that the parent stays small, since a forked child's peak counts the parent's pages). The
bounded and the unbounded outputs of each type are checked byte-identical before any figure is printed. Printed: peak
RSS and wall time per type and budget, and the ratios FP4 / Q4_0 under the same budget.

Measured 2026-12-06 on the 2-core dev VM (shared), peak RSS in MB, bounded ``--max-memory 64M`` / unbounded::

    checkout                          Q4_0        MXFP4               NVFP4
    984fca0 (before)                  231 / 667   330 / 1470 (x2.20)  336 / 1489 (x2.23)
    fp4-mem (stacks decoded in rows)  203 / 407   197 /  405 (x1.00)  202 /  433 (x1.06)

Before, an ``(expert, out, in)`` stack was dequantized as one block with its scales expanded to every element
(``converter/values.py`` ``dequantize_parts``; a codebook lookup also made an int64 index of every code); now
its ``expert x out`` rows go through the row-blocked kernel (``_stacked_rows``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from peak_rss import digest_safetensors, qckpt_process  # noqa: E402
NAME = "blk.0.ffn_up_exps.weight"
#: ggml type -> (elements per block, bytes per block)
TYPES = {"Q4_0": (32, 18), "MXFP4": (32, 17), "NVFP4": (64, 36)}


def build(path: Path, type_name: str, experts: int, out: int, inp: int) -> None:
    """One GGUF file with a random ``[experts, out, inp]`` stack of ``type_name`` blocks."""
    rng = np.random.default_rng(15)
    per, size = TYPES[type_name]
    nb = inp // per
    blocks = rng.integers(0, 256, (experts, out, nb, size), dtype=np.uint8)
    if type_name == "MXFP4":
        blocks[..., 0] = rng.integers(120, 131, (experts, out, nb), dtype=np.uint8)
    elif type_name == "NVFP4":
        blocks[..., :4] = rng.integers(0x20, 0x51, (experts, out, nb, 4), dtype=np.uint8)
    else:  # Q4_0: float16 d in [2^-5, 2^-3)
        d = rng.uniform(2 ** -5, 2 ** -3, (experts, out, nb)).astype(np.float16)
        blocks[..., :2] = d[..., None].view(np.uint8).reshape(experts, out, nb, 2)
    w = gguf.GGUFWriter(path, "unknownarch")
    w.add_tensor(NAME, blocks.reshape(experts, out, nb * size), raw_dtype=gguf.GGMLQuantizationType[type_name])
    if type_name == "NVFP4":
        w.add_tensor(NAME.replace(".weight", ".scale"), np.array([0.5], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(src: Path, dst: Path, budget: str, root: Path = ROOT) -> tuple[float, int]:
    """``(seconds, peak RSS bytes)`` of one ``qckpt dequantize`` subprocess of the checkout at ``root``."""
    secs, rss, _ = qckpt_process(root, "dequantize", src, dst, "--workers", "1", "--max-memory", budget, "--quiet")
    return secs, rss


def main() -> int:
    if sys.argv[1:2] == ["--build"]:
        path, t, *dims = sys.argv[2:]
        build(Path(path), t, *map(int, dims))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--out", type=int, default=2048)
    ap.add_argument("--in", dest="inp", type=int, default=4096)
    ap.add_argument("--budget", default="64M")
    ap.add_argument("--types", default="Q4_0,MXFP4,NVFP4")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (default: this one)")
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="qckpt-gguf-fp4-"))
    n = a.experts * a.out * a.inp
    big = f"{max(8 * 4 * n, 2 ** 30) // 2 ** 20}M"  # larger than every working set: the tensor whole
    results: dict[tuple[str, str], tuple[float, int]] = {}
    try:
        for t in a.types.split(","):
            src = work / f"{t}.gguf"
            # built in a child: a forked child's peak RSS counts the parent's pages at the fork
            subprocess.run([sys.executable, __file__, "--build", str(src), t, str(a.experts), str(a.out),
                            str(a.inp)], check=True)
            for label, budget in (("bounded", a.budget), ("unbounded", big)):
                results[t, label] = run(src, work / f"{t}-{label}", budget, a.root.resolve())
            if digest_safetensors(work / f"{t}-bounded") != digest_safetensors(work / f"{t}-unbounded"):
                raise SystemExit(f"{t}: bounded and unbounded outputs differ")
            shutil.rmtree(work / f"{t}-bounded")
            shutil.rmtree(work / f"{t}-unbounded")
            src.unlink()
        print(f"checkout {a.root.resolve()}; stack [{a.experts}, {a.out}, {a.inp}]: float32 {4 * n / 1e6:.0f} MB; "
              "bounded and unbounded outputs byte-identical per type")
        for (t, label), (secs, rss) in results.items():
            budget = a.budget if label == "bounded" else big
            base = results.get(("Q4_0", label))
            ratio = f"  x{rss / base[1]:.2f} of Q4_0" if base and t != "Q4_0" else ""
            print(f"{t:6s} {label:9s} --max-memory {budget:>6s}: {secs:6.2f} s, peak RSS {rss / 1e6:6.0f} MB{ratio}")
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
