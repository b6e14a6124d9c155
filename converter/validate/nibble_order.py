"""Nibble (in-word code) order from the data alone: ``nibble-order`` findings (CASES.md B09).

Two checks, for checkpoints whose codes were re-read in another in-word order than the one written:

- **Sibling profiles** (:func:`column_profile`, :func:`check_nibble_order`, checkpoint level):
  tensors that read the same input (q/k/v, gate/up) share its per-column magnitude profile. Only the
  part of a profile that a reorder within a packed word can change is compared (ranks minus each
  word's mean rank, :func:`word_detail`), and a finding needs strong evidence: one sibling matching
  the re-read tensor at ``|r| >=`` :data:`NIBBLE_MIN_CORR` and beating the declared order by
  :data:`NIBBLE_MARGIN`, or, with :data:`NIBBLE_POOL_MIN_SIBLINGS` siblings, a pooled match
  :data:`NIBBLE_MIN_EXCESS` times its chance level. On every correct real output (SmolLM2's 180
  siblings, MiniLM) the worst cases are 0.13 and 1.4x; a wrong order scores about 0.45 and 20x.
- **Zero pairing** (:func:`check_zero_pairing`, per tensor): with integer zero points and codes
  packed across groups (AWQ packs along ``out``), each code decodes against the right zero point
  only in the declared order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from converter.groups import Granularity
from converter.kernels.blas import blas_threads
from converter.kernels.compiled import use_compiled
from converter.kernels.compiled.column_sums import add_column_squares, add_column_squares_codes
from converter.scheme import ZeroPoint
from converter.tensor import QuantizedTensor
from converter.validate.data_checks import MIN_ELEMENTS
from converter.validate.findings import Finding, finding
from converter.validate.interpretations import _orders, nibble_alternatives
from converter.validate.word_scan import WordScan
from converter.rows import Rows

#: An alternative in-word order is reported when the tensor's within-word detail, read in that order,
#: correlates with a sibling's at least this well (|r| of ranks; chance level 1/sqrt(dof)) ...
NIBBLE_MIN_CORR = 0.4
#: ... and at least this much better than the declared order's best sibling does (correct files:
#: <= 0.13 on every sample and every SmolLM2 output, see check_nibble_order).
NIBBLE_MARGIN = 0.3
#: Pooled evidence, with at least NIBBLE_POOL_MIN_SIBLINGS siblings: the alternative raises the sum of
#: squared correlations over all siblings by this many times its chance level (siblings / dof)
#: (correct files: <= 1.4 on the SmolLM2 outputs; a wrong order: about 20). Catches a tensor that
#: several siblings each resemble only moderately (a k_proj with 192 rows).
NIBBLE_MIN_EXCESS = 5.0
#: ... (with fewer siblings the pooled sum is too noisy: the single-sibling test alone decides).
NIBBLE_POOL_MIN_SIBLINGS = 8
#: Profiles with fewer within-word degrees of freedom (length * (1 - 1/n)) are not scored: at 160 the
#: |r| threshold 0.4 is five standard deviations of a chance correlation.
NIBBLE_MIN_DOF = 160
#: The partner is named too when its own re-reading explains the pair at least this well.
AMBIGUOUS_RATIO = 0.8


def _word_perms(t: QuantizedTensor) -> tuple[str, int, int, dict[str, np.ndarray]] | None:
    """(packed axis, its length, fields per word, {alternative order name: index permutation along it})."""
    amap = (t.stored or {}).get("codes")
    if amap is None or amap.packed_axis is None or amap.packed_axis not in t.axes or amap.word_bits % amap.bits:
        return None
    n = amap.word_bits // amap.bits
    length = t.shape[t.axes.index(amap.packed_axis)]
    if n < 2 or length % n:
        return None
    declared = tuple(amap.order) if amap.order else tuple(range(n))
    out = {}
    for label, order in _orders(n).items():
        if order == declared:
            continue
        within = np.empty(n, dtype=np.int64)
        within[list(order)] = list(declared)  # alternative element order[k] = declared element declared[k]
        out[f"nibble order {label}"] = (np.arange(0, length, n)[:, None] + within[None, :]).ravel()
    return amap.packed_axis, length, n, out


def column_profile(t: QuantizedTensor, scan: WordScan | None = None) -> dict[str, Any] | None:
    """RMS of the dequantized weights per index of the packed axis, and the alternative orders' index maps.

    ``scan``: the column sums of :func:`converter.validate.word_scan.scan` (the same float64 sums), taken instead
    of dequantizing the rows.

    Returns ``{"axis": name, "length": L, "word": fields per word, "profile": float64 (L,),
    "perms": {name: int64 (L,)}}``, or None for codes that are not packed in words.
    """
    wp = _word_perms(t)
    if wp is None or len(t.axes) < 2:
        return None
    axis, length, word, perms = wp
    if scan is not None and axis == "in" and tuple(t.axes) == ("out", "in"):
        return {"axis": axis, "length": length, "word": word, "profile": np.sqrt(scan.column_squares / t.shape[0]),
                "perms": perms}
    if tuple(t.axes) == ("out", "in"):
        # the same mean of squares accumulated over row blocks of values (never the whole float64 matrix)
        rows = Rows(t)
        n_rows = t.shape[0]
        acc = np.zeros(length, dtype=np.float64) if axis == "in" else np.empty(length, dtype=np.float64)
        compiled = axis == "in" and use_compiled(t.numel)
        if compiled and _squares_from_codes(t, rows.step, acc):  # the fast extra, straight from the codes
            return {"axis": axis, "length": length, "word": word, "profile": np.sqrt(acc / n_rows), "perms": perms}
        if compiled:  # the fast extra: the same float64 sums without the float64 copy of each block
            both_nan = sum(add_column_squares(np.ascontiguousarray(rows[r0:r0 + rows.step], dtype=np.float32), acc)
                           for r0 in range(0, n_rows, rows.step))
            if not both_nan:
                return {"axis": axis, "length": length, "word": word, "profile": np.sqrt(acc / n_rows),
                        "perms": perms}
            acc[:] = 0.0  # two NaNs met in a sum: numpy's payload, from the start
        for r0 in range(0, n_rows, rows.step):
            x = rows[r0:r0 + rows.step]
            b = np.multiply(x, x, dtype=np.float64)  # float64(x) * float64(x), without a float64 copy of x
            if axis == "in":
                acc += b.sum(axis=0)
            else:
                acc[r0:r0 + b.shape[0]] = b.mean(axis=1)
        prof = np.sqrt(acc / n_rows if axis == "in" else acc)
        return {"axis": axis, "length": length, "word": word, "profile": prof, "perms": perms}
    w = t.dequantize().astype(np.float64)
    ax = t.axes.index(axis)
    prof = np.sqrt(np.mean(np.moveaxis(w, ax, -1).reshape(-1, length) ** 2, axis=0))
    return {"axis": axis, "length": length, "word": word, "profile": prof, "perms": perms}


def _squares_from_codes(t: QuantizedTensor, step: int, acc: np.ndarray) -> bool:
    """Add each ``in`` column's sum of squared values to ``acc`` from the codes (compiled, no float32 values):
    a plain integer scheme (implicit centre or integer zero points) whose parameters are per row block and
    finite; False (nothing done) for anything else."""
    s, gm = t.scheme, t.group_map
    if (s.codebook is not None or s.zero_point is ZeroPoint.FLOAT or t.double_quant is not None
            or t.global_scale is not None or not gm.row_local(t.axes) or gm.g_idx is not None
            or t.codes.dtype.itemsize != 1 or t.scales.ndim != 2 or not np.isfinite(t.scales).all()):
        return False  # (non-finite scales: the float32 rows' path, NaN payloads and all)
    n = t.shape[1]
    if gm.granularity is Granularity.GROUP:
        col_div = gm.group_size
    elif t.scales.shape[1] == 1:
        col_div = max(n, 1)
    else:
        return False
    integer = s.zero_point is ZeroPoint.INTEGER
    zeros = t.zero_points.astype(np.float32) if integer else np.zeros((1, 1), np.float32)
    add_column_squares_codes(np.ascontiguousarray(t.codes), np.float32(s.center), np.ascontiguousarray(zeros),
                             integer, np.ascontiguousarray(t.scales.astype(np.float32)), np.int64(col_div),
                             np.int64(step), acc)
    return True


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..L-1 of ``x`` (float64), ties sharing their mean rank (a tie carries no order)."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], xs.size]
    r = np.empty(x.size, dtype=np.float64)
    r[order] = np.repeat((starts + ends - 1) / 2.0, ends - starts)
    return r


def word_detail(profile: np.ndarray, word: int) -> np.ndarray | None:
    """The profile's within-word detail: its ranks minus each word's mean rank, scaled to unit norm.

    A permutation inside words changes exactly this part of a profile; what varies only from word
    to word (smooth trends, block structure) is removed, so it cannot vote for or against an order.
    Ranks instead of values keep a few outlier indices from deciding a correlation alone.
    Returns float64 ``(L,)`` with ``d @ e`` the correlation of two details, or None for a profile
    without within-word variation.
    """
    if not np.all(np.isfinite(profile)):  # non-finite scales are reported on their own
        return None
    d = _ranks(profile).reshape(-1, word)
    d = (d - d.mean(axis=1, keepdims=True)).reshape(-1)
    norm = float(np.sqrt(d @ d))
    return d / norm if norm > 1e-9 * d.size else None


def _nibble_round(names: list[str], profs: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The strongest nibble-order evidence among ``names`` (siblings sharing axis and length), or None."""
    details: dict[int, tuple[list[str], np.ndarray]] = {}
    found: list[dict[str, Any]] = []
    for name in names:
        p = profs[name]
        n = p["word"]
        if not p["perms"] or p["length"] * (n - 1) < NIBBLE_MIN_DOF * n:
            continue
        if n not in details:  # every sibling's detail at this tensor's word size
            kept = [(m, d) for m in names if (d := word_detail(profs[m]["profile"], n)) is not None]
            # (len(kept), L): siblings share the length L; none kept (every profile non-finite) is (0, L)
            details[n] = ([m for m, _ in kept], np.array([d for _, d in kept]).reshape(len(kept), p["length"]))
        sib_names, D = details[n]
        if name not in sib_names or len(sib_names) < 2:
            continue
        i = sib_names.index(name)
        others = np.arange(len(sib_names)) != i
        labels = list(p["perms"])
        mine = D[i][np.array([p["perms"][k] for k in labels])]          # (alternatives, L)
        declared = D[i] @ D[others].T                                    # (siblings,)
        alts = mine @ D[others].T                                        # (alternatives, siblings)
        m = len(declared)
        chance = m * n / (p["length"] * (n - 1))  # expected sum of squared chance correlations
        j0 = int(np.argmax(np.abs(declared)))
        for a, label in enumerate(labels):
            j = int(np.argmax(np.abs(alts[a])))
            single, gain = abs(alts[a, j]), abs(alts[a, j]) - abs(declared[j0])
            excess = float(alts[a] @ alts[a] - declared @ declared) / chance
            strong = single >= NIBBLE_MIN_CORR and gain >= NIBBLE_MARGIN
            pooled = m >= NIBBLE_POOL_MIN_SIBLINGS and excess >= NIBBLE_MIN_EXCESS
            if strong or pooled:
                sibs = [x for x, o in zip(sib_names, others) if o]
                found.append({"excess": excess, "gain": float(gain), "name": name, "label": label,
                              "alt": float(alts[a, j]), "alt_sibling": sibs[j], "dec": float(declared[j0]),
                              "dec_sibling": sibs[j0], "siblings": m})
    if not found:
        return None
    # rank by the pooled excess: a partner of a permuted tensor gains from that one tensor only
    found.sort(key=lambda c: -c["excess"])
    best = found[0]
    # ... unless the pair is all the evidence: then the partner re-read the other way explains it as well
    rival = next((c for c in found[1:] if c["name"] == best["alt_sibling"]), None)
    if (rival is not None and rival["alt_sibling"] == best["name"]
            and rival["excess"] >= AMBIGUOUS_RATIO * best["excess"]):
        best["or_tensor"] = rival["name"]
        best["or_order"] = rival["label"]
    return best


