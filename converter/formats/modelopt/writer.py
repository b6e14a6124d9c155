"""Write NVIDIA ModelOpt FP8 and NVFP4 exports: tensors, ``hf_quant_config.json`` and ``config.json`` as ModelOpt
0.47.0 does.

NVFP4 (E2M1 codes, E4M3 scales per 16 along ``in``; :mod:`converter.formats.modelopt.nvfp4`): codes and
group scales are relaid as stored, the global scale re-expressed as ModelOpt's multiplier
``weight_scale_2`` when an exact float32 one exists (:func:`converter.global_scales.equivalent_global_scale`;
refused before any data moves, naming tensor and value, when not; 1.0 when the source has none). ModelOpt
NVFP4 is W4A4: the source's one-value activation scale is required and written as ``<p>.input_scale``.

Per quantized module ``<p>`` (:mod:`converter.formats.modelopt.reader` has the layouts and sources):
per-tensor E4M3 -> ``FP8`` (``weight_scale`` 0-dim; the source's ``<p>.input_scale`` is required:
ModelOpt FP8 is W8A8 with a static activation scale, vLLM ``ModelOptFp8LinearMethod``),
per-channel -> ``FP8_PER_CHANNEL_PER_TOKEN`` (``weight_scale`` ``[O]``), 128 x 128 blocks ->
``FP8_PB_WO`` (``weight_scale`` ``[ceil(O/128), 1, ceil(I/128), 1]``). Several algorithms in one
checkpoint -> ``MIXED_PRECISION`` with ``quantized_layers``. Codes are written as stored (exact);
the scale dtype is kept (ModelOpt itself writes F32; its loaders widen BF16 / F16 exactly), so a
conversion to and from compressed-tensors is byte-identical. ``exclude_modules`` lists every
module kept dense that ModelOpt lists (Linear layers, the token embedding, an unstored tied head).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from converter.codebooks import element_of
from converter.errors import NotRepresentableError
from converter.groups import Granularity
from converter.layout import IN, OUT
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, TensorSpec, opaque_reason
from converter.formats import activations
from converter.formats.base import write_directory
from converter.formats.modules import dense_linear_modules, token_embedding_name
from converter.formats.source import module_prefix
from converter.write.plan import TensorPlan, dense_plan, rows_plan
from converter.formats.modelopt import nvfp4
from converter.formats.global_scale_routes import exact_targets_text, global_scales_of
from converter.formats.modelopt.config import (DEFAULT_VERSION, FP8, FP8_PB_WO, FP8_PC_PT, HF_QUANT_CONFIG, MIXED,
                                               NVFP4, NVFP4_GROUP, PB_WO_BLOCK, QUANT_METHOD, WRITTEN_NAME)

AXES = (OUT, IN)


def check_target(spec: TensorSpec, options: Any = None) -> str | None:
    """``None`` when ``spec`` can be written exactly as a ModelOpt FP8 layer, else the reason."""
    if spec.kind != "quantized":
        return opaque_reason(spec)
    s, gm = spec.scheme, spec.group_map
    if nvfp4.is_nvfp4(spec):
        return nvfp4.check_target(spec)
    el = element_of(s.codebook) if s.codebook is not None else None
    if el is None:
        return "ModelOpt is written as FP8 (E4M3) only, or NVFP4 (E2M1); integer layouts are not written (requantize)"
    if el.name != "e4m3":
        return f"{el.name} weights: ModelOpt FP8 stores E4M3 only (FP8QTensor.quantize)"
    if s.scale_dtype not in ("F32", "BF16", "F16"):
        return f"scale dtype {s.scale_dtype} is not a ModelOpt weight_scale dtype (F32; BF16 / F16 kept)"
    if tuple(spec.axes) != AXES:
        return f"axes {list(spec.axes)}: only 2-D [out, in] weights are written"
    if gm.granularity is Granularity.TENSOR:
        return None
    if gm.granularity is Granularity.CHANNEL:
        return None if gm.axis == OUT else "per-column (channel along in) scales have no ModelOpt algorithm"
    if gm.granularity is Granularity.BLOCK:
        if gm.extent(OUT) == PB_WO_BLOCK and gm.extent(IN) == PB_WO_BLOCK:
            return None
        return (f"{gm.describe()}: ModelOpt FP8_PB_WO uses 128 x 128 blocks only (FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG, "
                "vLLM ModelOptFp8PbWoLinearMethod)")
    return f"{gm.describe()} FP8 scales have no ModelOpt algorithm (per tensor, per channel, 128 x 128 blocks)"


def _dense(ckpt: Checkpoint, spec: TensorSpec) -> TensorPlan:
    """A dense tensor's plan: a single-value activation scale of a quantized module, whatever its source
    spelling (``activation_scale``, ``qscale_act`` ...), is written as ModelOpt's 0-dim ``<p>.input_scale``
    (``export_hf_checkpoint`` in 0.47.0; vLLM ``ModelOptFp8LinearMethod`` reads it); the rest passes through."""
    mod = activations.owner(spec.name) if activations.is_activation_scale(spec) else None
    w = f"{mod}.weight"
    if mod is not None and w in ckpt and ckpt.spec(w).kind == "quantized" \
            and int(np.prod(spec.shape, dtype=np.int64)) == 1:
        return activations.activation_plan(spec, f"{mod}.input_scale", ())
    return dense_plan(spec)


def probe_companions(t: "QuantizedTensor | TensorSpec") -> list[DenseTensor]:
    """The static activation scale a per-tensor FP8 probe (a tensor or a planned spec: its name, scheme and
    group map) needs to be written as ModelOpt ``FP8`` (W8A8:
    ``<module>.input_scale``, float32 0.5, 0-dim, as ``export_hf_checkpoint`` stores it); none otherwise."""
    if element_of(t.scheme.codebook) is not None and t.group_map.granularity is Granularity.TENSOR \
            and t.name.endswith(".weight"):
        return [DenseTensor(module_prefix(t.name) + ".input_scale", np.array(0.5, dtype=np.float32))]
    return []


def algo_of(spec: TensorSpec) -> str:
    if nvfp4.is_nvfp4(spec):
        return NVFP4
    g = spec.group_map.granularity
    return FP8 if g is Granularity.TENSOR else (FP8_PC_PT if g is Granularity.CHANNEL else FP8_PB_WO)


def encode(t: QuantizedTensor, prefix: str) -> dict:
    """``<p>.weight`` (E4M3 bytes as F8_E4M3) and ``<p>.weight_scale`` in ModelOpt's shape for the algorithm."""
    scales = np.ascontiguousarray(t.scales)
    algo = algo_of(t)
    if algo == FP8:
        scales = scales.reshape(())
    elif algo == FP8_PC_PT:
        scales = scales.reshape(-1)
    else:
        scales = scales.reshape(scales.shape[0], 1, scales.shape[1], 1)
    return {prefix + ".weight": np.ascontiguousarray(t.codes).view(element_of(t.scheme.codebook).numpy),
            prefix + ".weight_scale": scales}


