"""Write plans: output arrays known (name, dtype, shape) before any data moves.

A writer turns each source tensor into a :class:`TensorPlan` from its spec alone (shape
arithmetic), then the arrays are produced one source tensor at a time and streamed into a
planned safetensors file, so memory stays bounded by the largest tensor (zarr-style codecs that
compute output shapes first; DESIGN.md section 6).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..errors import ConverterError, FormatError
from ..io.atomic import atomic_output
from .safetensors_io import SafetensorsWriter
from .source import INDEX_NAME


@dataclass
class TensorPlan:
    """How one source tensor becomes output arrays.

    Attributes
    ----------
    source : str
        Name of the tensor in the source checkpoint.
    outputs : list of (name, dtype, shape)
        Arrays the encoder will return, with safetensors dtype strings.
    encode : callable(tensor) -> dict name -> ndarray
    notes : list of str
        What the writer did (for reports): "exact repack", "scales rounded to fp16" ...
    """

    source: str
    outputs: list[tuple[str, str, tuple[int, ...]]]
    encode: Callable[[Any], Mapping[str, np.ndarray]]
    notes: list[str] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        from ..dtypes import lookup
        total = 0
        for _, dt, shape in self.outputs:
            n = int(np.prod(shape, dtype=np.int64)) if shape else 1
            total += (n * lookup(dt).bits + 7) // 8
        return total


def write_plans(path: Path, plans: Sequence[TensorPlan], ckpt, metadata: Mapping[str, str] | None) -> None:
    """Stream the planned arrays of ``plans`` into one safetensors file at ``path`` (not atomic itself)."""
    entries = [o for p in plans for o in p.outputs]
    names = [e[0] for e in entries]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise FormatError("two output arrays share a name", file=path, tensor=dup[0])
    with SafetensorsWriter(path, entries, metadata) as w:
        for p in plans:
            try:
                arrays = p.encode(ckpt[p.source])
            except ConverterError as exc:
                raise exc.with_context(tensor=p.source)
            for name, arr in arrays.items():
                w.write(name, arr)


def shard_plans(plans: Sequence[TensorPlan], max_shard_bytes: int | None) -> list[list[TensorPlan]]:
    """Split plans into shards of at most ``max_shard_bytes`` (a tensor's arrays stay together)."""
    if not max_shard_bytes:
        return [list(plans)]
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for p in plans:
        if shards[-1] and size + p.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(p)
        size += p.nbytes
    return shards


def _test_shard_delay() -> None:
    """Test-only hook: sleep ``$QCKPT_TEST_SHARD_DELAY`` seconds after each shard, so a test can
    kill a multi-shard write mid-way deterministically (tests/io/test_kill.py). Unset: no effect."""
    delay = os.environ.get("QCKPT_TEST_SHARD_DELAY")
    if delay:
        time.sleep(float(delay))


def write_model_dir(dst: Path, plans: Sequence[TensorPlan], ckpt, *, metadata: Mapping[str, str] | None,
                    config: Mapping[str, Any] | None, extra_json: Mapping[str, Any] | None = None,
                    extra_files: Sequence[str | Path] = (), max_shard_bytes: int | None = None,
                    overwrite: bool = False) -> dict:
    """Write a Hugging Face style model directory atomically.

    ``model.safetensors`` (or ``model-0000i-of-0000N.safetensors`` shards with
    ``model.safetensors.index.json``, huggingface_hub naming), ``config.json`` (when given),
    other JSON files (``extra_json``: file name -> object) and copied ``extra_files``.

    Tied embeddings (:mod:`converter.formats.ties`, CASES.md B32/B33): when the config says
    ``tie_word_embeddings: true`` and an ``lm_head.weight`` is planned, an head identical to the
    embedding is stored once (its plan dropped); a different one is kept and the written config
    says ``tie_word_embeddings: false``. Either way the summary's ``tied_head`` says so.

    Returns
    -------
    dict with ``files`` (names written), ``tensors`` (count) and, when the rule applied,
    ``tied_head`` (head, embedding, identical, max_abs_diff, note).
    """
    from .ties import resolve_tied_head
    drop, config, tie = resolve_tied_head(ckpt, config, {p.source for p in plans})
    plans = [p for p in plans if p.source not in drop]
    shards = shard_plans(plans, max_shard_bytes)
    written: list[str] = []
    with atomic_output(dst, overwrite=overwrite, is_dir=True) as tmp:
        tmp.mkdir(parents=True, exist_ok=True)
        if len(shards) == 1:
            write_plans(tmp / "model.safetensors", shards[0], ckpt, metadata)
            written.append("model.safetensors")
        else:
            n = len(shards)
            weight_map: dict[str, str] = {}
            total = 0
            for i, shard in enumerate(shards, 1):
                fname = f"model-{i:05d}-of-{n:05d}.safetensors"
                write_plans(tmp / fname, shard, ckpt, metadata)
                written.append(fname)
                _test_shard_delay()
                for p in shard:
                    total += p.nbytes
                    for o in p.outputs:
                        weight_map[o[0]] = fname
            index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
            (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
            written.append(INDEX_NAME)
        if config is not None:
            (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            written.append("config.json")
        for fname, obj in (extra_json or {}).items():
            (tmp / fname).write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
            written.append(fname)
        for f in extra_files:
            f = Path(f)
            if f.name not in written:
                shutil.copyfile(f, tmp / f.name)
                written.append(f.name)
    result: dict[str, Any] = {"files": written, "tensors": len(plans)}
    if tie is not None:
        result["tied_head"] = tie
    return result


def write_single_file(dst: Path, plans: Sequence[TensorPlan], ckpt, *, metadata: Mapping[str, str] | None,
                      overwrite: bool = False) -> dict:
    """Write one safetensors file atomically."""
    with atomic_output(dst, overwrite=overwrite) as tmp:
        write_plans(tmp, plans, ckpt, metadata)
    return {"files": [Path(dst).name], "tensors": len(plans)}


def dense_plan(spec, name: str | None = None) -> TensorPlan:
    """Pass a dense tensor through bit-exact."""
    out = name or spec.name
    return TensorPlan(spec.name, [(out, spec.dtype, tuple(spec.shape))],
                      lambda t, out=out: {out: np.ascontiguousarray(t.data)}, ["passed through"])
