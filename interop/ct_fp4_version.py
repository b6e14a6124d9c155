#!/usr/bin/env python3
"""Recorded check: qckpt's compressed-tensors FP4 outputs, decoded by compressed-tensors itself.

    <interop venv>/bin/python interop/ct_fp4_version.py [--out interop/results] [--qckpt-python PY]

qckpt's compressed-tensors FP4 writer declares ``quantization_config.version`` 0.20.1 (the release in the
interop venv) over the bytes the real 0.19.0 samples hold. This script asks the installed
compressed-tensors whether that declaration is true, per source:

1. ``qckpt convert SRC OUT --to compressed-tensors`` (or ``qckpt quantize --fp4 ... --to
   compressed-tensors`` of the bf16 source), and qckpt's own decode of OUT (``qckpt dequantize OUT
   --dtype bf16`` and ``--dtype f32``); qckpt runs as ``<python> -m converter`` with PYTHONPATH=<repo>.
2. compressed-tensors decodes OUT: for each quantized module, its per-module state dict
   (``weight_packed``, ``weight_scale``, ``weight_global_scale``) through the compressor the config's
   ``format`` names (``BaseCompressor.get_value_from_registry``, ``.decompress(state, scheme)``; the
   module path transformers' ``decompress_model`` takes). MXFP4's scale bytes go through its
   ``decompress_mx_scale`` (``2 ** (byte - 127)``: the standard E8M0 rule, converter/formats/
   compressed_tensors/e8m0_rule.py).
3. Compared bit for bit: compressed-tensors' bfloat16 weights with qckpt's bf16 decode, and (as float32)
   with qckpt's f32 decode; for a real sample, also with the producing tool's own decode
   (``reference_dequant.safetensors``, written by compressed-tensors 0.19.0).
4. Round trip: compressed-tensors re-compresses its own decode with the file's scales
   (``.compress(state, scheme)``); the scale bytes must be the file's byte for byte, and the packed codes
   too once each -0 code (0x8, which decodes to zero and re-quantizes to +0, 0x0) is read as +0: the
   real tool writes -0 for small negative weights, so only a file without them survives the decode
   unchanged (counted in ``negative_zero_codes``).

Writes ``ct_fp4_version.json`` and prints one line per source. Imports torch and compressed-tensors, never
qckpt (``converter``): what qckpt wrote is judged by the consumer only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

# (label, qckpt argv before SRC DST, source relative to sample_checkpoints/ or "bf16", reference file or None)
SOURCES = [
    ("ct_mxfp4_smollm2 -> ct", ["convert"], "ct_mxfp4_smollm2", "reference_dequant.safetensors", ["--to"]),
    ("ct_nvfp4_smollm2 -> ct", ["convert"], "ct_nvfp4_smollm2", "reference_dequant.safetensors", ["--to"]),
    ("mlx_mxfp4_smollm2tiny -> ct", ["convert"], "mlx_mxfp4_smollm2tiny", None, ["--to"]),
    ("mlx_nvfp4_smollm2tiny -> ct", ["convert"], "mlx_nvfp4_smollm2tiny", None, ["--to"]),
    ("smollm2_tiny1L quantize --fp4 mxfp4 -> ct", ["quantize"], "bf16", None, ["--fp4", "mxfp4", "--to"]),
    ("smollm2_tiny1L quantize --fp4 nvfp4 -> ct", ["quantize"], "bf16", None, ["--fp4", "nvfp4", "--to"]),
]


def qckpt(py: str, argv: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([py, "-m", "converter"] + argv + ["--overwrite", "--quiet"], capture_output=True,
                          text=True, env=env, cwd=str(REPO))


def decode_with_ct(folder: Path) -> tuple[dict, dict, dict]:
    """(config's quantization_config, {module: decoded weight (torch, the compressor's dtype)},
    {module: {param: bytes of the re-compressed tensor}}) by compressed-tensors' own compressor."""
    import torch
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from safetensors.torch import load_file

    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    state = load_file(str(folder / "model.safetensors"))
    groups = qc["config_groups"]
    if len(groups) != 1:
        raise ValueError(f"{folder}: {len(groups)} config groups (this check handles one)")
    group = next(iter(groups.values()))
    scheme = QuantizationScheme(targets=group["targets"], weights=group["weights"],
                                input_activations=group.get("input_activations"))
    comp = BaseCompressor.get_value_from_registry(group.get("format") or qc["format"])
    decoded, recompressed = {}, {}
    for key in sorted(k for k in state if k.endswith(".weight_packed")):
        module = key[: -len(".weight_packed")]
        local = {k[len(module) + 1:]: v for k, v in state.items() if k.startswith(module + ".")}
        local.pop("weight_shape", None)
        dec = comp.decompress(dict(local), scheme)
        decoded[module] = dec["weight"]
        again = comp.compress({"weight": dec["weight"], "weight_scale": dec["weight_scale"],
                               **({"weight_global_scale": local["weight_global_scale"]}
                                  if "weight_global_scale" in local else {})}, scheme)
        recompressed[module] = {}
        for p in ("weight_packed", "weight_scale"):
            a, b = again[p].view(torch.uint8), local[p].view(torch.uint8)
            if p == "weight_packed":  # E2M1 code 0x8 is -0: it decodes to zero and re-quantizes to 0x0
                recompressed[module]["negative_zero_codes"] = int(((b & 0x0F) == 8).sum() + ((b >> 4) == 8).sum())
                a, b = _canonical_zero(a), _canonical_zero(b)
            recompressed[module][p] = again[p].dtype == local[p].dtype and torch.equal(a, b)
    return qc, decoded, recompressed


