"""Issue 18 items 8-9: a refused ``qckpt convert SRC DST --to T`` names ONE complete command line, and that
command line, run as given, succeeds (real samples x every integer-grid target). A requantize that leaves
out an option the target needs gets it filled in and reported (JSON ``filled_in`` and the human output);
an option the target cannot take is refused with a complete command line that changes it.

The expected command lines are derived by hand from each format's rules (GPTQ: 2/3/4/8 bits, fp16 scales,
one bits/group_size per model; AWQ: 4 bits, fp16 scales, one group size; GGUF legacy: 32-blocks, Q4_1 has a
float minimum; compressed-tensors: no float bias, symmetric preferred).
"""

from __future__ import annotations

import json
import re
import shlex

import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.formats.registry import load
from converter.schemas import validate_document
from tests.conftest import SAMPLES

GGUF = SAMPLES / "gguf"
SOURCES = {
    "gguf_q4_k_m": GGUF / "minilm_llamacpp_Q4_K_M.gguf",
    "gguf_q6_k": GGUF / "minilm_llamacpp_Q6_K.gguf",
    "gguf_q4_0": GGUF / "minilm_gguf_Q4_0.gguf",
    "gguf_q4_1": GGUF / "minilm_gguf_Q4_1.gguf",
    "gptq_sym": SAMPLES / "gptq_w4_g128_sym",
    "gptq_asym": None,  # AWQ repacked exactly as GPTQ (fixture below)
    "gguf_q4_k_s": None,  # llama-quantize's Q4_K_S mix of the F16 GGUF (Q5_0, Q5_1, Q4_K; fixture below)
    "awq": SAMPLES / "awq_gemm_w4_g128_zp",
    "ct_asym": SAMPLES / "ct_pack_w4a16_group128_asym",
    "mlx_affine_b8": SAMPLES / "mlx_affine_g32_b8",
    "mlx_affine_b4": SAMPLES / "mlx_affine_g64_b4",
    "mxfp4": SAMPLES / "ct_mxfp4_smollm2",
    "nvfp4": SAMPLES / "ct_nvfp4_smollm2",
    "fp8": SAMPLES / "ct_fp8_channel_smollm2",
    "fp8_block": SAMPLES / "deepseek_fp8_block_smollm2tiny",
    "bnb_nf4": SAMPLES / "bnb_nf4_bs64",
}
TARGETS = ("gptq", "awq", "compressed-tensors", "mlx", "gguf")

