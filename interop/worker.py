"""One loader check, run in a subprocess of the interop venv (python worker.py ACTION SPEC.json OUT.json).

Each action loads a checkpoint with a real consumer library (transformers, mlx_lm, llama-cpp-python,
compressed-tensors, gptqmodel, mlx, gguf-py), computes what the harness compares, and writes one JSON
object to OUT.json.  It never imports qckpt (`converter`): what qckpt wrote is judged only by the
consumers.  A Python error is caught and written as {"ok": false, "stage": ..., "error": ...}; a crash
(segfault, timeout) leaves no OUT.json and run.py records that instead.

Logit metrics (`compare_logits`) are computed here, in numpy, against the reference logits that the
`reference` action saved (an .npz with one (positions, vocab) float32 array per prompt).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

import numpy as np  # noqa: E402


class Stage(Exception):
    """An error inside a named stage of a check (load, tokenizer, forward, generate)."""

    def __init__(self, stage: str, exc: BaseException):
        super().__init__(f"{stage}: {type(exc).__name__}: {exc}")
        self.stage = stage
        self.exc = exc


def _last_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0][:400] if lines else type(exc).__name__


def stage(name, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every failure is a result here
        raise Stage(name, exc) from exc


# ----------------------------------------------------------------------------- metrics


def compare_logits(logits: list, ref: list, france_index: int, paris_id: int) -> dict:
    """Max / mean |logit - reference|, top-1 agreement over every position of every prompt.

    logits, ref: lists of (positions, vocab) float arrays, one per prompt, same order.
    """
    diffs, agree, total = [], 0, 0
    per_prompt = []
    for got, want in zip(logits, ref):
        got = np.asarray(got, dtype=np.float64)
        want = np.asarray(want, dtype=np.float64)
        if got.shape != want.shape:
            raise ValueError(f"logits shape {got.shape} != reference {want.shape}")
        d = np.abs(got - want)
        diffs.append(d)
        a = int((got.argmax(-1) == want.argmax(-1)).sum())
        agree += a
        total += got.shape[0]
        per_prompt.append({"max_abs": float(d.max()), "top1_agree": a, "positions": int(got.shape[0]),
                           "ref_max_abs_logit": float(np.abs(want).max())})
    alld = np.concatenate([d.ravel() for d in diffs])
    france_top1 = int(np.asarray(logits[france_index])[-1].argmax())
    return {
        "max_abs_logit_diff": float(alld.max()),
        "mean_abs_logit_diff": float(alld.mean()),
        "top1_agree_pct": 100.0 * agree / total,
        "top1_agree": agree,
        "positions": total,
        "france_last_top1": france_top1,
        "france_last_is_paris": france_top1 == paris_id,
        "ref_max_abs_logit": float(max(p["ref_max_abs_logit"] for p in per_prompt)),
        "per_prompt": per_prompt,
    }


def _finish(spec: dict, logits: list, greedy_ids: list | None, greedy_text: str | None,
            tokenizer_ids: list | None) -> dict:
    ref = np.load(spec["reference_npz"])
    ref_logits = [ref[f"p{i}"] for i in range(len(spec["prompts"]))]
    out = {"ok": True}
    out.update(compare_logits(logits, ref_logits, spec["france_index"], spec["paris_id"]))
    out["greedy_ids"] = greedy_ids
    out["greedy_text"] = greedy_text
    out["greedy_equal"] = greedy_ids == spec["reference_greedy_ids"] if greedy_ids is not None else None
    if tokenizer_ids is not None:
        out["tokenizer_ids_equal"] = tokenizer_ids == [p["ids"] for p in spec["prompts"]]
    return out


def _encode_all(encode, spec) -> list:
    return [list(map(int, encode(p["text"]))) for p in spec["prompts"]]


# ----------------------------------------------------------------------------- transformers


def _hf_tokenizer_encode(tok):
    return lambda text: tok(text, add_special_tokens=False)["input_ids"]


def _hf_logits_and_greedy(model, spec):
    import torch

    logits = []
    with torch.no_grad():
        for p in spec["prompts"]:
            ids = torch.tensor([p["ids"]], dtype=torch.long)
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
            logits.append(out.logits[0].float().numpy())
    g_prompt = spec["prompts"][spec["france_index"]]["ids"]
    with torch.no_grad():
        ids = torch.tensor([g_prompt], dtype=torch.long)
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=spec["greedy_tokens"], min_new_tokens=spec["greedy_tokens"],
                             pad_token_id=spec.get("pad_id", 2))
    return logits, [int(t) for t in gen[0, len(g_prompt):]]


def act_transformers(spec: dict) -> dict:
    """AutoModelForCausalLM.from_pretrained(dir[, gguf_file]) + AutoTokenizer on the same folder."""
    import torch
    import transformers

    torch.manual_seed(0)
    path = spec["path"]
    kwargs = {"dtype": getattr(torch, spec.get("dtype", "float32"))}
    if os.path.isfile(path):  # a GGUF file: transformers' own GGUF loader
        kwargs["gguf_file"] = os.path.basename(path)
        folder = os.path.dirname(path)
    else:
        folder = path
    t = time.time()
    model, linfo = stage("load", transformers.AutoModelForCausalLM.from_pretrained, folder,
                         output_loading_info=True, **kwargs)
    model.eval()
    load_s = time.time() - t
    info = {"model_class": type(model).__name__,
            "linear_class": sorted({type(m).__name__ for n, m in model.named_modules()
                                    if n.endswith(("q_proj", "down_proj"))}),
            "embed_class": type(model.get_input_embeddings()).__name__,
            "param_dtype": str(next(model.parameters()).dtype)}
    # what transformers left initialised at random (missing) or ignored (unexpected): the usual way a
    # checkpoint "loads" and computes garbage
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        vals = sorted(str(v) for v in (linfo or {}).get(key, []) or [])
        info[key] = {"count": len(vals), "first": vals[:5]}
    tok_kwargs = {"gguf_file": kwargs["gguf_file"]} if "gguf_file" in kwargs else {}
    tok, tok_err = None, None
    try:
        if spec.get("tokenizer", True):  # False: the source ships none (the FP8 rows' prompts are ids)
            tok = transformers.AutoTokenizer.from_pretrained(folder, **tok_kwargs)
    except Exception as exc:  # noqa: BLE001
        tok_err = _last_line(exc)
    logits, greedy = stage("forward", _hf_logits_and_greedy, model, spec)
    tok_ids = _encode_all(_hf_tokenizer_encode(tok), spec) if tok is not None else None
    text = tok.decode(greedy) if tok is not None else None
    out = _finish(spec, logits, greedy, text, tok_ids)
    out.update(info, load_seconds=load_s, tokenizer_error=tok_err)
    return out


def act_reference(spec: dict) -> dict:
    """The reference: transformers' GGUF loader on the source; saves logits, prompt ids, greedy ids."""
    import torch
    import transformers

    path = spec["path"]
    folder, name = os.path.dirname(path), os.path.basename(path)
    tok = stage("tokenizer", transformers.AutoTokenizer.from_pretrained, folder, gguf_file=name)
    model = stage("load", transformers.AutoModelForCausalLM.from_pretrained, folder, gguf_file=name,
                  dtype=torch.float32)
    model.eval()
    prompts = []
    for p in spec["prompts"]:
        if p.get("chat"):
            text = tok.apply_chat_template([{"role": "user", "content": p["chat"]}], tokenize=False,
                                           add_generation_prompt=True)
        else:
            text = p["text"]
        ids = [int(i) for i in tok(text, add_special_tokens=False)["input_ids"]]
        prompts.append({"name": p["name"], "text": text, "ids": ids})
    spec = dict(spec, prompts=prompts)
    logits, greedy = _hf_logits_and_greedy(model, spec)
    np.savez(spec["reference_npz"], **{f"p{i}": a.astype(np.float32) for i, a in enumerate(logits)})
    paris = tok(" Paris", add_special_tokens=False)["input_ids"]
    return {"ok": True, "prompts": prompts, "greedy_ids": greedy, "greedy_text": tok.decode(greedy),
            "paris_ids": [int(i) for i in paris],
            "france_top1": int(logits[spec["france_index"]][-1].argmax()),
            "top5_france": [[tok.decode([int(i)]), float(logits[spec["france_index"]][-1][i])]
                            for i in np.argsort(-logits[spec["france_index"]][-1])[:5]]}


