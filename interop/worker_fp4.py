"""Worker action of the FP4 rows (run in the interop venv by worker.py; see cases.FP4_SOURCES).

- ``fp4_reference``: the reference model of an FP4 source: the bf16 source's config without
  ``quantization_config``, its tensors overlaid with the FP4 file's dense tensors and then with the
  producing tool's own decode of every quantized weight (``reference_dequant.safetensors``); every
  quantization parameter of a decoded weight is dropped (``weight_packed``, ``weight_scale``,
  ``weight_global_scale`` (compressed-tensors NVFP4), ``weight_scale_2`` and ``input_scale`` (ModelOpt),
  ...), so neither a packed U8 tensor nor a global scale reaches the model. Without a reference
  file (the bf16 source itself) the source's tensors are used as they are. Run by transformers in
  ``spec["dtype"]`` (float32 or bfloat16); the logits of the id prompts and the greedy ids are saved.
"""

from __future__ import annotations

import json
import os

import numpy as np

# The tensors a quantized Linear stores beside (or instead of) its weight, by suffix after the module
# name: compressed-tensors (weight_packed, weight_scale, weight_global_scale, weight_zero_point,
# input_global_scale, weight_shape), ModelOpt (weight_scale, weight_scale_2, input_scale), FP8
# (weight_scale_inv).
QPARAM_SUFFIXES = ("weight_packed", "weight_scale", "weight_global_scale", "weight_zero_point", "weight_shape",
                   "weight_scale_2", "weight_scale_inv", "input_scale", "input_global_scale")


def reference_tensors(dense: dict, quantized: dict, decoded: dict) -> dict:
    """name -> tensor of the reference model: ``dense`` (the bf16 source) overlaid with ``quantized``'s
    own tensors, then with ``decoded`` (the tool's decode, ``<module>.weight``); a quantization
    parameter of a decoded module is dropped."""
    decoded_modules = {n[: -len(".weight")] for n in decoded}
    out = dict(dense)
    for name, t in quantized.items():
        module, _, leaf = name.rpartition(".")
        if module in decoded_modules and (leaf in QPARAM_SUFFIXES or leaf == "weight"):
            continue
        out[name] = t
    out.update(decoded)
    return out


def act_fp4_reference(spec: dict) -> dict:
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    from worker import _hf_logits_and_greedy, stage

    dest = spec["dest"]
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(spec["bf16_source"], "config.json")) as f:
        cfg = json.load(f)
    cfg.pop("quantization_config", None)
    dtype = spec.get("dtype", "float32")
    cfg["dtype"] = dtype
    with open(os.path.join(dest, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    dense = load_file(os.path.join(spec["bf16_source"], "model.safetensors"))
    quantized = load_file(os.path.join(spec["source"], "model.safetensors")) if spec.get("source") else {}
    decoded = load_file(spec["reference"]) if spec.get("reference") else {}
    tensors = reference_tensors(dense, quantized, decoded)
    bad = sorted(n for n, t in tensors.items() if not t.is_floating_point())
    if bad:  # a packed code or a scale left in: the reference would be wrong
        raise ValueError(f"non-float tensors left in the reference: {bad[:3]}")
    tensors = {n: t.to(getattr(torch, dtype)).contiguous() for n, t in tensors.items()}
    save_file(tensors, os.path.join(dest, "model.safetensors"), metadata={"format": "pt"})
    model = stage("load", transformers.AutoModelForCausalLM.from_pretrained, dest, dtype=getattr(torch, dtype))
    model.eval()
    logits, greedy = _hf_logits_and_greedy(model, spec)
    np.savez(spec["reference_npz"], **{f"p{i}": a.astype(np.float32) for i, a in enumerate(logits)})
    last = int(logits[spec["france_index"]][-1].argmax())
    return {"ok": True, "prompts": spec["prompts"], "greedy_ids": greedy, "greedy_text": None, "dtype": dtype,
            "paris_ids": [last], "france_top1": last, "decoded": sorted(decoded), "tensors": len(tensors),
            "from_fp4_file": sorted(n for n in quantized if n in tensors and n not in decoded)}


def _ggml_to_float():
    """``type -> (to_float(src, dst, n), block elements, block bytes)`` from the ggml C library llama-cpp-python
    ships (``ggml_get_type_traits``, ggml.h ``struct ggml_type_traits``): llama.cpp's own dequantization."""
    import ctypes
    import pathlib

    import llama_cpp

    lib_dir = pathlib.Path(llama_cpp.__file__).parent / "lib"
    base = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    to_float_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)

    class Traits(ctypes.Structure):
        _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64),
                    ("blck_size_interleave", ctypes.c_int64), ("type_size", ctypes.c_size_t),
                    ("is_quantized", ctypes.c_bool), ("to_float", to_float_t), ("from_float_ref", ctypes.c_void_p)]

    base.ggml_get_type_traits.restype = ctypes.POINTER(Traits)
    base.ggml_get_type_traits.argtypes = [ctypes.c_int]

    def get(ggml_type: int):
        t = base.ggml_get_type_traits(ggml_type).contents
        return t.to_float, int(t.blck_size), int(t.type_size), t.type_name.decode()
    return get


