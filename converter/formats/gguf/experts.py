"""Per-expert float weights of a Hugging Face MoE decoder as llama.cpp's stacked expert tensors (Qwen2-MoE, Qwen3-MoE).

``convert_hf_to_gguf.py`` ``Qwen2MoeModel.modify_tensors`` (also ``Qwen3MoeModel``) stacks
``<p>.experts.<e>.{gate,up,down}_proj.weight`` (``(out, in)`` each, ``e`` = 0 .. ``num_experts`` - 1) along a new
leading expert axis into ``<p>.experts.{gate,up,down}_proj.weight`` ``(expert, out, in)``, which gguf-py names
``blk.N.ffn_{gate,up,down}_exps`` (GGUF ``ne`` = ``[in, out, expert]``). transformers 5 may already store the experts
fused: ``<p>.experts.gate_up_proj`` ``(expert, 2 * ff, hidden)`` is cut into its first (gate) and second (up) halves
of rows, ``<p>.experts.down_proj`` is renamed with ``.weight``. Whole values move (exact); nothing is decoded until
a stacked tensor is loaded. Only dense (float) experts are stacked: a quantized per-expert source is refused when
written (:func:`check_stackable`).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from converter.errors import NotRepresentableError
from converter.spec import TensorSpec
from converter.tensor import Checkpoint, DenseTensor

__all__ = ["stack_experts", "MOE_MODEL_TYPES"]

MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3")
"""config.json ``model_type`` values whose experts are stacked (llama.cpp ``qwen2moe`` / ``qwen3moe``; ``deepseek2``,
``DeepseekV2Model.modify_tensors`` stacks them the same way)."""

_PER_EXPERT = re.compile(r"^(?P<p>.+)\.experts\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"^(?P<p>.+)\.experts\.(?P<proj>gate_up_proj|down_proj)$")


def stack_experts(ckpt: Checkpoint) -> Checkpoint:
    """``ckpt`` with its per-expert (or fused) float expert weights as stacked ``(expert, out, in)`` tensors; the
    checkpoint itself when its ``model_type`` is not in :data:`MOE_MODEL_TYPES` or it has nothing to stack.

    Raises
    ------
    NotRepresentableError
        Quantized per-expert weights; experts missing from ``0 .. n-1`` or of different shapes / dtypes; a fused
        ``gate_up_proj`` with an odd row count.
    """
    if ckpt.config.get("model_type") not in MOE_MODEL_TYPES:
        return ckpt
    groups: dict[tuple[str, str], dict[int, TensorSpec]] = {}
    fused: dict[str, TensorSpec] = {}
    for spec in ckpt.specs():
        m = _PER_EXPERT.match(spec.name)
        if m:
            if spec.kind != "dense":
                raise NotRepresentableError("quantized per-expert weights are not stacked into GGUF expert tensors "
                                            "(only float experts are)", tensor=spec.name, field="kind",
                                            expected="dense", found=spec.kind,
                                            hint="dequantize the model first, then convert it to GGUF")
            groups.setdefault((m["p"], m["proj"]), {})[int(m["e"])] = spec
        elif _FUSED.match(spec.name) and spec.kind == "dense" and len(spec.shape) == 3:
            fused[spec.name] = spec
    if not groups and not fused:
        return ckpt
    specs: dict[str, TensorSpec] = {}
    make: dict[str, object] = {}
    done: set[str] = set()
    for spec in ckpt.specs():
        m = _PER_EXPERT.match(spec.name)
        if m:
            key = (m["p"], m["proj"])
            new = f"{m['p']}.experts.{m['proj']}.weight"
            if new in done:
                continue
            done.add(new)
            members = groups[key]
            if sorted(members) != list(range(len(members))):
                raise NotRepresentableError("experts are not numbered 0 .. n-1", tensor=new, field="experts",
                                            expected=list(range(len(members))), found=sorted(members))
            first = members[0]
            odd = [s.name for s in members.values() if (s.shape, s.dtype) != (first.shape, first.dtype)]
            if odd:
                raise NotRepresentableError("experts differ in shape or dtype", tensor=odd[0], field="shape",
                                            expected=f"{first.dtype} {list(first.shape)}")
            names = [members[e].name for e in range(len(members))]
            specs[new] = replace(first, name=new, shape=(len(names),) + tuple(first.shape),
                                 stored=tuple(a for e in range(len(members)) for a in members[e].stored))
            make[new] = lambda names=names, new=new: DenseTensor(new, np.stack([np.asarray(ckpt[n].data)
                                                                                for n in names]))
        elif spec.name in fused:
            p, proj = _FUSED.match(spec.name)["p"], _FUSED.match(spec.name)["proj"]
            if proj == "down_proj":
                new = f"{p}.experts.down_proj.weight"
                specs[new] = replace(spec, name=new)
                make[new] = lambda src=spec.name, new=new: DenseTensor(new, np.asarray(ckpt[src].data))
                continue
            rows = spec.shape[1]
            if rows % 2:
                raise NotRepresentableError("fused gate_up_proj rows are not two halves", tensor=spec.name,
                                            field="shape", expected="an even row count", found=list(spec.shape))
            for k, part in enumerate(("gate_proj", "up_proj")):
                new = f"{p}.experts.{part}.weight"
                half = f"rows {'first' if k == 0 else 'second'} half of {spec.name}"
                specs[new] = replace(spec, name=new, shape=(spec.shape[0], rows // 2, spec.shape[2]),
                                     notes=spec.notes + (half,))
                make[new] = lambda src=spec.name, new=new, k=k, h=rows // 2: DenseTensor(
                    new, np.ascontiguousarray(np.asarray(ckpt[src].data)[:, k * h:(k + 1) * h]))
        else:
            specs[spec.name] = spec

    def load(name: str):
        return make[name]() if name in make else ckpt[name]
    return Checkpoint(specs, load, format=ckpt.format, path=ckpt.path, config=ckpt.config, metadata=ckpt.metadata,
                      files=ckpt.files, extra_files=ckpt.extra_files, side_files=ckpt.side_files)
