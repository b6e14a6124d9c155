"""Plain float safetensors: reading the real fp16 sample, writing single and sharded outputs."""

import json

import numpy as np
from safetensors.numpy import load_file

import converter
from converter.formats.plain import write_plain
from converter.tensor import Checkpoint, DenseTensor
from tests.conftest import SAMPLES


def test_reads_real_fp16_sample():
    ck = converter.load(SAMPLES / "minilm_fp16.safetensors")
    assert ck.format == "plain" and len(ck) == 14
    ref = load_file(str(SAMPLES / "minilm_fp16.safetensors"))
    w = ck["encoder.layer.0.output.dense.weight"]
    assert w.data.dtype == np.float16 and w.shape == (384, 1536)
    np.testing.assert_array_equal(w.data, ref["encoder.layer.0.output.dense.weight"])


def test_sharded_write_and_read(tmp_path):
    rng = np.random.default_rng(0)
    ck = Checkpoint.from_tensors([DenseTensor(f"l{i}.weight", rng.standard_normal((8, 16)).astype(np.float32))
                                  for i in range(5)], config={"model_type": "x"})
    out = tmp_path / "sharded"
    res = write_plain(ck, out, dtype="F32", max_shard_bytes=600)
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) == 5 and "model.safetensors.index.json" in res["files"]
    assert idx["metadata"]["total_size"] == 5 * 8 * 16 * 4
    back = converter.load(out)
    for name in ck.names():
        np.testing.assert_array_equal(back[name].data, ck[name].data)


def test_dequantize_config_states_the_written_dtype(tmp_path):
    """Regression: dequantizing a GPTQ sample (config torch_dtype float16) to f32 kept 'float16' in config.json,
    which transformers 5 (dtype='auto' by default) would load as fp16, rounding the f32 weights."""
    src = SAMPLES / "gptq_w4_g128_sym"
    assert json.loads((src / "config.json").read_text())["torch_dtype"] == "float16"
    out = tmp_path / "deq"
    write_plain(converter.load(src), out, dtype="F32")
    cfg = json.loads((out / "config.json").read_text())
    arrays = load_file(str(out / "model.safetensors"))
    # the dequantized Linear weights are F32, the biases pass through as F16: float32 holds both exactly
    by_dtype = {}
    for a in arrays.values():
        by_dtype[a.dtype] = by_dtype.get(a.dtype, 0) + a.size
    assert {arrays[n].dtype for n in arrays if n.endswith(".weight")} == {np.dtype(np.float32)}
    assert max(by_dtype, key=by_dtype.get) == np.float32
    assert cfg["torch_dtype"] == "float32" and cfg["dtype"] == "float32"
    assert "quantization_config" not in cfg


def test_dequantize_config_adds_flat_rope_theta(tmp_path):
    """Regression: a transformers 5 config.json (only ``rope_parameters.rope_theta``) was copied as is; mlx_lm 0.32
    ``models/llama.py`` ``ModelArgs`` reads only ``rope_theta`` (default 10000)."""
    src = SAMPLES / "deepseek_fp8_block_smollm2tiny"
    cfg_src = json.loads((src / "config.json").read_text())
    assert "rope_theta" not in cfg_src
    assert cfg_src["rope_parameters"] == {"rope_theta": 100000.0, "rope_type": "default"}
    write_plain(converter.load(src), tmp_path / "deq", dtype="F32")
    cfg = json.loads((tmp_path / "deq" / "config.json").read_text())
    assert cfg["rope_theta"] == 100000.0
    assert cfg["rope_parameters"] == {"rope_theta": 100000.0, "rope_type": "default"}
    # a flat rope_theta already present is kept as it is (not overwritten by the nested one)
    t = DenseTensor("l.weight", np.zeros((2, 4), np.float32))
    both = {"model_type": "x", "rope_theta": 10000.0, "rope_parameters": {"rope_theta": 5.0}}
    write_plain(Checkpoint.from_tensors([t], config=both), tmp_path / "b", dtype="F32")
    assert json.loads((tmp_path / "b" / "config.json").read_text())["rope_theta"] == 10000.0
    write_plain(Checkpoint.from_tensors([t], config={"model_type": "x"}), tmp_path / "c", dtype="F32")
    assert "rope_theta" not in json.loads((tmp_path / "c" / "config.json").read_text())


# -- conformance (tests/formats/conformance.py) ------------------------------------------------------
from tests.formats.conformance import ModelDirConformance  # noqa: E402


class TestPlainConformance(ModelDirConformance):
    FORMAT = "plain"


