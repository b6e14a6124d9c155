"""Every real checkpoint in sample_checkpoints/ validates clean: no finding at all, with and without the reference
(FP8 samples: only the info findings their layout implies, listed in FP8_INFO)."""

import ml_dtypes  # noqa: F401  (bfloat16 references load as numpy arrays)
import pytest
import numpy as np
from safetensors.numpy import load_file

from converter.validate import validate
from tests.conftest import SAMPLES
from tests.validate.helpers import FP16

DIRS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and p.name != "gguf")
GGUF = sorted(p.name for p in (SAMPLES / "gguf").glob("*.gguf"))
#: Samples made from MiniLM (FP16 is their float source); the FP8 samples come from SmolLM2 weights.
MINILM = [d for d in DIRS if "smollm2" not in d]
_KV = ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight")
_ALL7 = tuple(f"model.layers.0.{m}.weight" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                     "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
                                                     "mlp.down_proj"))
#: The info findings a correct FP8 sample must give, and no others: ``block-tail`` for every 128 x 128
#: tensor with a partial edge block (192 and 576 are not multiples of 128), ``activation-scale`` where
#: static input scales are stored (ModelOpt FP8 per-tensor: k/v_proj of the subset).
FP8_INFO = {
    "ct_fp8_channel_smollm2": set(),
    "modelopt_fp8_smollm2tiny": {("activation-scale", None)},
    "modelopt_fp8_pc_pt_smollm2tiny": set(),
    "modelopt_fp8_pb_wo_smollm2tiny": {("block-tail", t) for t in _KV},
    "deepseek_fp8_block_smollm2tiny": {("block-tail", t) for t in _ALL7},
    "modelopt_nvfp4_smollm2tiny": {("activation-scale", None)},  # input_scale of every NVFP4 layer (W4A4)
    # mx.quantize nvfp4 (no global scale) stores amax / 6 as E4M3: small groups get subnormal scales
    # routinely (v_proj: 2460 of 6912, the fraction FP_MANIFEST.json records for mx's own output), info only
    "mlx_nvfp4_smollm2tiny": {("scale-subnormal", f"model.{m}.weight") for m in (
        "embed_tokens", "layers.0.mlp.down_proj", "layers.0.self_attn.o_proj", "layers.0.self_attn.v_proj")},
}

def _expected_info(name):
    return FP8_INFO.get(name, set())


@pytest.mark.parametrize("name", DIRS)
def test_real_sample_is_clean(name):
    rep = validate(SAMPLES / name)
    assert {(f.code, f.tensor) for f in rep.findings} == _expected_info(name) and rep.exit_code == 0
    assert all(f.severity == "info" for f in rep.findings)
    assert rep.tensors, "every quantized tensor was checked"
    for stats in rep.tensors.values():
        # MXFP4: compressed-tensors rounds the E8M0 exponent of amax down (round_to_power_2), so about half
        # of the groups top out at 4 instead of 6 (FP_MANIFEST quirks: 0.47 of them saturate on this sample;
        # a wrong E8M0 bias moves every group by a factor 4, to 0 or to clipping); every other sample fully
        # MLX mxfp4 rounds the exponent up (e = ceil(log2(amax / 6)): amax / 2^e in (3, 6], never clips), so
        # only groups with amax / 2^e > 5 reach code 6: about log(6/5)/log(2) = 0.26 of them (0.20-0.31 here)
        floor = 0.15 if name.startswith("mlx_mxfp4") else 0.4 if "mxfp4" in name else 1.0
        assert stats["saturation"]["declared"] >= floor


@pytest.mark.parametrize("name", MINILM)
def test_real_sample_is_clean_against_the_float_reference(name):
    rep = validate(SAMPLES / name, reference=FP16, strict=True)
    assert rep.findings == [] and rep.exit_code == 0
    for stats in rep.tensors.values():
        r = stats["reference"]
        assert r["rms_steps"] < 0.36 and r["matmul_rel_error"] < 0.2
        # the declared interpretation is the best one by a wide margin
        assert min(r["alternatives_rel_rms"].values()) > 1.5 * r["rel_rms"]


@pytest.mark.parametrize("name", DIRS)
def test_against_the_tools_own_decode_the_error_is_tiny(name):
    ref = SAMPLES / name / "reference_dequant.safetensors"
    rep = validate(SAMPLES / name, reference=ref, strict=True)  # a partial reference is no reason to fail
    assert rep.exit_code == 0, [(f.code, f.tensor) for f in rep.findings if f.severity != "info"]
    missing = {f.tensor for f in rep.findings if f.code == "reference-missing"}
    assert all(f.severity == "info" for f in rep.findings if f.code == "reference-missing")
    assert missing == {n for n in rep.tensors if n not in set(load_file(str(ref)))}
    extra = {(f.code, f.tensor) for f in rep.findings if f.code != "reference-missing"}
    assert extra == _expected_info(name)
    dtypes = {v.dtype.name for v in load_file(str(SAMPLES / name / "reference_dequant.safetensors")).values()}
    # the tool decoded some of the weights: in fp16 (rounding 2^-11 relative), float32, or bf16 (2^-8:
    # compressed-tensors' and auto-round's FP8 decodes), which qckpt's float32 decode does not round
    limit = 2.0 ** -8 if "bfloat16" in dtypes else 1e-3
    for stats in rep.tensors.values():
        if "reference" in stats:
            assert stats["reference"]["rel_rms"] < limit


def test_plain_float_file_is_clean():
    rep = validate(FP16)
    assert rep.format == "plain" and rep.findings == [] and rep.exit_code == 0


@pytest.mark.parametrize("name", GGUF)
def test_real_gguf_is_clean(name):
    rep = validate(SAMPLES / "gguf" / name, reference=FP16, strict=True)
    assert [f for f in rep.findings if f.severity != "info"] == [] and rep.exit_code == 0
    # the only info: llama.cpp K-quants quantize one sub-block scale of the outlier layer to 0
    assert {(f.code, f.tensor) for f in rep.findings} <= {("scale-zero", "encoder.layer.0.output.dense.weight")}


def test_reference_of_another_shape_still_warns(tmp_path):
    """A tensor absent from a partial reference is info; one present under its name in another shape
    (a transposed export) is a warning, which --strict fails."""
    from safetensors.numpy import save_file

    ref = load_file(str(FP16))
    name = "encoder.layer.0.intermediate.dense.weight"  # [1536, 384]
    save_file({name: np.ascontiguousarray(ref[name].T)}, str(tmp_path / "ref.safetensors"))
    rep = validate(SAMPLES / "gptq_w4_g128_sym", reference=tmp_path / "ref.safetensors", strict=True)
    sev = {f.tensor: f.severity for f in rep.findings if f.code == "reference-missing"}
    assert sev.pop(name) == "warning" and set(sev.values()) == {"info"} and rep.exit_code == 1
