"""Group "fp4" of the interop suite (stdlib only): the real FP4 checkpoints of cases.FP4_SOURCES, and
the bf16 source they were quantized from (cases.FP4_BF16), converted / quantized by qckpt into every
target and loaded whole by the target's real loader; compared with transformers running the
producing tool's own decode of the source (worker_fp4.act_fp4_reference), in the dtype of the row.

The compressed-tensors FP4 files are llm-compressor model-free subsets (layer-0 q/k/v/down): before
anything runs, `complete` writes a loadable copy (their tensors byte for byte, plus the bf16 source's
other tensors, whose Linear modules go to the config's `ignore`), and that copy is the source of
every row.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import cases as C
import model_rows as M
import verdict as V

REF_VERSION = "1"  # bump when FP8_PROMPTS or the reference method change
HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------ safetensors, byte level
def read_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the offset of its data section."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def merge_safetensors(parts: list[tuple[Path, list[str]]], dest: Path) -> None:
    """Write ``dest`` holding the named tensors of each file, bytes copied unchanged (dtype, shape,
    data); the header is padded to 8 bytes as the safetensors format asks."""
    header, chunks, offset = {}, [], 0
    for path, names in parts:
        h, base = read_header(path)
        with open(path, "rb") as f:
            for name in names:
                info = h[name]
                a, b = info["data_offsets"]
                f.seek(base + a)
                data = f.read(b - a)
                header[name] = {"dtype": info["dtype"], "shape": info["shape"],
                                "data_offsets": [offset, offset + len(data)]}
                chunks.append(data)
                offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = dest.with_name(dest.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for c in chunks:
            f.write(c)
    tmp.replace(dest)


def complete(src: Path, bf16: Path, dest: Path) -> dict:
    """A loadable copy of a compressed-tensors subset: every tensor of ``src`` unchanged, plus each tensor
    of the bf16 source whose module ``src`` does not quantize; those modules' Linear layers (and
    ``lm_head``, tied to the embedding) are added to ``quantization_config.ignore``."""
    dest.mkdir(parents=True, exist_ok=True)
    qh, _ = read_header(src / "model.safetensors")
    bh, _ = read_header(bf16 / "model.safetensors")
    qnames = [n for n in qh if n != "__metadata__"]
    modules = {n.rpartition(".")[0] for n in qnames}
    added = [n for n in bh if n != "__metadata__" and n.rpartition(".")[0] not in modules]
    merge_safetensors([(src / "model.safetensors", qnames), (bf16 / "model.safetensors", added)],
                      dest / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    dense_linears = sorted(n.rpartition(".")[0] for n in added if n.endswith("_proj.weight"))
    qc = cfg["quantization_config"]
    qc["ignore"] = sorted(set(qc.get("ignore") or []) | {"lm_head"} | set(dense_linears))
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    return {"from_fp4_file": len(qnames), "from_bf16_source": len(added), "ignore": qc["ignore"]}


def default_bf16(repo: Path) -> str:
    """shared/real/fp_sources/<FP4_BF16> beside the repo, else /work/shared/real/..., else the copy in
    interop/data/ (byte-identical, PROVENANCE.json)."""
    import os

    if os.environ.get("QCKPT_FP4_BF16"):
        return os.environ["QCKPT_FP4_BF16"]
    for cand in (repo.parent / "shared" / "real" / "fp_sources" / C.FP4_BF16,
                 Path("/work/shared/real/fp_sources") / C.FP4_BF16, HERE / "data" / C.FP4_BF16):
        if (cand / "model.safetensors").exists():
            return str(cand)
    return str(HERE / "data" / C.FP4_BF16)


# ------------------------------------------------------------------ references
def reference(run, name: str, bf16: Path, dtype: str, source: Path | None, decoded: Path | None) -> dict:
    """The reference of one source in ``dtype`` (cached by the digest of its inputs; a failed one is
    returned: every row that needs it fails, naming this, and the run goes on)."""
    files = [bf16 / "config.json", bf16 / "model.safetensors"]
    if source is not None:
        files += [source / "model.safetensors", decoded]
    spec = {"bf16_source": str(bf16), "source": str(source) if source else None,
            "reference": str(decoded) if decoded else None, "dtype": dtype,
            "dest": str(run.work / f"ref-fp4-{name}-{dtype}"), "prompts": C.FP8_PROMPTS,
            "france_index": 0, "greedy_tokens": C.FP8_GREEDY_TOKENS, "pad_id": 2}
    return M.cached_reference(run, f"fp4-{name}-{dtype}-{M.digest(files)}-v{REF_VERSION}", "fp4_reference", spec,
                              C.slug(f"fp4-reference-{name}-{dtype}"))


# ------------------------------------------------------------------ the group
def _sources(run) -> list[tuple[str, dict | None]]:
    """(name, FP4_SOURCES entry) of every source, then (FP4_BF16, None) for the quantize rows."""
    return list(C.FP4_SOURCES.items()) + [(C.FP4_BF16, None)]


def run_fp4(run, log, selected, summary) -> list[dict]:
    rows = []
    bf16 = Path(run.args.fp4_bf16).resolve()  # the workers run in the work folder
    for name, info in _sources(run):
        all_cases = C.fp4_cases() if info else C.fp4_quantize_cases()
        quick_ok = name in C.FP4_QUICK_SOURCES
        cases = [c for c in all_cases if not run.args.quick or (c["quick"] and quick_ok)]
        cases = [c for c in cases if selected(run.args.only, c["id"])
                 and (info is None or info["kind"] in c.get("kinds", [info["kind"]]))]
        if not cases:
            continue
        sample = Path(run.args.samples).resolve() / name if info else bf16
        missing = [p for p in (sample, bf16) if not (p / "model.safetensors").exists()]
        if missing:
            rows.append({"group": "fp4", "id": f"{name}: all", "source": name, "loader": None, "verdict": "SKIP",
                         "reason": f"source not found: {missing[0]}"})
            continue
        src = sample
        if info and info["kind"] == "ct":  # a model-free subset: completed into a loadable model
            src = run.work / "fp4-sources" / name
            done = complete(sample, bf16, src)
            log(f"[fp4] {name}: completed into {src} ({done})")
        decoded = sample / C.FP4_REFERENCE if info else None
        refs = {}

        def spec_for(case, row, path, name=name, info=info, sample=sample, src=src, decoded=decoded, refs=refs):
            if case["loader"] == "llama_convert":  # llama.cpp's own converter on the same source
                return {"source": str(src), "llama_cpp_src": str(Path(M.llama_cpp_src(run)).resolve()),
                        "tool_extra_ok": case.get("tool_extra_ok", [])}
            if case["loader"] == "ggml_decode":  # compared with qckpt's float32 decode of the source (exact
                # repack) or of the written file (quantize rows)
                of, label = (src, name) if info else (path, f"{name}-{case['out']}")
                conv, deq = run.convert_once(of, f"fp4-{label}-deq_f32", ["dequantize", "--dtype", "f32"],
                                             run.args.timeout)
                if conv["rc"] != 0:
                    return f"qckpt dequantize --dtype f32 of {of.name}: {conv.get('error')}"
                return {"source_f32": str(deq / "model.safetensors")}
            dtype = row["ref_dtype"] = case.get("dtype", "float32")
            if dtype not in refs:
                refs[dtype] = reference(run, name, bf16, dtype, sample if info else None, decoded)
            ref = refs[dtype]
            if not ref.get("ok"):  # every row that needs it fails, naming this (the run goes on)
                return f"the {dtype} reference failed: {ref.get('stage')}: {ref.get('error')}"
            return {"reference_npz": ref["npz"], "prompts": ref["prompts"], "france_index": 0,
                    "paris_id": ref["paris_ids"][0], "greedy_tokens": C.FP8_GREEDY_TOKENS,
                    "reference_greedy_ids": ref["greedy_ids"], "tokenizer": False, "pad_id": 2, "dtype": dtype}

        for case in cases:
            rows.append(M.run_case(run, log, summary, case, group="fp4", name=name, source=name, src=src,
                                   spec_for=spec_for))
    return rows


def section(rows: list[dict], fmt, md_escape, loader_names) -> list[str]:
    """The RESULTS.md section of the fp4 rows (none: no section)."""
    rows = [r for r in rows if r["group"] == "fp4"]
    if not rows:
        return []
    L = ["## FP4 sources -> target -> real loader", "",
         "Sources (sample_checkpoints/): " + "; ".join(f"`{n}` ({i['written_by']})" for n, i in C.FP4_SOURCES.items())
         + f"; and the bf16 model they were quantized from, `{C.FP4_BF16}` (shared/real/fp_sources/, or the copy "
         "in interop/data/), for the `qckpt quantize --fp4` rows. The two compressed-tensors files hold only "
         "layer 0's q/k/v/down: the harness completes each into a loadable model (its tensors byte for byte, "
         "the bf16 source's other tensors, those Linear modules and lm_head in the config's `ignore`) and "
         "that is the source of every row. Reference: transformers on the bf16 source's config with every "
         "quantized weight replaced by the producing tool's own decode (reference_dequant.safetensors; every "
         "quantization parameter of a decoded weight, packed codes, scales, global scales (`weight_global_scale`, "
         "`weight_scale_2`) and `input_scale`, dropped), in the dtype of the row (column ref dtype: "
         "compressed-tensors decompresses FP4 to bfloat16 whatever dtype transformers loads in, so those rows "
         "run in bfloat16 against the bfloat16 reference). Prompts: token ids as the fp8 group. Exact rows: "
         f"greedy identical and max |logit diff| <= {V.EXACT_REL_TOL:g} x max |reference logit| "
         f"({V.EXACT_REL_TOL_BY_DEQUANT['bfloat16']:.3g} x for a float32 decode against the bf16-rounded "
         f"reference, and for MLX). Lossy rows: top-1 agreement >= {C.FP4_LOSSY_TOP1_PCT:g}%. REFUSED: qckpt "
         "declines at plan time, naming why (the target cannot hold the source, or has no FP4 writer yet: "
         "once one lands the row loads its output and is judged). TOOL-LIMIT: the pinned loader refuses a "
         "file with the documented message.", ""]
    return L + M.table(rows, fmt, md_escape, loader_names, ref_dtype=True)