def check_nibble_order(profiles: dict[str, dict[str, Any]]) -> list[Finding]:
    """``nibble-order``, from the data alone: tensors that read the same features along their packed
    axis (q/k/v/gate/up of every layer read the hidden state) share which indices are large; a tensor
    whose profile matches its siblings' only after re-reading its words in another order has its
    nibbles permuted (CASES.md B09).

    ``profiles`` maps tensor name -> :func:`column_profile`; siblings are the tensors with the same
    packed axis and length. Only the within-word detail of each profile (:func:`word_detail`) is
    compared, since that is all a permutation inside words changes: what differs only between
    words, and the few outlier indices that decide a Pearson correlation of raw magnitudes, cannot
    vote. The evidence must be strong, in one of two ways:

    - one sibling: the re-read detail correlates with it at ``|r| >= NIBBLE_MIN_CORR`` and beats
      the declared order's best sibling by ``NIBBLE_MARGIN``;
    - pooled, with at least ``NIBBLE_POOL_MIN_SIBLINGS`` siblings: the sum of squared correlations
      over all siblings rises by ``NIBBLE_MIN_EXCESS`` times its chance level.

    Calibration, on every shipped sample and on every SmolLM2-135M output qckpt writes (MLX, GPTQ,
    AWQ, compressed-tensors 4 and 8 bit; 30-180 siblings of 192-1536 indices): no alternative order
    of a correct tensor gains more than 0.13 (single) or 1.4 times chance (pooled); a tensor re-read
    in a wrong order gains about 0.45 and 20 times chance whenever it has related siblings (MiniLM
    query reversed: 0.65 against 0.12). The summed positive Pearson correlations used before this
    fired on 23-30 correct SmolLM2 tensors: over 180 siblings chance alone adds up past any margin.

    A permuted tensor also raises its partners' alternative scores (from that one tensor), so the
    tensor with the largest pooled gain is reported first, its profile is corrected, and the rest
    are re-scored ("explaining away"); when a pair of tensors is all the evidence, the partner is
    named too (``or_tensor``). Undetectable when every sibling is permuted the same way, or for a
    tensor without related siblings (o_proj and down_proj read features no other tensor reads):
    ``--reference`` catches those (``layout-mismatch``).
    """
    with blas_threads(1):  # small products per sibling: OpenBLAS's threads cost 10x more than they save
        return _check_nibble_order(profiles)


