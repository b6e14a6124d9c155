"""gpt-oss fused experts <-> separate stacked ``gate_proj`` / ``up_proj`` / ``down_proj``, exactly and lazily.

The stacked targets keep the expert axis but want gate and up apart, under the names their loaders map:

- llama.cpp ``convert_hf_to_gguf.py`` ``GptOssModel.generate_extra_tensors`` (MXFP4 source): ``gate_up_proj_blocks``
  rows ``[:, ::2]`` / ``[:, 1::2]`` become ``<p>.gate_proj.weight`` / ``<p>.up_proj.weight`` (``ffn_gate_exps`` /
  ``ffn_up_exps``), ``down_proj`` -> ``<p>.down_proj.weight`` (``ffn_down_exps``); ``modify_tensors`` splits
  ``gate_up_proj_bias`` ``[..., ::2]`` / ``[..., 1::2]`` into ``<p>.gate_proj.bias`` / ``<p>.up_proj.bias`` and
  renames ``down_proj_bias`` to ``<p>.down_proj.bias``. The expert axis stays first (``[E, out, in]``: GGUF
  ``ne = (in, out, E)``); the codes and E8M0 bytes are relaid, never re-encoded.
- mlx-lm ``models/gpt_oss.py`` ``Model.sanitize``: the same ``gate_proj`` / ``up_proj`` split of the
  ``SwitchGLU`` ``mlp.experts`` (``v[..., ::2, :]`` / ``v[..., 1::2, :]``), same names and biases.

:func:`split` gives the stacked view of a gpt-oss checkpoint (one source tensor decoded per request, the last
one cached, so two parts of one ``gate_up_proj`` decode it once); :func:`fuse` is its inverse. Both keep every
other tensor as it is; the interleave record is :data:`~converter.formats.gpt_oss.interleave.GATE_UP`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from converter.errors import LayoutError, MissingTensorError
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, Tensor
from converter.spec import StoredArray, TensorSpec
from converter.formats.gpt_oss.interleave import GATE_UP, fuse_rows, split_rows
from converter.formats.gpt_oss.interleave import fuse as fuse_parts, split as split_parts
from converter.formats.gpt_oss.layout import AXES

_FUSED_RE = re.compile(r"^(?P<p>.+\.experts)\.(?P<proj>gate_up_proj|down_proj)(?P<bias>_bias)?$")
_STACKED_RE = re.compile(r"^(?P<p>.+\.experts)\.(?P<proj>gate_proj|up_proj|down_proj)\.(?P<kind>weight|bias)$")


def has_fused(ckpt: Checkpoint) -> bool:
    """Whether ``ckpt`` holds a gpt-oss fused expert projection (``<p>.experts.gate_up_proj``, axes
    (expert, out, in))."""
    return any(_FUSED_RE.match(s.name) and not _FUSED_RE.match(s.name)["bias"] and s.kind == "quantized"
               and tuple(s.axes or ()) == AXES for s in ckpt.specs())


def has_stacked(ckpt: Checkpoint) -> bool:
    """Whether ``ckpt`` holds stacked ``<p>.experts.{gate,up}_proj.weight`` (the GGUF / mlx-lm spelling)."""
    return any((m := _STACKED_RE.match(s.name)) and m["proj"] == "gate_proj" and s.kind == "quantized"
               and len(s.shape) == 3 for s in ckpt.specs())


def _part_shape(shape: tuple[int, ...], axis: int, n: int) -> tuple[int, ...]:
    out = list(shape)
    out[axis] //= n
    return tuple(out)


def _stored(spec: TensorSpec, name: str, n: int) -> tuple[StoredArray, ...]:
    """The source's stored arrays, each as a ``1/n`` share (the rows of one part)."""
    return tuple(replace(a, name=f"{a.name}[{name}]", shape=_part_shape(a.shape, min(1, len(a.shape) - 1), n),
                         nbytes=a.nbytes // n) for a in spec.stored)


def _view(ckpt: Checkpoint, specs: dict[str, TensorSpec], make: dict[str, Callable[[Callable], Tensor]],
          metadata: dict[str, Any]) -> Checkpoint:
    cache: dict[str, Tensor] = {}

    def load(name: str) -> Tensor:
        src = make.get(name)
        if src is None:
            return ckpt[name]

        def fetch(n: str) -> Tensor:
            if n not in cache:
                cache.clear()
                cache[n] = ckpt[n]
            return cache[n]
        return src(fetch)
    return Checkpoint(specs, load, format=ckpt.format, path=ckpt.path, config=ckpt.config, metadata=metadata,
                      files=ckpt.files, extra_files=ckpt.extra_files, side_files=ckpt.side_files)


def split(ckpt: Checkpoint) -> Checkpoint:
    """The stacked view of gpt-oss ``ckpt``: ``<p>.gate_up_proj`` ``(E, 2I, H)`` -> ``<p>.gate_proj.weight`` (rows
    ``0::2``) and ``<p>.up_proj.weight`` (rows ``1::2``), each ``(E, I, H)``; ``<p>.down_proj`` ->
    ``<p>.down_proj.weight``; the biases likewise into ``.bias``. Lazy: nothing is decoded until asked for.

    Raises
    ------
    LayoutError
        (when a tensor is loaded) a fused projection whose rows are not a whole number of gate / up pairs.
    """
    fused = dict((ckpt.metadata or {}).get("fused") or {})
    specs: dict[str, TensorSpec] = {}
    make: dict[str, Callable[[Callable], Tensor]] = {}
    for spec in ckpt.specs():
        m = _FUSED_RE.match(spec.name)
        quantized = spec.kind == "quantized" and tuple(spec.axes or ()) == AXES
        dense_bias = spec.kind == "dense" and m is not None and m["bias"] and len(spec.shape) == 2
        if m is None or not (quantized or dense_bias) or (quantized and m["bias"]):
            specs[spec.name] = spec
            continue
        kind = "bias" if m["bias"] else "weight"
        if m["proj"] == "down_proj":
            new = f"{m['p']}.down_proj.{kind}"
            specs[new] = replace(spec, name=new)
            make[new] = lambda fetch, src=spec.name, new=new: fetch(src).replace(name=new) \
                if isinstance(fetch(src), QuantizedTensor) else DenseTensor(new, fetch(src).data)
            continue
        name = spec.name if kind == "weight" else spec.name[:-len("_bias")]
        rec = type(GATE_UP).from_json(fused[name]) if name in fused else GATE_UP
        axis = 1  # out: (expert, out, in); the bias [E, out]
        for k, part in enumerate(rec.parts):
            new = f"{m['p']}.{part}.{kind}"
            notes = spec.notes + (f"rows {k}::{rec.stride} of {spec.name} ({rec.note()})",)
            specs[new] = replace(spec, name=new, shape=_part_shape(spec.shape, axis, rec.stride),
                                 stored=_stored(spec, new, rec.stride), notes=notes)
            if kind == "weight":
                names = [f"{m['p']}.{p}.weight" for p in rec.parts]
                make[new] = lambda fetch, src=spec.name, k=k, names=names, rec=rec: \
                    split_parts(fetch(src), names, rec)[k]
            else:
                make[new] = lambda fetch, src=spec.name, k=k, new=new, rec=rec: \
                    DenseTensor(new, split_rows(np.asarray(fetch(src).data), -1, rec)[k])
    meta = {k: v for k, v in (ckpt.metadata or {}).items() if k not in ("fused", "dense_axes")}
    return _view(ckpt, specs, make, meta)


def fuse(ckpt: Checkpoint) -> Checkpoint:
    """The inverse of :func:`split`: stacked ``<p>.{gate,up}_proj.{weight,bias}`` interleaved back into
    ``<p>.gate_up_proj`` / ``<p>.gate_up_proj_bias`` and ``<p>.down_proj.{weight,bias}`` renamed to
    ``<p>.down_proj`` / ``<p>.down_proj_bias``; the interleave recorded in ``metadata["fused"]``. Lazy.

    Raises
    ------
    MissingTensorError
        A ``gate_proj`` without its ``up_proj`` (or the reverse).
    LayoutError
        (when loaded) gate and up that disagree in shape, scheme or grouping.
    """
    specs: dict[str, TensorSpec] = {}
    make: dict[str, Callable[[Callable], Tensor]] = {}
    by_name = {s.name: s for s in ckpt.specs()}
    records: dict[str, Any] = {}
    for spec in ckpt.specs():
        m = _STACKED_RE.match(spec.name)
        if m is None or (m["kind"] == "weight" and not (spec.kind == "quantized" and len(spec.shape) == 3)):
            specs[spec.name] = spec
            continue
        p, proj, kind = m["p"], m["proj"], m["kind"]
        suffix = "" if kind == "weight" else "_bias"
        if proj == "down_proj":
            new = f"{p}.down_proj{suffix}"
            specs[new] = replace(spec, name=new)
            make[new] = lambda fetch, src=spec.name, new=new: (
                fetch(src).replace(name=new) if isinstance(fetch(src), QuantizedTensor)
                else DenseTensor(new, fetch(src).data))
            continue
        if proj == "up_proj":
            if f"{p}.gate_proj.{kind}" not in by_name:
                raise MissingTensorError("up_proj without its gate_proj", file=ckpt.path, tensor=spec.name,
                                         field="experts", expected=f"{p}.gate_proj.{kind}", found="absent")
            continue
        other = f"{p}.up_proj.{kind}"
        up = by_name.get(other)
        if up is None:
            raise MissingTensorError("gate_proj without its up_proj", file=ckpt.path, tensor=spec.name,
                                     field="experts", expected=other, found="absent")
        if spec.shape != up.shape:
            raise LayoutError("gate_proj and up_proj must have one shape to interleave", tensor=spec.name,
                              field="shape", expected=list(up.shape), found=list(spec.shape))
        new = f"{p}.gate_up_proj{suffix}"
        shape = list(spec.shape)
        shape[1 if kind == "weight" else -1] *= GATE_UP.stride
        specs[new] = replace(spec, name=new, shape=tuple(shape), stored=spec.stored + up.stored,
                             notes=tuple(n for n in spec.notes if "rows 0::" not in n) + (GATE_UP.note(),))
        if kind == "weight":
            records[new] = GATE_UP.to_json()
            make[new] = lambda fetch, g=spec.name, u=other, new=new: fuse_parts(
                [ckpt[g], ckpt[u]], new, GATE_UP)
        else:
            make[new] = lambda fetch, g=spec.name, u=other, new=new: DenseTensor(
                new, fuse_rows([np.asarray(ckpt[g].data), np.asarray(ckpt[u].data)], -1, GATE_UP))
    meta = dict(ckpt.metadata or {})
    meta["fused"] = {**dict(meta.get("fused") or {}), **records}
    return _view(ckpt, specs, make, meta)
