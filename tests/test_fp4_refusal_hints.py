"""Issue 15 (what a new user hit): every FP4 refusal's hint names routes that work. For each real FP4 sample and
each FP4-holding target that refuses it, the routes the hint suggests (an exact ``--to T``, an FP8 requantization
with the granularities listed, ``--quant-type NVFP4``, an affine ``--bits 4 --group-size 32``) are followed and
must convert (exit 0), not end in another refusal."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from converter.cli import main
from tests.conftest import SAMPLES

FP4_SAMPLES = ("ct_nvfp4_smollm2", "ct_mxfp4_smollm2", "modelopt_nvfp4_smollm2tiny", "mlx_mxfp4_smollm2tiny",
               "mlx_nvfp4_global_smollm2", "mlx_nvfp4_smollm2tiny")
FP4_TARGETS = ("compressed-tensors", "modelopt", "mlx", "gguf")
#: refusals of these samples by hand: the global-scale directions (divisor 936.0 has no exact multiplier or amax,
#: ModelOpt's multiplier no exact divisor, one MLX amax 4.96875 no exact divisor), ModelOpt's W4A4 input_scale,
#: MXFP4's E8M0 scales in ModelOpt
REFUSED = {("ct_nvfp4_smollm2", "modelopt"), ("ct_nvfp4_smollm2", "mlx"), ("ct_nvfp4_smollm2", "gguf"),
           ("ct_mxfp4_smollm2", "modelopt"), ("modelopt_nvfp4_smollm2tiny", "compressed-tensors"),
           ("mlx_mxfp4_smollm2tiny", "modelopt"), ("mlx_nvfp4_global_smollm2", "compressed-tensors"),
           ("mlx_nvfp4_global_smollm2", "modelopt"), ("mlx_nvfp4_smollm2tiny", "modelopt")}


def _convert(src, dst, *args):
    return CliRunner().invoke(main, ["convert", str(src), str(dst), *args, "--json", "--quiet"])


def routes(hint: str, refused_target: str) -> list[list[str]]:
    """The command-line routes a hint names (see the module docstring)."""
    out = []
    for clause in hint.split(";"):
        if "keeps the codes" in clause:
            out += [["--to", t] for t in re.findall(r"--to ([\w-]+)", clause)]
            continue
        if "--fp8 e4m3" in clause:
            m = re.search(r"--to ([\w-]+) --fp8", clause)
            to = m.group(1) if m else refused_target
            out += [["--to", to, "--fp8", "e4m3", *g.split()]
                    for g in re.findall(r"--block \d+x\d+|--per-channel|--per-tensor", clause)]
        if "--quant-type NVFP4" in clause:
            out.append(["--to", "gguf", "--quant-type", "NVFP4"])
        if "--bits 4 --group-size 32" in clause:
            out.append(["--to", refused_target, "--bits", "4", "--group-size", "32"])
    return out


@pytest.mark.parametrize("sample", FP4_SAMPLES)
@pytest.mark.parametrize("target", FP4_TARGETS)
def test_a_refusal_hint_names_routes_that_work(sample, target, tmp_path):
    src = SAMPLES / sample
    r = _convert(src, tmp_path / ("out.gguf" if target == "gguf" else "out"), "--to", target)
    if (sample, target) not in REFUSED:
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 3, r.output
    hint = json.loads(r.output)["hint"]
    assert " a amax" not in hint and "requantize options" not in hint  # the slips the new user hit
    found = routes(hint, target)
    assert found, hint
    for i, route in enumerate(found):
        to = route[route.index("--to") + 1]
        dst = tmp_path / (f"route{i}.gguf" if to == "gguf" else f"route{i}")
        done = _convert(src, dst, *route)
        assert done.exit_code == 0, (hint, route, done.output[:400])


def test_per_tensor_fp8_is_not_offered_for_modelopt_without_an_activation_scale(tmp_path):
    """ModelOpt per-tensor FP8 is W8A8 and needs the source's input_scale: the MXFP4 samples have none, so the
    hint's one complete command line takes 128 x 128 blocks, never per tensor (issue 18 item 9: one command
    that works); the ModelOpt NVFP4 sample (with input_scale) converts per tensor."""
    r = _convert(SAMPLES / "ct_mxfp4_smollm2", tmp_path / "o", "--to", "modelopt")
    hint = json.loads(r.output)["hint"]
    assert "--to modelopt --fp8 e4m3 --block 128x128" in hint and "--per-tensor" not in hint
    refused = _convert(SAMPLES / "ct_mxfp4_smollm2", tmp_path / "p", "--to", "modelopt", "--fp8", "e4m3",
                       "--per-tensor")
    assert refused.exit_code == 3 and "input_scale" in refused.output
    ok = _convert(SAMPLES / "modelopt_nvfp4_smollm2tiny", tmp_path / "q", "--to", "modelopt", "--fp8", "e4m3",
                  "--per-tensor")
    assert ok.exit_code == 0, ok.output


def test_quantize_refusal_hint_names_routes_that_work(tmp_path):
    """``qckpt quantize --fp4 nvfp4 --to modelopt`` (weight-only: no input_scale) is refused; the routes its hint
    names, as quantize options (``--fp8 e4m3`` with the granularities listed, the exact ``--to`` targets with the
    same ``--fp4 nvfp4``), all write (the real SmolLM2 layer-0 bf16 fixture, tests/data/fp4)."""
    from tests.ops.test_quantize_fp4_targets import _source
    from tests.kernels.test_fp4_rtn import QKV, load_fixture

    src = _source(tmp_path / "src", load_fixture(), QKV)
    r = CliRunner().invoke(main, ["quantize", str(src), str(tmp_path / "o"), "--fp4", "nvfp4", "--to", "modelopt",
                                  "--json", "--quiet"])
    assert r.exit_code == 3, r.output
    hint = json.loads(r.output)["hint"]
    found = routes(hint, "modelopt")
    assert ["--to", "modelopt", "--fp8", "e4m3", "--per-channel"] in found and ["--to", "compressed-tensors"] in found
    for i, route in enumerate(found):
        to = route[route.index("--to") + 1]
        extra = [] if "--fp8" in route else ["--fp4", "nvfp4"]
        dst = tmp_path / (f"q{i}.gguf" if to == "gguf" else f"q{i}")
        done = CliRunner().invoke(main, ["quantize", str(src), str(dst), *route, *extra, "--json", "--quiet"])
        assert done.exit_code == 0, (hint, route, done.output[:400])
