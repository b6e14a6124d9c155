"""gpt-oss fused experts <-> separate per-expert Linear weights, exactly (for 2-D targets such as compressed-tensors).

compressed-tensors' FP4 compressors are 2-D ``[out, in]`` only, so a target of that kind wants one Linear per
expert and per projection. The names are llm-compressor's (``modeling/gpt_oss.py``: ``LinearExperts`` holds
``experts: ModuleList[LinearExpert]`` with ``gate_proj`` / ``up_proj`` / ``down_proj`` ``nn.Linear``, bias on, and
``copy_from_fused_weights`` de-interleaves ``gate_up_proj`` with ``0::2`` / ``1::2``):

- ``<p>.gate_up_proj`` ``(E, 2I, H)`` -> ``<p>.experts.<e>.gate_proj.weight`` ``(I, H)`` (rows ``0::2``) and
  ``<p>.experts.<e>.up_proj.weight`` (rows ``1::2``); ``<p>.gate_up_proj_bias`` ``[E, 2I]`` likewise into ``.bias``;
- ``<p>.down_proj`` ``(E, H, I)`` -> ``<p>.experts.<e>.down_proj.weight`` ``(H, I)``; ``down_proj_bias`` -> ``.bias``.

Codes stay in their packed bytes and scales in their E8M0 bytes (:func:`.interleave.split` cuts whole rows), so
:func:`fused` after :func:`linear` gives back the same bytes; both raise on anything they cannot place.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Callable, Mapping

import numpy as np

from converter.errors import LayoutError, MissingTensorError
from converter.layout import EXPERT, IN, OUT, PackedCodes
from converter.spec import TensorSpec
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, Tensor
from converter.formats.gpt_oss.interleave import GATE_UP, fuse, fuse_rows, split, split_rows
from converter.formats.gpt_oss.layout import AXES

_LINEAR_RE = re.compile(r"^(?P<p>.+)\.experts\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)"
                        r"\.(?P<kind>weight|bias)$")


def _expert(t: QuantizedTensor, e: int, name: str) -> QuantizedTensor:
    """Expert ``e`` of a ``(expert, out, in)`` tensor as an ``(out, in)`` tensor (packed words kept)."""
    packed = t.packed
    if packed is not None and packed.axes == AXES and packed.amap.stored_axes[0] == EXPERT:
        amap = type(packed.amap)((OUT, IN), packed.amap.packed_axis, packed.amap.bits, packed.amap.container,
                                 packed.amap.order, packed.amap.packing)
        codes = PackedCodes(np.ascontiguousarray(packed.words[e]), amap, (OUT, IN),
                            {OUT: packed.sizes[OUT], IN: packed.sizes[IN]}, signed=packed.signed, flip=packed.flip)
    else:
        codes = np.ascontiguousarray(t.codes[e])
    zp = None if t.zero_points is None else np.ascontiguousarray(t.zero_points[e])
    stored = {k: type(v)(tuple(a for a in v.stored_axes if a != EXPERT), v.packed_axis, v.bits, v.container,
                         v.order, v.packing) for k, v in (t.stored or {}).items() if EXPERT in v.stored_axes}
    return QuantizedTensor(name, (OUT, IN), codes, np.ascontiguousarray(t.scales[e]), t.scheme, t.group_map,
                           zero_points=zp, stored=stored)


def _stack(parts: list[QuantizedTensor], name: str) -> QuantizedTensor:
    first = parts[0]
    packs = [p.packed for p in parts]
    if all(pk is not None and pk.amap == packs[0].amap and pk.axes == (OUT, IN) and not pk.flip for pk in packs):
        a = packs[0].amap
        amap = type(a)(AXES, a.packed_axis, a.bits, a.container, a.order, a.packing)
        codes = PackedCodes(np.stack([pk.words for pk in packs]), amap, AXES,
                            {EXPERT: len(parts), OUT: packs[0].sizes[OUT], IN: packs[0].sizes[IN]},
                            signed=packs[0].signed)
    else:
        codes = np.stack([p.codes for p in parts])
    zp = None if first.zero_points is None else np.stack([p.zero_points for p in parts])
    return QuantizedTensor(name, AXES, codes, np.stack([p.scales for p in parts]), first.scheme, first.group_map,
                           zero_points=zp)


def _expert_spec(spec: TensorSpec, name: str, rows: int, share: int) -> TensorSpec:
    """The spec of one ``(out, in)`` part of an ``(expert, out, in)`` spec: ``rows`` out rows, ``1/share`` of the
    stored bytes."""
    stored = tuple(replace(a, name=f"{a.name}[{name}]", shape=a.shape[1:], nbytes=a.nbytes // share)
                   for a in spec.stored)
    return replace(spec, name=name, axes=(OUT, IN), shape=(rows, spec.shape[2]), stored=stored)


def linear(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` with every fused expert tensor split into per-expert Linear weights and biases.

    Lazy: the specs come from the source's specs; a part is cut from its source tensor when asked for (the
    last source tensor decoded is kept, so the experts of one stack decode it once)."""
    fused = dict((ckpt.metadata or {}).get("fused") or {})
    specs: dict[str, TensorSpec] = {}
    make: dict[str, Callable[[Callable[[str], Tensor]], Tensor]] = {}
    for spec in ckpt.specs():
        name = spec.name
        prefix, _, proj = name.rpartition(".")
        if spec.kind == "quantized" and tuple(spec.axes or ()) == AXES and proj in ("gate_up_proj", "down_proj"):
            n_exp, rows = spec.shape[0], spec.shape[1]
            rec = type(GATE_UP).from_json(fused[name]) if name in fused else GATE_UP
            for e in range(n_exp):
                whole = f"{prefix}.experts.{e}.{proj}.weight"
                if proj == "gate_up_proj":
                    names = [f"{prefix}.experts.{e}.{p}.weight" for p in rec.parts]
                    for k, part in enumerate(names):
                        specs[part] = _expert_spec(spec, part, rows // rec.stride, n_exp * rec.stride)
                        make[part] = lambda fetch, src=name, e=e, k=k, whole=whole, names=names, rec=rec: \
                            split(_expert(fetch(src), e, whole), names, rec)[k]
                else:
                    specs[whole] = _expert_spec(spec, whole, rows, n_exp)
                    make[whole] = lambda fetch, src=name, e=e, whole=whole: _expert(fetch(src), e, whole)
        elif spec.kind == "dense" and proj in ("gate_up_proj_bias", "down_proj_bias") and len(spec.shape) == 2:
            n_exp = spec.shape[0]
            parts = GATE_UP.parts if proj == "gate_up_proj_bias" else ("down_proj",)
            for e in range(n_exp):
                for k, p in enumerate(parts):
                    bname = f"{prefix}.experts.{e}.{p}.bias"
                    specs[bname] = replace(spec, name=bname, shape=(spec.shape[1] // len(parts),),
                                           stored=tuple(replace(a, name=f"{a.name}[{bname}]", shape=a.shape[1:],
                                                                nbytes=a.nbytes // (n_exp * len(parts)))
                                                        for a in spec.stored))
                    if len(parts) > 1:
                        make[bname] = lambda fetch, src=name, e=e, k=k, bname=bname: DenseTensor(
                            bname, split_rows(np.asarray(fetch(src).data[e]), -1)[k])
                    else:
                        make[bname] = lambda fetch, src=name, e=e, bname=bname: DenseTensor(
                            bname, np.array(fetch(src).data[e]))
        else:
            specs[name] = spec
    cache: dict[str, Tensor] = {}

    def fetch(n: str) -> Tensor:
        if n not in cache:
            cache.clear()
            cache[n] = ckpt[n]
        return cache[n]

    def load(n: str) -> Tensor:
        return make[n](fetch) if n in make else ckpt[n]
    meta = {k: v for k, v in (ckpt.metadata or {}).items() if k not in ("fused", "dense_axes")}
    return Checkpoint(specs, load, format=ckpt.format, path=ckpt.path, config=ckpt.config, metadata=meta,
                      files=ckpt.files, extra_files=ckpt.extra_files, side_files=ckpt.side_files)


def _stack_members(ckpt: Checkpoint, found: Mapping[int, Tensor], pattern: str) -> list[Tensor] | None:
    """The tensors of experts ``0 .. n-1`` in order (None when there are none); a gap raises MissingTensorError."""
    if not found:
        return None
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise MissingTensorError("expert missing from a stack", file=ckpt.path, tensor=pattern.format(e=missing[0]),
                                 expected="present", found="absent")
    return [found[e] for e in range(len(found))]


def fused(ckpt: Checkpoint) -> Checkpoint:
    """The inverse of :func:`linear`: per-expert ``experts.<e>.{gate,up,down}_proj`` weights and biases stacked and
    gate / up interleaved back into ``gate_up_proj`` (in memory; the interleave recorded in ``metadata["fused"]``).

    Raises
    ------
    MissingTensorError
        An expert index or a projection missing from a stack.
    LayoutError
        Parts that disagree in shape, scheme or grouping.
    """
    groups: dict[tuple[str, str, str], dict[int, Tensor]] = {}
    rest: list[Tensor] = []
    for name, t in ckpt.items():
        m = _LINEAR_RE.match(name)
        if m is None:
            rest.append(t)
            continue
        groups.setdefault((m["p"], m["proj"], m["kind"]), {})[int(m["e"])] = t
    out = list(rest)
    records = {}
    prefixes = sorted({p for p, _, _ in groups})
    for p in prefixes:
        def experts(proj: str, kind: str, p: str = p) -> list[Tensor] | None:
            return _stack_members(ckpt, groups.get((p, proj, kind), {}), f"{p}.experts.{{e}}.{proj}.{kind}")
        gate, up, down = (experts(j, "weight") for j in ("gate_proj", "up_proj", "down_proj"))
        if (gate is None) != (up is None):
            raise MissingTensorError("gate_proj and up_proj come in pairs", file=ckpt.path, tensor=f"{p}.experts.0",
                                     expected="both", found="one")
        if gate is not None:
            if len(gate) != len(up) or not all(isinstance(t, QuantizedTensor) for t in gate + up):
                raise LayoutError("gate / up stacks must be quantized and of one expert count", tensor=p,
                                  field="experts", expected=len(gate), found=len(up))
            stacked = [_stack(gate, f"{p}.gate_up_proj"), _stack(up, f"{p}.gate_up_proj")]
            out.append(fuse(stacked, f"{p}.gate_up_proj", GATE_UP))
            records[f"{p}.gate_up_proj"] = GATE_UP.to_json()
        if down is not None:
            out.append(_stack(down, f"{p}.down_proj"))
        for proj, parts in (("gate_up_proj_bias", ("gate_proj", "up_proj")), ("down_proj_bias", ("down_proj",))):
            biases = [experts(j, "bias") for j in parts]
            if any(b is None for b in biases):
                continue
            per_expert = [np.stack([np.asarray(b.data) for b in bs]) for bs in biases]
            data = fuse_rows(per_expert, -1) if len(per_expert) > 1 else per_expert[0]
            out.append(DenseTensor(f"{p}.{proj}", data))
    meta = dict(ckpt.metadata or {})
    meta["fused"] = records
    return Checkpoint.from_tensors(out, format=ckpt.format, config=ckpt.config, metadata=meta)
