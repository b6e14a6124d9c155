"""qckpt's own correct outputs validate without an error: every shipped sample converted to every
writable target that accepts the exact repack, and a few requantizations.

Which pairs repack is stated (with reasons) in tests/test_repack_matrix.py; each pair it expects to
succeed must succeed here too. The GGUF samples (llama.cpp Q4_0/Q4_1/Q5_0/Q8_0/K-quants, F16) are
converted wherever the target accepts them. The outputs are correct by construction (every exact
repack is proven by read-back in ``convert_exact``), so any error finding is a validator bug.

No warning either (``--strict`` passes). Two findings stay ``info``, each for a stated reason:
- ``scale-negative``: GGUF's ``d`` is negative where a block's largest magnitude is negative, and
  MLX scales may be negative; an exact repack keeps the sign, and every loader decodes
  ``s * (q - z)`` (GPTQModel ``scales[g_idx] * (weight - zeros[g_idx]))``) either way;
- ``scale-zero``: llama.cpp quantizes one K-quant sub-block scale of MiniLM's output.dense to 0
  (tests/validate/test_clean.py); repacked without its super-block it is a plain zero scale.
"""

from __future__ import annotations

import pytest

from converter.errors import NotRepresentableError
from converter.formats import registry
from converter.ops.convert import convert_exact
from converter.ops.requantize_model import requantize_model
from converter.quant.requant import Target
from converter.validate import validate
from tests.conftest import SAMPLES
from tests.test_repack_matrix import EXPECTED, NO_ARCH, REFUSE

SOURCES = sorted(p.name for p in SAMPLES.iterdir()
                 if p.name not in ("MANIFEST.json", "README.md", "SHA256SUMS", "gguf")) \
    + sorted(f"gguf/{p.name}" for p in (SAMPLES / "gguf").glob("*.gguf"))
TARGETS = registry.writable()
SUFFIX = {"native": ".safetensors", "plain": ".safetensors", "gguf": ".gguf"}


def _dst(tmp_path, to):
    return tmp_path / f"out-{to}{SUFFIX.get(to, '')}"


def _assert_clean(dst):
    rep = validate(dst)
    errors = [(f.code, f.tensor, f.message) for f in rep.findings if f.severity == "error"]
    warnings = [(f.code, f.tensor, f.message) for f in rep.findings if f.severity == "warning"]
    assert errors == [] and warnings == [] and rep.exit_code == 0
    assert validate(dst, strict=True).exit_code == 0
    return rep


#: every pair but those the repack matrix expects to be refused (those write nothing)
PAIRS = [(s, t) for s in SOURCES for t in TARGETS if EXPECTED.get((s, t)) not in (REFUSE, NO_ARCH)]
#: sources without quantized tensors (their outputs hold floats only)
DENSE = ("minilm_fp16.safetensors", "gguf/minilm_gguf_F16.gguf")


@pytest.mark.parametrize("source,to", PAIRS)
def test_exact_repack_validates_without_errors(tmp_path, source, to):
    dst = _dst(tmp_path, to)
    try:
        convert_exact(SAMPLES / source, dst, to)
    except NotRepresentableError:
        if (source, to) in EXPECTED:  # the repack matrix says this pair converts
            raise
        assert source.startswith("gguf/") and not dst.exists()
        return  # a GGUF sample the target cannot hold exactly: nothing written, nothing to validate
    rep = _assert_clean(dst)
    if to != "plain" and source not in DENSE:
        assert rep.tensors, "the quantized tensors were checked"


def test_the_matrix_covers_every_sample_and_target():
    assert {s for s, _ in PAIRS} == set(SOURCES) and {t for _, t in PAIRS} == set(TARGETS)
    assert sum(1 for p in PAIRS if p in EXPECTED) >= 40


# requantizations, including the issue's own cases: a float-min (Q4_1) source to integer zero points
# in groups of 32, and to compressed-tensors 8-bit per channel; a symmetric group-128 GPTQ to AWQ asym
REQUANT = [
    ("gguf/minilm_gguf_Q4_1.gguf", "gptq", Target(bits=4, granularity="group", group_size=32, symmetric=False)),
    ("gguf/minilm_gguf_Q4_1.gguf", "awq", Target(bits=4, granularity="group", group_size=32, symmetric=False)),
    ("gguf/minilm_gguf_Q4_1.gguf", "compressed-tensors", Target(bits=4, granularity="group", group_size=64,
                                                               symmetric=True)),
    ("gguf/minilm_gguf_Q4_1.gguf", "compressed-tensors", Target(bits=8, granularity="channel", symmetric=True)),
    ("gptq_w4_g128_sym", "awq", Target(bits=4, granularity="group", group_size=32, symmetric=False)),
    ("mlx_affine_g64_b4", "mlx", Target(bits=4, granularity="group", group_size=32)),
]


@pytest.mark.parametrize("source,to,target", REQUANT, ids=[f"{s}->{t}-{i}" for i, (s, t, _) in enumerate(REQUANT)])
def test_requantized_output_validates_without_errors(tmp_path, source, to, target):
    dst = _dst(tmp_path, to)
    requantize_model(SAMPLES / source, dst, target, to=to)
    rep = _assert_clean(dst)
    assert rep.tensors
