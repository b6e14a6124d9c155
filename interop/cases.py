"""The cases of the interop suite (stdlib only).

Group "smollm2": the real third-party SmolLM2-135M-Instruct GGUF (Q4_1, tied head, GQA 9/3, tokenizer in
its metadata) converted by qckpt and loaded whole by the target's real loader; compared with
transformers' own GGUF loader on the source.

Group "minilm": the shipped layer subsets (sample_checkpoints/: MiniLM in every integer format, the
real FP8 samples), repacked/requantized into each writable target and decoded by that target
library's own layer / decoder.

Group "fp8": the real FP8 checkpoints that load as a model (FP8_SOURCES, one entry per source; a
1-layer SmolLM2 with a 256-token vocabulary and no tokenizer, so prompts are token ids), converted
by qckpt and loaded whole by the target's real loader; compared with transformers running the
source's own decode (the producing tool's reference_dequant.safetensors) in float32.

Group "fp4": the real FP4 samples (FP4_SOURCES; the compressed-tensors model-free subsets completed
into a loadable model by fp4_group.complete) and their bf16 source (FP4_BF16, for `quantize --fp4`),
converted by qckpt and loaded whole by the target's real loader; compared with transformers running
the producing tool's decode, in the dtype the row loads in (fp4_group, worker_fp4).
"""

from __future__ import annotations

SMOLLM2 = "smollm2_135m_instruct_Q4_1.gguf"

PROMPTS = [
    {"name": "france", "text": "The capital of France is"},
    {"name": "code", "text": "def fibonacci(n):\n    if n < 2:\n        return n\n    return"},
    {"name": "prose", "text": "Quantization stores each weight of a neural network in a few bits, so that"},
    {"name": "chat", "chat": "What is the boiling point of water at sea level?"},
]
FRANCE_IDS = [504, 3575, 282, 4649, 314]  # MANIFEST.json: no BOS
GREEDY_TOKENS = 20
MANIFEST_GREEDY_TEXT = " Paris.\n\nThe answer is: 2018-01-22 "


def _case(group, lossy_top1_pct, cid, out, cmd, loader, expect, quick=False, **kw):
    """One whole-model case of ``group``: ``cmd`` (qckpt arguments after SRC DST; None: the source itself),
    ``out`` (the output's name), ``loader`` (worker action), ``expect`` (verdict.model_verdict); a "lossy"
    case gets ``lossy_top1_pct`` (the group's top-1 agreement bar; None: the ' Paris' rule); ``kw``: any
    other case key (``dtype``, ``needs``, ``limit_match``, ``accept_refusal`` ...)."""
    d = {"id": cid, "group": group, "out": out, "cmd": cmd, "loader": loader, "expect": expect, "quick": quick}
    if expect == "lossy" and lossy_top1_pct is not None:
        d["lossy_top1_pct"] = lossy_top1_pct
    d.update(kw)
    return d


def _c(*args, **kw):
    return _case("smollm2", None, *args, **kw)


