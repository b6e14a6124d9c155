"""Dequantize as the producing tool does (``qckpt dequantize --match-tool``): its arithmetic, its dtype.

qckpt's own decode (:func:`converter.values.dequantize`) is exact float32: every operand widened to
float32, the formula evaluated once and, for ``--dtype f16`` / ``bf16``, rounded once at the end. A
tool's decode may round elsewhere: MLX ``mx.dequantize`` (affine) computes ``scale * q`` in the scale
dtype and rounds it before adding the bias, and every torch tool returns the values in one dtype of
its own choosing (the scales', the model's, a ``dtype`` argument). Each format that knows its tool
declares it as a :attr:`~converter.formats.registry.FormatHandler.tool_decode` hook returning a
:class:`ToolDecode`; :func:`tool_plans` turns them into the plain writer's plans.

Where the tool's result is the exact float32 value rounded once to its dtype (most torch decodes:
``s * (q - z)`` with a small integer ``q - z`` is exact in float32), the hook is :func:`rounded_once`.
Where the tool's output dtype is a *runtime* choice (bitsandbytes 4-bit: ``quant_state.dtype``;
ModelOpt ``dequantize(dtype=...)``; compressed-tensors / auto-round: the model's dtype), the file's
own record is the default (:func:`model_dtype`: config.json ``dtype`` / ``torch_dtype``) and
``--tool-dtype`` overrides it; where the file fixes it (the stored scale dtype, gguf-py's float32),
an override that differs is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Container, Any, Callable, Mapping, Optional

import numpy as np

from converter.dtypes import float_dtype
from converter.errors import UnsupportedError
from converter.write.plan import TensorPlan, dense_plan, rows_plan

TORCH_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float": "F32", "half": "F16"}
"""config.json / quant_state dtype spellings (``torch.float16`` without its prefix) -> safetensors dtype."""


@dataclass(frozen=True)
class ToolDecode:
    """How the producing tool dequantizes one tensor.

    Attributes
    ----------
    tool : str
        The tool's function and its arithmetic, for the report (``"mlx.core.dequantize: fp16(fp16(s*q) + b)"``).
    dtype : str
        The safetensors dtype the tool returns (``"F16"``, ``"BF16"``, ``"F32"``).
    decode : callable(QuantizedTensor) -> ndarray
        The values, dtype ``dtype``, shape the tensor's logical shape.
    row_local : bool
        ``decode`` of a block of rows gives those rows of the whole decode (the writer may work in row
        blocks); False: whole tensors only.
    """

    tool: str
    dtype: str
    decode: Callable[[Any], np.ndarray]
    row_local: bool = True


def torch_dtype_name(name: Any) -> Optional[str]:
    """``"float16"`` / ``"torch.bfloat16"`` ... -> ``"F16"`` / ``"BF16"``; None when not a float dtype name."""
    if not isinstance(name, str):
        return None
    return TORCH_NAMES.get(name.removeprefix("torch."))


def model_dtype(config: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The model's dtype recorded in config.json (transformers 5 ``dtype``, older ``torch_dtype``): the
    dtype torch tools load the model in and decode into; None when absent."""
    cfg = config or {}
    return torch_dtype_name(cfg.get("dtype")) or torch_dtype_name(cfg.get("torch_dtype"))


def rounded_once(tool: str, dtype: str, unsigned_zero: bool = False) -> ToolDecode:
    """A tool whose decode equals qckpt's exact float32 value rounded once (round to nearest even) to
    ``dtype``; ``unsigned_zero``: a tool that never returns -0 (its code table holds +0 for the negative
    zero code), so -0 becomes +0."""
    np_dt = float_dtype(dtype)
    if not unsigned_zero:
        return ToolDecode(tool, dtype, lambda t: t.dequantize(np_dt))

    def decode(t) -> np.ndarray:
        out = t.dequantize(np_dt)
        out[out == 0] = 0  # -0 == 0: every zero written as +0
        return out
    return ToolDecode(tool, dtype, decode)


def runtime_dtype(tool: str, runtime: Optional[str], recorded: Optional[str], fallback: str) -> str:
    """The output dtype of a tool that takes it at run time: ``runtime`` (``--tool-dtype``) if given, else
    the one the file records, else ``fallback``."""
    return runtime or recorded or fallback


