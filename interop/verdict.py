"""Pass rules of the interop suite (stdlib only; checked by interop/selfcheck.py).

Verdicts: PASS, FAIL (with the reason), GARBAGE (the output loads but computes something else:
top-1 agreement below GARBAGE_TOP1_PCT), REFUSED (an exact repack qckpt declines, naming the
requantize options: not a failure, the target cannot hold the source scheme), SKIP (a consumer
that is not installed, e.g. llama-cpp-python without --with-llama), TOOL-LIMIT (a correct file the
pinned loader version refuses with a documented message, e.g. transformers' CPU FP8 path on partial
128-blocks: not a failure of qckpt, named in the table).
"""

from __future__ import annotations

# Exact targets: the loader computes with the same weights (bit-identical after decoding) but maybe
# other kernels (MLX's quantized matmul, another accumulation order). Float32 rounding through 30
# layers stays far below this; one wrong tensor moves logits by whole units. The figure is relative
# to the largest reference logit of the prompts (about 20-35 here).
EXACT_REL_TOL = 1e-3
# A loader that rebuilds the weights in float16 (MLX computes scale * q + bias in the dtype of the
# scales, float16 here) rounds every weight to 11 significant bits: the tolerance is 4 float16 units
# in the last place of the largest logit (2**-10 relative each), still far below what one wrong
# tensor does.
EXACT_REL_TOL_BY_DEQUANT = {"float32": EXACT_REL_TOL, "float16": 4 * 2.0 ** -10, "bfloat16": 4 * 2.0 ** -7}


def exact_tolerance(result: dict) -> float:
    """Relative logit tolerance for an exact target, by the dtype the loader rebuilds weights in
    (result["dequant_dtype"], default float32)."""
    dt = result.get("dequant_dtype") or "float32"
    return max(EXACT_REL_TOL_BY_DEQUANT.get(d, EXACT_REL_TOL) for d in dt.split(","))
# An output whose top-1 agrees with the reference at fewer than this share of positions is garbage,
# whatever else passes.
GARBAGE_TOP1_PCT = 50.0
# Layer checks (MiniLM samples): the consumer decodes in float16 (gptqmodel, compressed-tensors with
# fp16 scales) or float32 (mlx, gguf-py). Two float16 roundings (scale, product) bound the weight
# difference by 2**-10 of the largest |w|; the tolerance allows twice that.
LAYER_WEIGHT_REL_TOL = 2.0 ** -9
# Linear output x @ W.T over 384/1536 inputs in float16: relative to max |y|.
LAYER_OUTPUT_REL_TOL = 2.0 ** -7
# Requantized layers: a relative output error vs the source above this is garbage.
LAYER_GARBAGE_REL = 0.5