def _check_nibble_order(profiles: dict[str, dict[str, Any]]) -> list[Finding]:
    profs = {n: dict(p) for n, p in profiles.items()}
    groups: dict[tuple[str, int], list[str]] = {}
    for name, p in profs.items():
        groups.setdefault((p["axis"], p["length"]), []).append(name)
    out: list[Finding] = []
    for (axis, _), names in groups.items():
        if len(names) < 2:
            continue
        for _ in range(len(names)):
            best = _nibble_round(names, profs)
            if best is None:
                break
            p = profs[best["name"]]
            either = {}
            note = ""
            if "or_tensor" in best:
                either = {"or_tensor": best["or_tensor"], "or_order": best["or_order"]}
                note = (f"; the evidence is this pair alone, so '{best['or_tensor']}' read in "
                        f"'{best['or_order']}' order explains it as well: one of the two is permuted")
            out.append(finding(
                "nibble-order", best["name"],
                f"the per-{axis} magnitude pattern inside each word matches {best['alt_sibling']!r} "
                f"(r = {best['alt']:+.2f}) only when the words are read in '{best['label']}' order; in the "
                f"declared order the best of {best['siblings']} siblings is r = {best['dec']:+.2f} (squared "
                f"correlations over all siblings: {best['excess']:+.1f} times chance in the other order){note}",
                declared_correlation=round(abs(best["dec"]), 4), declared_sibling=best["dec_sibling"],
                best_alternative=best["label"], alternative_correlation=round(abs(best["alt"]), 4),
                alternative_sibling=best["alt_sibling"], pooled_excess=round(best["excess"], 2),
                siblings=best["siblings"], axis=axis, min_correlation=NIBBLE_MIN_CORR, margin=NIBBLE_MARGIN,
                min_excess=NIBBLE_MIN_EXCESS, **either))
            p["profile"] = p["profile"][p["perms"][best["label"]]]
            p["perms"] = {}
    return out


