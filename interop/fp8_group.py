"""Group "fp8" of the interop suite (stdlib only): each loadable FP8 source of cases.FP8_SOURCES,
converted by qckpt into every target and loaded whole by the target's real loader, compared with
transformers running the producing tool's own decode of the source (worker_fp8.act_fp8_reference).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import cases as C
import verdict as V

REF_VERSION = "1"  # bump when FP8_PROMPTS or the reference method change


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()):
        if f.is_file():
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def reference(run, name: str, folder: Path) -> dict:
    """The float32 reference of one source (cached by the source's digest)."""
    info = C.FP8_SOURCES[name]
    cache = Path(run.args.cache) / f"fp8-{name}-{_digest(folder)}-v{REF_VERSION}"
    meta_p, npz = cache / "reference.json", cache / "reference.npz"
    if meta_p.exists() and npz.exists() and not run.args.no_cache:
        return dict(json.loads(meta_p.read_text()), npz=str(npz))
    cache.mkdir(parents=True, exist_ok=True)
    spec = {"source": str(folder), "reference": info["reference"], "dest": str(run.work / f"ref-{name}"),
            "reference_npz": str(npz), "prompts": C.FP8_PROMPTS, "france_index": 0,
            "greedy_tokens": C.FP8_GREEDY_TOKENS, "pad_id": 2}
    r = run.worker("fp8_reference", spec, f"fp8-reference-{name}", run.args.timeout)
    if not r.get("ok"):
        raise SystemExit(f"fp8 reference of {name} failed: {r}")
    meta_p.write_text(json.dumps(r, indent=1))
    return dict(r, npz=str(npz))


def run_fp8(run, log, selected, summary) -> list[dict]:
    rows = []
    for name in C.FP8_SOURCES:
        folder = Path(run.args.fp8_sources) / name
        if not folder.exists():
            rows.append({"group": "fp8", "id": f"{name}: all", "source": name, "loader": None,
                         "verdict": "SKIP", "reason": f"source not found: {folder}"})
            continue
        cases = [c for c in C.fp8_cases() if (c["quick"] or not run.args.quick) and selected(run.args.only, c["id"])]
        if not cases:
            continue
        ref = reference(run, name, folder)
        base = {"reference_npz": ref["npz"], "prompts": ref["prompts"], "france_index": 0,
                "paris_id": ref["paris_ids"][0], "greedy_tokens": C.FP8_GREEDY_TOKENS,
                "reference_greedy_ids": ref["greedy_ids"], "tokenizer": False, "pad_id": 2}
        for case in cases:
            log(f"[fp8] {name}: {case['id']}")
            row = {"group": "fp8", "id": case["id"], "source": case.get("source", name), "loader": case["loader"],
                   "expect": case["expect"]}
            src = Path(run.args.fp8_sources) / case["source"] if case.get("source") else folder
            conv, path = run.convert_once(src, f"fp8-{name}-{case['out']}", case["cmd"], run.args.timeout)
            row["command"] = conv["command"]
            row["convert"] = conv
            result = None
            if case["loader"] and conv["rc"] == 0:
                result = run.worker(case["loader"], dict(base, path=str(path)), C.slug(f"fp8-{name}-{case['id']}"),
                                    run.args.timeout)
                if result.get("ok") and case.get("dequant_dtype"):
                    result["dequant_dtype"] = case["dequant_dtype"]
            v, reason = V.model_verdict(case, conv, result)
            row.update(verdict=v, reason=reason, result=result)
            log(f"    -> {v} {reason}" + (f" | {summary(result)}" if result and result.get("ok") else ""))
            rows.append(row)
    return rows


def section(rows: list[dict], fmt, md_escape, loader_names) -> list[str]:
    """The RESULTS.md section of the fp8 rows."""
    rows = [r for r in rows if r["group"] == "fp8"]
    if not rows:
        return []
    L = ["## FP8 sources -> target -> real loader", "",
         "Sources: " + "; ".join(f"`{n}` ({i['written_by']})" for n, i in C.FP8_SOURCES.items()) + ". "
         "Reference: transformers (float32) on the source's config with every quantized weight replaced by the "
         "producing tool's own decode (reference_dequant.safetensors). The model is one SmolLM2 layer with a "
         "256-token vocabulary and no tokenizer, so the prompts are fixed token ids "
         f"({', '.join(str(len(p['ids'])) for p in C.FP8_PROMPTS)} positions) and greedy decoding runs "
         f"{C.FP8_GREEDY_TOKENS} tokens. Exact rows: greedy identical and max |logit diff| <= "
         f"{V.EXACT_REL_TOL:g} x max |reference logit| ({V.EXACT_REL_TOL_BY_DEQUANT['bfloat16']:.3g} x where the "
         "weights are decoded in float32 (qckpt's float32 dequantize, transformers' compressed-tensors path): "
         "they keep the float32 products the bf16 reference rounds). Lossy rows: top-1 agreement over every "
         f"position >= {C.FP8_LOSSY_TOP1_PCT:g}%. TOOL-LIMIT: a correct file the pinned loader refuses with a "
         "documented message.", "",
         "| source | target (case) | command | loader | load | max \\|dlogit\\| | mean \\|dlogit\\| | top-1 % "
         "| greedy equal | verdict |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        res = r.get("result") or {}
        if res.get("ok"):
            load = "ok"
            for key, what in (("missing_keys", "left at random init"), ("unexpected_keys", "ignored")):
                k = res.get(key) or {}
                if k.get("count"):
                    load += f"; {k['count']} tensors {what} ({', '.join(k['first'][:2])}...)"
        elif res:
            load = f"{res.get('stage')}: {res.get('error')}"
        elif r.get("convert", {}).get("rc"):
            load = "(not written)"
        else:
            load = "-"
        reason = f"**{r['verdict']}**" + (f": {md_escape(r['reason'])}" if r.get("reason") else "")
        L.append(f"| {r['source']} | {r['id']} | `{md_escape(r.get('command') or '-')}` "
                 f"| {loader_names.get(r['loader'], r['loader'])} | {md_escape(load)} "
                 f"| {fmt(res.get('max_abs_logit_diff'))} | {fmt(res.get('mean_abs_logit_diff'))} "
                 f"| {fmt(res.get('top1_agree_pct'), '.1f')} | {fmt(res.get('greedy_equal'), '')} | {reason} |")
    L.append("")
    return L
