"""Fault injection on copies of the real samples (tmp_path only; sample_checkpoints/ is never modified)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from converter.formats.gptq import format as gptq
from converter.tensor import Checkpoint
from converter.validate import validate
from tests.conftest import SAMPLES

FP16 = SAMPLES / "minilm_fp16.safetensors"
QUERY = "encoder.layer.0.attention.self.query.weight"
POOLER = "encoder.layer.0.attention.self.key.weight"
OUTPUT = "encoder.layer.0.output.dense.weight"


def write_gptq(tmp_path: Path, t, name: str = "m", **kw) -> Path:
    """A GPTQ model directory ``tmp_path / name`` holding the one tensor ``t`` (``write_gptq`` options in ``kw``)."""
    d = tmp_path / name
    gptq.write_gptq(Checkpoint.from_tensors([t]), d, **kw)
    return d


def copy_sample(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(SAMPLES / name, dst, ignore=shutil.ignore_patterns("reference_dequant.safetensors"))
    return dst


def read_file(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str] | None]:
    with safe_open(str(path), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def edit_tensors(d: Path, fn: Callable[[dict[str, np.ndarray]], None], file: str = "model.safetensors") -> None:
    tensors, meta = read_file(d / file)
    fn(tensors)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(d / file), metadata=meta)


def with_inf_scales(d: Path, index) -> Path:
    """``d`` with ``scales[index] = inf`` in every ``*.scales`` array of its ``model.safetensors`` (GPTQ scales are
    ``(groups, out)``: ``(0, 0)`` is group 0 of output row 0); returns ``d``."""
    def infs(tensors: dict[str, np.ndarray]) -> None:
        for k in tensors:
            if k.endswith(".scales"):
                s = tensors[k].copy()
                s[index] = np.inf
                tensors[k] = s
    edit_tensors(d, infs)
    return d


def edit_config(d: Path, fn: Callable[[dict], None], files=("config.json", "quantize_config.json")) -> None:
    for name in files:
        p = d / name
        if not p.exists():
            continue
        cfg = json.loads(p.read_text())
        qc = cfg.get("quantization_config", cfg) if name == "config.json" else cfg
        fn(qc)
        p.write_text(json.dumps(cfg, indent=2))


def findings(path, **kw):
    rep = validate(path, **kw)
    return rep, {f.code: f for f in rep.findings}


def assert_finding(rep, code: str, tensor: str | None = None):
    hits = [f for f in rep.findings if f.code == code and (tensor is None or f.tensor == tensor)]
    assert hits, f"no {code} finding for {tensor}: {[(f.code, f.tensor, f.message) for f in rep.findings]}"
    assert hits[0].evidence, "a finding carries its evidence"
    return hits[0]