def model_verdict(case: dict, convert: dict | None, result: dict | None) -> tuple[str, str]:
    """Verdict for a full-model (SmolLM2) case.

    case: {"expect": "exact"|"lossy"|"refuse", "refuse_match": [words...], "accept_refusal": [words...]
    (a qckpt exit 3 naming one of them is REFUSED: the target cannot hold the source, or has no writer
    for it yet; a later writer makes the same case load and be judged)};
    convert: {"rc": int, "error": str} of the qckpt command (None: the case has no command);
    result: the worker's JSON (None: not run because the conversion failed or consumer missing).
    Returns (verdict, reason).
    """
    expect = case["expect"]
    if expect == "refuse":
        if convert is None:
            return "FAIL", "no qckpt command"
        if convert["rc"] == 0:
            return "FAIL", "qckpt converted; it must refuse at plan time"
        words = case.get("refuse_match", [])
        err = (convert.get("error") or "").lower()
        if words and not all(w.lower() in err for w in words):
            return "FAIL", f"refused for another reason (expected the message to name {words})"
        if convert["rc"] != 3:
            return "FAIL", f"exit status {convert['rc']}, expected 3"
        return "PASS", "refused at plan time"
    if convert is not None and convert["rc"] != 0:
        err = (convert.get("error") or "").lower()
        # a write the target cannot hold, or has no writer for yet, declined at plan time (exit 3)
        if convert["rc"] == 3 and any(w.lower() in err for w in case.get("accept_refusal", [])):
            return "REFUSED", convert.get("error", "")
        return "FAIL", f"qckpt exit {convert['rc']}: {convert.get('error', '')}"
    if result is None:
        return "FAIL", "loader did not run"
    if not result.get("ok") and not result.get("skipped") and (expect == "tool_limit" or case.get("limit_match")):
        # a documented limit of this loader version (for an "exact" / "lossy" row: of some sources only)
        err = ((result.get("error") or "") + "\n" + (result.get("log_tail") or "")).lower()
        if any(w.lower() in err for w in case.get("limit_match", [])):
            return "TOOL-LIMIT", f"the loader refuses the file: {result.get('error')}"
        return "FAIL", f"{result.get('stage', 'load')}: {result.get('error', 'no result')}"
    if result.get("skipped"):
        return "SKIP", result.get("error", "consumer not installed")
    if not result.get("ok"):
        return "FAIL", f"{result.get('stage', 'load')}: {result.get('error', 'no result')}"
    if expect == "same_as_tool":  # every tensor byte-identical with the real tool's own output
        if result["identical"] == result["tensors"]:
            tool = f"{result['tool']}'s output" if result.get("tool") else "llama.cpp's requantization"
            extra = result.get("tool_only_allowed") or []
            return "PASS", (f"all {result['tensors']} tensors byte-identical with {tool}"
                            + (f"; the tool also writes {len(extra)} tensors qckpt leaves out ({extra[0]} ...)"
                               if extra else ""))
        return "FAIL", f"{result['tensors'] - result['identical']} of {result['tensors']} tensors differ: " \
                       f"{result['differing'][:3]}"
    if expect == "decode_exact":  # the loader's own decode of every quantized tensor equals qckpt's, value for value
        bad = [t for t in result["tensors"] if "error" in t or t.get("values_differ")]
        if not result["tensors"]:
            return "FAIL", "no quantized tensor decoded"
        if bad:
            t = bad[0]
            return "FAIL", (f"{len(bad)} of {len(result['tensors'])} tensors differ; {t['tensor']}: "
                            + (t.get("error") or f"{t['values_differ']} of {t['elements']} values, "
                               f"max |diff| {t['max_abs_weight_diff']:.3g}"))
        return "PASS", (f"{result['elements']} weights of {len(result['tensors'])} tensors "
                        f"({', '.join(result['types'])}) match qckpt's decode"
                        + "".join(f"; {result[k]} {what}" for k, what in (
                            ("one_ulp", "of them one float32 ulp apart (the .scale multiplied in another order)"),
                            ("signed_zeros", "zeros of opposite sign")) if result.get(k)))
    if result["top1_agree_pct"] < GARBAGE_TOP1_PCT:
        return "GARBAGE", f"top-1 agreement {result['top1_agree_pct']:.1f}% < {GARBAGE_TOP1_PCT:.0f}%"
    problems = []
    if result.get("tokenizer_error"):
        problems.append(f"tokenizer: {result['tokenizer_error']}")
    elif result.get("tokenizer_ids_equal") is False:
        problems.append("tokenizer encodes the prompts to other ids")
    if expect == "lossy_tool":  # a lossy conversion whose fidelity to the real tool is a sibling row's
        if problems:
            return "FAIL", "; ".join(problems)
        kept = "kept" if result["france_last_is_paris"] else "not kept"
        return "LOSSY", (f"top-1 ' Paris' {kept}, top-1 agreement {result['top1_agree_pct']:.1f}%; "
                         f"fidelity to llama.cpp's own requantization: the llama-quantize row")
    if expect in ("exact", "tool_limit"):  # a tool_limit row that loads is judged as exact
        ref_key = "vs_loader_source" if result.get("vs_loader_source") else None
        m = result[ref_key] if ref_key else result
        tol = exact_tolerance(result) * m["ref_max_abs_logit"]
        if m["max_abs_logit_diff"] > tol:
            problems.append(f"max |logit diff| {m['max_abs_logit_diff']:.3g} > {tol:.3g}")
        greedy_ok = m.get("greedy_equal") if ref_key else result.get("greedy_equal")
        if not greedy_ok:
            problems.append("greedy tokens differ")
    elif case.get("lossy_top1_pct") is not None:  # a small model without a natural-language prompt
        if result["top1_agree_pct"] < case["lossy_top1_pct"]:
            problems.append(f"top-1 agreement {result['top1_agree_pct']:.1f}% < {case['lossy_top1_pct']:g}%")
    else:
        if not result["france_last_is_paris"]:
            problems.append(case.get("top1_problem", "top-1 after 'The capital of France is' is not ' Paris'"))
    if problems:
        return "FAIL", "; ".join(problems)
    return "PASS", ""


def layer_verdict(case: dict, convert: dict | None, result: dict | None) -> tuple[str, str]:
    """Verdict for a MiniLM layer case: case["kind"] is "exact" or "requantize"."""
    if convert is not None and convert["rc"] != 0:
        err = (convert.get("error") or "").lower()
        # an exact repack the target cannot hold, refused with the way out named (requantize options,
        # or `qckpt quantize` for a source without quantized tensors)
        if case["kind"] == "exact" and convert["rc"] == 3 and ("requantize" in err or "quantize it" in err):
            return "REFUSED", convert.get("error", "")
        return "FAIL", f"qckpt exit {convert['rc']}: {convert.get('error', '')}"
    if result is None:
        return "FAIL", "loader did not run"
    if result.get("skipped"):
        return "SKIP", result.get("error", "consumer not installed")
    if not result.get("ok"):
        if result.get("stage"):
            return "FAIL", f"{result['stage']}: {result.get('error', '')}"
        bad = [t for t in result.get("tensors", []) if "error" in t]
        if result.get("missing_tensors"):
            return "FAIL", f"tensors missing in the output: {result['missing_tensors'][:3]}"
        return "FAIL", f"{bad[0]['tensor']}: {bad[0]['error']}" if bad else "no result"
    problems = []
    for t in result["tensors"]:
        wtol = LAYER_WEIGHT_REL_TOL * t["max_abs_weight"]
        if t["max_abs_weight_diff"] > wtol:
            problems.append(f"{t['tensor']} weight diff {t['max_abs_weight_diff']:.3g} > {wtol:.3g}")
        if "max_abs_output_diff" in t:
            ytol = LAYER_OUTPUT_REL_TOL * t["max_abs_output"]
            if t["max_abs_output_diff"] > ytol:
                problems.append(f"{t['tensor']} output diff {t['max_abs_output_diff']:.3g} > {ytol:.3g}")
    if case["kind"] == "requantize":
        rel = result.get("vs_source_rel_output_err")
        if rel is not None and rel > LAYER_GARBAGE_REL:
            return "GARBAGE", f"relative output error vs the source {rel:.2f}"
    if problems:
        return "FAIL", problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")
    return "PASS", ""
