"""Structural checks of one tensor (partial groups, roles always stored, config vs loaded arrays, padding
bits) and of the checkpoint (widths vs config, layers left dense, tied embeddings). Files and shards are
checked by :mod:`converter.validate.files`, reader errors become findings in
:mod:`converter.validate.reader_errors`.

What is a finding and what is unreadable (exit status 3)
--------------------------------------------------------
- **Unreadable** (a :class:`~converter.errors.ConverterError` propagates, exit 3): the path does
  not exist, is a pickle, no registered format recognises it, a format qckpt does not support
  (:class:`UnsupportedError`), a corrupt ``config.json`` / index JSON, or a *lone* ``.safetensors``
  file whose header is corrupt (the reader's message names a git-LFS stub as such).
- **Findings** (exit 1): everything that can be pinned to a file, tensor or config field of a
  checkpoint whose structure is known: inside a model directory a missing, truncated, corrupt or
  LFS-stub shard, an index that disagrees with its shards; and every error a reader raises about
  tensors versus config (shapes, dtypes, missing partners, contradicting config, bad ``g_idx``,
  zero points or codes out of range). The reader's message is kept as evidence.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from converter.errors import ConverterError, LayoutError
from converter.formats.modules import EMBEDDING, module_role, token_embedding_name
from converter.formats.source import Source
from converter.groups import Granularity
from converter.layout import EXPERT
from converter.scheme import ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec
from converter.validate.findings import Finding, finding

#: config.json keys whose integer values are tensor widths (nested ``*_config`` dicts are walked).
SIZE_KEYS = ("hidden_size", "intermediate_size", "vocab_size", "d_model", "n_embd", "ffn_dim", "d_ff", "n_inner",
             "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_hidden_size", "dim", "hidden_dim",
             "projection_dim", "kv_lora_rank", "q_lora_rank", "d_kv", "num_labels", "embed_dim")
#: Group sizes consumers commonly accept (reported for partial tails, B13/B14/B15).
COMMON_GROUP_SIZES = (16, 32, 64, 128, 256)
HEAD_NAMES = ("lm_head.weight", "output.weight")


# -- per tensor --------------------------------------------------------------------------------------
def legal_group_sizes(n: int) -> list[int]:
    return [g for g in COMMON_GROUP_SIZES if n % g == 0]


def check_spec(spec: TensorSpec, *, always_stored: Iterable[str] = ()) -> list[Finding]:
    """Header-level checks of one quantized spec: partial tail (info), roles the format always stores."""
    out: list[Finding] = []
    gm, axes = spec.group_map, tuple(spec.axes or ())
    if gm is not None and gm.granularity is Granularity.GROUP and gm.axis in axes:
        n = int(spec.shape[axes.index(gm.axis)])
        tail = n % gm.group_size
        if tail:
            ng = -(-n // gm.group_size)
            out.append(finding("group-tail", spec.name, f"{gm.axis} width {n} is not a multiple of group size "
                               f"{gm.group_size}: {ng} groups, the last {tail} wide; consumers without partial groups "
                               f"need {gm.axis} padded to {ng * gm.group_size} with zero weights",
                               logical_width=n, padded_width=ng * gm.group_size, n_groups=ng, tail=tail,
                               group_size=gm.group_size, legal_group_sizes=legal_group_sizes(n)))
    if gm is not None and gm.granularity is Granularity.GROUP and gm.axis in axes \
            and gm.group_size not in COMMON_GROUP_SIZES:
        n = int(spec.shape[axes.index(gm.axis)])
        divisors = [g for g in COMMON_GROUP_SIZES if gm.group_size % g == 0]
        out.append(finding("group-size", spec.name, f"group size {gm.group_size} is outside what common kernels accept "
                           f"({', '.join(map(str, COMMON_GROUP_SIZES))}; ONNX Runtime MLAS stops at 256 and silently "
                           f"returns zeros beyond)" + (f"; re-blocking to {divisors[-1]} (scales repeated) is exact"
                                                        if divisors else ""),
                           group_size=gm.group_size, width=n, accepted=list(COMMON_GROUP_SIZES),
                           exact_reblock_to=divisors[-1] if divisors else None, legal_group_sizes=legal_group_sizes(n)))
    roles = {s.role for s in spec.stored}
    for role in always_stored:
        if role not in roles:
            sev = "error" if (role == "g_idx" and spec.act_order) or role != "g_idx" else "warning"
            msg = (f"no stored {role} array although the format's writers always store one"
                   + (" and the config declares act-order: the group map is lost" if sev == "error" and role == "g_idx"
                      else "; loaders fall back to sequential groups"))
            out.append(finding("missing-tensor", spec.name, msg, severity=sev, role=role, act_order=spec.act_order,
                               stored=[s.name for s in spec.stored]))
    return out


def check_loaded(spec: TensorSpec, t: QuantizedTensor) -> list[Finding]:
    """Config (spec) vs loaded tensor: symmetric claim vs zero points, act-order vs ``g_idx``, ``g_idx`` counts."""
    out: list[Finding] = []
    claimed = spec.declared_scheme or spec.scheme
    if claimed is not None and claimed.zero_point is ZeroPoint.NONE \
            and t.scheme.zero_point is ZeroPoint.INTEGER and t.zero_points is not None:
        vals, counts = np.unique(t.zero_points, return_counts=True)
        top = dict(sorted(zip(vals.tolist(), counts.tolist()), key=lambda kv: -kv[1])[:4])
        out.append(finding("config-mismatch", t.name, f"the config declares symmetric quantization (implicit zero "
                           f"{t.scheme.center}) but the stored zero points differ: kernels that ignore zero points "
                           f"(vLLM GPTQ-Marlin) decode differently", expected_zero=t.scheme.center,
                           zero_point_counts=top))
    gm = t.group_map
    if gm.granularity is Granularity.GROUP and gm.g_idx is not None:
        n = t.shape[t.axes.index(gm.axis)]
        ng = gm.n_groups(t.shape, t.axes)
        counts = np.bincount(gm.g_idx, minlength=ng)
        full = -(-n // gm.group_size)
        expected = np.full(full, gm.group_size)
        if n % gm.group_size:
            expected[-1] = n % gm.group_size
        if ng != full or not np.array_equal(counts, expected):
            bad = int(np.argmax(counts[:full] != expected)) if ng == full else full
            out.append(finding("g-idx", t.name, f"g_idx does not assign {gm.group_size} {gm.axis} indices to each "
                               f"group", n_groups=ng, expected_groups=full, first_bad_group=bad,
                               members_of_first_bad=int(counts[bad]), group_size=gm.group_size,
                               empty_groups=int((counts == 0).sum())))
        if not spec.act_order:
            out.append(finding("g-idx", t.name, "g_idx is not the sequential i // group_size map but the config "
                               "declares no act-order (desc_act false): loaders that ignore g_idx decode other groups",
                               first_difference=int(np.argmax(gm.g_idx != np.arange(n) // gm.group_size)),
                               group_size=gm.group_size))
    return out


def check_padding(source: Source, spec: TensorSpec, t: QuantizedTensor) -> list[Finding]:
    """Bits past the last field along a packed axis must be zero (checked on the raw stored words, read only when
    the stored shape leaves room for such fields: mapping a tensor's words again would double their resident pages)."""
    out: list[Finding] = []
    by_role = {s.role: s for s in spec.stored}
    for role, amap in (t.stored or {}).items():
        if amap.packed_axis is None or role not in by_role or role not in ("codes", "zero_points"):
            continue
        if role == "codes":
            sizes = dict(zip(t.axes, t.shape))
        else:
            sizes = dict(zip(t.axes, t.group_map.param_shape(t.shape, t.axes)))
        if set(sizes) != set(amap.stored_axes):
            continue
        stored_shape = tuple(int(d) for d in by_role[role].shape)  # the header's: no words read unless padded
        if stored_shape != tuple(amap.stored_shape(sizes)):
            continue
        dim = amap.stored_axes.index(amap.packed_axis)
        words = stored_shape[dim]
        per = amap.word_bits // amap.bits
        cap = words * per if amap.packing == "padded" else (words * amap.word_bits) // amap.bits
        n = int(sizes[amap.packed_axis])
        if cap <= n:
            continue
        try:
            raw = source.read(by_role[role].name)
        except ConverterError:
            continue
        if tuple(raw.shape) != stored_shape:
            continue
        full = dict(sizes)
        full[amap.packed_axis] = cap
        try:
            fields = amap.to_logical(raw, amap.stored_axes, full)
        except (LayoutError, ValueError):
            continue
        tail = np.take(fields, np.arange(n, cap), axis=dim)
        if np.any(tail != 0):
            out.append(finding("padding", t.name,
                               f"{int(np.count_nonzero(tail))} padding fields past {amap.packed_axis} "
                               f"index {n} of {by_role[role].name} are not zero", stored_tensor=by_role[role].name,
                               role=role, logical_length=n, capacity=cap, nonzero=int(np.count_nonzero(tail))))
    return out


# -- checkpoint level --------------------------------------------------------------------------------
def known_widths(ckpt: Checkpoint) -> set[int]:
    """Widths named by config.json (nested ``*_config`` too, head products, fused 2x/3x) and dense tensor dims."""
    known: set[int] = set()

    def walk(cfg: Mapping[str, Any]) -> None:
        for k, v in cfg.items():
            if isinstance(v, dict) and k.endswith("_config") and k not in ("quantization_config",):
                walk(v)
            elif k in SIZE_KEYS and isinstance(v, int) and not isinstance(v, bool) and v > 0:
                known.add(v)
        heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
        hidden = cfg.get("hidden_size")
        hd = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads
                                     else None)
        if isinstance(hd, int):
            for h in (heads, kv):
                if isinstance(h, int):
                    known.add(h * hd)
    walk(ckpt.config or {})
    if not known:
        return known
    for spec in ckpt.specs():
        if spec.kind == "dense":
            known.update(int(d) for d in spec.shape)
    return known


