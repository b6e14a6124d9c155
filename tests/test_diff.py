"""``qckpt diff A B`` (issue 17): figures computed by hand, and the real sample against its own conversions."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import save_file

from converter.cli import main
from converter.ops.diff import diff
from converter.schemas import validate_document
from tests.conftest import SAMPLES

A_W = np.array([[1, 2], [3, 4], [0, 0]], np.float32)
B_W = np.array([[1, 2], [3, 5], [0, 0]], np.float32)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def pair(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"w": A_W, "bias": np.ones(2, np.float32), "only_a": np.zeros(3, np.float32),
               "s": np.zeros((2, 2), np.float32)}, str(a))
    save_file({"w": B_W, "bias": np.ones(2, np.float32), "only_b": np.zeros(3, np.float32),
               "s": np.zeros((2, 3), np.float32)}, str(b))
    return a, b


def test_figures_by_hand(pair):
    a, b = pair
    doc = diff(a, b)
    validate_document(doc, "diff-report")
    by = {r["name"]: r for r in doc["tensors"]}
    w = by["w"]
    # B - A = [[0,0],[0,1],[0,0]]: sum A^2 = 30, sum (B-A)^2 = 1
    assert w["status"] == "different"
    assert w["rel_frobenius"] == pytest.approx(math.sqrt(1 / 30), rel=1e-6)
    assert w["sqnr_db"] == pytest.approx(10 * math.log10(30), rel=1e-6)
    assert w["max_abs"] == 1.0 and w["worst_channel"]["index"] == [1] and w["worst_channel"]["mse"] == 0.5
    x = np.random.default_rng(0).standard_normal((2, 8))  # the documented seeded batch
    expected = np.linalg.norm((B_W - A_W).astype(np.float64) @ x) / np.linalg.norm(A_W.astype(np.float64) @ x)
    assert w["output_rel_error"] == pytest.approx(expected, rel=1e-6)
    assert by["bias"]["status"] == "identical" and by["bias"]["output_rel_error"] is None
    assert by["s"]["status"] == "shape-mismatch" and by["s"]["shape_b"] == [2, 3]
    assert doc["only_in_a"] == ["only_a"] and doc["only_in_b"] == ["only_b"]
    s = doc["summary"]
    assert (s["compared"], s["identical"], s["different"], s["shape_mismatch"]) == (3, 1, 1, 1)
    assert s["rel_frobenius"] == pytest.approx(math.sqrt(1 / 32), rel=1e-6)  # + bias: sum A^2 = 32
    assert s["worst"] == "w" and s["verdict"] == "different" and doc["exit_code"] == 1


def test_tolerance_and_exit_status(tmp_path):
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"w": A_W}, str(a))
    save_file({"w": B_W}, str(b))
    r = run("diff", a, b)
    assert r.exit_code == 1 and "DIFFERENT" in r.output
    r = run("diff", a, b, "--tolerance", "0.2", "--json")  # sqrt(1/30) = 0.1826 <= 0.2
    doc = json.loads(r.output)
    assert r.exit_code == 0 and doc["tensors"][0]["status"] == "within-tolerance"
    assert doc["summary"]["verdict"] == "within-tolerance"
    assert run("diff", a, b, "--tolerance", "0.18").exit_code == 1
    assert run("diff", a, a).exit_code == 0
    assert run("diff", a, tmp_path / "missing.safetensors").exit_code == 3


def test_a_sample_against_its_exact_conversions_is_identical(tmp_path):
    src = SAMPLES / "gptq_w4_g128_sym"
    assert run("convert", src, tmp_path / "ct", "--to", "compressed-tensors").exit_code == 0
    assert run("dequantize", src, tmp_path / "f32").exit_code == 0
    for other in ("ct", "f32"):
        doc = diff(src, tmp_path / other)
        assert doc["exit_code"] == 0 and doc["summary"]["identical"] == doc["summary"]["compared"] == 14, other
    # and a lossy one is not: requantized to 8-bit per channel
    assert run("convert", src, tmp_path / "w8", "--to", "compressed-tensors", "--bits", "8",
               "--per-channel").exit_code == 0
    doc = diff(src, tmp_path / "w8")
    assert doc["exit_code"] == 1 and doc["summary"]["different"] == 7  # the 7 quantized weights
    assert 0 < doc["summary"]["rel_frobenius"] < 0.05


@pytest.mark.parametrize("option", ["--format-a", "--format-b"])
def test_an_unknown_format_is_a_usage_error(pair, option):
    """The epilog's status 2 (usage error) for an unknown ``--format-a`` / ``--format-b``, as ``--format`` of every
    other command; it was exit 3 (unreadable input) after reading the other side."""
    a, b = pair
    r = run("diff", a, b, option, "bogus")
    assert r.exit_code == 2 and "bogus" in r.output


def test_a_tied_head_stored_once_is_compared_with_the_embedding(tmp_path):
    """Review finding: a GGUF written without output.weight (its head tied to token_embd) against its source
    listed lm_head only in A and said 'different'; the head is compared with B's embedding instead."""
    emb = np.arange(12, dtype=np.float32).reshape(4, 3)
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"model.embed_tokens.weight": emb, "lm_head.weight": emb.copy()}, str(a))
    save_file({"model.embed_tokens.weight": emb}, str(b))
    doc = diff(a, b)
    validate_document(doc, "diff-report")
    head = next(r for r in doc["tensors"] if r["name"] == "lm_head.weight")
    assert head["status"] == "identical" and "model.embed_tokens.weight" in head["tied_to"]
    assert doc["only_in_a"] == [] and doc["exit_code"] == 0
    save_file({"model.embed_tokens.weight": emb, "lm_head.weight": emb + 1}, str(a))  # an untied, different head
    doc = diff(a, b)
    assert next(r for r in doc["tensors"] if r["name"] == "lm_head.weight")["status"] == "different"
    assert doc["exit_code"] == 1


def test_an_undecodable_tensor_is_listed_not_fatal(tmp_path):
    """Review finding: one tensor of a type nothing decodes made the whole diff exit 3."""
    import gguf
    w = gguf.GGUFWriter(str(tmp_path / "a.gguf"), "llama")
    w.add_tensor("token_embd.weight", np.ones((4, 32), np.float32))
    # Q8_1 (a type gguf-py lists and decodes nowhere): 40 bytes per 32-element block, 2 rows of 64
    w.add_tensor("blk.0.ffn_up.weight", np.zeros((2, 80), np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    doc = diff(tmp_path / "a.gguf", tmp_path / "a.gguf")
    validate_document(doc, "diff-report")
    rows = {r["name"]: r for r in doc["tensors"]}
    up = next(r for n, r in rows.items() if "up" in n)
    assert up["status"] == "not-compared" and "Q8_1" in up["why"]
    assert doc["summary"]["not_compared"] == 1 and doc["exit_code"] == 1
    r = run("diff", tmp_path / "a.gguf", tmp_path / "a.gguf")
    assert r.exit_code == 1 and "not compared" in r.output