def act_side_files(spec: dict) -> dict:
    """For diagnostic rows only: config.json and tokenizer files as transformers derives them from the
    source GGUF (AutoConfig / AutoTokenizer .from_pretrained(gguf_file=...).save_pretrained)."""
    import transformers

    path = spec["path"]
    folder, name = os.path.dirname(path), os.path.basename(path)
    cfg = stage("config", transformers.AutoConfig.from_pretrained, folder, gguf_file=name)
    cfg.save_pretrained(spec["dest"])
    tok = stage("tokenizer", transformers.AutoTokenizer.from_pretrained, folder, gguf_file=name)
    tok.save_pretrained(spec["dest"])
    return {"ok": True, "files": sorted(os.listdir(spec["dest"]))}


# ----------------------------------------------------------------------------- mlx_lm


def act_mlx_lm(spec: dict) -> dict:
    """mlx_lm.load(dir) (model + tokenizer), logits from model(ids), greedy via mlx_lm.generate_step."""
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import generate_step

    t = time.time()
    try:
        if not spec.get("tokenizer", True):  # the source ships none (the FP8 rows' prompts are ids)
            raise RuntimeError("no tokenizer (by design)")
        model, tok = mlx_lm.load(spec["path"])
        tok_err = None
    except Exception as exc:  # noqa: BLE001
        # the model may load while the tokenizer does not: say which
        from mlx_lm.utils import load_model

        first = _last_line(exc)
        model, _ = stage("load", load_model, __import__("pathlib").Path(spec["path"]))
        tok, tok_err = None, first if spec.get("tokenizer", True) else None
    load_s = time.time() - t
    qlayers = sorted({type(m).__name__ for n, m in model.named_modules() if n.endswith(("q_proj", "embed_tokens"))})

    dtypes = set()

    def run():
        logits = []
        for p in spec["prompts"]:
            out = model(mx.array([p["ids"]]))
            dtypes.add(str(out.dtype).replace("mlx.core.", ""))
            logits.append(np.array(out[0].astype(mx.float32)))
        prompt = mx.array(spec["prompts"][spec["france_index"]]["ids"])
        greedy = []
        for token, _ in generate_step(prompt, model, max_tokens=spec["greedy_tokens"]):
            greedy.append(int(token))
        return logits, greedy

    logits, greedy = stage("forward", run)
    tok_ids = _encode_all(lambda s: tok.encode(s, add_special_tokens=False), spec) if tok is not None else None
    text = tok.decode(greedy) if tok is not None else None
    out = _finish(spec, logits, greedy, text, tok_ids)
    # MLX rebuilds each weight as scale * q + bias in the dtype of the scales: with float16 scales the
    # weights it multiplies by are rounded to float16 (measured: the same file with its scales cast
    # losslessly to float32 is within 1.2e-4 of the reference, with float16 scales 0.069)
    from mlx.utils import tree_flatten

    sdt = sorted({str(v.dtype).replace("mlx.core.", "") for k, v in tree_flatten(model.parameters())
                  if k.endswith(".scales")})
    out.update(load_seconds=load_s, tokenizer_error=tok_err, layer_classes=qlayers,
               logits_dtype=",".join(sorted(dtypes)), dequant_dtype=",".join(sdt) or None)
    return out