def act_ggml_decode(spec: dict) -> dict:
    """llama.cpp's decode of every quantized 2-D tensor of a GGUF: ggml's C ``to_float`` of the raw blocks
    (the library llama-cpp-python loads), times the tensor's F32 ``<name>.scale`` when the file has one
    (llama.cpp ``build_lora_mm``: ``ggml_mul(ggml_mul_mat(w, x), w_s)``, so the weight it computes with is
    ``to_float(w) * w_s``, in float32), q/k rows un-permuted; compared value for value with qckpt's float32
    dequantize of the source (``spec["source_f32"]``): every float32 equal, -0 against +0 counted apart
    (``signed_zeros``), and where a ``.scale`` applies a difference of one float32 unit in the last place
    counted apart (``one_ulp``: the same exact product rounded in another order).
    Names via gguf-py's TensorNameMap, as layers_gguf."""
    import ctypes

    import gguf
    import ml_dtypes  # noqa: F401  (bf16 dense tensors of the decode load as numpy arrays)
    from safetensors.numpy import load_file

    from worker import stage

    get = stage("load", _ggml_to_float)
    reader = stage("load", gguf.GGUFReader, spec["path"])
    arch_name = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    tmap = gguf.get_tensor_name_map(arch, int(reader.fields[f"{arch_name}.block_count"].parts[-1][0]))
    src = load_file(spec["source_f32"])
    gguf_to_hf = {}
    for hf in src:
        base, _, suffix = hf.rpartition(".")
        mapped = tmap.get_name(base)
        if mapped is not None:
            gguf_to_hf[f"{mapped}.{suffix}"] = hf

    def field(k):
        f = reader.fields.get(f"{arch_name}.{k}")
        return int(f.parts[-1][0]) if f is not None else None
    heads = {"q_proj.weight": field("attention.head_count"), "k_proj.weight": field("attention.head_count_kv")}
    tensors = {t.name: t for t in reader.tensors}
    rows, types = [], set()
    for t in reader.tensors:
        if len(t.shape) != 2 or t.tensor_type.name in ("F32", "F16", "BF16"):
            continue
        to_float, blck, tsize, tname = get(int(t.tensor_type))
        types.add(tname)
        n_in, n_out = int(t.shape[0]), int(t.shape[1])
        raw = np.ascontiguousarray(np.asarray(t.data).view(np.uint8)).reshape(-1)
        if raw.size != n_in * n_out // blck * tsize:
            raise ValueError(f"{t.name}: {raw.size} bytes for {n_out} x {n_in} {tname}")
        w = np.empty(n_in * n_out, dtype=np.float32)
        to_float(raw.ctypes.data_as(ctypes.c_void_p), w.ctypes.data_as(ctypes.c_void_p), w.size)
        w = w.reshape(n_out, n_in)
        scale = tensors.get(t.name[: -len("weight")] + "scale")
        if scale is not None:
            w = w * np.float32(np.asarray(scale.data, dtype=np.float32).reshape(-1)[0])
        hf = gguf_to_hf.get(t.name)
        row = {"tensor": hf or t.name, "gguf": t.name, "type": tname, "scale_tensor": scale is not None}
        if hf is None:
            row["error"] = "no source tensor of that name"
            rows.append(row)
            continue
        n = next((h for suffix, h in heads.items() if hf.endswith(suffix)), None)
        if arch_name == "llama" and n:  # llama.cpp stores q/k rows permuted (convert_hf_to_gguf LlamaModel.permute)
            w = w.reshape(n, n_out // n // 2, 2, n_in).swapaxes(1, 2).reshape(n_out, n_in)
        want = src[hf].astype(np.float32)
        if want.shape != w.shape:
            row["error"] = f"shape {w.shape} != source {want.shape}"
        else:
            # values compared (NaN unequal); -0 vs +0 counted apart: ggml's table holds one integer zero for E2M1
            # codes 0x0 and 0x8 (kvalues_mxfp4), so code 0x8 decodes to +0 there and to -0 in qckpt
            unequal = ~((w == want) | (np.isnan(w) & np.isnan(want)))
            signed_zero = (w.view(np.int32) != want.view(np.int32)) & (w == want)
            one_ulp = np.zeros_like(unequal)
            if scale is not None:  # (e2m1 * e4m3) * s here, e2m1 * (e4m3 * s) in ModelOpt / qckpt: two float32
                # roundings of one exact product; llama.cpp never forms the product (it scales the matmul output)
                one_ulp = unequal & (np.abs(w - want) <= np.spacing(np.maximum(np.abs(w), np.abs(want))))
            differ = unequal & ~one_ulp
            row.update(elements=int(w.size), values_differ=int(differ.sum()), one_ulp=int(one_ulp.sum()),
                       signed_zeros=int(signed_zero.sum()),
                       max_abs_weight_diff=float(np.abs(w - want).max()), max_abs_weight=float(np.abs(want).max()))
        rows.append(row)
    return {"ok": True, "loader": "ggml to_float (llama-cpp-python's libggml-base) x <name>.scale", "tensors": rows,
            "types": sorted(types), "n_tensors": len(rows),
            "values_differ": sum(r.get("values_differ", 0) for r in rows),
            "signed_zeros": sum(r.get("signed_zeros", 0) for r in rows),
            "one_ulp": sum(r.get("one_ulp", 0) for r in rows),
            "elements": sum(r.get("elements", 0) for r in rows),
            "max_abs_weight_diff": max((r.get("max_abs_weight_diff", 0.0) for r in rows), default=0.0)}


# llama.cpp's converter on a source without tokenizer files: its vocabulary step replaced by its own
# _set_vocab_none (tokenizer.ggml.model "none"), the rest of convert_hf_to_gguf.py unchanged.
_CONVERT = """
import os, runpy, sys
root = sys.argv[1]
sys.path[:0] = [root, os.path.join(root, "gguf-py")]
if not any(os.path.exists(os.path.join(sys.argv[2], f)) for f in ("tokenizer.json", "tokenizer.model")):
    import conversion.base as base
    import conversion.llama as llama
    llama.LlamaModel.set_vocab = base.TextModel._set_vocab_none
sys.argv = [os.path.join(root, "convert_hf_to_gguf.py")] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def act_llama_convert(spec: dict) -> dict:
    """llama.cpp's own ``convert_hf_to_gguf.py`` (from the llama.cpp tree ``spec["llama_cpp_src"]``, e.g. the one
    vendored in the llama-cpp-python sdist) on the source, compared tensor by tensor with qckpt's GGUF
    ``spec["path"]``: same ggml type and the same bytes. Tensors only the tool writes whose names end with one of
    ``spec["tool_extra_ok"]`` are listed (``tool_only_allowed``), not counted."""
    import subprocess
    import sys

    import gguf

    dst = spec["path"] + ".llama-convert.gguf"
    p = subprocess.run([sys.executable, "-c", _CONVERT, spec["llama_cpp_src"], spec["source"], "--outfile", dst],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return {"ok": False, "stage": "convert_hf_to_gguf", "error": (p.stderr.strip().splitlines() or [""])[-1][:400]}
    ours = {t.name: t for t in gguf.GGUFReader(spec["path"]).tensors}
    reader = gguf.GGUFReader(dst)
    theirs = {t.name: t for t in reader.tensors}
    allowed = sorted(n for n in set(theirs) - set(ours) if n.endswith(tuple(spec.get("tool_extra_ok", []))))
    differing = []
    for name in sorted((set(ours) | set(theirs)) - set(allowed)):
        a, b = ours.get(name), theirs.get(name)
        if a is None or b is None or a.tensor_type != b.tensor_type or \
                np.asarray(a.data).tobytes() != np.asarray(b.data).tobytes():
            differing.append({"tensor": name, "ours": a.tensor_type.name if a is not None else None,
                              "llama.cpp": b.tensor_type.name if b is not None else None})
    kv = {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.") or k == "general.file_type"}
    del reader, theirs
    os.remove(dst)
    n = len(set(ours) | {d["tensor"] for d in differing})
    return {"ok": True, "tool": "llama.cpp convert_hf_to_gguf.py", "tensors": n, "identical": n - len(differing),
            "differing": differing[:10], "tool_only_allowed": allowed, "tool_kv": kv}


ACTIONS = {"fp4_reference": act_fp4_reference, "ggml_decode": act_ggml_decode, "llama_convert": act_llama_convert}