def smollm2_cases() -> list[dict]:
    """cmd: qckpt arguments after SRC DST ("{out}" is DST); loader: worker action; expect: exact/lossy/refuse."""
    G32S = ["--group-size", "32", "--sym"]
    cases = [
        # baselines: the source itself in the loaders that read GGUF (no qckpt command)
        _c("source/llama.cpp", None, None, "llama_cpp", "baseline", needs="llama_cpp"),
        _c("dequantize-f32/transformers", "deq_f32", ["dequantize", "--dtype", "f32"], "transformers", "exact",
           quick=True),
        _c("dequantize-f32/mlx_lm", "deq_f32", ["dequantize", "--dtype", "f32"], "mlx_lm", "exact"),
        _c("dequantize-bf16/transformers", "deq_bf16", ["dequantize", "--dtype", "bf16"], "transformers", "lossy",
           dtype="bfloat16"),
        _c("dequantize-bf16/mlx_lm", "deq_bf16", ["dequantize", "--dtype", "bf16"], "mlx_lm", "lossy"),
        _c("mlx/mlx_lm", "mlx", ["convert", "--to", "mlx"], "mlx_lm", "exact", quick=True),
        _c("gguf/transformers-gguf", "exact.gguf", ["convert", "--to", "gguf"], "transformers", "exact"),
        _c("gguf/llama.cpp", "exact.gguf", ["convert", "--to", "gguf"], "llama_cpp", "exact", needs="llama_cpp"),
        # Q4_1 -> Q4_0 loses ' Paris' in llama.cpp's own requantization too: judged by llama-quantize
        _c("gguf-Q4_0/transformers-gguf", "q4_0.gguf", ["convert", "--to", "gguf", "--bits", "4"] + G32S,
           "transformers", "lossy_tool"),
        _c("gguf-Q4_0/llama.cpp", "q4_0.gguf", ["convert", "--to", "gguf", "--bits", "4"] + G32S, "llama_cpp",
           "lossy_tool", needs="llama_cpp"),
        # requantized GGUF: is it llama.cpp's own requantization of the same source, tensor for tensor?
        # (ftype LLAMA_FTYPE_MOSTLY_Q4_0 = 2, MOSTLY_Q8_0 = 7)
        _c("gguf-Q4_0/llama-quantize", "q4_0.gguf", ["convert", "--to", "gguf", "--bits", "4"] + G32S,
           "llama_quantize", "same_as_tool", needs="llama_cpp", ftype=2),
        _c("gguf-Q8_0/llama-quantize", "q8_0.gguf", ["convert", "--to", "gguf", "--bits", "8"] + G32S,
           "llama_quantize", "same_as_tool", needs="llama_cpp", ftype=7),
        # a K-quant mix (--quant-type): llama-quantize's own Q4_K_M of the same source (ftype
        # LLAMA_FTYPE_MOSTLY_Q4_K_M = 15), tensor for tensor (types chosen and bytes)
        _c("gguf-Q4_K_M/llama-quantize", "q4_k_m.gguf", ["convert", "--to", "gguf", "--quant-type", "Q4_K_M"],
           "llama_quantize", "same_as_tool", needs="llama_cpp", ftype=15),
        _c("gguf-Q4_K_M/llama.cpp", "q4_k_m.gguf", ["convert", "--to", "gguf", "--quant-type", "Q4_K_M"],
           "llama_cpp", "lossy", needs="llama_cpp"),
        _c("gguf-Q8_0/transformers-gguf", "q8_0.gguf", ["convert", "--to", "gguf", "--bits", "8"] + G32S,
           "transformers", "lossy"),
        _c("gguf-Q8_0/llama.cpp", "q8_0.gguf", ["convert", "--to", "gguf", "--bits", "8"] + G32S, "llama_cpp",
           "lossy", needs="llama_cpp"),
        _c("gptq-w4g32-asym/transformers", "gptq", ["convert", "--to", "gptq", "--bits", "4", "--group-size", "32",
                                                    "--asym"], "transformers", "lossy"),
        _c("awq-w4g32/transformers", "awq", ["convert", "--to", "awq", "--bits", "4", "--group-size", "32"],
           "transformers", "lossy"),
        _c("awq-w4g32-asym/transformers", "awq_asym", ["convert", "--to", "awq", "--bits", "4", "--group-size",
                                                       "32", "--asym"], "transformers", "lossy"),
        _c("ct-w8-channel/transformers", "ct8", ["convert", "--to", "compressed-tensors", "--bits", "8",
                                                 "--per-channel"], "transformers", "lossy"),
        _c("ct-w8-channel-sym/transformers", "ct8_sym", ["convert", "--to", "compressed-tensors", "--bits", "8",
                                                         "--per-channel", "--sym"], "transformers", "lossy",
           quick=True),
        _c("ct-w4g64/transformers", "ct4", ["convert", "--to", "compressed-tensors", "--bits", "4",
                                            "--group-size", "64"], "transformers", "lossy"),
        _c("ct-w4g64-sym/transformers", "ct4_sym", ["convert", "--to", "compressed-tensors", "--bits", "4",
                                                    "--group-size", "64", "--sym"], "transformers", "lossy"),
        # 128 does not divide 576 (hidden) : qckpt must refuse at plan time
        _c("ct-w4g128 (refuse)", "ct128", ["convert", "--to", "compressed-tensors", "--bits", "4",
                                           "--group-size", "128"], None, "refuse", refuse_match=["128", "576"]),
        _c("ct-w4g128-sym (refuse)", "ct128_sym", ["convert", "--to", "compressed-tensors", "--bits", "4",
                                                   "--group-size", "128", "--sym"], None, "refuse",
           refuse_match=["128", "576"]),
    ]
    return cases


