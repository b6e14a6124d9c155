"""What the whole-model groups share (stdlib only): one case run as a row, and the Markdown of those rows.

A whole-model case (cases.smollm2_cases / fp8_cases / fp4_cases) runs one qckpt command (or none: the
source itself), loads the output with the case's loader in the interop venv, and is judged by
verdict.model_verdict. The fp8 and fp4 groups run their cases through :func:`run_case` and render them
with :func:`table`; run.py's SmolLM2 table uses :func:`load_cell`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

import cases as C
import verdict as V

NO_LLAMA = "llama-cpp-python not installed (setup.sh --with-llama)"
NO_LLAMA_SRC = "no llama.cpp source tree with convert_hf_to_gguf.py (--llama-cpp-src / $QCKPT_LLAMA_CPP_SRC)"


def digest(files: list[Path]) -> str:
    """First 16 hex digits of the sha256 of each file's name and bytes, in order (a reference cache key)."""
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cached_reference(run, key: str, action: str, spec: dict, worker_name: str) -> dict:
    """The reference worker ``action``'s result, cached in ``<--cache>/<key>/`` (reference.json beside the
    logits ``reference.npz``, whose path the worker gets as ``spec["reference_npz"]``); ``npz`` is added.
    A failed result is returned as it is and not cached."""
    cache = Path(run.args.cache) / key
    meta_p, npz = cache / "reference.json", cache / "reference.npz"
    if meta_p.exists() and npz.exists() and not run.args.no_cache:
        return dict(json.loads(meta_p.read_text()), npz=str(npz))
    cache.mkdir(parents=True, exist_ok=True)
    r = run.worker(action, dict(spec, reference_npz=str(npz)), worker_name, run.args.timeout)
    if not r.get("ok"):
        return r
    meta_p.write_text(json.dumps(r, indent=1))
    return dict(r, npz=str(npz))


def run_case(run, log, summary, case: dict, *, group: str, name: str, source: str, src: Path,
             spec_for: Callable[[dict, dict, Path], dict | str]) -> dict:
    """The row of one case of source ``name`` (shown as ``source``; the qckpt input is ``src``).

    ``spec_for(case, row, path)`` gives the loader's spec for the output ``path`` (``path`` is added; a str
    instead: why the loader cannot run, a FAIL row). A case that ``needs`` "llama_cpp" is SKIP without
    llama-cpp-python ("llama_cpp_src": without a llama.cpp source tree); ``cmd`` None runs the loader on
    ``src`` itself; ``dequant_dtype`` is copied into a loaded result (verdict.exact_tolerance).
    """
    log(f"[{group}] {name}: {case['id']}")
    row = {"group": group, "id": case["id"], "source": source, "loader": case["loader"], "expect": case["expect"]}
    missing = {"llama_cpp": lambda: NO_LLAMA if not run.has_module("llama_cpp") else None,
               "llama_cpp_src": lambda: NO_LLAMA_SRC if not llama_cpp_src(run) else None}.get(case.get("needs"))
    if missing and missing():
        row.update(verdict="SKIP", reason=missing(), command=None)
        return row
    if case["cmd"] is None:
        conv, path = None, src
        row["command"] = "(the source itself)"
    else:
        conv, path = run.convert_once(src, f"{group}-{name}-{case['out']}", case["cmd"], run.args.timeout)
        row["command"], row["convert"] = conv["command"], conv
    result = None
    if case["loader"] and (conv is None or conv["rc"] == 0):
        spec = spec_for(case, row, path)
        if isinstance(spec, str):
            row.update(verdict="FAIL", reason=spec, result=None)
            log(f"    -> FAIL {row['reason']}")
            return row
        result = run.worker(case["loader"], dict(spec, path=str(path)), C.slug(f"{group}-{name}-{case['id']}"),
                            run.args.timeout)
        if result.get("ok") and case.get("dequant_dtype"):
            result["dequant_dtype"] = case["dequant_dtype"]
    v, reason = V.model_verdict(case, conv, result)
    row.update(verdict=v, reason=reason, result=result)
    log(f"    -> {v} {reason}" + (f" | {summary(result)}" if result and result.get("ok") else ""))
    return row


def llama_cpp_src(run) -> str | None:
    """The llama.cpp source tree of ``--llama-cpp-src`` when it holds ``convert_hf_to_gguf.py``, else None."""
    d = getattr(run.args, "llama_cpp_src", None)
    return d if d and (Path(d) / "convert_hf_to_gguf.py").exists() else None


def load_cell(r: dict) -> str:
    """The load column: ``ok`` (with the tensors left at random init / ignored, a tokenizer error), the
    loader's failing stage and error, ``(not written)`` when qckpt did not write, else ``-``."""
    res = r.get("result") or {}
    if res.get("ok"):
        load = "ok"
        for key, what in (("missing_keys", "left at random init"), ("unexpected_keys", "ignored")):
            k = res.get(key) or {}
            if k.get("count"):
                load += f"; {k['count']} tensors {what} ({', '.join(k['first'][:2])}...)"
        if res.get("tokenizer_error"):
            load += f"; tokenizer: {res['tokenizer_error']}"
        return load
    if res:
        return f"{res.get('stage')}: {res.get('error')}"
    if (r.get("convert") or {}).get("rc"):
        return "(not written)"
    return "-"


def table(rows: list[dict], fmt, md_escape, loader_names, ref_dtype: bool = False) -> list[str]:
    """The Markdown table of whole-model rows (with a ``ref dtype`` column when ``ref_dtype``)."""
    extra = " ref dtype |" if ref_dtype else ""
    L = ["| source | target (case) | command | loader |" + extra + " load | max \\|dlogit\\| | mean \\|dlogit\\| "
         "| top-1 % | greedy equal | verdict |",
         "|---|---|---|---|" + ("---|" if ref_dtype else "") + "---|---|---|---|---|---|"]
    for r in rows:
        res = r.get("result") or {}
        reason = f"**{r['verdict']}**" + (f": {md_escape(r['reason'])}" if r.get("reason") else "")
        L.append(f"| {r['source']} | {r['id']} | `{md_escape(r.get('command') or '-')}` "
                 f"| {loader_names.get(r['loader'], r['loader'])} "
                 + (f"| {r.get('ref_dtype', '-')} " if ref_dtype else "")
                 + f"| {md_escape(load_cell(r))} | {fmt(res.get('max_abs_logit_diff'))} "
                 f"| {fmt(res.get('mean_abs_logit_diff'))} | {fmt(res.get('top1_agree_pct'), '.1f')} "
                 f"| {fmt(res.get('greedy_equal'), '')} | {reason} |")
    L.append("")
    return L
