"""MLX ``mxfp4`` / ``nvfp4`` writing: E2M1 codes relaid into MLX's uint32 words, the group scales' bytes
kept, an NVFP4 global scale re-expressed as MLX's ``global_scale`` (the tensor amax) or refused.

Storage (mlx 0.32.4 ``mlx/ops.cpp`` ``fp_quantize``; mlx-lm 0.32.2 ``utils.quantize_model`` /
``switch_layers._quantize_experts``; checked byte for byte against sample_checkpoints/mlx_*fp4*):

- ``<p>.weight`` U32 ``[out, in/8]``: the 4-bit E2M1 codes (bit 3 the sign) packed along ``in``,
  LSB-first (:func:`converter.formats.mlx.reader.codes_map`);
- ``<p>.scales`` U8 ``[out, in/G]``: E8M0 bytes per 32 (``mxfp4``) or E4M3 bytes per 16 (``nvfp4``);
- an expert stack (``SwitchLinear``, e.g. mlx-lm ``gpt_oss`` ``mlp.experts.gate_proj``) the same with a leading
  expert axis: ``[E, out, in/8]`` / ``[E, out, in/G]`` (mlx-lm ``models/gpt_oss.py`` ``sanitize`` makes exactly
  these from gpt-oss's blocks: ``view(uint32).flatten(-2)``; no global scale on a stack);
- ``<p>.global_scale`` F32 0-dim (``nvfp4`` only, optional): the tensor's amax ``g``; the effective
  group scale is ``s * fp32(g / 2688)`` (:data:`converter.scheme.AMAX_DENOMINATOR`), and mlx-lm's
  config entry for the module says ``"global_scale": true``.

A global scale in another direction (ModelOpt's multiplier, compressed-tensors' divisor) is written
only when :func:`converter.global_scales.equivalent_global_scale` proves an amax with bit-identical
effective scales over every E4M3 value; otherwise the write is refused before any data moves.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from converter import codebooks
from converter.errors import NotRepresentableError
from converter.global_scales import equivalent_global_scale
from converter.groups import Granularity, GroupMap
from converter.layout import EXPERT, IN, OUT
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec
from converter.write.plan import TensorPlan
from converter.formats.source import module_prefix
from converter.formats.global_scale_routes import exact_targets_text, global_scales_of

from converter.formats.mlx.config import MODES
from converter.formats.mlx.reader import codes_map

#: MLX's global-scale direction (``mx.quantize(..., global_scale=amax)``).
DIRECTION = "amax"
#: What reads a dense layer's global scale (measured with mlx 0.32.4 / mlx-lm 0.32.2 on CPU).
LOADER_NOTE = ("warning: mx.dequantize(..., global_scale=g) decodes it; mlx-lm 0.32.2 attaches a global_scale to "
               "switch (expert) layers only (utils._takes_global_scale), so mlx_lm.load refuses it on a dense Linear")
#: E2M1 scale dtype -> MLX mode.
FP4_MODES = {"F8_E8M0": "mxfp4", "F8_E4M3": "nvfp4"}


def is_fp4(spec: TensorSpec) -> bool:
    """Whether ``spec`` has E2M1 codes (the MXFP4 / NVFP4 element)."""
    s = spec.scheme
    return s is not None and s.codebook is not None and codebooks.element_of(s.codebook) is codebooks.ELEMENTS["e2m1"]


def fp4_mode(spec: TensorSpec) -> str | None:
    """``mxfp4`` / ``nvfp4`` for an E2M1 ``spec`` by its scale dtype, else None."""
    return FP4_MODES.get(spec.scheme.scale_dtype) if is_fp4(spec) else None


def fp4_reason(spec: TensorSpec) -> str | None:
    """None when the E2M1 ``spec`` fits an MLX fp4 mode (from the spec; a global scale's value is
    checked by :func:`check_global_scales`), else the reason."""
    mode = fp4_mode(spec)
    if mode is None:
        return (f"E2M1 with {spec.scheme.scale_dtype} scales: MLX mxfp4 stores E8M0 and nvfp4 E4M3 group scales "
                f"(mx.quantize)")
    group = MODES[mode][0]
    gm = spec.group_map
    if tuple(spec.axes) not in ((OUT, IN), (EXPERT, OUT, IN)):
        return f"axes {list(spec.axes)}: MLX {mode} is written for [out, in] weights and [expert, out, in] stacks"
    if spec.axes[0] == EXPERT and spec.scheme.global_scale is not None:
        return (f"a global scale on an expert stack: MLX {mode} switch layers (QuantizedSwitchLinear) take one "
                f"global_scale per layer, and qckpt writes none for a stack")
    if gm.granularity is not Granularity.GROUP or gm.axis != IN or gm.group_size != group or spec.act_order:
        return f"{gm.describe()}: MLX {mode} takes one scale per {group} along in"
    if spec.shape[-1] % group:
        return f"in = {spec.shape[-1]} is not a multiple of {group} (MLX {mode} has no partial group)"
    if spec.scheme.global_scale is not None and mode != "nvfp4":
        return f"a global scale belongs to nvfp4; MLX {mode} has none"
    return None


def amax_global_scale(t: QuantizedTensor) -> np.ndarray | None:
    """``t``'s global scale as MLX's amax (float32 0-dim), or None when no float32 value gives the
    same effective scales (:func:`converter.global_scales.equivalent_global_scale`). A tensor without a
    global scale: None, and nothing is written."""
    if t.global_scale is None:
        return None
    return equivalent_global_scale(t.global_scale, t.scheme.global_scale, DIRECTION, t.scheme.scale_dtype)


def refuse_global_scale(name: str, g, direction: str, ckpt: Checkpoint | None = None) -> NotRepresentableError:
    """The typed refusal of a global scale with no exact MLX amax (names tensor, direction and value)."""
    value = float(np.float32(g))
    return NotRepresentableError(
        f"the {direction} global scale {value!r} has no float32 amax g' with s * fp32(g' / 2688) equal to the "
        f"source's effective scale for every E4M3 s: MLX nvfp4's global_scale is the tensor amax",
        tensor=name, field="global_scale", expected="a global scale exactly re-expressible as an amax",
        found=f"{direction} {value!r}",
        hint="requantize to MLX affine (--bits 4 --group-size 32), or to NVFP4 without a global scale for GGUF "
             "(--to gguf --quant-type NVFP4)" + "".join(
                 f"; {x}" for x in [exact_targets_text(
                     direction, "F8_E4M3", global_scales_of(ckpt) if ckpt is not None else (), exclude="mlx")] if x))


def check_global_scales(ckpt: Checkpoint) -> Checkpoint:
    """Before any data moves: every E2M1 global scale of ``ckpt`` has an exact MLX amax (values read).

    Returns ``ckpt``, or a view of it without the global scales that are the identity (effective scale
    = group scale for every E4M3 value: a divisor or multiplier of 1.0, an amax of 2688, what
    compressed-tensors / ModelOpt write for a source that had none): writing none is exact, and keeps
    the file loadable by mlx_lm (:data:`LOADER_NOTE`).

    Raises
    ------
    NotRepresentableError
        A global scale with no exact amax (:func:`refuse_global_scale`).
    """
    identity = set()
    for spec in ckpt.specs():
        if spec.kind == "quantized" and is_fp4(spec) and spec.scheme.global_scale is not None:
            t = ckpt[spec.name]
            if spec.scheme.global_scale != DIRECTION and amax_global_scale(t) is None:
                raise refuse_global_scale(spec.name, t.global_scale, spec.scheme.global_scale, ckpt)
            if is_identity_global_scale(t):
                identity.add(spec.name)
    return without_global_scales(ckpt, identity) if identity else ckpt


def is_identity_global_scale(t: QuantizedTensor) -> bool:
    """Whether ``t``'s global scale changes no effective scale (its exact multiplier is 1.0)."""
    if t.global_scale is None:
        return False
    w = equivalent_global_scale(t.global_scale, t.scheme.global_scale, "multiplier", t.scheme.scale_dtype)
    return w is not None and float(w) == 1.0