def test_dequantize_drops_static_activation_scales_and_says_so(tmp_path):
    """Issue 15: ``qckpt dequantize`` of the real ModelOpt NVFP4 sample leaves its ``input_scale`` tensors out of
    the float model (transformers' float Linear has no such parameter) and reports each one as dropped."""
    from click.testing import CliRunner

    from converter.cli import main

    src = SAMPLES / "modelopt_nvfp4_smollm2tiny"
    with open(src / "model.safetensors", "rb") as f:  # the header only (F8 dtypes: no numpy loader)
        stored = set(json.loads(f.read(int.from_bytes(f.read(8), "little")))) - {"__metadata__"}
    act = {n for n in stored if n.endswith(".input_scale")}
    assert len(act) == 7  # q, k, v, o, gate, up, down of the one layer (the file as ModelOpt wrote it)
    r = CliRunner().invoke(main, ["dequantize", str(src), str(tmp_path / "out"), "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert set(doc["dropped"]) == act and all("activation scale" in v for v in doc["dropped"].values())
    written = set(load_file(str(tmp_path / "out" / "model.safetensors")))
    # every weight as one float tensor (ModelOpt's weight_scale / weight_scale_2 folded in), nothing else
    assert written == {n for n in stored if not n.endswith(("_scale", "_scale_2"))}
    assert doc["tensors"] == len(written)
    human = CliRunner().invoke(main, ["dequantize", str(src), str(tmp_path / "out2"), "--quiet"])
    assert human.exit_code == 0 and "dropped 7 tensors" in human.output


def test_dequantize_dry_run_lists_the_dropped_activation_scales(tmp_path):
    """``--dry-run`` plans what the real run writes: the 7 ``input_scale`` tensors of the ModelOpt NVFP4 sample
    (counted from its header above) are ``dropped`` in the plan, as the real run drops them, not ``passthrough``;
    the plan's rows that are not dropped are exactly the tensors the real run writes."""
    from click.testing import CliRunner

    from converter.cli import main

    src = SAMPLES / "modelopt_nvfp4_smollm2tiny"
    with open(src / "model.safetensors", "rb") as f:
        stored = set(json.loads(f.read(int.from_bytes(f.read(8), "little")))) - {"__metadata__"}
    act = {n for n in stored if n.endswith(".input_scale")}
    r = CliRunner().invoke(main, ["dequantize", str(src), str(tmp_path / "out"), "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert not (tmp_path / "out").exists()
    assert {t["name"] for t in plan["tensors"] if t["mode"] == "dropped"} == act
    assert plan["summary"]["dropped"] == 7
    real = CliRunner().invoke(main, ["dequantize", str(src), str(tmp_path / "real"), "--quiet"])
    assert real.exit_code == 0
    written = set(load_file(str(tmp_path / "real" / "model.safetensors")))
    assert {t["name"] for t in plan["tensors"] if t["mode"] != "dropped"} == written


def test_convert_to_gguf_dry_run_lists_what_the_writer_leaves_out(tmp_path):
    """The GGUF writer leaves the ModelOpt sample's 7 ``input_scale`` tensors out: its ``--dry-run`` plan says
    ``dropped`` for exactly the tensors the real conversion's proof reports as dropped."""
    from click.testing import CliRunner

    from converter.cli import main

    src = SAMPLES / "modelopt_nvfp4_smollm2tiny"
    r = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "p.gguf"), "--to", "gguf", "--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert not (tmp_path / "p.gguf").exists()
    real = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "r.gguf"), "--to", "gguf", "--json",
                                     "--quiet"])
    assert real.exit_code == 0, real.output
    rows = json.loads(real.output)["tensors"]
    dropped = {t["name"] for t in rows if t["mode"] == "dropped"}
    assert len(dropped) == 7 and all(n.endswith(".input_scale") for n in dropped)
    assert {t["name"] for t in plan["tensors"] if t["mode"] == "dropped"} == dropped


def test_forced_plain_on_a_quantized_checkpoint_is_refused(tmp_path):
    """A new user's finding: `--format plain` on a GPTQ folder listed its packed I32 qweight as dense float weights,
    and `dequantize` would have written them into a 'float' model that loads and computes garbage."""
    import pytest
    from click.testing import CliRunner

    from converter.cli import main
    from converter.errors import FormatError
    from converter.formats.registry import load
    src = SAMPLES / "gptq_w4_g128_sym"
    with pytest.raises(FormatError) as e:
        load(src, format="plain")
    assert e.value.field == "quantization_config.quant_method" and e.value.found == "gptq"
    r = CliRunner().invoke(main, ["dequantize", str(src), str(tmp_path / "o"), "--format", "plain"])
    assert r.exit_code == 3 and "packed codes" in r.output and not (tmp_path / "o").exists()