# ----------------------------------------------------------------------------- llama.cpp


def act_llama_cpp(spec: dict) -> dict:
    """llama_cpp.Llama(path, logits_all=True): logits of every position, greedy with top_k=1."""
    import llama_cpp

    t = time.time()
    llm = stage("load", llama_cpp.Llama, model_path=spec["path"], logits_all=True, n_ctx=512, n_threads=2,
                n_batch=512, verbose=False, seed=0)
    load_s = time.time() - t

    def run():
        logits = []
        for p in spec["prompts"]:
            llm.reset()
            llm.eval(p["ids"])
            logits.append(np.array(llm.scores[: len(p["ids"])], dtype=np.float32))
        llm.reset()
        prompt = spec["prompts"][spec["france_index"]]["ids"]
        greedy = []
        for tok in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                reset=True):
            greedy.append(int(tok))
            if len(greedy) >= spec["greedy_tokens"]:
                break
        return logits, greedy

    logits, greedy = stage("forward", run)
    if spec.get("tokenizer", True):
        tok_ids = _encode_all(lambda s: llm.tokenize(s.encode(), add_bos=False, special=True), spec)
        text = llm.detokenize(greedy).decode("utf-8", "replace")
    else:  # the source ships no tokenizer (the FP8 / FP4 rows' prompts are ids)
        tok_ids, text = None, None
    out = _finish(spec, logits, greedy, text, tok_ids)
    if spec.get("save_npz"):  # the baseline: llama.cpp on the source, reference for its targets
        np.savez(spec["save_npz"], **{f"p{i}": a for i, a in enumerate(logits)})
    if spec.get("loader_reference_npz"):
        ref = np.load(spec["loader_reference_npz"])
        same = compare_logits(logits, [ref[f"p{i}"] for i in range(len(logits))], spec["france_index"],
                              spec["paris_id"])
        same["greedy_equal"] = greedy == spec["loader_reference_greedy_ids"]
        del same["per_prompt"]
        out["vs_loader_source"] = same
    out.update(load_seconds=load_s, tokenizer_error=None)
    return out


