#!/usr/bin/env python3
"""Self-check of the harness logic (no pytest, no torch): python interop/selfcheck.py

Checks the pass rules of verdict.py, the FP4 group's byte-level completion of a subset
(fp4_group.complete), and the logit metrics of worker.compare_logits and the FP4 reference's tensor
choice (worker_fp4.reference_tensors; these two need numpy, skipped with a message if it is absent)
on hand-made inputs whose answers are worked out below.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import verdict as V  # noqa: E402

FAILS = []


def check(name, got, want):
    if got != want:
        FAILS.append(f"{name}: got {got!r}, want {want!r}")


def model_result(**kw):
    r = {"ok": True, "top1_agree_pct": 100.0, "max_abs_logit_diff": 0.0, "ref_max_abs_logit": 20.0,
         "greedy_equal": True, "france_last_is_paris": True, "tokenizer_error": None, "tokenizer_ids_equal": True}
    r.update(kw)
    return r


ok = {"rc": 0}
exact, lossy = {"expect": "exact"}, {"expect": "lossy"}
refuse = {"expect": "refuse", "refuse_match": ["128", "576"]}

# exact: tolerance is EXACT_REL_TOL * 20 = 0.02
check("exact pass", V.model_verdict(exact, ok, model_result(max_abs_logit_diff=0.019))[0], "PASS")
check("exact over tol", V.model_verdict(exact, ok, model_result(max_abs_logit_diff=0.021))[0], "FAIL")
# float16 dequantization: 4 * 2**-10 * 20 = 0.078
check("exact f16 dequant", V.model_verdict(exact, ok, model_result(max_abs_logit_diff=0.07,
                                                                   dequant_dtype="float16"))[0], "PASS")
check("exact f16 dequant over", V.model_verdict(exact, ok, model_result(max_abs_logit_diff=0.08,
                                                                        dequant_dtype="float16"))[0], "FAIL")
check("exact greedy differs", V.model_verdict(exact, ok, model_result(greedy_equal=False))[0], "FAIL")
check("exact llama uses loader source",
      V.model_verdict(exact, ok, model_result(max_abs_logit_diff=5.0, greedy_equal=False,
                                             vs_loader_source={"max_abs_logit_diff": 0.0, "ref_max_abs_logit": 20.0,
                                                               "greedy_equal": True}))[0], "PASS")
check("garbage", V.model_verdict(lossy, ok, model_result(top1_agree_pct=49.9))[0], "GARBAGE")
# lossy, judged by the tool-equality row: reported, not failed, unless garbage or a tokenizer fault
tool = {"expect": "lossy_tool"}
check("lossy_tool reported", V.model_verdict(tool, ok, model_result(top1_agree_pct=65.0,
                                                                    france_last_is_paris=False))[0], "LOSSY")
check("lossy_tool garbage", V.model_verdict(tool, ok, model_result(top1_agree_pct=20.0))[0], "GARBAGE")
same = {"expect": "same_as_tool"}
check("same as tool", V.model_verdict(same, ok, {"ok": True, "tensors": 3, "identical": 3, "differing": []})[0],
      "PASS")
check("not same as tool", V.model_verdict(same, ok, {"ok": True, "tensors": 3, "identical": 2,
                                                     "differing": [{"tensor": "x"}]})[0], "FAIL")
dec = {"expect": "decode_exact"}
dres = {"ok": True, "types": ["nvfp4"], "elements": 8, "signed_zeros": 1,
        "tensors": [{"tensor": "a", "elements": 4, "values_differ": 0, "max_abs_weight_diff": 0.0},
                    {"tensor": "b", "elements": 4, "values_differ": 0, "max_abs_weight_diff": 0.0}]}
check("decode exact", V.model_verdict(dec, ok, dres),
      ("PASS", "8 weights of 2 tensors (nvfp4) match qckpt's decode; 1 zeros of opposite sign"))
check("decode differs", V.model_verdict(dec, ok, dict(dres, tensors=[dict(dres["tensors"][0], values_differ=1,
                                                                          max_abs_weight_diff=0.5)]))[0], "FAIL")
check("decode unmapped tensor", V.model_verdict(dec, ok, dict(dres, tensors=[{"tensor": "x", "error": "no"}]))[0],
      "FAIL")
check("decode nothing", V.model_verdict(dec, ok, dict(dres, tensors=[]))[0], "FAIL")
check("garbage beats exact", V.model_verdict(exact, ok, model_result(top1_agree_pct=10.0))[0], "GARBAGE")
check("lossy not paris", V.model_verdict(lossy, ok, model_result(france_last_is_paris=False))[0], "FAIL")
check("lossy pass despite greedy", V.model_verdict(lossy, ok, model_result(greedy_equal=False,
                                                                           max_abs_logit_diff=3.0))[0], "PASS")
check("tokenizer missing", V.model_verdict(lossy, ok, model_result(tokenizer_error="OSError: no file"))[0], "FAIL")
check("tokenizer other ids", V.model_verdict(lossy, ok, model_result(tokenizer_ids_equal=False))[0], "FAIL")
check("convert failed", V.model_verdict(lossy, {"rc": 3, "error": "x"}, None)[0], "FAIL")
check("load failed", V.model_verdict(lossy, ok, {"ok": False, "stage": "load", "error": "E"}),
      ("FAIL", "load: E"))
check("refuse ok", V.model_verdict(refuse, {"rc": 3, "error": "group size 128 does not divide 576"}, None)[0], "PASS")
check("refuse converted", V.model_verdict(refuse, ok, None)[0], "FAIL")
check("refuse wrong reason", V.model_verdict(refuse, {"rc": 3, "error": "zero point not integer"}, None)[0], "FAIL")
check("refuse usage error", V.model_verdict(refuse, {"rc": 2, "error": "group 128 576"}, None)[0], "FAIL")

limit = {"expect": "tool_limit", "limit_match": ["not divisible by scale grid"]}
check("tool limit refused as documented",
      V.model_verdict(limit, ok, {"ok": False, "stage": "load",
                                  "error": "Weight shape (576, 1536) not divisible by scale grid (5, 12)."})[0],
      "TOOL-LIMIT")
check("tool limit, other error", V.model_verdict(limit, ok, {"ok": False, "stage": "load", "error": "KeyError"})[0],
      "FAIL")
check("tool limit that loads is judged exact",
      V.model_verdict(limit, ok, dict(ok=True, top1_agree_pct=100.0, max_abs_logit_diff=5.0, ref_max_abs_logit=10.0,
                                      greedy_equal=True, france_last_is_paris=True))[0], "FAIL")

small = {"expect": "lossy", "lossy_top1_pct": 90.0}
res = dict(ok=True, max_abs_logit_diff=3.0, ref_max_abs_logit=20.0, greedy_equal=False, france_last_is_paris=False)
check("small-model lossy pass", V.model_verdict(small, ok, dict(res, top1_agree_pct=92.1))[0], "PASS")
check("small-model lossy below", V.model_verdict(small, ok, dict(res, top1_agree_pct=85.0))[0], "FAIL")
check("tool limit in the loader's log",
      V.model_verdict(limit, ok, {"ok": False, "stage": "load", "error": "RuntimeError: issues during conversion",
                                  "log_tail": "ValueError('Weight shape (576, 1536) not divisible by scale grid')"})[0],
      "TOOL-LIMIT")

# a write the target cannot hold, or has no writer for yet (the FP4 rows): REFUSED only at plan time (exit 3)
# and only with one of the case's words
pending = {"expect": "exact", "accept_refusal": ["not yet writable", "not representable"]}
check("pending writer refused", V.model_verdict(pending, {"rc": 3, "error": "format mlx cannot write nvfp4 (E2M1) "
                                                                       "tensors yet: not yet writable"}, None),
      ("REFUSED", "format mlx cannot write nvfp4 (E2M1) tensors yet: not yet writable"))
check("pending writer, other error", V.model_verdict(pending, {"rc": 3, "error": "worker died"}, None)[0], "FAIL")
check("pending writer, usage error", V.model_verdict(pending, {"rc": 2, "error": "not representable"}, None)[0],
      "FAIL")
check("pending writer landed: judged", V.model_verdict(pending, ok, model_result(max_abs_logit_diff=1.0))[0], "FAIL")
check("no accept_refusal: a refusal fails", V.model_verdict(exact, {"rc": 3, "error": "not yet writable"}, None)[0],
      "FAIL")


def fp4_checks():
    """The byte-level completion of a compressed-tensors subset (fp4_group.complete) on two hand-made
    safetensors files: every tensor's bytes where the inputs have them, the dense Linear in `ignore`."""
    import json
    import struct
    import tempfile

    import fp4_group

    def write(path, tensors):  # {name: (dtype, shape, bytes)}
        header, data = {}, b""
        for n, (dt, shape, raw) in tensors.items():
            header[n] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
            data += raw
        h = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(h)) + h + data)

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        (d / "q").mkdir()
        (d / "b").mkdir()
        write(d / "q" / "model.safetensors", {"m.a_proj.weight_packed": ("U8", [2, 1], b"\x12\x34"),
                                              "m.a_proj.weight_global_scale": ("F32", [1], struct.pack("<f", 448.0))})
        write(d / "b" / "model.safetensors", {"m.a_proj.weight": ("BF16", [2, 2], b"\x01\x02\x03\x04\x05\x06\x07\x08"),
                                              "m.o_proj.weight": ("BF16", [1, 2], b"\xaa\xbb\xcc\xdd"),
                                              "norm.weight": ("BF16", [2], b"\x80\x3f\x00\x40")})
        (d / "q" / "config.json").write_text(json.dumps({"quantization_config": {"ignore": []}}))
        info = fp4_group.complete(d / "q", d / "b", d / "c")
        h, base = fp4_group.read_header(d / "c" / "model.safetensors")
        raw = (d / "c" / "model.safetensors").read_bytes()

        def get(n):
            a, b = h[n]["data_offsets"]
            return h[n]["dtype"], h[n]["shape"], raw[base + a: base + b]

        check("complete: names", sorted(k for k in h if k != "__metadata__"),
              ["m.a_proj.weight_global_scale", "m.a_proj.weight_packed", "m.o_proj.weight", "norm.weight"])
        check("complete: packed bytes", get("m.a_proj.weight_packed"), ("U8", [2, 1], b"\x12\x34"))
        check("complete: global scale", get("m.a_proj.weight_global_scale"), ("F32", [1], struct.pack("<f", 448.0)))
        check("complete: dense from bf16", get("m.o_proj.weight"), ("BF16", [1, 2], b"\xaa\xbb\xcc\xdd"))
        check("complete: header aligned", base % 8, 0)
        check("complete: ignore", info["ignore"], ["lm_head", "m.o_proj"])
        cfg = json.loads((d / "c" / "config.json").read_text())
        check("complete: config ignore", cfg["quantization_config"]["ignore"], ["lm_head", "m.o_proj"])