def fixed_dtype(tool: str, dtype: str, runtime: Optional[str], why: str, tensor: str) -> str:
    """The output dtype of a tool that the file fixes (``why``); ``runtime`` must agree.

    Raises
    ------
    UnsupportedError
        ``--tool-dtype`` names another dtype (the tool has no such choice).
    """
    if runtime is not None and runtime != dtype:
        raise UnsupportedError(f"{tool} decodes in {dtype} ({why}); --tool-dtype cannot change it",
                               tensor=tensor, field="tool_dtype", expected=dtype, found=runtime,
                               hint="leave --tool-dtype out")
    return dtype


def tool_plans(ckpt, hook: Optional[Callable[..., ToolDecode]], fmt: str,
               runtime: Optional[str] = None, skip: Container[str] = ()) -> tuple[list[TensorPlan], dict[str, str]]:
    """The plain writer's plans decoding each quantized tensor as its producing tool does; dense tensors
    pass through as stored (a tool loads them as they are), but those in ``skip`` (static activation
    scales a float model does not have). Returns ``(plans, {tensor: tool})``.

    Raises
    ------
    UnsupportedError
        The format declares no tool decode (``hook`` None) and the checkpoint holds quantized tensors.
    """
    plans, tools = [], {}
    for spec in ckpt.specs():
        if spec.name in skip:
            continue
        if spec.kind == "dense":
            plans.append(dense_plan(spec))
            continue
        if hook is None:
            raise UnsupportedError(f"format {fmt} declares no producing tool's decode", tensor=spec.name,
                                   field="match_tool", hint="leave --match-tool out: the exact float32 decode")
        td = hook(ckpt, spec, runtime)
        plan = TensorPlan(spec.name, [(spec.name, td.dtype, tuple(spec.shape))],
                          lambda t, n=spec.name, f=td.decode: {n: np.ascontiguousarray(f(t))},
                          [f"decoded as {td.tool}, {td.dtype}"])
        plans.append(rows_plan(plan, values=True) if td.row_local else plan)
        tools[spec.name] = f"{td.tool} -> {td.dtype}"
    return plans, tools


FLOAT_RESULT_DTYPES = ("F16", "BF16", "F32")


def in_scale_dtype(tool: str) -> Callable[..., ToolDecode]:
    """The hook of a tool that decodes ``s * (q - z)`` in its scales' dtype (torch: ``scales * (q - z)``,
    one rounding of the exact float32 product): GPTQModel ``TorchLinear.dequantize_weight``, AutoAWQ
    ``dequantize_gemm``. The stored scale dtype fixes the output dtype."""
    def hook(ckpt, spec, runtime: Optional[str]) -> ToolDecode:
        dt = fixed_dtype(tool, spec.scheme.scale_dtype, runtime, "the scales' dtype", spec.name)
        return rounded_once(f"{tool}: round({dt.lower()}, scale * (q - zero))", dt)
    return hook


def in_model_dtype(tool: str, fallback: str = "F32", unsigned_zero: bool = False) -> Callable[..., ToolDecode]:
    """The hook of a tool that returns the float32 decode rounded once to a dtype chosen at run time (the
    model's, config.json ``dtype`` / ``torch_dtype``; ``--tool-dtype`` overrides; ``fallback`` without
    either): ModelOpt ``QTensor.dequantize(dtype=...)``, auto-round ``_dequant_fp8_linear_weight``.
    ``unsigned_zero``: the tool writes every zero of a codebook tensor as +0 (:func:`rounded_once`)."""
    def hook(ckpt, spec, runtime: Optional[str]) -> ToolDecode:
        dt = runtime_dtype(tool, runtime, model_dtype(ckpt.config), fallback)
        return rounded_once(f"{tool}: round({dt.lower()}, float32 decode)", dt,
                            unsigned_zero=unsigned_zero and spec.scheme.codebook is not None
                            and len(spec.scheme.codebook) == 16)
    return hook


def in_float32(tool: str) -> Callable[..., ToolDecode]:
    """The hook of a tool whose decode is float32, every step in float32 in qckpt's order (gguf-py
    ``gguf.quants.dequantize``: checked tensor by tensor against gguf-py on the GGUF samples, Q4_0 ... Q8_0,
    Q6_K). llama.cpp's C ``dequantize_row_*`` evaluates the same float formulas (``x * d + m`` for Q4_1);
    a build whose compiler contracts that into a fused multiply-add (GCC's default ``-ffp-contract=fast``
    on an FMA target) rounds once instead of twice: not reproduced, not checked."""
    def hook(ckpt, spec, runtime: Optional[str]) -> ToolDecode:
        fixed_dtype(tool, "F32", runtime, "its result is float32", spec.name)
        return rounded_once(f"{tool}: float32", "F32")
    return hook