def act_llama_quantize(spec: dict) -> dict:
    """llama.cpp's own requantization of the source (``llama_model_quantize``, ``allow_requantize``,
    ``spec["ftype"]``, not ``--pure``: its per-tensor type choice applies), compared tensor by
    tensor with qckpt's output ``spec["path"]``: same ggml type and the same bytes."""
    import ctypes

    import gguf
    import llama_cpp

    dst = spec["path"] + ".llama-quantize.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = int(spec["ftype"])
    params.allow_requantize = True
    params.nthread = 2
    rc = stage("quantize", llama_cpp.llama_model_quantize, spec["source"].encode(), dst.encode(),
               ctypes.byref(params))
    if rc != 0:
        return {"ok": False, "stage": "quantize", "error": f"llama_model_quantize returned {rc}"}
    ours = {t.name: t for t in gguf.GGUFReader(spec["path"]).tensors}
    theirs = {t.name: t for t in gguf.GGUFReader(dst).tensors}
    differing = []
    for name in sorted(set(ours) | set(theirs)):
        a, b = ours.get(name), theirs.get(name)
        if a is None or b is None or a.tensor_type != b.tensor_type or \
                np.asarray(a.data).tobytes() != np.asarray(b.data).tobytes():
            differing.append({"tensor": name, "ours": a.tensor_type.name if a is not None else None,
                              "llama.cpp": b.tensor_type.name if b is not None else None})
    os.remove(dst)
    types = {}
    for t in theirs.values():
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return {"ok": True, "tensors": len(theirs), "identical": len(theirs) - len(differing),
            "differing": differing[:10], "llama_cpp_types": types}


# ----------------------------------------------------------------------------- layer checks (MiniLM)


def _x_for(in_features: int, seed: int = 0):
    rng = np.random.default_rng(seed + in_features)
    return rng.standard_normal((8, in_features)).astype(np.float32)