fp4_checks()


def layer_result(dw=0.0, dy=0.0, w=1.0, y=10.0, **kw):
    r = {"ok": True, "tensors": [{"tensor": "a.weight", "max_abs_weight_diff": dw, "max_abs_weight": w,
                                  "max_abs_output_diff": dy, "max_abs_output": y}]}
    r.update(kw)
    return r


ex, rq = {"kind": "exact"}, {"kind": "requantize"}
check("layer pass", V.layer_verdict(ex, ok, layer_result(dw=2 ** -10, dy=0.05))[0], "PASS")
check("layer weight over", V.layer_verdict(ex, ok, layer_result(dw=2 ** -8))[0], "FAIL")  # tol 2**-9
check("layer output over", V.layer_verdict(ex, ok, layer_result(dy=0.1))[0], "FAIL")  # tol 10 * 2**-7 = 0.078
check("layer refused", V.layer_verdict(ex, {"rc": 3, "error": "not representable; requantize with --asym"},
                                       None)[0], "REFUSED")
check("layer dense source refused", V.layer_verdict(ex, {"rc": 3, "error": "no quantized tensors: quantize it first"},
                                                   None)[0], "REFUSED")
check("layer float source refused", V.layer_verdict(ex, {"rc": 3, "error": "the source is a float checkpoint (plain, "
                                                    "14 dense tensors). quantize it: qckpt quantize SRC DST"},
                                                    None)[0], "REFUSED")