#: transformers 5.24 logs "Unknown quantization type, got modelopt ... we will skip the quantization" and
#: loads the stored FP8 codes as if they were weights (measured: top-1 agreement 12 % on SmolLM2 layers).
TRANSFORMERS_NOTE = ("warning: transformers 5.24 does not read ModelOpt quantization: it skips quantization_config "
                     "and loads the raw FP8 codes as weights; load ModelOpt checkpoints with vLLM or TensorRT-LLM")


def _plan(spec: TensorSpec, prefix: str) -> TensorPlan:
    algo = algo_of(spec)
    if algo == NVFP4:
        plan = TensorPlan(spec.name, nvfp4.outputs(spec, prefix), lambda t, prefix=prefix: nvfp4.encode(t, prefix), [])
        return rows_plan(plan, once=[prefix + ".weight_scale_2"])
    o, i = spec.shape
    shape = {FP8: (), FP8_PC_PT: (o,), FP8_PB_WO: (-(-o // PB_WO_BLOCK), 1, -(-i // PB_WO_BLOCK), 1)}[algo]
    plan = TensorPlan(spec.name, [(prefix + ".weight", "F8_E4M3", tuple(spec.shape)),
                                  (prefix + ".weight_scale", spec.scheme.scale_dtype, shape)],
                      lambda t, prefix=prefix: encode(t, prefix), [])
    if algo == FP8:
        return rows_plan(plan, once=[prefix + ".weight_scale"])
    return rows_plan(plan) if algo == FP8_PC_PT else plan


def _excluded(ckpt: Checkpoint, quantized: set[str]) -> list[str]:
    """Modules ModelOpt lists in ``exclude_modules``: dense Linear layers, the token embedding and an
    output head that is not stored quantized (tied or dense), as ``get_quant_config`` lists them."""
    out = set(dense_linear_modules(ckpt.specs()))
    emb = token_embedding_name(ckpt.names())
    if emb is not None:
        out.add(module_prefix(emb))
    cfg = ckpt.config or {}
    archs = cfg.get("architectures") or []
    if "lm_head" not in quantized and ("lm_head.weight" in ckpt or cfg.get("tie_word_embeddings") is True
                                       or any(isinstance(a, str) and a.endswith("ForCausalLM") for a in archs)):
        out.add("lm_head")
    return sorted(out - quantized)


def _group_config(algo: str) -> dict:
    """``convert_hf_config._quant_algo_to_group_config`` for the FP8 algorithms."""
    if algo == FP8:
        return {"input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                "weights": {"dynamic": False, "num_bits": 8, "type": "float"}}
    if algo == FP8_PC_PT:
        return {"input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
                "weights": {"dynamic": False, "num_bits": 8, "type": "float", "strategy": "channel"}}
    if algo == NVFP4:
        return {k: dict(v) for k, v in nvfp4.GROUP_CONFIG.items()}
    return {"quant_algo": WRITTEN_NAME[algo]}


def _layer_entry(algo: str) -> dict:
    """A MIXED_PRECISION ``quantized_layers`` entry (``process_layer_quant_config``: NVFP4 adds its group_size)."""
    return {"quant_algo": WRITTEN_NAME[algo], **({"group_size": NVFP4_GROUP} if algo == NVFP4 else {})}


def configs(by_algo: dict[str, list[str]], exclude: list[str], kv: str | None, version: str) -> tuple[dict, dict]:
    """(``hf_quant_config.json``, ``config.json`` ``quantization_config``) as ModelOpt writes them."""
    producer = {"name": QUANT_METHOD, "version": version}
    if len(by_algo) <= 1:  # nothing quantized: quant_algo null, as get_quant_config leaves it
        algo = WRITTEN_NAME[next(iter(by_algo))] if by_algo else None
        quant = {"quant_algo": algo, "kv_cache_quant_algo": kv,
                 **({"group_size": NVFP4_GROUP} if algo == NVFP4 else {}), "exclude_modules": exclude}
    else:
        algo = MIXED
        layers = {p: _layer_entry(a) for a, mods in by_algo.items() for p in sorted(mods)}
        quant = {"quant_algo": MIXED, "kv_cache_quant_algo": kv, "quantized_layers": layers}
    qc: dict[str, Any] = {}
    if algo in (FP8, NVFP4):
        qc["config_groups"] = {"group_0": {**_group_config(algo), "targets": ["Linear"]}}
    elif algo == MIXED:
        qc["config_groups"] = {f"group_{i}": {**_group_config(a), "targets": sorted(mods)}
                               for i, (a, mods) in enumerate(by_algo.items())}
        qc["quantized_layers"] = quant["quantized_layers"]
    qc["ignore"] = quant.get("exclude_modules", [])
    qc["quant_algo"] = algo
    if kv:
        qc["kv_cache_scheme"] = {"dynamic": False, "num_bits": 8, "type": "float"} if kv == "FP8" else kv
    qc["producer"] = producer
    qc["quant_method"] = QUANT_METHOD
    return {"producer": producer, "quantization": quant}, qc


def _check_nvfp4(ckpt: Checkpoint, spec: TensorSpec, act: TensorSpec | None) -> None:
    """Before any data moves: the static activation scale NVFP4 (W4A4) needs, and a global scale ModelOpt's
    multiplier can hold exactly (the value is read from the source tensor)."""
    prefix = module_prefix(spec.name)
    if act is None or int(np.prod(act.shape, dtype=np.int64)) != 1:
        # the global scales' values decide which weight-only targets hold them exactly
        exact = exact_targets_text(spec.scheme.global_scale, spec.scheme.scale_dtype, global_scales_of(ckpt))
        raise NotRepresentableError(
            "ModelOpt NVFP4 is W4A4 with a static activation global scale (input_scale); the source has none",
            tensor=spec.name, field="input_scale", expected=prefix + ".input_scale (one value)",
            found="absent" if act is None else list(act.shape),
            hint=nvfp4.FP8_HINT + (f"; weight-only NVFP4: {exact}" if exact else ""))
    if spec.scheme.global_scale not in (None, nvfp4.DIRECTION):
        t = ckpt[spec.name]
        if nvfp4.multiplier(t) is None:
            raise nvfp4.refuse_global_scale(spec.name, t.global_scale, spec.scheme.global_scale)


def write_modelopt(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, max_shard_bytes: int | None = None,
                   modelopt_version: str | None = None, **_: Any) -> dict:
    """Write ``ckpt`` as a ModelOpt FP8 / NVFP4 export (atomically).

    Raises
    ------
    NotRepresentableError
        A tensor :func:`check_target` refuses, a per-tensor FP8 or NVFP4 weight without a static
        ``input_scale``, or an NVFP4 global scale with no exact ModelOpt multiplier (``field="global_scale"``).
    UnsupportedError
        An opaque tensor.
    """
    ckpt.refuse_opaque(QUANT_METHOD)
    plans: list[TensorPlan] = []
    by_algo: dict[str, list[str]] = {}
    notes: dict[str, list[str]] = {}
    static = activations.activation_scales(ckpt)
    for spec in ckpt.specs():
        if spec.kind == "dense":
            plans.append(_dense(ckpt, spec))
            continue
        reason = check_target(spec)
        if reason:
            raise NotRepresentableError(f"cannot write as modelopt: {reason}", tensor=spec.name, field="scheme",
                                        hint="requantize to FP8: --fp8 e4m3 --per-channel (or --block 128x128)")
        if not spec.name.endswith(".weight"):
            raise NotRepresentableError("ModelOpt stores quantized weights as <module>.weight", tensor=spec.name,
                                        field="name", expected="<module>.weight", found=spec.name)
        prefix = module_prefix(spec.name)
        algo = algo_of(spec)
        act = static.get(prefix)
        if algo == NVFP4:
            _check_nvfp4(ckpt, spec, act)
        if algo == FP8 and (act is None or int(np.prod(act.shape, dtype=np.int64)) != 1):
            raise NotRepresentableError(
                "ModelOpt FP8 (per-tensor weight scale) is W8A8 with a static input_scale; the source has none",
                tensor=spec.name, field="input_scale", expected=prefix + ".input_scale (or activation_scale / "
                "qscale_act / scale_input: one value)", found="absent" if act is None else list(act.shape),
                hint="ModelOpt has no per-tensor-weight algorithm with dynamic activations; requantize per channel "
                     "(FP8_PER_CHANNEL_PER_TOKEN) or write compressed-tensors")
        if algo == FP8_PC_PT and act is not None:
            notes[spec.name] = ["FP8_PER_CHANNEL_PER_TOKEN quantizes activations dynamically: the source's static "
                                "input_scale is kept as stored but ModelOpt runtimes do not use it"]
        notes.setdefault(spec.name, []).append(nvfp4.TRANSFORMERS_NOTE if algo == NVFP4 else TRANSFORMERS_NOTE)
        by_algo.setdefault(algo, []).append(prefix)
        plans.append(_plan(spec, prefix))
    quantized = {p for mods in by_algo.values() for p in mods}
    kv = (ckpt.metadata or {}).get("kv_cache_quant_algo") if ckpt.format == QUANT_METHOD else None
    hf, qc = configs(by_algo, _excluded(ckpt, quantized), kv if isinstance(kv, str) else None,
                     modelopt_version or DEFAULT_VERSION)
    config = {k: v for k, v in (ckpt.config or {}).items() if k not in ("quantization_config", "quantization")}
    config["quantization_config"] = qc
    summary = write_directory(ckpt, dst, plans, config=config, extra_json={HF_QUANT_CONFIG: hf},
                              max_shard_bytes=max_shard_bytes, overwrite=overwrite,
                              notes=lambda: {k: v for k, v in notes.items() if v})
    return activations.declare(summary, plans)