# MiniLM samples (relative to sample_checkpoints/) and the layer decoder of each target format.
MINILM_SAMPLES = [
    "gptq_w4_g128_sym", "gptq_w4_gchan_sym", "awq_gemm_w4_g128_zp",
    "ct_pack_w4a16_channel_sym", "ct_pack_w4a16_group128_asym", "ct_pack_w4a16_group128_sym",
    "ct_pack_w8a16_channel_sym", "mlx_affine_g32_b8", "mlx_affine_g64_b4",
    "gguf/minilm_gguf_F16.gguf", "gguf/minilm_gguf_Q4_0.gguf", "gguf/minilm_gguf_Q4_1.gguf",
    "gguf/minilm_gguf_Q5_0.gguf", "gguf/minilm_gguf_Q8_0.gguf", "gguf/minilm_llamacpp_Q4_K_M.gguf",
    "gguf/minilm_llamacpp_Q6_K.gguf", "bnb_int8", "bnb_nf4_bs64",
    "ct_fp8_channel_smollm2", "deepseek_fp8_block_smollm2tiny",
]
# The FP8 samples also go to the FP8 targets (exact): the DeepSeek-style "fp8" layout (decoded by
# transformers' FineGrainedFP8 dequantize) and ModelOpt (no ModelOpt library in the venv: SKIP).
FP8_SAMPLES = {"ct_fp8_channel_smollm2", "deepseek_fp8_block_smollm2tiny"}
FP8_TARGETS = {
    "fp8": ("fp8", "", "layers_fp8", None),
    "modelopt": ("modelopt", "", "layers_modelopt", None),
}
QUICK_SAMPLES = ["gptq_w4_g128_sym", "ct_pack_w4a16_group128_asym", "gguf/minilm_gguf_Q4_1.gguf"]

TARGETS = {
    # target: (qckpt --to, output name suffix, worker action, requantize options)
    # --scale-dtype f16 where the target stores only float16 scales: without it qckpt keeps a float32
    # source's scale dtype and refuses (K-quant / bitsandbytes sources)
    "gptq": ("gptq", "", "layers_gptq", ["--bits", "4", "--group-size", "32", "--asym", "--scale-dtype", "f16"]),
    "awq": ("awq", "", "layers_awq", ["--bits", "4", "--group-size", "64", "--asym", "--scale-dtype", "f16"]),
    "compressed-tensors": ("compressed-tensors", "", "layers_compressed_tensors",
                           ["--bits", "8", "--per-channel", "--sym"]),
    # f16 scales: MLX computes scale * q + bias in the scales' dtype (a bf16 source's scales would stay bf16)
    "mlx": ("mlx", "", "layers_mlx", ["--bits", "4", "--group-size", "64", "--scale-dtype", "f16"]),
    "gguf": ("gguf", ".gguf", "layers_gguf", ["--bits", "8", "--group-size", "32", "--sym", "--scale-dtype", "f16"]),
}
# Every target also gets this one requantize even where the exact repack is accepted.
REQUANT_SAMPLE = "gptq_w4_g128_sym"


def slug(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in s)


def minilm_cases(quick: bool) -> list[dict]:
    out = []
    for sample in (QUICK_SAMPLES if quick else MINILM_SAMPLES):
        targets = dict(TARGETS, **(FP8_TARGETS if sample in FP8_SAMPLES else {}))
        for target, (to, suffix, action, requant) in targets.items():
            base = f"{slug(sample)}__{slug(target)}"
            out.append({"id": f"{sample} -> {target}", "group": "minilm", "sample": sample, "target": target,
                        "kind": "exact", "cmd": ["convert", "--to", to], "out": base + suffix,
                        "loader": action, "requant_if_refused": requant})
            if sample == REQUANT_SAMPLE:
                out.append({"id": f"{sample} -> {target} (requantize)", "group": "minilm", "sample": sample,
                            "target": target, "kind": "requantize", "cmd": ["convert", "--to", to] + requant,
                            "out": base + "__rq" + suffix, "loader": action})
    return out