def zero_pairing_spread(t: QuantizedTensor, codes: np.ndarray) -> float:
    """RMS over groups of the group mean of ``q - z`` (code units): small when codes sit with their own zeros.

    Exact group sums of the integer codes (``q - z`` averages to ``mean(q) - z``, ``z`` being one
    value per group), never a float64 copy of the tensor.
    """
    gm, axes = t.group_map, t.axes
    sums = gm.reduce(codes.astype(np.int32), np.add, axes)
    counts = gm.reduce(np.broadcast_to(np.int32(1), codes.shape), np.add, axes)
    means = sums / counts - t.zero_points.astype(np.float64)
    return float(np.sqrt(np.mean(means * means)))


def _words_within_groups(t: QuantizedTensor) -> bool:
    """True when every packed word lies inside one quantization group: any in-word order then
    leaves each group's codes (and so its mean) unchanged, and zero pairing cannot tell orders apart."""
    amap = (t.stored or {}).get("codes")
    gm = t.group_map
    if amap is None or amap.packed_axis is None or not amap.bits or amap.word_bits % amap.bits:
        return False
    n = amap.word_bits // amap.bits
    if gm.granularity is Granularity.TENSOR:
        return True
    if gm.granularity is Granularity.CHANNEL:
        return amap.packed_axis != gm.axis
    if gm.granularity is Granularity.GROUP:
        return amap.packed_axis == gm.axis and gm.g_idx is None and gm.group_size % n == 0
    return False