#: (source, target) pairs whose hinted command line is refused again for a reason no header shows:
#: the values. None so far; an entry names the source, the target and the substring of that refusal.
VALUE_REFUSALS: dict[tuple[str, str], str] = {}


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Sources made from the samples: GPTQ with integer zero points (AutoAWQ's sample repacked exactly, its
    proof says so) and a Q4_K_S GGUF (qckpt's llama-quantize mix, byte-identical with llama-quantize:
    tests/formats/test_gguf_kquant_convert.py)."""
    root = tmp_path_factory.mktemp("made")
    r = run("convert", SOURCES["awq"], root / "gptq", "--to", "gptq", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["summary"]["quantized"]["exact"] == 7
    r = run("convert", GGUF / "minilm_gguf_F16.gguf", root / "q4_k_s.gguf", "--to", "gguf", "--quant-type", "Q4_K_S")
    assert r.exit_code == 0, r.output
    return {"gptq_asym": root / "gptq", "gguf_q4_k_s": root / "q4_k_s.gguf"}


def _source(name, made):
    return made.get(name) or SOURCES[name]


def hinted_command(hint: str) -> list[str]:
    """The ``qckpt convert ...`` command line of a hint (to its end, or to '; '), without ``qckpt``."""
    m = re.search(r"qckpt convert .*?(?=; |$)", hint or "")
    assert m, f"no command line in the hint: {hint!r}"
    words = shlex.split(m.group(0))
    assert words[:2] == ["qckpt", "convert"]
    return words[1:]


def _dst(tmp_path, to, name="out"):
    return tmp_path / (name + (".gguf" if to == "gguf" else ""))


@pytest.mark.parametrize("to", TARGETS)
@pytest.mark.parametrize("src_name", list(SOURCES))
def test_a_refused_convert_names_a_command_line_that_works(src_name, to, tmp_path, made):
    src, dst = _source(src_name, made), _dst(tmp_path, to)
    r = run("convert", src, dst, "--to", to, "--json")
    doc = json.loads(r.output)
    if r.exit_code == 0:  # an exact repack: nothing to hint
        assert doc["target_format"] == to and load(dst).format == to
        return
    assert r.exit_code == 3 and not dst.exists(), doc
    words = hinted_command(doc["hint"])
    assert words[:3] == ["convert", str(src), str(dst)] and words[3:5] == ["--to", to]
    assert len(words) > 5, "the hint must requantize (an option), not repeat the refused repack"
    again = run(*words)
    if (src_name, to) in VALUE_REFUSALS:
        assert again.exit_code == 3 and VALUE_REFUSALS[(src_name, to)] in again.output
        return
    assert again.exit_code == 0, f"{doc['hint']}\n{again.output}"
    assert load(dst).format == to


# -- the hints themselves, derived from the format rules ----------------------------------------------------
@pytest.mark.parametrize("src_name,to,options", [
    # the Q4_K_S -> GPTQ (three tries before): 5-bit Q5_0 / Q5_1, float minima (Q5_1, Q4_K), F32
    # K-quant scales; every group is 32 already
    ("gguf_q4_k_s", "gptq", ["--bits", "4", "--asym", "--scale-dtype", "f16"]),
    # Q4_K_M holds 4/5/6-bit codes (GPTQ: 2/3/4/8), group 16 and 32 (one group_size), F32 K-quant scales (fp16)
    ("gguf_q4_k_m", "gptq", ["--bits", "4", "--group-size", "32", "--scale-dtype", "f16"]),
    # Q6_K: 6 -> 8 bits (nearest, ties upward); the Q8_0 tensors make two group sizes
    ("gguf_q6_k", "gptq", ["--bits", "8", "--group-size", "32", "--scale-dtype", "f16"]),
    # MLX takes group 32/64/128: only the group-16 Q6_K tensors block, and --group-size 32 fixes them all
    ("gguf_q6_k", "mlx", ["--group-size", "32"]),
    # Q4_1's float minimum: GPTQ / AWQ store integer zero points, compressed-tensors prefers symmetric
    ("gguf_q4_1", "gptq", ["--asym"]),
    ("gguf_q4_1", "compressed-tensors", ["--sym"]),
    # item 8: integer zero points -> GGUF: Q4_1 (float minimum), one option
    ("awq", "gguf", ["--asym"]),
    ("ct_asym", "gguf", ["--asym"]),
    # no 8-bit affine legacy type: Q8_0
    ("mlx_affine_b8", "gguf", ["--sym"]),
    # a codebook source is requantized by --bits (MXFP4: 4; E4M3: 8), with the fp16 scales GPTQ stores
    ("mxfp4", "gptq", ["--bits", "4", "--scale-dtype", "f16"]),
    ("fp8", "gptq", ["--bits", "8", "--scale-dtype", "f16"]),
    ("fp8", "gguf", ["--bits", "8"]),
])
def test_the_hint_collects_every_blocking_option(src_name, to, options, tmp_path, made):
    src, dst = _source(src_name, made), _dst(tmp_path, to)
    doc = json.loads(run("convert", src, dst, "--to", to, "--json").output)
    assert hinted_command(doc["hint"]) == ["convert", str(src), str(dst), "--to", to, *options]


# -- item 8: AWQ -> Q4_1 in one step ------------------------------------------------------------------------
def test_awq_to_q4_1_as_hinted_carries_codes_with_the_minimum_rounded(tmp_path):
    """The hint's 'qckpt convert AWQ OUT.gguf --to gguf --asym' (AWQ's group 128 kept): s*(q - z) -> Q4_1's
    d*q + m with codes and scales carried and m = fp16(-z*s) (by hand below); the report says lossy with the
    measured error (was: a fresh min/max requantization, overall SQNR 49.5 dB; the carry gives 66.7 dB)."""
    src, dst = SOURCES["awq"], tmp_path / "out.gguf"
    r = run("convert", src, dst, "--to", "gguf", "--asym", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "error-report")
    a, back = load(src), load(dst)
    for row in doc["tensors"]:
        assert row["target"]["scheme"] == "uint4 affine(float bias)" and row["route"] == "carried"
        assert row["note"].endswith("rounded to F16") and row["readback_bit_exact"]
        t, q = a[row["name"]], back[row["name"]]
        assert q.group_map.group_size == 32  # Q4_1 blocks repeating each group-128 parameter
        s = np.repeat(t.scales.astype(np.float32), 4, axis=1)
        z = np.repeat(t.zero_points.astype(np.float32), 4, axis=1)
        np.testing.assert_array_equal(q.codes, t.codes)
        np.testing.assert_array_equal(q.scales.astype(np.float32), s)
        np.testing.assert_array_equal(q.zero_points, (-(z * s)).astype(np.float16))
        e = q.dequantize().astype(np.float64) - t.dequantize()
        assert row["result"] == "lossy" and e.any()
        assert row["vs_source"]["max_abs"] == pytest.approx(float(np.abs(e).max()), rel=1e-6)
    assert doc["overall"]["lossy"] == 7 and doc["filled_in"] == []
    assert doc["overall"]["vs_source"]["sqnr_db"] > 60


def test_awq_to_q4_1_at_group_32_is_llama_cpp_s_q4_1(tmp_path):
    """'--bits 4 --group-size 32 --asym' asks for Q4_1 as llama.cpp defines it: its quantizer's bytes
    (tests/formats/test_gguf_requant.py checks them against gguf.quants.quantize), reported lossy."""
    r = run("convert", SOURCES["awq"], tmp_path / "out.gguf", "--to", "gguf", "--bits", "4", "--group-size", "32",
            "--asym", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert {(t["route"], t["result"], t["target"]["quantizer"].split(":")[0]) for t in doc["tensors"]} == \
        {("requantized", "lossy", "gguf Q4_1")}


# -- item 9: options filled in and reported, or one command line that changes the user's ---------------------
def test_requantize_fills_in_what_the_target_needs_and_reports_it(tmp_path):
    """Q4_K_M -> GPTQ with only --bits 4: the group size (one per model) and the fp16 scales are filled in."""
    src, dst = SOURCES["gguf_q4_k_m"], tmp_path / "out"
    r = run("convert", src, dst, "--to", "gptq", "--bits", "4", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    validate_document(doc, "error-report")
    filled = {f["field"]: f for f in doc["filled_in"]}
    assert {f: v["option"] for f, v in filled.items()} == {"granularity": "--group-size 32",
                                                           "scale_dtype": "--scale-dtype f16"}
    assert "one bits/group_size" in filled["granularity"]["reason"]
    assert "fp16 scales" in filled["scale_dtype"]["reason"] or "F16" in filled["scale_dtype"]["reason"]
    assert doc["target"] == {"bits": 4, "granularity": "group", "group_size": 32, "symmetric": None,
                                  "scale_dtype": "F16", "scale_search": "none"}
    q = load(dst)
    assert {(q.spec(n).scheme.bits, q.spec(n).group_map.group_size, q.spec(n).scheme.scale_dtype)
            for n in q.quantized_names()} == {(4, 32, "F16")}
    human = run("convert", src, tmp_path / "out2", "--to", "gptq", "--bits", "4")
    assert human.exit_code == 0
    assert "options filled in for gptq" in human.output and "--group-size 32 --scale-dtype f16" in human.output


def test_mxfp4_to_gptq_with_bits_is_a_requantize(tmp_path):
    """'--bits 4' on an MXFP4 source asks for a 4-bit integer grid (was: refused, 'requantize')."""
    r = run("convert", SOURCES["mxfp4"], tmp_path / "out", "--to", "gptq", "--bits", "4", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [f["option"] for f in doc["filled_in"]] == ["--scale-dtype f16"]
    assert doc["overall"]["lossy"] == doc["overall"]["tensors"] == 4
    q = load(tmp_path / "out")
    assert all(q.spec(n).scheme.codebook is None and q.spec(n).scheme.bits == 4 for n in q.quantized_names())


def test_an_option_the_target_cannot_take_is_refused_with_one_command_line(tmp_path):
    """--bits 5 to GPTQ (2/3/4/8 bits): refused, the hint changes it and adds what else is needed."""
    src, dst = SOURCES["gguf_q4_k_m"], tmp_path / "out"
    r = run("convert", src, dst, "--to", "gptq", "--bits", "5", "--json")
    assert r.exit_code == 3
    doc = json.loads(r.output)
    assert "GPTQ supports bits [2, 3, 4, 8], not 5" in doc["message"]
    assert doc["hint"].startswith("--bits 5 -> --bits 4")
    words = hinted_command(doc["hint"])
    assert words == ["convert", str(src), str(dst), "--to", "gptq", "--bits", "4", "--group-size", "32",
                     "--scale-dtype", "f16"]
    assert run(*words).exit_code == 0


def test_q4_k_s_to_gptq_with_bits_only_fills_in_asym_and_fp16_scales(tmp_path, made):
    """The issue's three tries: '--bits 4' now suffices; --asym (float minima) and --scale-dtype f16
    (K-quant F32 scales) are filled in and reported."""
    r = run("convert", made["gguf_q4_k_s"], tmp_path / "out", "--to", "gptq", "--bits", "4", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [f["option"] for f in doc["filled_in"]] == ["--asym", "--scale-dtype f16"]
    assert "float bias" in doc["filled_in"][0]["reason"] and "F32" in doc["filled_in"][1]["reason"]
    q = load(tmp_path / "out")
    assert {(q.spec(n).scheme.bits, q.spec(n).scheme.zero_point.value, q.spec(n).group_map.group_size,
             q.spec(n).scheme.scale_dtype) for n in q.quantized_names()} == {(4, "integer", 32, "F16")}


def test_a_partial_group_refusal_also_names_the_exact_command_line(tmp_path):
    """Group 128 on a 576-wide layer (a partial final group GPTQ loaders cannot read): the hint keeps the
    group sizes that fit and adds the one command line, group 64 (a refinement of 128: exact, by hand)."""
    from safetensors.numpy import save_file
    w = np.random.default_rng(0).standard_normal((64, 576)).astype(np.float16)
    save_file({"model.layers.0.mlp.down_proj.weight": w}, str(tmp_path / "float.safetensors"))
    src, dst = tmp_path / "g128", tmp_path / "out"
    assert run("quantize", tmp_path / "float.safetensors", src, "--bits", "4", "--group-size", "128").exit_code == 0
    doc = json.loads(run("convert", src, dst, "--to", "gptq", "--json").output)
    assert doc["field"] == "group_size" and doc["hint"].startswith("use --group-size 32 or 64 (divides every layer)")
    assert "requantize instead (exact)" in doc["hint"]
    words = hinted_command(doc["hint"])
    assert words == ["convert", str(src), str(dst), "--to", "gptq", "--group-size", "64"]
    r = run(*words, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["overall"]["exact"] == 1


def test_the_exact_route_stays_exact_when_every_minimum_is_an_fp16_value(tmp_path):
    """Integer zero points with power-of-two scales (2^-5 .. 2^-3): every -z*s has at most 4 significant bits,
    an fp16 value, so the hinted '--asym' into GGUF carries the tensor bit for bit (report: exact, read back
    bit-exact), though the plan from headers alone says lossy."""
    from converter import save
    from converter.groups import GroupMap
    from converter.scheme import QuantScheme, ZeroPoint
    from converter.tensor import Checkpoint, QuantizedTensor
    rng = np.random.default_rng(1)
    a = QuantScheme(4, signed=False, zero_point=ZeroPoint.INTEGER, scale_dtype="F16")
    t = QuantizedTensor("encoder.layer.0.attention.self.query.weight", ("out", "in"),
                        rng.integers(0, 16, (384, 384)).astype(np.uint8),
                        (2.0 ** -rng.integers(3, 6, (384, 3))).astype(np.float16), a, GroupMap.per_group(128, "in"),
                        zero_points=rng.integers(1, 16, (384, 3)).astype(np.uint8), stored={})
    config = {k: v for k, v in json.loads((SOURCES["awq"] / "config.json").read_text()).items()
              if k != "quantization_config"}  # MiniLM's BERT config: GGUF needs the architecture
    src, dst = tmp_path / "gptq", tmp_path / "out.gguf"
    save(Checkpoint.from_tensors([t], config=config), src, format="gptq")
    doc = json.loads(run("convert", src, dst, "--to", "gguf", "--json").output)
    words = hinted_command(doc["hint"])
    assert words[5:] == ["--asym"]
    r = run(*words, "--json")
    assert r.exit_code == 0, r.output
    row, = json.loads(r.output)["tensors"]
    assert (row["planned"], row["route"], row["result"], row["readback_bit_exact"]) == \
        ("lossy", "carried", "exact", True)
    np.testing.assert_array_equal(load(dst)[t.name].dequantize(), t.dequantize())


def test_awq_needs_fill_in_bits_and_asym_from_an_8_bit_mlx_source(tmp_path):
    """MLX affine 8-bit (float biases) -> AWQ with only --group-size 32: AWQ stores 4-bit codes with integer
    zero points, so --bits 4 and --asym are filled in, each with the refusal it avoids."""
    r = run("convert", SOURCES["mlx_affine_b8"], tmp_path / "out", "--to", "awq", "--group-size", "32", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    filled = {f["field"]: f for f in doc["filled_in"]}
    assert {f: v["option"] for f, v in filled.items()} == {"bits": "--bits 4", "symmetric": "--asym"}
    assert "AWQ stores 4-bit codes only, not 8-bit" in filled["bits"]["reason"]
    assert "no float bias" in filled["symmetric"]["reason"]
    assert (doc["target"]["bits"], doc["target"]["symmetric"], doc["target"]["group_size"]) == (4, False, 32)
    q = load(tmp_path / "out")
    assert {(q.spec(n).scheme.bits, q.spec(n).scheme.zero_point.value) for n in q.quantized_names()} == \
        {(4, "integer")}


def test_a_block_with_a_whole_axis_is_written_as_the_cli_reads_it():
    """A block target covering one axis whole (``--block *x128``: extent None) is written back as ``*x128`` in
    a suggested command line, which ``--block`` parses to the same extents; it once read ``0x128``, which
    ``--block`` refuses (extents must be positive integers or ``*``)."""
    import shlex

    from converter.ops.command_line import command_line, target_words
    from converter.quant.target import Target
    from converter.vocabulary import parse_block

    for block in ((None, 128), (128, None), (128, 128)):
        words = target_words(Target(element="e4m3", granularity="block", block=block))
        assert parse_block(words[words.index("--block") + 1]) == block
    line = shlex.split(command_line("a", "b", "fp8", Target(element="e4m3", granularity="block", block=(None, 128))))
    assert line[line.index("--block") + 1] == "*x128"


def test_the_suggested_line_keeps_the_format_the_source_was_read_as(tmp_path):
    """A folder holding a GPTQ model and a GGUF file is read only with ``--format``: a refusal's suggested command
    line carries ``--format gptq`` too, and following it succeeds (without it the folder is refused as ambiguous)."""
    import shutil

    from tests.conftest import SAMPLES

    folder = tmp_path / "both"
    shutil.copytree(SAMPLES / "gptq_w4_g128_sym", folder)
    shutil.copy(SAMPLES / "gguf" / "minilm_gguf_Q4_0.gguf", folder)
    dst = tmp_path / "out"
    r = CliRunner().invoke(main, ["convert", str(folder), str(dst), "--format", "gptq", "--to", "fp8"])
    assert r.exit_code != 0 and not dst.exists()
    line = shlex.split(r.output.split(": qckpt convert ", 1)[1].strip().replace("\n", " "))
    assert line[line.index("--format") + 1] == "gptq"
    follow = CliRunner().invoke(main, ["convert", *line, "--quiet"])
    assert follow.exit_code == 0, follow.output
    assert dst.is_dir()