# ------------------------------------------------------------------------------------------ fp8
# Loadable FP8 sources (relative to shared/real/; FP_MANIFEST.json): the producing tool's own decode
# (reference_dequant.safetensors) of the quantized weights + the source's dense tensors make the
# reference model.
FP8_SOURCES = {
    "deepseek_fp8_block_smollm2tiny": {
        "written_by": "auto-round 0.15.1 quantize_and_save(format='fp8'): DeepSeek-style block FP8, "
                      "128x128 E4M3, BF16 weight_scale_inv, partial 64-wide edge blocks",
        "reference": "reference_dequant.safetensors",
    },
}
# Token ids (vocabulary 256, no tokenizer shipped): fixed, every id < 256.
FP8_PROMPTS = [
    {"name": "ids-a", "ids": [1, 45, 78, 120, 5, 200, 17, 99, 33, 250, 8, 64]},
    {"name": "ids-b", "ids": [1, 3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 83, 27, 95, 28]},
    {"name": "ids-c", "ids": [2, 255, 128, 64, 32, 16, 8, 4]},
]
FP8_GREEDY_TOKENS = 12
# transformers 5.24's FineGrainedFP8 dequantize (the CPU path) needs every dimension to be a multiple of
# the block size (FP_MANIFEST.json failed_or_not_produced): a known limit of the loader, not of the file.
TF_FP8_PARTIAL_BLOCKS = ["not divisible by scale grid"]
# (the message is in transformers' CONVERSION report, printed before the RuntimeError it raises)


# Lossy rows: top-1 agreement with the reference over every position of the id prompts (a 1-layer model
# on token ids has no ' Paris' to keep; a random-initialised or garbage layer agrees on a few %).
FP8_LOSSY_TOP1_PCT = 90.0


def _f(*args, **kw):
    return _case("fp8", FP8_LOSSY_TOP1_PCT, *args, **kw)


def fp8_cases() -> list[dict]:
    """Cases run on every FP8_SOURCES entry (cmd / loader / expect as in smollm2_cases; "tool_limit":
    the loader is expected to refuse with one of ``limit_match``, a documented limit of that loader)."""
    G32 = ["--group-size", "32"]
    return [
        _f("dequantize-bf16/transformers", "deq_bf16", ["dequantize", "--dtype", "bf16"], "transformers", "exact",
           quick=True),
        _f("dequantize-f32/transformers", "deq_f32", ["dequantize", "--dtype", "f32"], "transformers", "exact",
           dequant_dtype="bfloat16"),
        # the exact repack declares the source's dynamic FP8 activations (W8A8, as DeepSeek computes): the
        # runtime quantizes activations, so logits move by that (the weights' exactness: the layer group)
        _f("compressed-tensors W8A8/transformers", "ct", ["convert", "--to", "compressed-tensors"], "transformers",
           "lossy", quick=True),
        _f("fp8/transformers", "fp8", ["convert", "--to", "fp8"], "transformers", "tool_limit",
           limit_match=TF_FP8_PARTIAL_BLOCKS),
        # the FP8 writers on a file transformers' FP8 loader accepts: the bf16 source (FP_MANIFEST.json
        # fp_sources) quantized by qckpt in 64 x 64 blocks, which tile 576, 192 and 1536
        _f("quantize bf16 -> fp8 64x64/transformers", "q_fp8_64", ["quantize", "--fp8", "e4m3", "--block", "64x64",
                                                                 "--to", "fp8"], "transformers", "lossy",
           source="fp_sources/smollm2_tiny1L"),
        _f("quantize bf16 -> ct fp8 channel/transformers", "q_ct_fp8", ["quantize", "--fp8", "e4m3",
                                                                       "--per-channel", "--to",
                                                                       "compressed-tensors"],
           "transformers", "lossy", source="fp_sources/smollm2_tiny1L"),
        _f("mlx-mxfp8 (refuse: scales not powers of two)", "mlx_mx", ["convert", "--to", "mlx"], None, "refuse",
           refuse_match=["power"]),
        _f("mlx-w8g32/mlx_lm", "mlx8", ["convert", "--to", "mlx", "--bits", "8"] + G32, "mlx_lm", "lossy"),
        _f("mlx-w4g32/mlx_lm", "mlx4", ["convert", "--to", "mlx", "--bits", "4"] + G32, "mlx_lm", "lossy"),
        # transformers' GGUF loader reads the model from the file (vocab_size, rope freq_base); a source without a
        # tokenizer gives tokenizer.ggml.model 'none' (llama.cpp's model without a vocabulary; the report warns)
        _f("gguf-Q8_0/transformers-gguf", "q8_0.gguf", ["convert", "--to", "gguf", "--bits", "8", "--sym"] + G32,
           "transformers", "lossy"),
        _f("gptq-w4g32-asym/transformers", "gptq", ["convert", "--to", "gptq", "--bits", "4", "--asym"] + G32,
           "transformers", "lossy"),
        _f("awq-w4g32/transformers", "awq", ["convert", "--to", "awq", "--bits", "4"] + G32, "transformers",
           "lossy"),
        _f("ct-w8-channel-sym/transformers", "ct8", ["convert", "--to", "compressed-tensors", "--bits", "8",
                                                     "--per-channel", "--sym"], "transformers", "lossy"),
        _f("ct-w4g32-sym/transformers", "ct4", ["convert", "--to", "compressed-tensors", "--bits", "4", "--sym"]
           + G32, "transformers", "lossy"),
    ]


