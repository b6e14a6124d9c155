"""``qckpt validate --reference`` memory benchmark (qckpt issue 15): peak RSS of the reference comparison on one
large FP4 tensor, for this checkout and, optionally, a baseline checkout in the same run.

Run from a checkout::

    python benchmarks/bench_validate_reference_memory.py                   # [16384, 4096] float32 (268 MB)
    git archive 984fca0 | tar -x -C /tmp/base                               # a baseline checkout
    python benchmarks/bench_validate_reference_memory.py --baseline /tmp/base

A float32 reference ``model.layers.0.mlp.down_proj.weight`` (seeded normal values, ``--out x --in``) is written
as plain safetensors and quantized by this checkout with ``qckpt quantize REF Q --fp4 FMT --to
compressed-tensors`` (``--fp4 nvfp4``, default, or ``mxfp4``). Then ``qckpt validate Q --reference REF --json``
runs in a fresh subprocess per checkout; its peak RSS is the kernel's peak resident set of that process
(``os.wait4`` ``ru_maxrss``). The findings (codes, tensors, the best alternative named) of the two checkouts are
checked equal before any figure is printed. Printed: the statistics of the comparison, peak RSS and wall time per
checkout, and the ratio this checkout / baseline.

Measured 2026-12-06 on the 2-core dev VM (shared), NVFP4, same findings (none) and the same figures printed
(rel_rms 0.095131, rms_steps 0.264482, max |error| 0.0146872, closest alternative 'scales read in the other
orientation' 0.3458) in both checkouts::

    tensor            baseline 984fca0    fp4-mem
    [8192, 4096]      2689 MB             632 MB (x0.24; before the declared decode was freed first)
    [16384, 4096]     5317 MB             1186 MB (x0.22), then 917 MB (x0.17) with the declared decode freed

Before, every alternative decode (about ten) was held at once, each with a full-size float32 scale array and an
int64 codebook index, and the error sums made float64 copies of the tensor; now the alternatives are made and
compared one at a time (``converter/validate/interpretations.py`` ``lazy_alternatives``), the sums run in chunks
(``converter/validate/reference.py``) and ``dequantize_parts`` works in blocks of its leading axis.
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
from peak_rss import qckpt_process  # noqa: E402

from converter.write.safetensors import write_safetensors  # noqa: E402

NAME = "model.layers.0.mlp.down_proj.weight"


def qckpt(root: Path, *args: str) -> tuple[float, int, str]:
    """``(seconds, peak RSS bytes, stdout)`` of ``python -m converter ARGS`` from the checkout at ``root``
    (exit 1, findings, is a result too)."""
    return qckpt_process(root, *args, ok=(0, 1))


def summary(doc: dict) -> tuple:
    """What must not change: each finding's code, tensor and best alternative."""
    return tuple(sorted((f.get("code"), f.get("tensor"), str((f.get("details") or {}).get("best_alternative")))
                        for f in doc.get("findings", [])))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=int, default=16384)
    ap.add_argument("--in", dest="inp", type=int, default=4096)
    ap.add_argument("--fp4", default="nvfp4", choices=("nvfp4", "mxfp4"))
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout to measure in the same run")
    ap.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="qckpt-validate-ref-"))
    try:
        ref = work / "ref"
        ref.mkdir(parents=True)
        w = np.random.default_rng(15).standard_normal((a.out, a.inp), dtype=np.float32) * np.float32(0.02)
        write_safetensors(ref / "model.safetensors", {NAME: w}, {"format": "pt"})
        del w
        q = work / "q"
        qckpt(ROOT, "quantize", str(ref), str(q), "--fp4", a.fp4, "--to", "compressed-tensors",
              "--include", "down_proj", "--quiet")
        rows = []
        for label, root in (("this checkout", ROOT), ("baseline", a.baseline)):
            if root is None:
                continue
            secs, rss, text = qckpt(Path(root).resolve(), "validate", str(q), "--reference", str(ref), "--json")
            rows.append((label, secs, rss, json.loads(text)))
        if len({summary(doc) for *_, doc in rows}) > 1:
            raise SystemExit(f"findings differ: {[summary(doc) for *_, doc in rows]}")
        print(f"{a.fp4} [{a.out}, {a.inp}]: reference float32 {4 * a.out * a.inp / 1e6:.0f} MB; findings "
              f"{list(summary(rows[0][3])) or 'none'}" + (" (equal in both checkouts)" if len(rows) > 1 else ""))
        for label, _, _, doc in rows:
            ref = next((t.get("reference") for t in (doc.get("tensors") or {}).values() if t.get("reference")), None)
            if ref:
                print(f"{label}: rel_rms {ref['rel_rms']:.6g}, rms_steps {ref['rms_steps']:.6g}, max_abs_error "
                      f"{ref['max_abs_error']:.6g}, best alternative "
                      f"{min(ref['alternatives_rel_rms'].items(), key=lambda kv: kv[1])}")
        for label, secs, rss, _ in rows:
            ratio = f"  x{rss / rows[-1][2]:.2f} of baseline" if len(rows) > 1 and label != "baseline" else ""
            print(f"{label:13s}: {secs:6.2f} s, peak RSS {rss / 1e6:6.0f} MB{ratio}")
    finally:
        if a.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