def _compare_layers(decoded: dict, source_path: str, loader: str, orig_path: str | None = None) -> dict:
    """decoded: name -> (W (out,in) float32 as decoded by the target library, y = library's Linear(x)
    output or None, bias or None). source: qckpt's f32 dequantize of the source checkpoint."""
    import ml_dtypes  # noqa: F401  (bf16 dense tensors of a source load as numpy arrays)
    from safetensors.numpy import load_file

    src = load_file(source_path)
    rows, worst_w, worst_y = [], 0.0, 0.0
    # every quantized 2-D weight must come back; embeddings stay dense in every target (module policy)
    missing = [n for n in src if n.endswith(".weight") and src[n].ndim == 2 and n not in decoded
               and "embed" not in n]
    for name, (w, y, _bias) in sorted(decoded.items()):
        if name not in src:
            rows.append({"tensor": name, "error": "not in source"})
            continue
        ws = src[name].astype(np.float32)
        w = np.asarray(w, dtype=np.float32)
        if w.shape != ws.shape:
            rows.append({"tensor": name, "error": f"shape {w.shape} != source {ws.shape}"})
            worst_w = float("inf")
            continue
        dw = float(np.abs(w - ws).max())
        x = _x_for(ws.shape[1])
        b = src.get(name[: -len("weight")] + "bias")
        y_src = x @ ws.T + (b.astype(np.float32) if b is not None else 0.0)
        row = {"tensor": name, "max_abs_weight_diff": dw, "max_abs_weight": float(np.abs(ws).max())}
        if y is not None:
            dy = float(np.abs(np.asarray(y, dtype=np.float32) - y_src).max())
            row["max_abs_output_diff"] = dy
            row["max_abs_output"] = float(np.abs(y_src).max())
            worst_y = max(worst_y, dy)
        worst_w = max(worst_w, dw)
        rows.append(row)
    res = {"ok": not missing and all("error" not in r for r in rows), "loader": loader, "tensors": rows,
           "missing_tensors": missing, "max_abs_weight_diff": worst_w, "max_abs_output_diff": worst_y,
           "n_tensors": len(rows)}
    if orig_path:  # requantized: how far the consumer's decode is from the original source
        orig = load_file(orig_path)
        rel_y, dw_o = 0.0, 0.0
        for name, (w, _y, _b) in decoded.items():
            if name not in orig or np.shape(w) != orig[name].shape:
                continue
            wo = orig[name].astype(np.float32)
            x = _x_for(wo.shape[1])
            y_o, y_t = x @ wo.T, x @ np.asarray(w, dtype=np.float32).T
            rel_y = max(rel_y, float(np.abs(y_t - y_o).max() / max(np.abs(y_o).max(), 1e-30)))
            dw_o = max(dw_o, float(np.abs(np.asarray(w, dtype=np.float32) - wo).max()))
        res["vs_source_rel_output_err"] = rel_y
        res["vs_source_max_abs_weight_diff"] = dw_o
    return res


def _read_json(path):
    with open(path) as f:
        return json.load(f)