# ------------------------------------------------------------------------------------------ fp4
# The real FP4 checkpoints (relative to sample_checkpoints/): each with the producing tool's own decode
# (reference_dequant.safetensors). The two compressed-tensors files are llm-compressor model-free
# subsets (layer-0 q/k/v/down only): the group completes them into a loadable 1-layer model with the
# bf16 source's other tensors (FP4_BF16: the source every FP4 file was quantized from), their
# quantized tensors byte for byte, the dense Linear modules listed in the config's `ignore`.
FP4_SOURCES = {
    "ct_mxfp4_smollm2": {
        "written_by": "llm-compressor 0.14.0.1 model_free_ptq(scheme='MXFP4A16'), compressed-tensors 0.19.0: "
                      "E2M1 group 32, E8M0 scales; layer-0 q/k/v/down subset",
        "kind": "ct", "scheme": "mxfp4",
    },
    "ct_nvfp4_smollm2": {
        "written_by": "llm-compressor 0.14.0.1 model_free_ptq(scheme='NVFP4A16'), compressed-tensors 0.19.0: "
                      "E2M1 group 16, E4M3 scales, F32 weight_global_scale (a divisor); layer-0 q/k/v/down subset",
        "kind": "ct", "scheme": "nvfp4",
    },
    "modelopt_nvfp4_smollm2tiny": {
        "written_by": "nvidia-modelopt 0.47.0 mtq.quantize(NVFP4_DEFAULT_CFG) + export_hf_checkpoint: E2M1 group "
                      "16, E4M3 scales, F32 weight_scale_2 (a multiplier), input_scale (W4A4); the whole 1-layer model",
        "kind": "modelopt", "scheme": "nvfp4",
    },
}
FP4_REFERENCE = "reference_dequant.safetensors"
# The bf16 source (shared/real/fp_sources/, FP_MANIFEST.json fp_sources); a byte-identical copy ships in
# interop/data/ (PROVENANCE.json there) for a run without shared/.
FP4_BF16 = "smollm2_tiny1L"
# Lossy rows: top-1 agreement with the reference over every position of the id prompts (38). FP4 loses
# more than FP8 (the fp8 group's 90 %): the real tool's own NVFP4 of this model (ModelOpt 0.47,
# modelopt_nvfp4_smollm2tiny's reference_dequant) agrees with its bf16 source at 34 of 38 positions
# (89.5 %, measured 2026-12-02 from the two cached references); 80 % leaves 3 more positions for a
# requantization of an FP4 source, and is far above a wrong tensor (GARBAGE < 50 %).
FP4_LOSSY_TOP1_PCT = 80.0
# --quick (CI): the quick cases run on this source only (one reference, two loads: ~25 s; with the
# dequantize and quantize rows, three references and four loads took 78 s, too slow for CI).
FP4_QUICK_SOURCES = ["ct_nvfp4_smollm2"]
# What qckpt says when it declines a write the target cannot hold (exact repack) or has no writer
# for yet (MLX / GGUF FP4, on other branches): REFUSED, not a failure; once the writer lands the same
# row loads the output and is judged.
FP4_REFUSAL = ["not representable", "not yet writable", "input_scale", "has no float32 divisor",
               # a global scale with no exact equivalent in the target's convention (global_scales.py)
               "has no float32 multiplier", "has no float32 amax"]
