#!/usr/bin/env python3
"""qckpt interop suite: every checkpoint qckpt writes, loaded by its target's real loader.

    python interop/run.py [--quick] [--out interop/results] [--only SUBSTRING] [--keep]

Needs the interop venv made by interop/setup.sh ($QCKPT_INTEROP_VENV, default interop/.venv). This
script itself uses only the standard library: it runs the qckpt CLI of this repository
(`<python> -m converter` with PYTHONPATH=<repo>) into a temporary folder, then each loader check in a
subprocess of the interop venv (interop/worker.py) with a timeout, so a crash or a hang is one
failed row, not a dead run. Writes RESULTS.md and results.json into --out. See interop/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import cases as C  # noqa: E402
import fp4_group  # noqa: E402
import fp8_group  # noqa: E402
import model_rows as M  # noqa: E402
import verdict as V  # noqa: E402

WORKER = HERE / "worker.py"
REF_VERSION = "1"  # bump when the reference prompts or method change (invalidates the cache)


def log(msg: str) -> None:
    print(msg, flush=True)


def last_error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "error" in ln.lower():
            return ln[:500]
    return lines[-1][:500] if lines else ""


class Runner:
    def __init__(self, args):
        self.args = args
        self.venv = Path(args.venv).resolve()
        self.py = str(self.venv / "bin" / "python")
        self.qpy = args.qckpt_python or self.py
        self.work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="qckpt-interop-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.converted: dict[str, dict] = {}
        self._modules: dict[str, bool] = {}
        self.source = Path(args.smollm2)

    # -------------------------------------------------------------- subprocesses
    def qckpt(self, argv: list[str], timeout: float) -> dict:
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        cmd = [self.qpy, "-m", "converter"] + argv
        t = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO))
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = -9, exc.stdout or "", f"timeout after {timeout:.0f} s"
            out = out.decode() if isinstance(out, bytes) else out
        res = {"rc": rc, "seconds": round(time.time() - t, 2)}
        if rc != 0:
            res["error"] = last_error_line(err) or last_error_line(out)
        else:
            res["summary"] = last_error_line(out) if False else (out.strip().splitlines() or [""])[-1][:300]
        return res

    def worker(self, action: str, spec: dict, name: str, timeout: float) -> dict:
        d = self.work / "specs"
        d.mkdir(exist_ok=True)
        spec_p, out_p = d / f"{name}.json", d / f"{name}.result.json"
        spec_p.write_text(json.dumps(spec))
        if out_p.exists():
            out_p.unlink()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(self.args.threads),
                   PYTHONWARNINGS="ignore")
        t = time.time()
        try:
            p = subprocess.run([self.py, str(WORKER), action, str(spec_p), str(out_p)], capture_output=True,
                               text=True, timeout=timeout, env=env, cwd=str(self.work))
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired:
            return {"ok": False, "stage": "timeout", "error": f"no result after {timeout:.0f} s",
                    "seconds": round(time.time() - t, 1)}
        if out_p.exists():
            res = json.loads(out_p.read_text())
            if not res.get("ok"):  # what the loader printed before failing (transformers' CONVERSION report ...)
                res["log_tail"] = ((p.stdout or "") + (p.stderr or ""))[-4000:]
            return res
        return {"ok": False, "stage": "crash", "error": f"worker exit {rc}: {last_error_line(err)}",
                "seconds": round(time.time() - t, 1)}

    def has_module(self, mod: str) -> bool:
        """Whether the interop venv can import ``mod`` (asked once per run)."""
        if mod not in self._modules:
            p = subprocess.run([self.py, "-c",
                                f"import importlib.util,sys; sys.exit(importlib.util.find_spec('{mod}') is None)"])
            self._modules[mod] = p.returncode == 0
        return self._modules[mod]

    def convert_once(self, src: Path, out_name: str, cmd: list[str], timeout: float) -> tuple[dict, Path]:
        key = json.dumps([str(src), out_name, cmd])
        dst = self.work / "out" / out_name
        if key not in self.converted:
            dst.parent.mkdir(parents=True, exist_ok=True)
            argv = [cmd[0], str(src), str(dst)] + cmd[1:] + ["--overwrite", "--quiet"]
            res = self.qckpt(argv, timeout)
            try:
                shown = str(src.resolve().relative_to(REPO))
            except ValueError:
                shown = src.name if src == self.source else str(src)
            if str(src).startswith(str(self.work)):
                shown = "<out>/" + src.name
            res["command"] = "qckpt " + " ".join([cmd[0], shown, "<out>/" + out_name] + cmd[1:])
            self.converted[key] = res
            log(f"    qckpt {' '.join(cmd)}  -> rc {res['rc']} ({res['seconds']} s)"
                + (f"  {res.get('error', '')}" if res["rc"] else ""))
        return self.converted[key], dst

    # -------------------------------------------------------------- versions
    def versions(self) -> dict:
        code = ("import importlib.metadata as m, json, sys\n"
                "names=['torch','transformers','compressed-tensors','accelerate','gptqmodel','mlx','mlx-lm',"
                "'gguf','tokenizers','safetensors','numpy','llama-cpp-python']\n"
                "out={}\n"
                "for n in names:\n"
                "    try: out[n]=m.version(n)\n"
                "    except Exception: out[n]=None\n"
                "out['python']=sys.version.split()[0]\n"
                "print(json.dumps(out))")
        p = subprocess.run([self.py, "-c", code], capture_output=True, text=True)
        v = json.loads(p.stdout) if p.returncode == 0 else {"error": p.stderr[-300:]}
        try:
            commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                                    text=True).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "converter"],
                                   capture_output=True, text=True).stdout.strip()
        except OSError:
            commit, dirty = None, ""
        v["qckpt_commit"] = commit + ("+dirty converter/" if dirty else "") if commit else None
        v["platform"] = platform.platform()
        return v

    # -------------------------------------------------------------- reference
    def reference(self) -> dict:
        h = hashlib.sha256()
        with open(self.source, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        key = h.hexdigest()[:16] + "-v" + REF_VERSION
        cache = Path(self.args.cache) / key
        meta_p, npz = cache / "reference.json", cache / "reference.npz"
        if meta_p.exists() and npz.exists() and not self.args.no_cache:
            log(f"reference: cached {cache}")
            return dict(json.loads(meta_p.read_text()), npz=str(npz))
        cache.mkdir(parents=True, exist_ok=True)
        log("reference: transformers' GGUF loader on the source (float32) ...")
        spec = {"path": str(self.source), "reference_npz": str(npz), "prompts": C.PROMPTS,
                "france_index": 0, "greedy_tokens": C.GREEDY_TOKENS}
        r = self.worker("reference", spec, "reference", self.args.timeout * 2)
        if not r.get("ok"):
            raise SystemExit(f"reference failed: {r}")
        if r["prompts"][0]["ids"] != C.FRANCE_IDS:
            raise SystemExit(f"reference tokenizer: France prompt ids {r['prompts'][0]['ids']} != {C.FRANCE_IDS}")
        if r["greedy_text"] != C.MANIFEST_GREEDY_TEXT:
            log(f"WARNING: reference greedy {r['greedy_text']!r} differs from MANIFEST's {C.MANIFEST_GREEDY_TEXT!r}")
        meta_p.write_text(json.dumps(r, indent=1))
        log(f"reference: greedy {r['greedy_text']!r} ({r['seconds']} s)")
        return dict(r, npz=str(npz))

    # -------------------------------------------------------------- groups
    def run_smollm2(self, ref: dict) -> list[dict]:
        rows = []
        have_llama = self.has_module("llama_cpp")
        base = {"reference_npz": ref["npz"], "prompts": ref["prompts"], "france_index": 0,
                "paris_id": ref["paris_ids"][0], "greedy_tokens": C.GREEDY_TOKENS,
                "reference_greedy_ids": ref["greedy_ids"]}
        llama_ref = None
        for case in C.smollm2_cases():
            if self.args.quick and not case["quick"]:
                continue
            if not selected(self.args.only, case["id"]):
                if not (case["id"] == "source/llama.cpp" and "llama" in (self.args.only or "")):
                    continue
            log(f"[smollm2] {case['id']}")
            row = {"group": "smollm2", "id": case["id"], "source": C.SMOLLM2, "loader": case["loader"],
                   "expect": case["expect"]}
            if case.get("needs") == "llama_cpp" and not have_llama:
                row.update(verdict="SKIP", reason=M.NO_LLAMA, command=None)
                rows.append(row)
                continue
            conv = None
            if case["cmd"] is None:
                path = self.source
                row["command"] = "(the source itself)"
            else:
                conv, path = self.convert_once(self.source, case["out"], case["cmd"], self.args.timeout)
                row["command"] = conv["command"]
                row["convert"] = conv
            result = None
            if case["loader"] and (conv is None or conv["rc"] == 0):
                spec = dict(base, path=str(path))
                if case.get("dtype"):
                    spec["dtype"] = case["dtype"]
                if case["loader"] == "llama_quantize":
                    spec = {"path": str(path), "source": str(self.source), "ftype": case["ftype"]}
                if case["loader"] == "llama_cpp":
                    if case["expect"] == "baseline":
                        spec["save_npz"] = str(self.work / "llama_source.npz")
                    elif llama_ref is not None:
                        spec["loader_reference_npz"] = llama_ref["npz"]
                        spec["loader_reference_greedy_ids"] = llama_ref["greedy_ids"]
                result = self.worker(case["loader"], spec, C.slug(case["id"]), self.args.timeout)
                if case["expect"] == "baseline" and result.get("ok"):
                    llama_ref = {"npz": spec["save_npz"], "greedy_ids": result["greedy_ids"]}
            if case["expect"] == "baseline":
                v, reason = ("INFO", "baseline for the llama.cpp rows") if result and result.get("ok") else \
                    ("FAIL", f"{result.get('stage')}: {result.get('error')}" if result else "not run")
            else:
                v, reason = V.model_verdict(case, conv, result)
            row.update(verdict=v, reason=reason, result=result)
            log(f"    -> {v} {reason}" + (f" | {summary(result)}" if result and result.get("ok") else ""))
            rows.append(row)
            incomplete = result is not None and (not result.get("ok") or result.get("tokenizer_error"))
            if (self.args.diag and incomplete and case["loader"] in ("transformers", "mlx_lm")
                    and conv is not None and conv["rc"] == 0 and path.is_dir()):
                rows.append(self.diag_row(case, row, path, base))
        return rows

    def side_files(self) -> Path | None:
        d = self.work / "side_files"
        if not d.exists():
            d.mkdir()
            r = self.worker("side_files", {"path": str(self.source), "dest": str(d)}, "side_files",
                            self.args.timeout)
            if not r.get("ok"):
                log(f"    side files failed: {r}")
        return d if (d / "config.json").exists() else None

    def diag_row(self, case: dict, row: dict, path: Path, base: dict) -> dict:
        """The same check on a copy of the output completed with transformers' config.json and tokenizer
        for the source (qckpt's own config keys win): says whether the weights are right although
        the folder is incomplete. Never counts as a pass of the product."""
        did = case["id"] + " [diag: + config/tokenizer from transformers]"
        log(f"[smollm2] {did}")
        side = self.side_files()
        drow = {"group": "smollm2", "id": did, "source": C.SMOLLM2, "loader": case["loader"], "diag": True,
                "expect": case["expect"], "command": row.get("command")}
        if side is None:
            drow.update(verdict="DIAG-FAIL", reason="could not derive config/tokenizer")
            return drow
        dst = self.work / "diag" / path.name
        if not dst.exists():
            dst.mkdir(parents=True)
            for f in path.iterdir():
                os.symlink(f, dst / f.name)
            added = []
            for f in side.iterdir():
                if f.name == "config.json":
                    cfg = json.loads(f.read_text())
                    own = json.loads((path / "config.json").read_text()) if (path / "config.json").exists() else {}
                    cfg.update(own)
                    # transformers 5 saves rope_theta only inside rope_parameters; mlx_lm 0.32 reads
                    # the flat key and silently falls back to 10000 without it (as a hub config has it)
                    rp = cfg.get("rope_parameters") or {}
                    if "rope_theta" not in cfg and "rope_theta" in rp:
                        cfg["rope_theta"] = rp["rope_theta"]
                    if (dst / "config.json").is_symlink():
                        (dst / "config.json").unlink()
                    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
                    added.append("config.json (merged)" if own else "config.json")
                elif not (dst / f.name).exists():
                    shutil.copy(f, dst / f.name)
                    added.append(f.name)
            (dst / ".added").write_text(json.dumps(added))
        drow["added_files"] = json.loads((dst / ".added").read_text())
        spec = dict(base, path=str(dst))
        if case.get("dtype"):
            spec["dtype"] = case["dtype"]
        result = self.worker(case["loader"], spec, C.slug(did), self.args.timeout)
        v, reason = V.model_verdict(case, None, result)
        drow.update(verdict="DIAG-" + v, reason=reason, result=result)
        log(f"    -> DIAG-{v} {reason}" + (f" | {summary(result)}" if result and result.get("ok") else ""))
        return drow

    def run_minilm(self) -> list[dict]:
        rows = []
        samples = Path(self.args.samples)
        for case in C.minilm_cases(self.args.quick):
            if not selected(self.args.only, case["id"]):
                continue
            src = samples / case["sample"]
            sconv, src_f32 = self.f32_of(src, C.slug(case["sample"]))
            if sconv["rc"] != 0:
                rows.append({"group": "minilm", "id": case["id"], "source": case["sample"], "target": case["target"],
                             "kind": case["kind"], "loader": case["loader"], "command": sconv["command"],
                             "verdict": "FAIL", "reason": f"qckpt dequantize of the source: {sconv.get('error')}"})
                continue
            row = self.layer_case(case, src, src_f32)
            rows.append(row)
            err = row.get("convert", {}).get("error") or ""
            dense = "the source is a float checkpoint" in err or "no quantized tensors" in err  # (older wording)
            if row["verdict"] == "REFUSED" and case.get("requant_if_refused") and not dense:
                rq = dict(case, id=case["id"] + " (requantize; exact refused)", kind="requantize",
                          cmd=case["cmd"] + case["requant_if_refused"], out=case["out"] + "__rq",
                          requant_if_refused=None)
                rows.append(self.layer_case(rq, src, src_f32))
        return rows

    def f32_of(self, path: Path, name: str) -> tuple[dict, Path]:
        """qckpt's float32 dequantize of a checkpoint (the comparison side of the layer checks)."""
        return self.convert_once(path, name + ".f32.safetensors", ["dequantize", "--dtype", "f32"],
                                 self.args.timeout)

    def layer_case(self, case: dict, src: Path, src_f32: Path) -> dict:
        log(f"[minilm] {case['id']}")
        conv, out = self.convert_once(src, case["out"], case["cmd"], self.args.timeout)
        row = {"group": "minilm", "id": case["id"], "source": case["sample"], "target": case["target"],
               "kind": case["kind"], "loader": case["loader"], "command": conv["command"], "convert": conv}
        result = None
        if conv["rc"] == 0:
            spec = {"path": str(out), "source_f32": str(src_f32)}
            if case["kind"] != "exact":  # compare with what qckpt says it wrote, and report vs the source
                oconv, out_f32 = self.f32_of(out, case["out"])
                spec = {"path": str(out), "source_f32": str(out_f32), "orig_f32": str(src_f32)}
                if oconv["rc"] != 0:
                    result = {"ok": False, "stage": "qckpt dequantize of the output", "error": oconv.get("error")}
            if result is None:
                result = self.worker(case["loader"], spec, C.slug(case["id"]), self.args.timeout)
        v, reason = V.layer_verdict(case, conv, result)
        row.update(verdict=v, reason=reason, result=result)
        log(f"    -> {v} {reason}" + (f" | {layer_summary(result)}" if result and result.get("ok") else ""))
        return row


def selected(only: str | None, cid: str) -> bool:
    """--only: comma-separated substrings of case ids (none: every case)."""
    return not only or any(part and part in cid for part in only.split(","))


def summary(r: dict) -> str:
    if "identical" in r:  # llama_quantize / llama_convert: tensor-by-tensor comparison with llama.cpp's own output
        return f"{r['identical']}/{r['tensors']} tensors byte-identical" + (
            f"; llama.cpp types {r['llama_cpp_types']}" if r.get("llama_cpp_types") else "")
    if "values_differ" in r:  # ggml_decode: the loader's decode of every quantized weight vs qckpt's
        return (f"{r['elements']} weights ({', '.join(r['types'])}): {r['values_differ']} differ, {r['one_ulp']} one "
                f"ulp apart, {r['signed_zeros']} zeros of opposite sign")
    s = (f"max|dlogit| {r['max_abs_logit_diff']:.3g} mean {r['mean_abs_logit_diff']:.3g} "
         f"top1 {r['top1_agree_pct']:.1f}% greedy_eq {r['greedy_equal']}")
    if r.get("vs_loader_source"):
        m = r["vs_loader_source"]
        s += f" | vs llama.cpp(source): max {m['max_abs_logit_diff']:.3g} greedy_eq {m['greedy_equal']}"
    return s


def layer_summary(r: dict) -> str:
    s = f"{r['n_tensors']} tensors, max|dW| {r['max_abs_weight_diff']:.3g}, max|dy| {r['max_abs_output_diff']:.3g}"
    if "vs_source_rel_output_err" in r:
        s += f", rel err vs source {r['vs_source_rel_output_err']:.3g}"
    return s


# ------------------------------------------------------------------ report

LOADER_NAMES = {
    "transformers": "transformers AutoModelForCausalLM + AutoTokenizer",
    "mlx_lm": "mlx_lm.load",
    "llama_cpp": "llama_cpp.Llama(logits_all=True)",
    "llama_quantize": "llama_cpp.llama_model_quantize of the source (same ftype), tensor bytes compared",
    "llama_convert": "llama.cpp convert_hf_to_gguf.py of the source, tensor bytes compared",
    "ggml_decode": "ggml to_float (llama-cpp-python's libggml-base) x <name>.scale, vs qckpt's f32 decode",
    None: "-",
}


def fmt(v, spec=".3g"):
    return "-" if v is None else format(v, spec)


def md_escape(s: str) -> str:
    return (s or "").replace("|", "\\|").replace("\n", " ")


def write_report(out: Path, meta: dict, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    L = ["# qckpt interop results", "",
         f"Run {meta['started']} ({meta['mode']}, {meta['seconds']:.0f} s) "
         f"on qckpt commit `{meta['versions'].get('qckpt_commit')}`.",
         "Verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ".", "",
         "Tool versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()
                                        if k not in ("qckpt_commit", "platform"))
         + f"; {meta['versions'].get('platform')}.",
         ""]
    ref = meta.get("reference")
    if ref:
        L += ["## SmolLM2-135M-Instruct (GGUF Q4_1) -> target -> real loader", "",
              "Reference: transformers' own GGUF loader on the source, float32 "
              f"(greedy 20 tokens {ref['greedy_text']!r}; top-5 after 'The capital of France is': "
              + ", ".join(f"{t!r} {v:.2f}" for t, v in ref["top5_france"]) + "). "
              f"Logits compared at every position of {len(ref['prompts'])} prompts "
              f"({sum(len(p['ids']) for p in ref['prompts'])} positions: "
              + ", ".join(f"{p['name']} {len(p['ids'])}" for p in ref["prompts"]) + ").", "",
              f"Pass rule. Exact targets: greedy identical and max |logit diff| <= {V.EXACT_REL_TOL:g} "
              "x max |reference logit| "
              "(float32 rounding through another framework's kernels; a wrong tensor moves logits by whole units), "
              f"{V.EXACT_REL_TOL_BY_DEQUANT['float16']:.3g} x when the loader rebuilds the weights in float16 "
              "(MLX computes "
              "scale * q + bias in the scales' dtype, float16 here: 4 float16 units in the last place; the same file "
              "with its scales cast to float32 is within 1.2e-4); "
              "for llama.cpp the comparison is with llama.cpp on the source (it quantizes activations, so it "
              "differs from the float reference by design) and must be identical. "
              "Lossy targets: top-1 after 'The capital of France is' is ' Paris'. Every loader that loads a "
              "tokenizer must encode the prompts to the reference ids. "
              f"GARBAGE: top-1 agreement < {V.GARBAGE_TOP1_PCT:.0f}% over all positions.", "",
              "| source | target (case) | command | loader | load | max \\|dlogit\\| | mean \\|dlogit\\| | top-1 % "
              "| greedy equal | greedy text | verdict |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["group"] != "smollm2":
                continue
            res = r.get("result") or {}
            load = M.load_cell(r)
            m = res.get("vs_loader_source") or {}
            mx = fmt(res.get("max_abs_logit_diff"))
            if m:
                mx += f" (vs llama.cpp src {fmt(m.get('max_abs_logit_diff'))})"
            ge = fmt(res.get("greedy_equal"), "") + (f" (vs llama.cpp src {m.get('greedy_equal')})" if m else "")
            cmd = r.get("command") or "-"
            reason = f"**{r['verdict']}**" + (f": {md_escape(r['reason'])}" if r.get("reason") else "")
            L.append(f"| {r['source']} | {r['id']} | `{md_escape(cmd)}` "
                     f"| {LOADER_NAMES.get(r['loader'], r['loader'])} | "
                     f"{md_escape(load)} | {mx} | {fmt(res.get('mean_abs_logit_diff'))} | "
                     f"{fmt(res.get('top1_agree_pct'), '.1f')} | {ge} | "
                     f"{md_escape(repr(res['greedy_text'])) if res.get('greedy_text') is not None else '-'} "
                     f"| {reason} |")
        L.append("")
    L += fp8_group.section(rows, fmt, md_escape, LOADER_NAMES)
    L += fp4_group.section(rows, fmt, md_escape, LOADER_NAMES)
    lrows = [r for r in rows if r["group"] == "minilm"]
    if lrows:
        L += ["## MiniLM layer samples -> target -> the target library's own decoder", "",
              "Each shipped sample (encoder layer 0 + pooler, not a loadable model) is converted by qckpt, the "
              "written tensors are decoded by the target library (loader column), and its weights and its "
              "Linear output on a seeded random batch are compared with qckpt's float32 dequantize of the "
              "source (exact repack) or of the written file (requantize; the error vs the source is shown "
              f"as well). Pass: |dW| <= {V.LAYER_WEIGHT_REL_TOL:g} x max|W| "
              f"and |dy| <= {V.LAYER_OUTPUT_REL_TOL:g} x max|y| "
              "per tensor (two float16 roundings). REFUSED: qckpt declines the exact repack and names the "
              f"requantize options (then the requantize row follows). GARBAGE: requantized output error > "
              f"{V.LAYER_GARBAGE_REL:g} of max|y|.", "",
              "| source | target | command | loader | load | tensors | max \\|dW\\| | max \\|dy\\| "
              "| rel. err vs source | verdict |",
              "|---|---|---|---|---|---|---|---|---|---|"]
        for r in lrows:
            res = r.get("result") or {}
            load = "ok" if res.get("ok") else (f"{res.get('stage')}: {res.get('error')}" if res.get("stage") else
                                                ("-" if not res else "decoded"))
            reason = f"**{r['verdict']}**" + (f": {md_escape(r['reason'])}" if r.get("reason") else "")
            L.append(f"| {r['source']} | {r['target']} ({r['kind']}) | `{md_escape(r.get('command') or '-')}` | "
                     f"{md_escape(res.get('loader', r['loader']))} | {md_escape(load)} | {res.get('n_tensors', '-')} | "
                     f"{fmt(res.get('max_abs_weight_diff'))} | {fmt(res.get('max_abs_output_diff'))} | "
                     f"{fmt(res.get('vs_source_rel_output_err'))} | {reason} |")
        L.append("")
    (out / "RESULTS.md").write_text("\n".join(L))


def default_fp8_sources() -> str:
    if os.environ.get("QCKPT_FP8_SOURCES"):
        return os.environ["QCKPT_FP8_SOURCES"]
    for cand in (REPO.parent / "shared" / "real", Path("/work/shared/real")):
        if cand.exists():
            return str(cand)
    return "/work/shared/real"


def default_smollm2() -> str:
    if os.environ.get("QCKPT_SMOLLM2"):
        return os.environ["QCKPT_SMOLLM2"]
    for cand in (REPO.parent / "shared" / "real" / C.SMOLLM2, Path("/work/shared/real") / C.SMOLLM2):
        if cand.exists():
            return str(cand)
    return str(Path("/work/shared/real") / C.SMOLLM2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the CI subset (a few minutes)")
    ap.add_argument("--out", default=str(HERE / "results"), help="where RESULTS.md and results.json go")
    ap.add_argument("--venv", default=os.environ.get("QCKPT_INTEROP_VENV", str(HERE / ".venv")))
    ap.add_argument("--qckpt-python", default=os.environ.get("QCKPT_PYTHON"),
                    help="python that runs `-m converter` (default: the interop venv's)")
    ap.add_argument("--smollm2", default=default_smollm2(),
                    help="the SmolLM2 GGUF (default: $QCKPT_SMOLLM2, else shared/real/ beside the repo, "
                         "else /work/shared/real/)")
    ap.add_argument("--samples", default=str(REPO / "sample_checkpoints"))
    ap.add_argument("--fp8-sources", default=default_fp8_sources(),
                    help="folder holding the FP8 sources of cases.FP8_SOURCES (default: $QCKPT_FP8_SOURCES, "
                         "else shared/real/ beside the repo, else /work/shared/real/)")
    ap.add_argument("--fp4-bf16", default=fp4_group.default_bf16(REPO),
                    help="the bf16 source of the FP4 samples (default: $QCKPT_FP4_BF16, else "
                         "shared/real/fp_sources/smollm2_tiny1L beside the repo, else /work/shared/..., else the "
                         "copy in interop/data/)")
    ap.add_argument("--llama-cpp-src", default=os.environ.get("QCKPT_LLAMA_CPP_SRC"),
                    help="a llama.cpp source tree (convert_hf_to_gguf.py, conversion/, gguf-py/), e.g. "
                         "vendor/llama.cpp of the llama-cpp-python sdist, for the rows that run llama.cpp's own "
                         "converter")
    ap.add_argument("--group", choices=["all", "smollm2", "fp8", "fp4", "minilm"], default="all")
    ap.add_argument("--only", help="run the cases whose id contains one of these comma-separated texts")
    ap.add_argument("--work", help="working folder (default: a new temporary folder, removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the working folder")
    ap.add_argument("--cache", default=str(HERE / ".cache"), help="reference cache folder")
    ap.add_argument("--no-cache", action="store_true", help="recompute the reference")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per qckpt command / loader check")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-diag", dest="diag", action="store_false",
                    help="no diagnostic rows (a folder that fails to load, retried with transformers' "
                         "config.json/tokenizer added)")
    args = ap.parse_args(argv)
    if not Path(args.venv, "bin", "python").exists():
        log(f"no interop venv at {args.venv}: run interop/setup.sh (or set QCKPT_INTEROP_VENV)")
        return 2
    run = Runner(args)
    t0, started = time.time(), time.strftime("%Y-%m-%d %H:%M:%S %Z")
    log(f"work folder {run.work}")
    versions = run.versions()
    log("versions: " + json.dumps(versions))
    rows, ref = [], None
    try:
        if args.group in ("all", "smollm2"):
            if not run.source.exists():
                log(f"SmolLM2 source not found at {run.source} (--smollm2 / $QCKPT_SMOLLM2): group skipped")
                rows.append({"group": "smollm2", "id": "all", "source": C.SMOLLM2, "loader": None,
                             "verdict": "SKIP", "reason": f"source not found: {run.source}"})
            else:
                ref = run.reference()
                rows += run.run_smollm2(ref)
        if args.group in ("all", "fp8"):
            rows += fp8_group.run_fp8(run, log, selected, summary)
        if args.group in ("all", "fp4"):
            rows += fp4_group.run_fp4(run, log, selected, summary)
        if args.group in ("all", "minilm"):
            rows += run.run_minilm()
    finally:
        meta = {"started": started, "seconds": time.time() - t0, "mode": "quick" if args.quick else "full",
                "versions": versions, "reference": ref, "argv": sys.argv[1:]}
        write_report(Path(args.out), meta, rows)
        if not args.keep and not args.work:
            shutil.rmtree(run.work, ignore_errors=True)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    log(f"done in {time.time() - t0:.0f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f"; report {Path(args.out) / 'RESULTS.md'}")
    return 0 if not any(k in counts for k in ("FAIL", "GARBAGE")) else 1


if __name__ == "__main__":
    sys.exit(main())