def act_layers_compressed_tensors(spec: dict) -> dict:
    """transformers' compressed-tensors path on a module tree of nn.Linear named like the checkpoint:
    apply_quantization_config(run_compressed=False) + ModelCompressor.compress_model (the layout
    transformers loads into), load the safetensors state dict strictly, decompress_model, Linear(x)."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config
    from safetensors.torch import load_file
    from transformers.utils.quantization_config import CompressedTensorsConfig

    folder = spec["path"]
    qc = _read_json(os.path.join(folder, "config.json"))["quantization_config"]
    state = load_file(os.path.join(folder, "model.safetensors"))
    model = _linear_tree(state, torch, suffixes=(".weight_packed", ".weight"))
    cfg = CompressedTensorsConfig.from_dict(dict(qc))
    cfg.post_init()
    comp = stage("load", ModelCompressor.from_compression_config, cfg)
    stage("load", apply_quantization_config, model, comp.quantization_config, run_compressed=False)
    if cfg.is_quantization_compressed:
        stage("load", comp.compress_model, model=model)
    missing, unexpected = stage("load", model.load_state_dict, state, strict=False)
    missing = [m for m in missing if not m.endswith(("weight_g_idx",))]
    unexpected = [u for u in unexpected if state[u].ndim >= 2]  # norms and other 1-D tensors: no Linear
    if missing or unexpected:
        raise Stage("load", ValueError(f"state dict: missing {missing[:4]} unexpected {unexpected[:4]}"))
    stage("decompress", comp.decompress_model, model)
    decoded = {}
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear):
                w = mod.weight.detach().float()
                x = torch.from_numpy(_x_for(w.shape[1]))
                y = torch.nn.functional.linear(x.to(mod.weight.dtype), mod.weight, mod.bias).float()
                decoded[name + ".weight"] = (w.numpy(), y.numpy(), None)
    return _compare_layers(decoded, spec["source_f32"], orig_path=spec.get("orig_f32"), loader=
                           "compressed_tensors ModelCompressor.compress_model + load_state_dict + decompress_model")


def _linear_tree(state, torch, suffixes):
    """nn.Module tree with one nn.Linear per quantized/plain weight named in state (for a CT/GPTQ file)."""
    root = torch.nn.Module()
    shapes = {}
    for key, t in state.items():
        for suf in suffixes:
            if key.endswith(suf):
                prefix = key[: -len(suf)]
                if suf == ".weight_packed":
                    shape = state.get(prefix + ".weight_shape")
                    if shape is None:
                        continue
                    out_f, in_f = (int(v) for v in shape.tolist())
                elif t.ndim == 2 and prefix + ".weight_packed" not in state:
                    out_f, in_f = t.shape
                else:
                    continue
                shapes[prefix] = (out_f, in_f)
    for prefix, (out_f, in_f) in shapes.items():
        parent = root
        parts = prefix.split(".")
        for p in parts[:-1]:
            if not hasattr(parent, p):
                parent.add_module(p, torch.nn.Module())
            parent = getattr(parent, p)
        parent.add_module(parts[-1], torch.nn.Linear(in_f, out_f, bias=(prefix + ".bias") in state))
    return root


def _gptq_like_layers(spec, kind):
    import torch

    from safetensors.torch import load_file

    folder = spec["path"]
    cfg = _read_json(os.path.join(folder, "config.json")).get("quantization_config", {})
    qcfg_path = os.path.join(folder, "quantize_config.json")
    if not cfg and os.path.exists(qcfg_path):
        cfg = _read_json(qcfg_path)
    state = load_file(os.path.join(folder, "model.safetensors"))
    bits, group = int(cfg["bits"]), int(cfg["group_size"])
    sym = bool(cfg.get("sym", kind == "gptq"))
    desc_act = bool(cfg.get("desc_act", False))
    fmt = str(cfg.get("checkpoint_format", cfg.get("format", "gptq"))).lower()
    decoded = {}
    dtype = torch.float16
    if kind == "gptq":
        from gptqmodel.nn_modules.qlinear.torch import TorchLinear as QL
        from gptqmodel.utils.model import convert_gptq_v1_to_v2_format_module
    else:
        from gptqmodel.nn_modules.qlinear.torch_awq import AwqTorchLinear as QL
        from gptqmodel.quantization.awq.utils.packing_utils import dequantize_gemm
    prefixes = sorted(k[: -len(".qweight")] for k in state if k.endswith(".qweight"))
    for prefix in prefixes:
        qweight = state[prefix + ".qweight"]
        if kind == "gptq":
            in_f, out_f = qweight.shape[0] * 32 // bits, qweight.shape[1]
        else:
            in_f, out_f = qweight.shape[0], qweight.shape[1] * 32 // bits
        has_bias = (prefix + ".bias") in state
        g = in_f if group == -1 else group
        mod = stage("load", QL, bits=bits, group_size=g if kind == "awq" else group, sym=sym, desc_act=desc_act,
                    in_features=in_f, out_features=out_f, bias=has_bias, register_buffers=True,
                    **({"dtype": dtype} if kind == "awq" else {}))
        sd = {k[len(prefix) + 1:]: v for k, v in state.items() if k.startswith(prefix + ".")}
        if "bias" in sd:
            sd["bias"] = sd["bias"].to(dtype)
        sd["scales"] = sd["scales"].to(dtype)
        if kind == "gptq" and "g_idx" not in sd:
            sd["g_idx"] = torch.tensor([i // (g) for i in range(in_f)], dtype=torch.int32)
        missing, unexpected = mod.load_state_dict(sd, strict=False)
        if unexpected or [m for m in missing if m not in ("g_idx",)]:
            raise Stage("load", ValueError(f"{prefix}: missing {missing} unexpected {unexpected}"))
        if kind == "gptq" and fmt in ("gptq", "gptq_v1", "v1"):
            stage("load", convert_gptq_v1_to_v2_format_module, mod, bits=bits, pack_dtype=torch.int32)
        stage("load", mod.post_init)
        mod.eval()
        with torch.no_grad():
            # both return (in_features, out_features): the kernels' own orientation
            if kind == "gptq":
                w = stage("dequantize", mod.dequantize_weight).float().T
            else:  # what AwqTorchLinear.forward multiplies by (_dequantize_weight_for_inference)
                w = stage("dequantize", dequantize_gemm, qweight=mod.qweight, qzeros=mod.qzeros,
                          scales=mod.scales, bits=bits, group_size=g).float().T
            x = torch.from_numpy(_x_for(in_f)).to(dtype)
            y = stage("forward", mod, x).float()
        decoded[prefix + ".weight"] = (w.numpy(), y.numpy(), None)
    name = ("gptqmodel TorchLinear (v1->v2 via convert_gptq_v1_to_v2_format_module when v1) "
            "load_state_dict + post_init, dequantize_weight and forward (fp16)") if kind == "gptq" else \
        "gptqmodel AwqTorchLinear load_state_dict + post_init, forward (fp16); weights by dequantize_gemm"
    res = _compare_layers(decoded, spec["source_f32"], orig_path=spec.get("orig_f32"), loader= name)
    res["config"] = {"bits": bits, "group_size": group, "sym": sym, "desc_act": desc_act, "format": fmt}
    return res


def act_layers_gptq(spec):
    return _gptq_like_layers(spec, "gptq")


def act_layers_awq(spec):
    return _gptq_like_layers(spec, "awq")


def act_layers_mlx(spec: dict) -> dict:
    """mx.load + mlx.nn.QuantizedLinear (update with the file's weight/scales/biases/bias) and
    mx.dequantize; group size and bits from config.json's quantization block."""
    import mlx.core as mx
    import mlx.nn as nn

    folder = spec["path"]
    cfg = _read_json(os.path.join(folder, "config.json"))
    q = cfg.get("quantization") or cfg.get("quantization_config")
    arrays = stage("load", mx.load, os.path.join(folder, "model.safetensors"))
    decoded = {}
    for key in sorted(arrays):
        if not key.endswith(".scales"):
            continue
        prefix = key[: -len(".scales")]
        per = q.get(prefix, q) if isinstance(q.get(prefix), dict) else q
        bits, group = int(per["bits"]), int(per["group_size"])
        wq = arrays[prefix + ".weight"]
        out_f, in_f = wq.shape[0], wq.shape[1] * 32 // bits
        has_bias = (prefix + ".bias") in arrays
        layer = nn.QuantizedLinear(in_f, out_f, bias=has_bias, group_size=group, bits=bits)
        params = {"weight": wq, "scales": arrays[key], "biases": arrays[prefix + ".biases"]}
        if has_bias:
            params["bias"] = arrays[prefix + ".bias"]
        stage("load", layer.update, params)
        w = stage("dequantize", mx.dequantize, wq, arrays[key], arrays[prefix + ".biases"], group_size=group,
                  bits=bits)
        x = mx.array(_x_for(in_f))
        y = stage("forward", layer, x)
        decoded[prefix + ".weight"] = (np.array(w.astype(mx.float32)), np.array(y.astype(mx.float32)), None)
    return _compare_layers(decoded, spec["source_f32"], orig_path=spec.get("orig_f32"), loader=
                           "mlx.nn.QuantizedLinear.update + forward, mlx.core.dequantize")


def act_layers_gguf(spec: dict) -> dict:
    """gguf.GGUFReader + gguf.quants.dequantize per tensor; GGUF names mapped to HF names with gguf-py's
    own TensorNameMap for the file's architecture; output = x @ W.T in numpy (gguf-py has no kernel)."""
    import gguf
    import ml_dtypes  # noqa: F401  (bf16 dense tensors of the source load as numpy arrays)

    reader = stage("load", gguf.GGUFReader, spec["path"])
    arch_name = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    arch = next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == arch_name)
    n_blocks = int(reader.fields[f"{arch_name}.block_count"].parts[-1][0])
    tmap = gguf.get_tensor_name_map(arch, n_blocks)
    from safetensors.numpy import load_file

    src_names = list(load_file(spec["source_f32"]).keys())
    gguf_to_hf = {}
    for hf in src_names:
        base, _, suffix = hf.rpartition(".")
        mapped = tmap.get_name(base)
        if mapped is not None:
            gguf_to_hf[f"{mapped}.{suffix}"] = hf
    heads = {}
    if arch_name == "llama":  # llama.cpp stores q/k rows permuted (convert_hf_to_gguf LlamaModel.permute)
        def field(k):
            f = reader.fields.get(f"llama.{k}")
            return int(f.parts[-1][0]) if f is not None else None
        n_head = field("attention.head_count")
        heads = {"q_proj.weight": n_head, "k_proj.weight": field("attention.head_count_kv") or n_head}
    decoded, unmapped = {}, []
    for t in reader.tensors:
        if len(t.shape) != 2:
            continue
        w = stage("dequantize", gguf.quants.dequantize, t.data, t.tensor_type).astype(np.float32)
        w = w.reshape(int(t.shape[1]), int(t.shape[0]))
        hf = gguf_to_hf.get(t.name, t.name if t.name in src_names else None)
        if hf is None:
            unmapped.append(t.name)
            continue
        n = next((h for suffix, h in heads.items() if hf.endswith(suffix)), None)
        if n:  # the inverse permutation, as transformers' GGUF loader applies it (reverse_permute)
            w = w.reshape(n, w.shape[0] // n // 2, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        decoded[hf] = (w, None, None)
    res = _compare_layers(decoded, spec["source_f32"], orig_path=spec.get("orig_f32"), loader=
                          "gguf-py GGUFReader + gguf.quants.dequantize (names via gguf.get_tensor_name_map; "
                          "no Linear kernel in gguf-py, so no output column)")
    res["types"] = sorted({t.tensor_type.name for t in reader.tensors})
    if unmapped:
        res["unmapped"] = unmapped
    return res


ACTIONS = {
    "reference": act_reference,
    "side_files": act_side_files,
    "transformers": act_transformers,
    "mlx_lm": act_mlx_lm,
    "llama_cpp": act_llama_cpp,
    "llama_quantize": act_llama_quantize,
    "layers_compressed_tensors": act_layers_compressed_tensors,
    "layers_gptq": act_layers_gptq,
    "layers_awq": act_layers_awq,
    "layers_mlx": act_layers_mlx,
    "layers_gguf": act_layers_gguf,
}

# the FP8 rows' actions live in worker_fp8.py; it imports this module by name (run as a script, this
# module is __main__: alias it so both see the same Stage class)
sys.modules.setdefault("worker", sys.modules[__name__])
import worker_fp4  # noqa: E402
import worker_fp8  # noqa: E402

ACTIONS.update(worker_fp8.ACTIONS)
ACTIONS.update(worker_fp4.ACTIONS)


def main(argv):
    action, spec_path, out_path = argv[1:4]
    spec = _read_json(spec_path)
    t0 = time.time()
    try:
        result = ACTIONS[action](spec)
    except Stage as exc:
        result = {"ok": False, "stage": exc.stage, "error": _last_line(exc.exc),
                  "traceback": traceback.format_exception(exc.exc)[-6:]}
    except Exception as exc:  # noqa: BLE001
        result = {"ok": False, "stage": action, "error": _last_line(exc),
                  "traceback": traceback.format_exception(exc)[-6:]}
    result["seconds"] = round(time.time() - t0, 2)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, default=str)
    os.replace(tmp, out_path)


if __name__ == "__main__":
    main(sys.argv)