def check_zero_pairing(t: QuantizedTensor) -> tuple[list[Finding], dict[str, Any] | None]:
    """``nibble-order`` for codes packed across groups (AWQ packs along ``out``): with integer zero points,
    each group's codes centre on its own zero (group mean of ``q - z`` near 0: 0.21-0.28 steps RMS on
    the real samples with groups of 128, 0.58-0.75 with groups of 32 on SmolLM2-135M); codes read in
    the wrong in-word order land in other rows' groups and sit several steps off (above 1.0 on every
    sample, at least twice the declared spread on SmolLM2). Reported when another order brings the
    spread below :data:`PAIRING_RATIO` times the declared one. Skipped when every word lies inside one
    group (GPTQ, compressed-tensors: packed along their groups), where no order changes a group mean."""
    if t.scheme.zero_point is not ZeroPoint.INTEGER or t.numel < MIN_ELEMENTS or _words_within_groups(t):
        return [], None
    alts = nibble_alternatives(t)
    if not alts:
        return [], None
    declared = zero_pairing_spread(t, t.codes)
    spreads = {k: round(zero_pairing_spread(t, v), 4) for k, v in alts.items()}
    stats = {"declared": round(declared, 4), "alternatives": spreads}
    best, val = min(spreads.items(), key=lambda kv: kv[1])
    if declared > PAIRING_MIN and val < PAIRING_RATIO * declared:
        return [finding("nibble-order", t.name, f"codes sit {declared:.2f} steps (RMS of group means) from their "
                        f"groups' zero points, but {val:.2f} when the words are read in '{best}' order: the codes "
                        f"were packed in another order than declared", declared_spread=round(declared, 4),
                        best_alternative=best, alternative_spread=val, alternatives=spreads)], stats
    return [], stats


#: Zero-pairing spreads: flag when the best alternative is below this fraction of the declared spread ...
PAIRING_RATIO = 0.5
#: ... and the declared spread exceeds this many steps.
PAIRING_MIN = 0.5
