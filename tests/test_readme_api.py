"""The README's one-call API example (issue 17) runs as written, and each function returns the document the
CLI prints for the same command (``--json``), so the two can never disagree."""

import json
import os
import re
from pathlib import Path

from click.testing import CliRunner

import converter
from converter.cli import main
from converter.validate.report import ValidationReport

REPO = Path(__file__).resolve().parent.parent


def _block() -> str:
    section = (REPO / "README.md").read_text().split("## Python API", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) >= 2 and "converter.diff(" in blocks[1]
    return blocks[1]


def _cli_json(*args):
    r = CliRunner().invoke(main, [str(a) for a in args] + ["--json"])
    return r.exit_code, json.loads(r.output)


def test_the_readme_block_runs_and_prints_what_it_says(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    os.symlink(REPO / "sample_checkpoints", tmp_path / "sample_checkpoints")
    block = _block()
    exec(compile(block, "README.md (commands as functions)", "exec"), {})  # noqa: S102 - our own README
    printed = capsys.readouterr().out.split("\n")
    # each print's comment says what it prints (an explanation may follow in parentheses)
    claimed = [line.split("#", 1)[1].split(" (")[0].strip() for line in block.splitlines()
               if line.startswith("print(")]
    assert printed[:len(claimed)] == claimed
    for out in ("minilm-ct", "minilm-w8", "minilm-f32", "minilm-gptq"):
        assert (tmp_path / out / "config.json").is_file(), out


def test_each_function_returns_the_cli_document(tmp_path):
    src = REPO / "sample_checkpoints" / "gptq_w4_g128_sym"
    assert converter.inspect(src) == _cli_json("inspect", src)[1]
    assert converter.audit(src, what_if=True) == _cli_json("audit", src, "--what-if")[1]
    rep = converter.validate(src, strict=True)
    assert isinstance(rep, ValidationReport) and rep.to_json() == _cli_json("validate", src, "--strict")[1]
    a = converter.convert(src, tmp_path / "a", to="awq")
    code, b = _cli_json("convert", src, tmp_path / "b", "--to", "awq")
    assert code == 0 and {k: v for k, v in a.items() if k != "destination"} == \
        {k: v for k, v in b.items() if k != "destination"}
    d = converter.diff(tmp_path / "a", tmp_path / "b")
    assert d == _cli_json("diff", tmp_path / "a", tmp_path / "b")[1] and d["exit_code"] == 0
    f = converter.dequantize(src, tmp_path / "f.safetensors", dtype="bf16")
    code, g = _cli_json("dequantize", src, tmp_path / "g.safetensors", "--dtype", "bf16")
    assert {k: v for k, v in f.items() if k not in ("destination", "files")} == \
        {k: v for k, v in g.items() if k not in ("destination", "files")} and f["tensors"] == 14
    assert (tmp_path / "f.safetensors").read_bytes() == (tmp_path / "g.safetensors").read_bytes()
    fp16 = REPO / "sample_checkpoints" / "minilm_fp16.safetensors"
    q = converter.quantize(fp16, tmp_path / "q", bits=4, group_size=128, to="gptq")
    code, r = _cli_json("quantize", fp16, tmp_path / "r", "--bits", 4, "--group-size", 128, "--to", "gptq")
    assert q["tensors"] == r["tensors"] and q["overall"] == r["overall"]


def test_tensor_level_quantize_and_dequantize_still_work():
    import numpy as np
    w = np.array([[0.1, -0.1], [10.0, -10.0]], np.float32)
    q = converter.quantize(w, converter.QuantScheme(bits=8, signed=True), converter.GroupMap.per_channel("out"))
    assert q.codes.tolist() == [[127, -127], [127, -127]]  # per-row (contract 4)
    assert np.allclose(converter.dequantize(q), w, atol=0.1 / 127)


def test_quantize_to_mlx_selects_what_the_cli_selects(tmp_path):
    """``converter.quantize(..., to="mlx")`` keeps the target's own default selection, as ``qckpt quantize
    --to mlx`` does: mlx-lm 0.32.2 quantizes the token embedding (``nn.Embedding.to_quantized``) and leaves norms
    dense. The API once used the generic ``--exclude`` default instead (embedding left dense)."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    save_file({"model.embed_tokens.weight": rng.standard_normal((16, 64)).astype(np.float32),
               "model.norm.weight": np.ones(64, np.float32),
               "model.layers.0.mlp.up_proj.weight": rng.standard_normal((32, 64)).astype(np.float32)},
              str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    q = converter.quantize(src, tmp_path / "api", bits=4, group_size=32, to="mlx")
    code, r = _cli_json("quantize", src, tmp_path / "cli", "--bits", 4, "--group-size", 32, "--to", "mlx")
    assert code == 0 and q["tensors"] == r["tensors"]
    with safe_open(str(tmp_path / "api" / "model.safetensors"), "np") as f:
        names = set(f.keys())
    # mlx-lm's selection: embedding and Linear quantized (weight + scales + biases), the norm dense
    assert {"model.embed_tokens.scales", "model.layers.0.mlp.up_proj.scales"} <= names
    assert "model.norm.scales" not in names
    api, cli = (tmp_path / d / "model.safetensors" for d in ("api", "cli"))
    assert api.read_bytes() == cli.read_bytes()


def test_quantize_fp8_takes_an_explicit_f16_scale_dtype(tmp_path):
    """``converter.quantize(..., fp8="e4m3", scale_dtype="F16")`` stores F16 scales, as ``qckpt quantize --fp8 e4m3
    --scale-dtype f16`` does; without ``scale_dtype`` the scales take each weight's own dtype (F32 here). The API
    once read ``"F16"`` as "not given" (its default) and wrote F32 scales."""
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import save_file

    src = tmp_path / "w.safetensors"
    save_file({"model.layers.0.mlp.up_proj.weight": np.random.default_rng(0).standard_normal((32, 64))
               .astype(np.float32)}, str(src))

    def scale_dtypes(d):
        with safe_open(str(d / "model.safetensors"), "np") as f:
            return {f.get_slice(k).get_dtype() for k in f.keys() if k.endswith("weight_scale")}
    converter.quantize(src, tmp_path / "api16", fp8="e4m3", granularity="channel", scale_dtype="F16",
                       to="compressed-tensors")
    code, _ = _cli_json("quantize", src, tmp_path / "cli16", "--fp8", "e4m3", "--per-channel", "--scale-dtype", "f16",
                        "--to", "compressed-tensors")
    assert code == 0 and scale_dtypes(tmp_path / "api16") == scale_dtypes(tmp_path / "cli16") == {"F16"}
    converter.quantize(src, tmp_path / "own", fp8="e4m3", granularity="channel", to="compressed-tensors")
    assert scale_dtypes(tmp_path / "own") == {"F32"}


def test_api_refuses_what_the_cli_refuses(tmp_path):
    """Review findings: a writer option for another writer, and fp4 with its fixed options, were silently ignored."""
    import pytest

    from converter.errors import FormatError
    src = REPO / "sample_checkpoints" / "gptq_w4_g128_sym"
    with pytest.raises(FormatError, match="'checkpoint_format' is not an option of the awq writer"):
        converter.convert(src, tmp_path / "a", to="awq", checkpoint_format="gptq")
    with pytest.raises(FormatError, match="'gguf_metadata' is not an option of the gptq writer"):
        converter.convert(src, tmp_path / "b", gguf_metadata="x.gguf")  # to: the source's own format, gptq
    fp16 = REPO / "sample_checkpoints" / "minilm_fp16.safetensors"
    with pytest.raises(FormatError, match="fp4 fixes the bits"):
        converter.quantize(fp16, tmp_path / "c", fp4="mxfp4", bits=8)
    assert not any(tmp_path.iterdir())
