"""What the gpt-oss interop scripts share (numpy only): the fixture, the tokens, running qckpt, comparing logits,
and storing a section of ``tests/data/gpt_oss/interop.json``.

Used by gpt_oss_tiny.py (transformers), gpt_oss_mlx.py (mlx-lm vs transformers) and gpt_oss_gguf_roundtrip.py
(gpt-oss -> GGUF -> gpt-oss in transformers); each runs in its own venv, so nothing here imports torch or mlx.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "gpt_oss" / "tiny_mxfp4"
INTEROP_JSON = FIXTURE.parent / "interop.json"
TOKENS = [[1, 5, 9, 17, 33, 65, 100, 127, 2, 64, 77, 3]]
#: qckpt runs from this checkout, with nothing else on its path.
QCKPT_ENV = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def qckpt_convert(python: str, src: Path, dst: Path, to: str) -> None:
    """``<python> -m converter convert SRC DST --to TO`` of this checkout (raises on a non-zero exit)."""
    subprocess.run([python, "-m", "converter", "convert", str(src), str(dst), "--to", to], check=True,
                   env=QCKPT_ENV, cwd=ROOT, stdout=subprocess.DEVNULL)


def logit_stats(got, want) -> tuple[float, float, float]:
    """(max |got - want|, mean |want|, share of positions whose argmax agrees) of two float logit arrays
    ``(batch, positions, vocab)`` (numpy, or anything ``np.asarray`` reads), computed in their own dtype."""
    got, want = np.asarray(got), np.asarray(want)
    return (float(np.abs(got - want).max()), float(np.abs(want).mean()),
            float((got.argmax(-1) == want.argmax(-1)).mean()))


def store_section(key: str, out: dict) -> None:
    """Write ``out`` as section ``key`` of interop.json (the other sections kept)."""
    doc = json.loads(INTEROP_JSON.read_text())
    doc[key] = out
    INTEROP_JSON.write_text(json.dumps(doc, indent=1) + "\n")