# mlx-lm 0.32.2 passes an nvfp4 global_scale to mlx 0.32.4's nn.Linear.to_quantized, which has no such
# argument: a global scale loads only on expert (switch) layers.
MLX_DENSE_GLOBAL_SCALE = ["unexpected keyword argument 'global_scale'"]
# transformers 5.24's GGUF loader treats llama.cpp's NVFP4 F32 [1] `<name>.scale` tensor (the second-level
# scale, conversion/base.py _write_scale_tensor) as a weight to reverse-permute and fails.
TF_GGUF_NVFP4_SCALE = ["cannot reshape array of size 1 into shape"]
# transformers 5.24 + compressed-tensors 0.20.1 decompress FP4 weights to bfloat16 whatever dtype the
# model is loaded in: a float32 load fails at the first decompressed Linear.
TF_CT_FP4_FLOAT32 = ["expected m1 and m2 to have the same dtype"]
# transformers 5.24 has no ModelOpt reader: the packed [out, in/2] weights fail the model's shapes.
TF_MODELOPT = ["size mismatch"]


def _p(*args, **kw):
    return _case("fp4", FP4_LOSSY_TOP1_PCT, *args, **kw)


def fp4_cases() -> list[dict]:
    """Cases run on every FP4_SOURCES entry (``kinds``: only on sources of those kinds); ``cmd`` None: the
    source itself; ``dtype``: the dtype transformers loads in (the reference of that dtype is used);
    ``accept_refusal``: a plan-time refusal naming one of these is REFUSED (see FP4_REFUSAL)."""
    G32S = ["--group-size", "32", "--sym"]
    bf16 = {"dtype": "bfloat16"}
    return [
        _p("source/transformers (float32)", None, None, "transformers", "tool_limit", kinds=["ct"],
           limit_match=TF_CT_FP4_FLOAT32),
        _p("source/transformers (bf16)", None, None, "transformers", "exact", kinds=["ct"], quick=True, **bf16),
        _p("source/transformers", None, None, "transformers", "tool_limit", kinds=["modelopt"],
           limit_match=TF_MODELOPT),
        _p("dequantize-bf16/transformers", "deq_bf16", ["dequantize", "--dtype", "bf16"], "transformers", "exact"),
        _p("dequantize-f32/transformers", "deq_f32", ["dequantize", "--dtype", "f32"], "transformers", "exact",
           dequant_dtype="bfloat16"),
        _p("compressed-tensors/transformers (bf16)", "ct", ["convert", "--to", "compressed-tensors"], "transformers",
           "exact", quick=True, accept_refusal=FP4_REFUSAL, **bf16),
        _p("modelopt/transformers", "modelopt", ["convert", "--to", "modelopt"], "transformers", "tool_limit",
           accept_refusal=FP4_REFUSAL, limit_match=TF_MODELOPT),
        # the FP4 writers of other branches: REFUSED today (no writer), judged once they land (MLX runs a bf16
        # source's dense tensors in bf16: the bf16 tolerance, 4 units in the last place of the largest logit)
        _p("mlx (FP4)/mlx_lm", "mlx", ["convert", "--to", "mlx"], "mlx_lm", "exact", accept_refusal=FP4_REFUSAL,
           limit_match=MLX_DENSE_GLOBAL_SCALE, dequant_dtype="bfloat16"),
        # transformers' GGUF loader decodes to float32 (gguf-py 0.19 has MXFP4 / NVFP4 dequantize): the bf16-
        # rounded reference's tolerance, as dequantize-f32; llama.cpp quantizes activations: lossy
        _p("gguf (FP4)/transformers-gguf", "fp4.gguf", ["convert", "--to", "gguf"], "transformers", "exact",
           accept_refusal=FP4_REFUSAL, limit_match=TF_GGUF_NVFP4_SCALE, dequant_dtype="bfloat16"),
        _p("gguf (FP4)/llama.cpp", "fp4.gguf", ["convert", "--to", "gguf"], "llama_cpp", "lossy",
           accept_refusal=FP4_REFUSAL, needs="llama_cpp"),
        # llama.cpp's own decode of the same file (ggml's C to_float x the <name>.scale it multiplies by): every
        # weight must equal qckpt's float32 decode of the source (llama.cpp's logits differ by its Q8 activations)
        _p("gguf (FP4)/ggml decode", "fp4.gguf", ["convert", "--to", "gguf"], "ggml_decode", "decode_exact",
           accept_refusal=FP4_REFUSAL, needs="llama_cpp"),
        # llama.cpp's own convert_hf_to_gguf.py of the ModelOpt source (it reads ModelOpt NVFP4 natively): every
        # tensor byte-identical; it also writes each <name>.input_scale, which qckpt leaves out (llama.cpp loads
        # them and never computes with them; transformers' GGUF loader fails on them)
        _p("gguf (FP4)/llama.cpp convert_hf_to_gguf", "fp4.gguf", ["convert", "--to", "gguf"], "llama_convert",
           "same_as_tool", kinds=["modelopt"], needs="llama_cpp_src", tool_extra_ok=[".input_scale"]),
        _p("gguf-Q8_0/transformers-gguf", "q8_0.gguf", ["convert", "--to", "gguf", "--bits", "8"] + G32S,
           "transformers", "lossy"),
        _p("gguf-Q8_0/llama.cpp", "q8_0.gguf", ["convert", "--to", "gguf", "--bits", "8"] + G32S, "llama_cpp",
           "lossy", needs="llama_cpp"),
        _p("gguf-Q4_0/transformers-gguf", "q4_0.gguf", ["convert", "--to", "gguf", "--bits", "4"] + G32S,
           "transformers", "lossy"),
        _p("gguf-Q4_0/llama.cpp", "q4_0.gguf", ["convert", "--to", "gguf", "--bits", "4"] + G32S, "llama_cpp",
           "lossy", needs="llama_cpp"),
    ]


