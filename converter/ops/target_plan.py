"""Every option a requantize target format needs, found at once from the specs (:func:`complete_target`).

A refused ``qckpt convert SRC DST --to T`` and a requantize that leaves out an option the target
needs are both answered here, from headers alone. Candidate targets keep the user's options and fill
the others from a fixed order of preference (bits nearest the source's, ties upward; the source's
groups, then 128, 64, 32, per channel; the symmetry the target's loaders prefer for a float-bias
source; the scale dtype the target stores). Each candidate is resolved tensor by tensor
(:func:`converter.quant.requant.target_spec`, the target format's own adaptation included) and checked
with everything the target checks before data moves (``check_target``, ``check_model``, partial final
groups) plus the two properties a target otherwise checks value by value at write time: a float bias
where the format stores integer zero points (``FormatHandler.float_bias``) and a scale dtype other than
the one it stores (``FormatHandler.scale_dtype``). Of the candidates that pass, the one changing the
fewest of the user's options wins, then one whose every tensor is planned exact
(:func:`converter.quant.classify.classify`), then the fewest options filled in.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from itertools import product
from typing import Any, Iterable

from converter.errors import ConverterError
from converter.groups import Granularity
from converter.ops.command_line import FIELDS, field_words
from converter.quant.classify import classify
from converter.quant.requant import target_spec
from converter.quant.target import Target
from converter.scheme import ZeroPoint
from converter.tensor import Checkpoint, TensorSpec

__all__ = ["TargetPlan", "complete_target", "target_blocking"]

#: Bit widths tried when ``--bits`` is left out (the command line's range).
BIT_CHOICES = (2, 3, 4, 5, 6, 8)
#: Group sizes tried after the source's own (the sizes kernels take).
GROUP_CHOICES = (128, 64, 32)
#: Scale dtypes tried when ``--scale-dtype`` is left out.
SCALE_DTYPES = ("F16", "F32", "BF16")


@dataclass(frozen=True)
class TargetPlan:
    """A complete requantize target for a format.

    Attributes
    ----------
    target : Target
        The user's target with ``filled`` added and ``changed`` replaced: every option it needs is set.
    filled : dict
        Field -> (command-line words, reason): options the user left out and the target needs.
    changed : dict
        Field -> (the user's words, the plan's words): options of the user's the target cannot take.
    exact : bool
        Every quantized tensor is planned exact (:func:`converter.quant.classify.classify`).
    """

    target: Target
    filled: dict[str, tuple[str, str]] = field(default_factory=dict)
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)
    exact: bool = False

    def to_json(self) -> list[dict[str, Any]]:
        """The ``filled_in`` list of the error report: option, field and reason per filled-in option."""
        return [{"field": f, "option": words, "reason": why} for f, (words, why) in self.filled.items()]


def effective(target: Target, handler) -> Target:
    """``target`` with the defaults ``requantize_model`` applies for ``handler``: what a float-bias
    source becomes (``Target.float_bias``) and the one scale dtype the format stores."""
    if target.element is not None or target.named_types:
        return target
    if target.symmetric is None:
        target = dataclasses.replace(target, float_bias=handler.float_bias)
    if handler.scale_dtype is not None and target.scale_dtype is None:
        target = dataclasses.replace(target, scale_dtype=handler.scale_dtype)
    return target


def _value_checked(spec: TensorSpec, handler) -> str | None:
    """What ``handler``'s writer would check value by value in a requantized ``spec`` (a requantize
    should not leave it to chance): a float bias where it stores integer zero points, a scale dtype
    other than the one it stores."""
    s = spec.scheme
    if s.codebook is None and s.zero_point is ZeroPoint.FLOAT and handler.float_bias != "keep":
        return (f"{handler.name} stores no float bias (zero points are integers); a float bias is written only "
                "when every -bias/scale is an integer")
    if handler.scale_dtype is not None and s.codebook is None and s.scale_dtype != handler.scale_dtype:
        return f"{handler.name} stores {handler.scale_dtype} scales, not {s.scale_dtype}"
    return None


def _partial_group(spec: TensorSpec, handler) -> str | None:
    gm = spec.group_map
    if handler.partial_groups or gm.granularity is not Granularity.GROUP or not gm.partial_tail(spec.shape, spec.axes):
        return None
    return (f"partial final group: {handler.name} loaders cannot read a group that runs past the end of a row "
            f"(in {spec.shape[-1]}, group size {gm.group_size})")


class _Checker:
    """Candidate targets checked against one checkpoint view and target format. A candidate is checked as
    written, without the format's defaults (:func:`effective`): the options it needs are on the command
    line. Tensors sharing what the check depends on (scheme, groups, shape, axes ...) are checked once
    per candidate (a 7B model has a handful of such classes), the results cached."""

    def __init__(self, ckpt: Checkpoint, handler, strict_values: bool):
        self.ckpt, self.handler, self.strict = ckpt, handler, strict_values
        self.specs = [s for s in ckpt.specs() if s.kind == "quantized"]
        self.by_name = {s.name: s for s in self.specs}
        self.classes: dict[tuple, list[TensorSpec]] = {}
        for s in self.specs:
            self.classes.setdefault(self._signature(s), []).append(s)
        self._checked: dict[tuple, tuple[TensorSpec | None, str | None, str]] = {}
        self._exact: dict[tuple, bool] = {}
        self._over: dict[Target, dict[str, Target]] = {}

    @staticmethod
    def _signature(s: TensorSpec) -> tuple:
        gm = s.group_map
        # (not the notes: a target spec has none, and the checks read the target spec)
        return (repr(s.scheme), gm.granularity, gm.axis, gm.group_size, gm.block, tuple(s.shape), tuple(s.axes),
                bool(s.act_order), s.double_quant, s.name.endswith(".weight"))

    def _one(self, s: TensorSpec, target: Target) -> tuple[TensorSpec | None, str | None, str]:
        """The target spec of ``s``, the reason it is refused (or None) and the field that reason is about."""
        key = (self._signature(s), target)
        if key not in self._checked:
            try:
                ts = target_spec(s, target, self.handler.quantizer)
                why = self.handler.target_reason(ts) or _partial_group(ts, self.handler)
                if why is None and self.strict:
                    why = _value_checked(ts, self.handler)
                self._checked[key] = (ts, why, "scheme")
            except ConverterError as exc:  # the target's adaptation refused an option (GGUF: --scale-dtype bf16)
                self._checked[key] = (None, exc.message, exc.field or "scheme")
        return self._checked[key]

    def overrides(self, target: Target) -> dict[str, Target]:
        """The format's per-tensor targets for ``target`` (GGUF's output head), cached."""
        if target not in self._over:
            rt = self.handler.requant_targets
            self._over[target] = {n: t for n, (t, _) in rt(self.ckpt, target).items()} if rt is not None else {}
        return self._over[target]

    def _pairs(self, target: Target):
        """``(a spec, its target, how many tensors it stands for)`` covering every quantized tensor."""
        over = self.overrides(target)
        for group in self.classes.values():
            plain = [s for s in group if s.name not in over]
            if plain:
                yield plain[0], target, len(plain)
        for name, t in over.items():
            if name in self.by_name:
                yield self.by_name[name], t, 1

    def blocking(self, target: Target) -> tuple[str | None, str, str] | None:
        """``(tensor, reason, field)`` of the first property of ``target`` the format refuses, or None."""
        try:
            pairs = list(self._pairs(target))
        except ConverterError as exc:
            return exc.tensor, exc.message, exc.field or "scheme"
        out = []
        for s, t, n in pairs:
            ts, why, fld = self._one(s, t)
            if why is not None:
                return s.name, why, fld
            out += [ts] * n
        why = self.handler.model_reason(out)
        return (None, why, "quantization_config") if why else None

    def keeps_codebook(self, target: Target) -> bool:
        """Some tensor keeps its codebook (FP8 / FP4 codes carried, only the scales re-stored)."""
        for s, t, _ in self._pairs(target):
            ts, _, _ = self._one(s, t)
            if ts is not None and s.scheme.codebook is not None and ts.scheme.codebook == s.scheme.codebook:
                return True
        return False

    def exact(self, target: Target) -> bool:
        """Every quantized tensor is planned exact for ``target`` (:func:`classify`)."""
        try:
            for s, t, _ in self._pairs(target):
                key = (self._signature(s), t)
                if key not in self._exact:
                    self._exact[key] = classify(s, t, self.handler.quantizer)[0] == "exact"
                if not self._exact[key]:
                    return False
            return True
        except ConverterError:
            return False


def _weighted_mode(values: Iterable[tuple[Any, int]]) -> Any:
    c: Counter = Counter()
    for v, n in values:
        c[v] += n
    return max(c, key=lambda v: (c[v], str(v))) if c else None


def _choices(ckpt: Checkpoint, handler, given: Target) -> dict[str, list]:
    """Per field, the values tried, best first (the given value first when the user set it)."""
    specs = [s for s in ckpt.specs() if s.kind == "quantized"]
    bits = _weighted_mode((s.scheme.bits, s.numel) for s in specs) or 4
    groups = _weighted_mode((s.group_map.group_size, s.numel) for s in specs
                            if s.group_map.granularity is Granularity.GROUP)
    asym = any(s.scheme.zero_point is not ZeroPoint.NONE for s in specs if s.scheme.codebook is None)
    sym_order = [True, False] if handler.float_bias == "symmetric" or not asym else [False, True]
    gran = [(None, None)] + [(Granularity.GROUP, g) for g in dict.fromkeys(
        ([groups] if groups else []) + list(GROUP_CHOICES))] + [(Granularity.CHANNEL, None)]
    out = {"bits": [None] + sorted(BIT_CHOICES, key=lambda b: (abs(b - bits), -b)),
           "granularity": gran,
           "symmetric": [None] + sym_order,
           "scale_dtype": [None] + list(SCALE_DTYPES)}
    user = {"bits": given.bits, "granularity": (given.granularity, given.group_size),
            "symmetric": given.symmetric, "scale_dtype": given.scale_dtype}
    for f, v in user.items():
        if v not in (None, (None, None)):  # the user's value first, then the others (to change it if must)
            out[f] = [v] + [c for c in out[f] if c != v and c not in (None, (None, None))]
    return out


def _candidate(given: Target, values: dict[str, Any]) -> Target | None:
    g, gs = values["granularity"]
    try:
        return dataclasses.replace(given, bits=values["bits"], granularity=g, group_size=gs,
                                   symmetric=values["symmetric"], scale_dtype=values["scale_dtype"])
    except ConverterError:
        return None


def target_blocking(ckpt: Checkpoint, handler, target: Target, *, strict_values: bool = True
                    ) -> tuple[str | None, str, str] | None:
    """``(tensor, reason, field)`` of the first property of ``target`` that ``handler`` refuses for ``ckpt``
    (tensor None for a model-wide rule; field ``scheme``, ``quantization_config`` or the option an adaptation
    refused, e.g. ``--scale-dtype``), or None when every tensor passes. From specs only. ``strict_values``:
    also the float-bias / scale-dtype properties the writer would otherwise check value by value."""
    return _Checker(ckpt, handler, strict_values).blocking(target)


def complete_target(ckpt: Checkpoint, handler, given: Target | None = None, *, require_change: bool = False,
                    keep_given: bool = False, avoid_exact: bool = False) -> TargetPlan | None:
    """The complete requantize target for writing ``ckpt`` (a view after the target's module policy)
    with ``handler``, or None when no candidate passes.

    Parameters
    ----------
    given : Target, optional
        The user's options (none: a refused exact repack). Its FP8 element and ``--quant-type``
        targets are not completed (returned as they are when they pass, else None).
    require_change : bool
        At least one option is set (a command line that requantizes, not the refused repack).
    keep_given : bool
        Never change an option the user gave (only fill in the others).
    avoid_exact : bool
        Skip candidates planned exact or keeping a source codebook (the writer refused the source's
        values: carrying them would meet the same check).

    Returns
    -------
    TargetPlan or None
    """
    given = given or Target()
    chk = _Checker(ckpt, handler, strict_values=True)
    if not chk.specs:
        return None
    if given.element is not None or given.named_types:
        return TargetPlan(given, exact=chk.exact(given)) if chk.blocking(given) is None else None
    choices = _choices(ckpt, handler, given)
    # the order fields are changed in (the last first): a codebook source is requantized by --bits,
    # an integer one first by symmetry or scale dtype, its groups and bits last
    codebook = any(s.scheme.codebook is not None for s in chk.specs)
    order = ("granularity", "symmetric", "scale_dtype", "bits") if codebook else \
        ("bits", "granularity", "scale_dtype", "symmetric")
    user = {"bits": given.bits, "granularity": (given.granularity, given.group_size),
            "symmetric": given.symmetric, "scale_dtype": given.scale_dtype}
    best = None
    for idx in product(*(range(len(choices[f])) for f in FIELDS)):
        values = {f: choices[f][i] for f, i in zip(FIELDS, idx)}
        set_by_user = {f for f in FIELDS if user[f] not in (None, (None, None))}
        changed = {f for f in set_by_user if values[f] != user[f]}
        if keep_given and changed:
            continue
        n_set = sum(v not in (None, (None, None)) for v in values.values())
        if require_change and n_set == 0 and given.scale_search == "none":
            continue
        cand = _candidate(given, values)
        if cand is None:
            continue
        rank0 = (len(changed),)
        if best is not None and rank0 > best[0][:1]:
            continue
        if chk.blocking(cand) is not None:
            continue
        exact = chk.exact(cand)
        if avoid_exact and (exact or chk.keeps_codebook(cand)):
            continue
        rank = (len(changed), not exact, n_set, tuple(idx[FIELDS.index(f)] for f in order))
        if best is None or rank < best[0]:
            best = (rank, cand, values)
    if best is None:
        return None
    _, cand, values = best
    filled, changed = {}, {}
    for f in FIELDS:
        words = field_words(cand, f)
        if user[f] in (None, (None, None)):
            if words:
                filled[f] = (words, _why_needed(chk, cand, f))
        elif values[f] != user[f]:
            changed[f] = (field_words(given, f), words)
    return TargetPlan(cand, filled, changed, exact=not best[0][1])


def _why_needed(chk: _Checker, target: Target, name: str) -> str:
    """Why ``target`` needs field ``name``: the refusal of the same target without it."""
    empty = {"granularity": {"granularity": None, "group_size": None}}.get(name, {name: None})
    try:
        without = dataclasses.replace(target, **empty)
    except ConverterError as exc:
        return exc.message
    hit = chk.blocking(without)
    if hit is None:
        return "chosen with the other options"
    tensor, why, _ = hit
    return f"{tensor}: {why}" if tensor else why


def describe_changes(plan: TargetPlan) -> str:
    """``--bits 5 -> --bits 4, --asym added`` style summary of what a plan changes or adds."""
    parts = [f"{old} -> {new or 'left out'}" for old, new in plan.changed.values()]
    parts += [f"{words} added" for words, _ in plan.filled.values()]
    return ", ".join(parts)