def check_shape_config(ckpt: Checkpoint) -> list[Finding]:
    """Each quantized weight's ``in`` must be a width the config or the dense tensors name; ``out`` may
    also be twice or three times one (fused gate/up, q/k/v projections)."""
    known = known_widths(ckpt)
    if not known:
        return []
    fused = known | {2 * k for k in known} | {3 * k for k in known}
    out = []
    for spec in ckpt.specs():
        if spec.kind != "quantized" or not spec.axes:
            continue
        dims = {a: int(n) for a, n in zip(spec.axes, spec.shape) if a != EXPERT}
        unknown = {a: n for a, n in dims.items() if n not in (fused if a == "out" else known)}
        if unknown:
            out.append(finding("shape-config", spec.name,
                               f"logical {', '.join(f'{a}={n}' for a, n in unknown.items())} "
                               f"is not a width named by config.json or the dense tensors: bits or group size may be "
                               f"misread from packed shapes (B27)", shape=list(spec.shape), axes=list(spec.axes),
                               unexplained=unknown, known_widths=sorted(known)[:16]))
    return out


def check_group_skip(ckpt: Checkpoint) -> list[Finding]:
    """Dense 2-D ``*.weight`` Linear layers whose ``in`` the model's single group size does not divide (B15)."""
    sizes = {s.group_map.group_size for s in ckpt.specs() if s.kind == "quantized" and s.group_map is not None
             and s.group_map.granularity is Granularity.GROUP}
    if len(sizes) != 1:
        return []
    g = sizes.pop()
    out = []
    for spec in ckpt.specs():
        if spec.kind != "dense" or len(spec.shape) != 2 or not spec.name.endswith(".weight") \
                or module_role(spec.name, 2) == EMBEDDING or "norm" in spec.name:
            continue
        n = int(spec.shape[1])
        if n % g:
            out.append(finding("group-skip", spec.name, f"left unquantized ({spec.dtype}): in width {n} is not a "
                               f"multiple of the model's group size {g}", in_width=n, group_size=g, dtype=spec.dtype,
                               legal_group_sizes=legal_group_sizes(n)))
    return out


