"""MLX storage facts and ``config.json`` ``quantization``: modes (affine, mxfp4, nvfp4, mxfp8), bits
and group sizes, per-layer overrides, and the cross-check of bits / group size against widths.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from converter import codebooks
from converter.errors import FormatError
from converter.formats.source import Source


FORMAT = "mlx"

#: FP4 E2M1 / FP8 E4M3 (fn) values by code (``mlx/ops.cpp`` ``fp_quantize``; OCP MX spec), shared
#: with every other format through :mod:`converter.codebooks`.
E2M1, E4M3 = codebooks.E2M1, codebooks.E4M3

#: mode -> (default group size, default bits, scale dtype or None for the model dtype, codebook).
MODES: dict[str, tuple[int, int, str | None, tuple[float, ...] | None]] = {
    "affine": (64, 4, None, None),
    "mxfp4": (32, 4, "F8_E8M0", E2M1),
    "nvfp4": (16, 4, "F8_E4M3", E2M1),
    "mxfp8": (32, 8, "F8_E8M0", E4M3),
}
AFFINE_BITS = (2, 3, 4, 5, 6, 8)
AFFINE_GROUPS = (32, 64, 128)
FLOAT_SCALE_DTYPES = ("F16", "BF16", "F32")

#: config.json keys whose integer values are model widths (independent ``in_features`` candidates, B27).
_SIZE_KEYS = ("hidden_size", "intermediate_size", "d_model", "n_embd", "ffn_dim", "d_ff", "n_inner",
              "embed_dim", "moe_intermediate_size", "shared_expert_intermediate_size", "vocab_size",
              "kv_lora_rank", "q_lora_rank", "projection_dim")


# -- config -------------------------------------------------------------------------------------
def quant_config(src: Source) -> dict | None:
    """``config.json["quantization"]`` (mlx-lm), else its ``quantization_config`` mirror, else None."""
    cfg = src.config or {}
    for key in ("quantization", "quantization_config"):
        q = cfg.get(key)
        if isinstance(q, dict) and ("bits" in q or "group_size" in q or "mode" in q) and "quant_method" not in q:
            return q
    return None


def layer_params(qcfg: Mapping[str, Any], module: str, *, file: Any = None) -> dict | None:
    """Effective ``{"group_size", "bits", "mode"}`` of ``module``, or None when the config says ``false``.

    Per-module entries override the top-level defaults key by key (``mlx_lm/utils.py``
    ``load_model``: ``quantization.get(path, defaults)``); a missing ``mode`` means ``affine``.

    Raises
    ------
    FormatError
        Unknown mode, or non-integer bits / group size.
    """
    entry = qcfg.get(module, None)
    if entry is False:
        return None
    base = {"mode": qcfg.get("mode") or "affine"}
    if isinstance(entry, dict):
        base["mode"] = entry.get("mode") or base["mode"]
    mode = base["mode"]
    if not isinstance(mode, str) or mode not in MODES:
        raise FormatError("unknown MLX quantization mode", file=file, tensor=module, field="quantization.mode",
                          expected=sorted(MODES), found=mode)
    g0, b0, _, _ = MODES[mode]
    params = {"group_size": qcfg.get("group_size", g0), "bits": qcfg.get("bits", b0), "mode": mode}
    if isinstance(entry, dict):
        params.update({k: entry[k] for k in ("group_size", "bits") if k in entry})
    for k in ("group_size", "bits"):
        if not isinstance(params[k], int) or isinstance(params[k], bool) or params[k] <= 0:
            raise FormatError("quantization parameter must be a positive integer", file=file, tensor=module,
                              field=f"quantization.{k}", found=params[k])
    return params


def known_widths(src: Source, quantized: Iterable[str]) -> set[int]:
    """Widths that an ``in_features`` can be checked against (B27), from config and headers only.

    Config sizes (``hidden_size`` ...; nested ``*_config`` too), every dimension of every dense
    tensor (biases, norms: out widths of other layers) and the ``out`` of every quantized weight.
    """
    known: set[int] = set()

    def walk(cfg: Mapping[str, Any]) -> None:
        for k, v in cfg.items():
            if isinstance(v, dict) and k.endswith("_config") and k not in ("quantization_config",):
                walk(v)
            elif k in _SIZE_KEYS and isinstance(v, int) and not isinstance(v, bool):
                known.add(v)
        heads, hd = cfg.get("num_attention_heads"), cfg.get("head_dim")
        if isinstance(heads, int) and isinstance(hd, int):
            known.add(heads * hd)
    walk(src.config or {})
    owned = set()
    for p in quantized:
        owned.update({f"{p}.weight", f"{p}.scales", f"{p}.biases", f"{p}.global_scale"})
        known.add(int(src.info(f"{p}.weight").shape[-2]) if len(src.info(f"{p}.weight").shape) >= 2 else 0)
    for n in src.tensor_names():
        if n not in owned:
            known.update(int(d) for d in src.info(n).shape)
    known.discard(0)
    return known


def cross_check(src: Source, p: str, bits: int, group: int, in_features: int, wcols: int, scols: int,
                 known: set[int]) -> str | None:
    """B27: the packed shapes pin only ``bits*group``; check the config's ``in_features`` independently.

    Returns a note when nothing independent confirms it; raises FormatError when another
    ``(bits, group_size)`` fits the shapes and gives a width the model has while the config's does not.
    """
    if not known or in_features in known:
        return None
    alts = []
    for b in (1, 2, 3, 4, 5, 6, 8):
        if (wcols * 32) % b:
            continue
        i2 = wcols * 32 // b
        for g in (16, 32, 64, 128):
            if i2 % g == 0 and i2 // g == scols and i2 in known and (b, g) != (bits, group):
                alts.append((b, g, i2))
    if alts:
        b, g, i2 = alts[0]
        raise FormatError(
            "config bits/group_size contradict the model's widths: the packed shapes fit both readings",
            file=src.file_of(f"{p}.weight"), tensor=f"{p}.weight", field="quantization",
            expected=f"bits={b}, group_size={g} (in_features {i2}, a width of this model)",
            found=f"config bits={bits}, group_size={group} (in_features {in_features}, not a width of this model)",
            hint="fix config.json 'quantization' for this module (CASES.md B27)")
    return f"in_features {in_features} not confirmed by an independent width"
