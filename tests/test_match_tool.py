"""``qckpt dequantize --match-tool``: byte-identical to each producing tool's own decode (issue 18 item 7).

Ground truth: every real sample's ``reference_dequant.safetensors`` (sample_checkpoints/, copies of
/work/shared/real/ byte for byte; deepseek's a documented 2-tensor subset), written by the tool itself
(``decoded_by`` in each file's metadata: mx.dequantize, bitsandbytes int8_vectorwise_dequant /
dequantize_4bit, gptqmodel TorchLinear.dequantize_weight, autoawq dequantize_gemm, compressed-tensors
decompress, gguf-py gguf.quants.dequantize, auto-round, ModelOpt QTensor.dequantize).
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from converter.cli import main
from converter.errors import UnsupportedError
from converter.formats.plain import write_plain
from converter.formats.registry import load
from tests.conftest import SAMPLES

G = SAMPLES / "gguf"
#: (checkpoint, reference, --tool-dtype): the ModelOpt FP8 references were made with dequantize(dtype=float32).
CASES = [(SAMPLES / d, SAMPLES / d / "reference_dequant.safetensors", None) for d in (
    "mlx_affine_g32_b8", "mlx_affine_g64_b4", "mlx_mxfp4_smollm2tiny", "mlx_nvfp4_smollm2tiny",
    "mlx_nvfp4_global_smollm2", "bnb_int8", "bnb_nf4_bs64", "gptq_w4_g128_sym", "gptq_w4_gchan_sym",
    "awq_gemm_w4_g128_zp", "ct_pack_w4a16_channel_sym", "ct_pack_w4a16_group128_asym",
    "ct_pack_w4a16_group128_sym", "ct_pack_w8a16_channel_sym", "ct_fp8_channel_smollm2", "ct_nvfp4_smollm2",
    "ct_mxfp4_smollm2", "deepseek_fp8_block_smollm2tiny", "modelopt_nvfp4_smollm2tiny")]
CASES += [(SAMPLES / d, SAMPLES / d / "reference_dequant.safetensors", "f32") for d in (
    "modelopt_fp8_smollm2tiny", "modelopt_fp8_pc_pt_smollm2tiny", "modelopt_fp8_pb_wo_smollm2tiny")]
CASES += [(G / f, G / (f + ".reference_dequant.safetensors"), None) for f in (
    "minilm_gguf_Q4_0.gguf", "minilm_gguf_Q4_1.gguf", "minilm_gguf_Q5_0.gguf", "minilm_gguf_Q8_0.gguf",
    "minilm_llamacpp_Q4_K_M.gguf", "minilm_llamacpp_Q6_K.gguf", "minilm_gguf_F16.gguf")]


def _raw(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@pytest.mark.parametrize("src,reference,tool_dtype", CASES, ids=[c[0].name for c in CASES])
def test_match_tool_is_byte_identical_to_the_tools_decode(src, reference, tool_dtype, tmp_path):
    out = tmp_path / "o.safetensors"
    res = write_plain(load(src), out, match_tool=True, tool_dtype=tool_dtype)
    ref = load_file(str(reference))
    quantized = {s.name for s in load(src).specs() if s.kind == "quantized"}
    got = load_file(str(out))
    assert set(res["match_tool"]) == quantized
    checked = 0
    for name, want in ref.items():
        if name not in quantized:
            # dense: passed through as stored; the reference keeps it "float16 where exact"
            assert np.array_equal(got[name].astype(np.float32), want.astype(np.float32)), name
            continue
        assert got[name].dtype == want.dtype, (name, got[name].dtype, want.dtype)
        assert _raw(got[name]) == _raw(want), name
        checked += 1
    assert checked == len(set(ref) & quantized)
    assert checked >= 1 or src.name == "minilm_gguf_F16.gguf"


def _differs(a: np.ndarray, b: np.ndarray) -> int:
    wide = {2: np.uint16, 4: np.uint32}[a.dtype.itemsize]
    return int(np.count_nonzero(np.ascontiguousarray(a).view(wide) != np.ascontiguousarray(b).view(wide)))


def test_the_default_exact_decode_is_not_the_tools_where_the_tool_rounds_twice():
    """Why the option exists: MLX affine (fp16 product rounded before the bias add) and bnb int8 ((w * SCB) *
    (1/127)) round twice; qckpt's exact float32 decode, rounded once, differs from them (measured: 305964 of
    589824 MLX output.dense elements, max |diff| 4.9e-4; 124293 of 589824 bnb elements, max |diff| 3.0e-8)."""
    for d, name, dt, n in (("mlx_affine_g64_b4", "encoder.layer.0.output.dense.weight", np.float16, 305964),
                           ("bnb_int8", "encoder.layer.0.output.dense.weight", np.float32, 124293)):
        ref = load_file(str(SAMPLES / d / "reference_dequant.safetensors"))[name]
        exact = load(SAMPLES / d)[name].dequantize(dt)
        assert _differs(exact, ref) == n, d


def _bnb_bf16(tmp_path):
    """bnb_nf4_bs64 with its quant_state recording bfloat16 (a model quantized from bf16 weights)."""
    src = SAMPLES / "bnb_nf4_bs64"
    d = tmp_path / "bf16"
    d.mkdir()
    tensors = load_file(str(src / "model.safetensors"))
    for k in [k for k in tensors if k.endswith("quant_state.bitsandbytes__nf4")]:
        qs = json.loads(tensors[k].tobytes().decode())
        assert qs["dtype"] == "float16"
        qs["dtype"] = "bfloat16"
        tensors[k] = np.frombuffer(json.dumps(qs).encode(), np.uint8).copy()
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text((src / "config.json").read_text())
    return d


def test_bnb_4bit_decodes_in_the_quant_state_dtype_or_the_option(tmp_path):
    """dequantize_4bit: float32 quant_map[q] * absmax, one conversion to quant_state.dtype (bf16 by round to
    nearest even, csrc/cpu_ops.cpp). Expected values by hand: the NF4 table times absmax, in float32."""
    d = _bnb_bf16(tmp_path)
    name = "encoder.layer.0.attention.self.query.weight"
    stored = load_file(str(d / "model.safetensors"))
    packed, absmax = stored[name], stored[name + ".absmax"]
    table = stored[name + ".quant_map"]
    codes = np.empty(packed.size * 2, np.uint8)
    codes[0::2], codes[1::2] = packed.reshape(-1) >> 4, packed.reshape(-1) & 0xF  # element 2k in the high nibble
    want = (table[codes] * np.repeat(absmax, 64)).astype(ml_dtypes.bfloat16).reshape(384, 384)
    write_plain(load(d), tmp_path / "bf16.safetensors", match_tool=True)
    got = load_file(str(tmp_path / "bf16.safetensors"))[name]
    assert got.dtype == ml_dtypes.bfloat16 and _raw(got) == _raw(want)
    write_plain(load(d), tmp_path / "f32.safetensors", match_tool=True, tool_dtype="f32")
    got = load_file(str(tmp_path / "f32.safetensors"))[name]
    assert got.dtype == np.float32 and _raw(got) == _raw((table[codes] * np.repeat(absmax, 64)).reshape(384, 384))


def test_a_dtype_the_tool_has_no_choice_of_is_refused(tmp_path):
    with pytest.raises(UnsupportedError) as e:
        write_plain(load(SAMPLES / "mlx_affine_g64_b4"), tmp_path / "o.safetensors", match_tool=True, tool_dtype="bf16")
    assert e.value.field == "tool_dtype" and e.value.expected == "F16" and e.value.found == "BF16"
    assert not (tmp_path / "o.safetensors").exists()


def test_cli_match_tool(tmp_path):
    r = CliRunner().invoke(main, ["dequantize", str(SAMPLES / "mlx_affine_g32_b8"), str(tmp_path / "o"),
                                  "--match-tool", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["dtype"] == "tool" and len(doc["match_tool"]) == 7
    tools = doc["match_tool"].values()
    assert all(v.startswith("mlx.core.dequantize (affine)") and v.endswith("-> F16") for v in tools)
    with safe_open(str(tmp_path / "o" / "model.safetensors"), "np") as f:
        assert f.get_slice("encoder.layer.0.output.dense.weight").get_dtype() == "F16"
    assert json.loads((tmp_path / "o" / "config.json").read_text())["dtype"] == "float16"
    r = CliRunner().invoke(main, ["dequantize", str(SAMPLES / "mlx_affine_g32_b8"), str(tmp_path / "p"),
                                  "--match-tool", "--dtype", "f16"])
    assert r.exit_code == 2 and "--match-tool" in r.output
    r = CliRunner().invoke(main, ["dequantize", str(SAMPLES / "mlx_affine_g32_b8"), str(tmp_path / "q"),
                                  "--tool-dtype", "f16"])
    assert r.exit_code == 2 and "--tool-dtype needs --match-tool" in r.output


GGUF_FILES = sorted(G.glob("*.gguf")) + [SAMPLES.parent / "tests" / "data" / "gguf" / "smollm2_vocab_tiny.gguf"]


@pytest.mark.parametrize("path", GGUF_FILES, ids=lambda p: p.name)
def test_gguf_match_tool_is_gguf_py_itself(path, tmp_path):
    """Every quantized tensor of every GGUF sample against gguf-py 0.19's own ``gguf.quants.dequantize`` run
    here (a qckpt dependency): byte-identical rows; LLaMA q/k rows come in Hugging Face order (qckpt's reader
    undoes llama.cpp's ``permute``), every other tensor in the file's order."""
    from gguf import GGUFReader
    from gguf.quants import dequantize as gguf_dequantize
    reader = GGUFReader(path)
    ck = load(path)
    write_plain(ck, tmp_path / "o.safetensors", match_tool=True)
    got = load_file(str(tmp_path / "o.safetensors"))
    for spec in (s for s in ck.specs() if s.kind == "quantized"):
        t = next(t for t in reader.tensors if t.name == spec.stored[0].name)
        want = gguf_dequantize(t.data, t.tensor_type).reshape(spec.shape)
        ours = got[spec.name]
        assert ours.dtype == want.dtype == np.float32 and ours.shape == want.shape
        rows = {want[i].tobytes(): i for i in range(want.shape[0])}
        order = [rows.get(ours[i].tobytes()) for i in range(ours.shape[0])]
        assert None not in order and sorted(order) == list(range(want.shape[0])), spec.name
        permuted = spec.name.endswith(("q_proj.weight", "k_proj.weight")) and ck.metadata.get("gguf_kv", {}).get(
            "general.architecture") == "llama"
        assert (order == list(range(want.shape[0]))) != permuted, spec.name


def test_a_format_without_a_tool_decode_is_refused_by_name(tmp_path):
    """qckpt's own native format declares no producing tool: --match-tool is refused (one line, exit 3) and
    nothing is written; the default exact decode still works."""
    native = tmp_path / "native"
    r = CliRunner().invoke(main, ["quantize", str(SAMPLES / "minilm_fp16.safetensors"), str(native), "--bits", "4",
                                  "--group-size", "64"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["dequantize", str(native), str(tmp_path / "o"), "--match-tool"])
    assert r.exit_code == 3 and "declares no producing tool's decode" in r.output and "--match-tool" in r.output
    assert not (tmp_path / "o").exists()
    assert CliRunner().invoke(main, ["dequantize", str(native), str(tmp_path / "p")]).exit_code == 0


@pytest.mark.parametrize("sample", ["mlx_affine_g64_b4", "bnb_int8"])
def test_match_tool_in_row_blocks_and_workers_is_the_same_file(sample, tmp_path):
    """MLX's decode runs in row blocks under a small memory budget (row_local), bnb int8's whole (it reads SCB
    again): either way the file is byte-identical to a one-worker, whole-tensor run."""
    src = str(SAMPLES / sample)
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    r = CliRunner().invoke(main, ["dequantize", src, str(a), "--match-tool", "--workers", "1", "--quiet"])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["dequantize", src, str(b), "--match-tool", "--workers", "2", "--max-memory", "1M",
                                  "--quiet"])
    assert r.exit_code == 0, r.output
    assert a.read_bytes() == b.read_bytes()
