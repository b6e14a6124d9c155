"""Plain float safetensors: every tensor dense (F32/F16/BF16), one file or a sharded directory.

Writing dequantizes quantized tensors (float32 arithmetic, one cast at the end) to the chosen
dtype; dense tensors pass through bit-exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Container


import numpy as np

from converter.dtypes import float_dtype
from converter.errors import FormatError
from converter.tensor import Checkpoint
from converter.spec import refuse_opaque
from converter.write.plan import TensorPlan, dense_plan, rows_plan
from converter.formats.base import dropped_activation_scales
from converter.formats.model_dir import write_model_dir
from converter.write.dry_run import DryRunPlanned
from converter.write.engine import task_count
from converter.write.files import write_single_file
from converter.formats.registry import Detection, FormatHandler, OutputKind, opaque_target, register
from converter.formats.source import Source
from converter.vocabulary import FLOAT_DTYPE_ALIASES

FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
#: Why a static activation scale is not written to a float checkpoint (the summary's ``dropped`` reason).
ACT_SCALE_DROPPED = ("static activation scale not written: it quantizes a layer's input at run time (ModelOpt / "
                     "compressed-tensors input_scale), a float model has no such parameter (transformers' float "
                     "Linear ignores it)")


def read_plain(src: Source) -> Checkpoint:
    """Every tensor as stored, dense.

    Raises
    ------
    FormatError
        The config declares a quantization (``--format plain`` forced on a quantized checkpoint would read its
        packed codes and scales as float parameters: a model that loads and computes garbage).
    """
    qm = (src.quantization_config or {}).get("quant_method")
    if qm:
        raise FormatError("the config declares a quantized checkpoint: read as plain, its packed codes and scales "
                          "would pass for float weights", file=src.path, field="quantization_config.quant_method",
                          expected="no quantization_config for --format plain", found=qm,
                          hint="leave --format out (or name the quantized format); `qckpt dequantize` writes floats")
    specs = {}
    for name in src.tensor_names():
        specs[name] = src.dense_spec(name)
    return Checkpoint(specs, src.dense, format="plain", path=str(src.path),
                      config=src.config, metadata={}, files=[str(f) for f in src.files],
                      extra_files=[str(p) for p in src.extra_files()])


def detect_plain(src: Source) -> Detection | None:
    if src.kind == "gguf" or src.quantization_config or src.st_metadata.get("qckpt.format"):
        return None
    names = src.tensor_names()
    if names and all(src.info(n).dtype in FLOAT_DTYPES for n in names):
        return Detection("plain", 20, "only float tensors and no quantization config")
    return None


def _transposed_plan(spec, axes: list[str], dtype: str) -> TensorPlan:
    """A quantized tensor dequantized and stored with its axes in ``axes`` order.

    When the outermost axis stays first (gpt-oss experts ``(expert, out, in)`` -> ``[expert, in, out]``) each
    block of leading rows is one contiguous run of the output, so the plan is row-splittable: the writer
    dequantizes and transposes a few experts at a time under the memory budget (a gpt-oss-120b expert stack
    is ~8.5 GB in float32, one expert ~66 MB). Otherwise the tensor is worked on whole."""
    perm = [spec.axes.index(a) for a in axes]
    np_dt = float_dtype(dtype)
    plan = TensorPlan(spec.name, [(spec.name, dtype, tuple(spec.shape[i] for i in perm))],
                      lambda t: {spec.name: np.ascontiguousarray(np.transpose(t.dequantize(np_dt), perm))},
                      [f"dequantized to {dtype}, stored as ({', '.join(axes)}): the model's float parameter order"])
    return rows_plan(plan, values=True) if perm[0] == 0 else plan


def counted(name: str, values: np.ndarray) -> np.ndarray:
    """``values`` (a dequantized tensor or row block), its NaN / inf count reported as the task result
    ``("non_finite", name)`` when it has any (:func:`converter.write.engine.task_count`): non-finite scales or zero
    points decode to NaN / inf, and a float16 / bfloat16 output overflows to inf; the dequantize report names them."""
    finite = np.isfinite(values)
    if not finite.all():
        task_count("non_finite", name, values.size - int(np.count_nonzero(finite)))
    return values


def _counting(name: str, encode):
    """``encode`` with each array it returns :func:`counted` under ``name``."""
    return lambda t: {k: counted(name, v) for k, v in encode(t).items()}


def plain_plans(ckpt: Checkpoint, dtype: str = "F32", skip: Container[str] = ()) -> list[TensorPlan]:
    """Plans that dequantize quantized tensors to ``dtype`` and pass dense ones through (but those in ``skip``).

    A quantized tensor whose float parameter stores its axes in another order than the logical one
    (``ckpt.metadata["dense_axes"]``: ``{name: [axis, ...]}``, declared by the source's reader; gpt-oss
    experts are ``[expert, in, out]`` in transformers' BF16 ``GptOssExperts``) is written in that order."""
    np_dt = float_dtype(dtype)
    orders = (ckpt.metadata or {}).get("dense_axes") or {}
    plans = []
    for spec in ckpt.specs():
        if spec.name in skip:
            continue
        if spec.kind == "dense":
            plans.append(dense_plan(spec))
        elif spec.decoded_by:  # values decoded by another decoder (GGUF IQ* / TQ*): float32, rounded to dtype
            plans.append(rows_plan(TensorPlan(spec.name, [(spec.name, dtype, tuple(spec.shape))],
                                              lambda t, n=spec.name: {n: np.asarray(t.data, np.float32).astype(np_dt)},
                                              [f"decoded by {spec.decoded_by}, stored as {dtype}"]), values=True))
        elif spec.name in orders and sorted(orders[spec.name]) == sorted(spec.axes) \
                and list(orders[spec.name]) != list(spec.axes):
            plans.append(_transposed_plan(spec, list(orders[spec.name]), dtype))
        else:
            plans.append(rows_plan(TensorPlan(spec.name, [(spec.name, dtype, tuple(spec.shape))],
                                              lambda t, n=spec.name: {n: t.dequantize(np_dt)},
                                              [f"dequantized to {dtype}"]), values=True))
    return plans


TORCH_DTYPE_NAMES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
"""safetensors dtype -> the ``torch_dtype`` / ``dtype`` name transformers writes in config.json."""


def written_dtype(plans: list[TensorPlan]) -> str | None:
    """The narrowest float dtype that holds every written float tensor exactly (``"F32"`` ...), None
    without float outputs: the one dtype written, else the widest (F16 and BF16 together: F32).

    A model loaded in this dtype computes with exactly the values written (a bf16 dequantization
    beside a GGUF's float32 norms loads in float32, not with its norms rounded to bf16).
    """
    found = {dt for p in plans for _, dt, _ in p.outputs if dt in TORCH_DTYPE_NAMES}
    if not found:
        return None
    if len(found) == 1:
        return next(iter(found))
    return "F64" if "F64" in found else "F32"


def _plain_config(config: dict | None, plans: list[TensorPlan]) -> dict | None:
    """config.json without quantization keys, ``dtype`` (and ``torch_dtype`` when the source had one) set to
    the dtype written: transformers 5 loads in ``dtype`` by default, so a source's ``bfloat16`` kept over
    float32 weights would round them on load.

    A flat ``rope_theta`` is added beside ``rope_parameters.rope_theta`` when only the nested one is present
    (transformers 5 writes only ``rope_parameters`` and reads both; mlx_lm 0.32 ``models/llama.py``
    ``ModelArgs`` has only ``rope_theta: float = 10000`` and ``BaseModelArgs.from_dict`` drops unknown keys, so
    without it the model runs at the default base)."""
    if not config:
        return None
    cfg = {k: v for k, v in config.items() if k not in ("quantization_config", "quantization")}
    rope = cfg.get("rope_parameters")
    if "rope_theta" not in cfg and isinstance(rope, dict) and isinstance(rope.get("rope_theta"), (int, float)):
        cfg["rope_theta"] = rope["rope_theta"]
    dt = written_dtype(plans)
    if dt is not None:
        cfg["dtype"] = TORCH_DTYPE_NAMES[dt]
        if "torch_dtype" in cfg:
            cfg["torch_dtype"] = TORCH_DTYPE_NAMES[dt]
    return cfg


def write_plain(ckpt: Checkpoint, dst: Path, *, dtype: str = "F32", overwrite: bool = False,
                max_shard_bytes: int | None = None, match_tool: bool = False, tool_dtype: str | None = None,
                **_: Any) -> dict:
    """Write ``ckpt`` as plain float safetensors.

    ``match_tool``: each quantized tensor decoded as the source format's producing tool does, in the tool's
    dtype (:mod:`converter.formats.tool_decode`; ``dtype`` is then unused, ``tool_dtype`` is the tool's
    run-time dtype where it has one); the summary's ``match_tool`` names the tool per tensor.

    ``dst`` ending in ``.safetensors`` gives one file; otherwise a model directory (sharded when
    ``max_shard_bytes`` is set) with ``config.json`` (its ``quantization_config`` removed, ``dtype`` the
    dtype written: :func:`written_dtype`), the source directory's other files copied and the source's
    side files (a GGUF's tokenizer) written. Static activation scales (``input_scale`` ...) are not written:
    the summary's ``dropped`` names each with the reason (:func:`~converter.formats.base.dropped_activation_scales`).
    """
    for spec in ckpt.specs():  # float values are what this writer stores: a decoded type's values are enough
        if not spec.decoded_by:
            refuse_opaque(spec, "plain")
    dtype = FLOAT_DTYPE_ALIASES.get(dtype, dtype)
    if dtype not in ("F32", "F16", "BF16"):
        raise FormatError("plain output dtype must be f32, f16 or bf16", field="dtype", found=dtype)
    dropped = dropped_activation_scales(ckpt, ACT_SCALE_DROPPED)
    tools = None
    if match_tool:
        from converter.formats.registry import get
        from converter.formats.tool_decode import tool_plans
        tool_dtype = FLOAT_DTYPE_ALIASES.get(tool_dtype, tool_dtype) if tool_dtype else None
        plans, tools = tool_plans(ckpt, get(ckpt.format).tool_decode, ckpt.format, tool_dtype, skip=dropped)
    else:
        plans = plain_plans(ckpt, dtype, skip=dropped)
    dense = {spec.name for spec in ckpt.specs() if spec.kind == "dense"}
    for plan in plans:  # every decoded tensor's NaN / inf counted, whoever decodes it (dense ones pass through)
        if plan.source not in dense:
            plan.encode = _counting(plan.source, plan.encode)
    meta = {"format": "pt"}
    dst = Path(dst)
    try:
        if dst.suffix == ".safetensors":
            res = write_single_file(dst, plans, ckpt, metadata=meta, overwrite=overwrite)
        else:
            res = write_model_dir(dst, plans, ckpt, metadata=meta, config=_plain_config(ckpt.config, plans),
                                  extra_files=ckpt.extra_files, max_shard_bytes=max_shard_bytes, overwrite=overwrite)
    except DryRunPlanned as planned:  # --dry-run: the plan also names what is not written
        planned.outputs["dropped"] = dropped
        raise
    if tools is not None:
        res["match_tool"] = tools
    return {**res, **({"dropped": dropped} if dropped else {})}


HANDLER = register(FormatHandler("plain", "float safetensors (F32/F16/BF16), single file or sharded",
                                 detect_plain, read_plain, write_plain, check_target=opaque_target,
                                 output=OutputKind(quantized=False, dense_source=True)))