def _canonical_zero(packed):
    """Packed E2M1 bytes with each -0 nibble (0x8) replaced by +0 (0x0)."""
    lo, hi = packed & 0x0F, packed >> 4
    lo = lo.masked_fill(lo == 8, 0)
    hi = hi.masked_fill(hi == 8, 0)
    return lo | (hi << 4)


def _bits_equal(a, b) -> tuple[int, int]:
    """(elements whose bits differ, total); a, b torch tensors of one dtype and shape."""
    import torch

    if a.shape != b.shape:
        raise ValueError(f"shape {tuple(a.shape)} != {tuple(b.shape)}")
    view = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}[a.dtype]
    return int((a.contiguous().view(view) != b.contiguous().view(view)).sum()), a.numel()


def check(label, head, src: Path, ref_name, to, py: str, tmp: Path) -> dict:
    from safetensors.torch import load_file

    out = tmp / label.replace(" ", "_").replace(">", "").replace("/", "_")
    p = qckpt(py, head + [str(src), str(out)] + to + ["compressed-tensors"])
    row = {"source": label, "command": "qckpt " + " ".join(head + [src.name, "OUT"] + to + ["compressed-tensors"]),
           "rc": p.returncode}
    if p.returncode != 0:
        row.update(verdict="REFUSED" if p.returncode == 3 else "FAIL",
                   reason=(p.stderr.strip().splitlines() or [""])[-1][:400])
        return row
    deq = {}
    for dt in ("bf16", "f32"):
        d = qckpt(py, ["dequantize", str(out), str(tmp / f"{out.name}.{dt}.safetensors"), "--dtype", dt])
        if d.returncode != 0:
            row.update(verdict="FAIL", reason=f"qckpt dequantize --dtype {dt}: {d.stderr.strip()[-300:]}")
            return row
        deq[dt] = load_file(str(tmp / f"{out.name}.{dt}.safetensors"))
    qc, decoded, recompressed = decode_with_ct(out)
    row["declared_version"] = qc.get("version")
    row["format"] = qc.get("format")
    ref = load_file(str(src / ref_name)) if ref_name else None
    tot = {"modules": len(decoded), "elements": 0, "ct_vs_qckpt_bf16_differ": 0, "ct_vs_qckpt_f32_differ": 0,
           "ct_vs_tool_reference_differ": 0 if ref is not None else None, "ct_dtype": None,
           "recompressed_identical": 0}
    for module, w in decoded.items():
        name = module + ".weight"
        tot["ct_dtype"] = str(w.dtype).replace("torch.", "")
        n16, n = _bits_equal(w, deq["bf16"][name].to(w.dtype) if deq["bf16"][name].dtype != w.dtype
                             else deq["bf16"][name])
        n32, _ = _bits_equal(w.float(), deq["f32"][name])
        tot["elements"] += n
        tot["ct_vs_qckpt_bf16_differ"] += n16
        tot["ct_vs_qckpt_f32_differ"] += n32
        if ref is not None:
            r = ref[name]
            nr, _ = _bits_equal(w, r) if r.dtype == w.dtype else _bits_equal(w.float(), r.float())
            tot["ct_vs_tool_reference_differ"] += nr
        rc = recompressed[module]
        tot["recompressed_identical"] += int(rc["weight_packed"] and rc["weight_scale"])
        tot["negative_zero_codes"] = tot.get("negative_zero_codes", 0) + rc["negative_zero_codes"]
    row.update(tot)
    bad = [k for k in ("ct_vs_qckpt_bf16_differ", "ct_vs_tool_reference_differ") if tot[k]]
    if tot["recompressed_identical"] != tot["modules"]:
        bad.append(f"re-compressed bytes differ in {tot['modules'] - tot['recompressed_identical']} module(s)")
    row["verdict"] = "FAIL" if bad else "PASS"
    row["reason"] = "; ".join(str(b) for b in bad)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--qckpt-python", default=os.environ.get("QCKPT_PYTHON", sys.executable))
    ap.add_argument("--samples", default=str(REPO / "sample_checkpoints"))
    args = ap.parse_args(argv)
    import importlib.metadata as md

    import fp4_group

    bf16 = Path(fp4_group.default_bf16(REPO))
    rows = []
    with tempfile.TemporaryDirectory(prefix="ct-fp4-version-") as t:
        for label, head, src, ref_name, to in SOURCES:
            path = bf16 if src == "bf16" else Path(args.samples) / src
            row = check(label, head, path, ref_name, to, args.qckpt_python, Path(t))
            rows.append(row)
            print(f"{row['verdict']:8} {label}: " + json.dumps({k: v for k, v in row.items()
                                                                if k not in ("source", "verdict")}), flush=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    meta = {"compressed-tensors": md.version("compressed-tensors"), "torch": md.version("torch"),
            "qckpt_commit": commit.strip()}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ct_fp4_version.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 1 if any(r["verdict"] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