def fp4_quantize_cases() -> list[dict]:
    """`qckpt quantize --fp4` of the bf16 source FP4_BF16 into each target; reference: transformers on
    that source (float32 / bfloat16)."""
    out = []
    for fp in ("mxfp4", "nvfp4"):
        q = ["quantize", "--fp4", fp, "--to"]
        out += [
            _p(f"quantize {fp} -> compressed-tensors/transformers (bf16)", f"q_{fp}_ct", q + ["compressed-tensors"],
               "transformers", "lossy", dtype="bfloat16"),
            _p(f"quantize {fp} -> modelopt/transformers", f"q_{fp}_modelopt", q + ["modelopt"], "transformers",
               "tool_limit", accept_refusal=FP4_REFUSAL, limit_match=TF_MODELOPT),
            _p(f"quantize {fp} -> mlx/mlx_lm", f"q_{fp}_mlx", q + ["mlx"], "mlx_lm", "lossy",
               accept_refusal=FP4_REFUSAL),
            _p(f"quantize {fp} -> gguf/transformers-gguf", f"q_{fp}.gguf", q + ["gguf"], "transformers", "lossy",
               accept_refusal=FP4_REFUSAL),
            _p(f"quantize {fp} -> gguf/llama.cpp", f"q_{fp}.gguf", q + ["gguf"], "llama_cpp", "lossy",
               accept_refusal=FP4_REFUSAL, needs="llama_cpp"),
            # llama.cpp's decode of the written file equals qckpt's float32 decode of it
            _p(f"quantize {fp} -> gguf/ggml decode", f"q_{fp}.gguf", q + ["gguf"], "ggml_decode", "decode_exact",
               accept_refusal=FP4_REFUSAL, needs="llama_cpp"),
        ]
    return out