def check_tied(ckpt: Checkpoint) -> list[Finding]:
    """``tie_word_embeddings`` vs the tensor set (B32/B33); compares the head with the embedding when both exist."""
    cfg = ckpt.config or {}
    tie = cfg.get("tie_word_embeddings")
    head = next((n for n in ckpt.names() if n in HEAD_NAMES), None)
    embed = token_embedding_name(ckpt.names())
    if tie is None or embed is None:
        return []
    if any(ckpt.spec(n).kind == "opaque" for n in (head, embed) if n is not None):
        return []  # cannot be decoded: reported as "opaque"
    if tie and head is not None:
        h, e = ckpt[head].dequantize(), ckpt[embed].dequantize()
        if h.shape != e.shape:
            return [finding("tied-embeddings", head, "tie_word_embeddings is true but the head's shape differs from "
                            "the embedding's", head_shape=list(h.shape), embedding_shape=list(e.shape))]
        diff = float(np.max(np.abs(h - e))) if h.size else 0.0
        if diff == 0.0:
            nbytes = sum(s.nbytes for s in ckpt.spec(head).stored)
            return [finding("tied-embeddings", head, f"tie_word_embeddings is true and {head} duplicates {embed}: "
                            f"store one copy", severity="warning", duplicate_bytes=nbytes, embedding=embed)]
        return [finding("tied-embeddings", head, f"tie_word_embeddings is true but {head} differs from {embed} "
                        f"(max |L - E| = {diff:.4g}): a loader that ties them drops a real head", max_abs_diff=diff,
                        embedding=embed)]
    if tie is False and head is None:
        return [finding("tied-embeddings", embed, "tie_word_embeddings is false but there is no lm_head tensor: the "
                        "head would be uninitialised or silently tied", embedding=embed)]
    return []