def without_global_scales(ckpt: Checkpoint, names: set[str]) -> Checkpoint:
    """A view of ``ckpt`` where the tensors ``names`` carry no global scale (callers prove it the identity)."""
    def drop_spec(sp: TensorSpec) -> TensorSpec:
        return dataclasses.replace(sp, scheme=sp.scheme.replace(global_scale=None),
                                   stored=tuple(a for a in sp.stored if a.role != "global_scale"))
    specs = {sp.name: drop_spec(sp) if sp.name in names else sp for sp in ckpt.specs()}

    def load(name: str):
        t = ckpt[name]
        return t.replace(scheme=t.scheme.replace(global_scale=None), global_scale=None) if name in names else t
    return Checkpoint(specs, load, format=ckpt.format, path=ckpt.path, config=ckpt.config, metadata=ckpt.metadata,
                      files=ckpt.files, extra_files=ckpt.extra_files, side_files=ckpt.side_files)


def config_entry(spec: TensorSpec) -> dict | None:
    """mlx-lm's per-module config entry for a global-scaled nvfp4 module (``quantize_model``), else None."""
    if fp4_mode(spec) == "nvfp4" and spec.scheme.global_scale is not None:
        return {"group_size": MODES["nvfp4"][0], "bits": 4, "mode": "nvfp4", "global_scale": True}
    return None


def plan_fp4(spec: TensorSpec) -> TensorPlan:
    """``<p>.weight`` U32, ``<p>.scales`` U8 (the scale bytes as stored) and, with a global scale,
    ``<p>.global_scale`` F32 0-dim."""
    mode = fp4_mode(spec)
    p = module_prefix(spec.name)
    sizes = dict(zip(spec.axes, spec.shape))
    cmap = codes_map(tuple(spec.axes), 4)
    pshape = GroupMap.per_group(MODES[mode][0], axis=IN).param_shape(spec.shape, spec.axes)
    outs = [(f"{p}.weight", "U32", cmap.stored_shape(sizes)), (f"{p}.scales", "U8", pshape)]
    scale_np = spec.scheme.scale_np_dtype
    notes = [f"exact: E2M1 codes relaid into uint32 words, {spec.scheme.scale_dtype} scale bytes kept ({mode})"]
    if spec.scheme.global_scale is not None:
        outs.append((f"{p}.global_scale", "F32", ()))
        notes.append(LOADER_NOTE)
        if spec.scheme.global_scale != DIRECTION:
            notes.append(f"the {spec.scheme.global_scale} global scale re-expressed as MLX's amax (proven exact over "
                         f"every E4M3 scale)")

    def encode(t: QuantizedTensor) -> dict[str, np.ndarray]:
        out = {f"{p}.weight": cmap.store_codes(t.packed if t.packed is not None else t.codes, t.axes),
               f"{p}.scales": np.ascontiguousarray(np.asarray(t.scales).astype(scale_np)).view(np.uint8)}
        if t.global_scale is not None:
            g = amax_global_scale(t)
            if g is None:
                raise refuse_global_scale(t.name, t.global_scale, t.scheme.global_scale)
            out[f"{p}.global_scale"] = np.array(g, dtype=np.float32).reshape(())
        return out
    return TensorPlan(spec.name, outs, encode, notes)
