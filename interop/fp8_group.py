"""Group "fp8" of the interop suite (stdlib only): each loadable FP8 source of cases.FP8_SOURCES,
converted by qckpt into every target and loaded whole by the target's real loader, compared with
transformers running the producing tool's own decode of the source (worker_fp8.act_fp8_reference).
"""

from __future__ import annotations

from pathlib import Path

import cases as C
import model_rows as M
import verdict as V

REF_VERSION = "1"  # bump when FP8_PROMPTS or the reference method change


def reference(run, name: str, folder: Path) -> dict:
    """The float32 reference of one source (cached by the digest of the source folder's files)."""
    info = C.FP8_SOURCES[name]
    key = f"fp8-{name}-{M.digest(sorted(f for f in folder.iterdir() if f.is_file()))}-v{REF_VERSION}"
    spec = {"source": str(folder), "reference": info["reference"], "dest": str(run.work / f"ref-{name}"),
            "prompts": C.FP8_PROMPTS, "france_index": 0, "greedy_tokens": C.FP8_GREEDY_TOKENS, "pad_id": 2}
    r = M.cached_reference(run, key, "fp8_reference", spec, f"fp8-reference-{name}")
    if not r.get("ok"):
        raise SystemExit(f"fp8 reference of {name} failed: {r}")
    return r


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
            src = Path(run.args.fp8_sources) / case["source"] if case.get("source") else folder
            rows.append(M.run_case(run, log, summary, case, group="fp8", name=name, source=case.get("source", name),
                                   src=src, spec_for=lambda case, row, path, base=base: base))
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
         "documented message.", ""]
    return L + M.table(rows, fmt, md_escape, loader_names)