check("layer refused w/o hint is a failure", V.layer_verdict(ex, {"rc": 3, "error": "crash"}, None)[0], "FAIL")
check("layer requant garbage", V.layer_verdict(rq, ok, layer_result(vs_source_rel_output_err=0.7))[0], "GARBAGE")
check("layer requant ok", V.layer_verdict(rq, ok, layer_result(vs_source_rel_output_err=0.1))[0], "PASS")
check("layer missing", V.layer_verdict(ex, ok, {"ok": False, "missing_tensors": ["b.weight"], "tensors": []})[0],
      "FAIL")

try:
    import numpy as np

    import worker

    ref = [np.zeros((2, 4), np.float32), np.zeros((3, 4), np.float32)]
    ref[0][:, 1] = 5.0  # argmax 1 at both positions
    ref[1][:, 2] = 7.0  # argmax 2 at all three
    got = [r.copy() for r in ref]
    got[0][1, 3] = 9.0  # position 1 of prompt 0 now argmax 3: one disagreement, |diff| 9
    got[1][0, 0] = -0.5
    m = worker.compare_logits(got, ref, france_index=0, paris_id=3)
    check("max diff", m["max_abs_logit_diff"], 9.0)
    check("mean diff", m["mean_abs_logit_diff"], (9.0 + 0.5) / 20)
    check("top1", (m["top1_agree"], m["positions"]), (4, 5))
    check("france last top1", (m["france_last_top1"], m["france_last_is_paris"]), (3, True))
    check("ref max", m["ref_max_abs_logit"], 7.0)
    # the FP4 reference: the tool's decode replaces a weight, and every quantization parameter of that
    # module goes (CT: packed codes, scales, the global scale; ModelOpt: U8 weight, weight_scale_2, input_scale)
    import worker_fp4

    dense = {"m.q.weight": "bf16 q", "m.o.weight": "bf16 o", "norm.weight": "bf16 norm"}
    ct = {"m.q.weight_packed": "U8", "m.q.weight_scale": "E4M3", "m.q.weight_global_scale": "F32"}
    mo = {"m.q.weight": "U8", "m.q.weight_scale": "E4M3", "m.q.weight_scale_2": "F32", "m.q.input_scale": "F32",
          "norm.weight": "modelopt norm"}
    want = {"m.q.weight": "decoded", "m.o.weight": "bf16 o", "norm.weight": "bf16 norm"}
    check("fp4 reference, CT", worker_fp4.reference_tensors(dense, ct, {"m.q.weight": "decoded"}), want)
    check("fp4 reference, ModelOpt", worker_fp4.reference_tensors(dense, mo, {"m.q.weight": "decoded"}),
          dict(want, **{"norm.weight": "modelopt norm"}))
    check("fp4 reference, bf16 source", worker_fp4.reference_tensors(dense, {}, {}), dense)
except ImportError as exc:
    print(f"(compare_logits not checked: {exc})")

if FAILS:
    print("\n".join(FAILS))
    print(f"0 passed, {len(FAILS)} failed")
    sys.exit(1)
print("harness self-check: all rules as worked out")
