"""Every real checkpoint in sample_checkpoints/ validates clean: no finding at all, with and without the reference."""

import ml_dtypes  # noqa: F401  (bfloat16 references load as numpy arrays)
import pytest
from safetensors.numpy import load_file

from converter.validate import validate
from tests.conftest import SAMPLES
from tests.validate.helpers import FP16

DIRS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir() and p.name != "gguf")
GGUF = sorted(p.name for p in (SAMPLES / "gguf").glob("*.gguf"))
#: the samples of MiniLM, the model of the float reference FP16 (the FP8 sample is a SmolLM2 layer)
MINILM = [d for d in DIRS if d != "deepseek_fp8_block_smollm2tiny"]


@pytest.mark.parametrize("name", DIRS)
def test_real_sample_is_clean(name):
    rep = validate(SAMPLES / name)
    assert rep.findings == [] and rep.exit_code == 0
    assert rep.tensors, "every quantized tensor was checked"
    for stats in rep.tensors.values():
        assert stats["saturation"]["declared"] == 1.0


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
    rep = validate(SAMPLES / name, reference=SAMPLES / name / "reference_dequant.safetensors")
    assert rep.exit_code == 0
    assert not [f for f in rep.findings if f.severity != "warning" or f.code != "reference-missing"]
    dtypes = {v.dtype.name for v in load_file(str(SAMPLES / name / "reference_dequant.safetensors")).values()}
    # the tool decoded two of the weights, in fp16 (rounding: 2^-11 relative), or bf16 (2^-8: auto-round's fp8)
    limit = 4e-3 if "bfloat16" in dtypes else 1e-3
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
