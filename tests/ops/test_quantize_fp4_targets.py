"""``qckpt quantize --fp4 ... --to FORMAT``: the real SmolLM2 layer-0 bf16 weights (tests/data/fp4/README.md)
quantized straight into each FP4-capable format.

The expected bytes are the real tools' files, never qckpt's own output:

- ``--fp4-rule ct --to compressed-tensors``: the tensors compressed-tensors 0.19.0 wrote (llm-compressor
  ``model_free_ptq`` MXFP4A16 / NVFP4A16; the fixture holds its bytes), and the sample's
  ``quantization_config.config_groups`` (sample_checkpoints/ct_{mx,nv}fp4_smollm2/config.json).
- ``--fp4-rule mlx --to mlx``: the uint32 words and E8M0 / E4M3 bytes of the genuine mlx-lm 0.32.2
  ``quantize_model(mode="mxfp4" | "nvfp4")`` samples (sample_checkpoints/mlx_{mx,nv}fp4_smollm2tiny, whose
  layer-0 bf16 source is bit-identical to the fixture's; down_proj at the fixture's ``down_rows``).
- ``--to gguf``: llama.cpp's decode as gguf-py 0.19 ports it (``gguf.quants.dequantize``) equals the
  compressed-tensors codes x scales computed by hand from the fixture bytes (ggml decodes E2M1 code 0x8
  as +0.0: compared as values, sign of zero aside).

Refused with the real reason, nothing written: NVFP4 ``--to gguf`` / ``mlx`` when a tensor's divisor
global scale (2688 / amax, 936.0 for down_proj) has no exact multiplier / amax; ``--to modelopt``
(ModelOpt NVFP4 needs an ``input_scale``, which a weight-only quantize has not; MXFP4 has E8M0 scales).
Every file written validates clean under ``--strict``.
"""

from __future__ import annotations

import json
import shutil

import gguf
import numpy as np
import pytest

from converter.errors import NotRepresentableError
from converter.formats.registry import load
from converter.ops.quantize_model import QuantizeOptions, quantize_model
from converter.validate.run import validate
from tests.conftest import SAMPLES
from tests.formats.test_gguf_fp4 import _raw_safetensors
from tests.kernels.test_fp4_rtn import HERE, NAMES, QKV, load_fixture
from tests.ops.test_quantize_fp8 import run, write_bf16

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6], np.float32)


@pytest.fixture(scope="module")
def fx():
    return load_fixture()


def _source(root, fx, names) -> "object":
    """A float model folder: the fixture's bf16 weights ``names`` and its config.json."""
    root.mkdir()
    write_bf16(root / "model.safetensors", {n: fx[f"{n}.bf16"] for n in names})
    shutil.copy(HERE / "config.json", root / "config.json")
    return root


@pytest.fixture()
def src(tmp_path, fx):
    return _source(tmp_path / "src", fx, NAMES)


@pytest.fixture()
def src_qkv(tmp_path, fx):
    """q/k/v whole: every width is one config.json names (the fixture's 64-row down_proj is not), and the
    fused NVFP4 global scale is 512.0, a power of two (exact in every direction)."""
    return _source(tmp_path / "src_qkv", fx, QKV)


def _quantize(src, dst, kind, to, rule="ct"):
    r = run("quantize", src, dst, "--fp4", kind, "--fp4-rule", rule, "--to", to, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["format"] == to and doc["target"]["element"] == kind
    return doc


def _llama_permute(w: np.ndarray, n: str) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py ``LlamaModel.permute`` of q_proj (9 heads) / k_proj (3 kv heads):
    the GGUF row order of the rotary halves (tests/data/fp4/config.json); other tensors as they are."""
    heads = {"q_proj": 9, "k_proj": 3}.get(n.split(".")[-2])
    if heads is None:
        return w
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _by_hand(fx, n, kind) -> np.ndarray:
    """compressed-tensors' decode of its own bytes: E2M1 (low nibble first) x E8M0 2^(e-127) | E4M3 / global."""
    b = fx[f"{n}.{kind}.packed"]
    codes = np.stack([b & 15, b >> 4], -1).reshape(b.shape[0], -1)
    v = np.where(codes & 8, -1, 1) * E2M1[codes & 7]
    if kind == "mxfp4":
        return v * np.repeat(np.exp2(fx[f"{n}.mxfp4.scale"].astype(np.float32) - 127), 32, 1)
    import ml_dtypes
    s = fx[f"{n}.nvfp4.scale"].view(ml_dtypes.float8_e4m3fn).astype(np.float32) / fx[f"{n}.nvfp4.global"][0]
    return v * np.repeat(s, 16, 1)


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_ct_rule_to_compressed_tensors_is_the_real_bytes(src, fx, tmp_path, kind):
    dst = tmp_path / "ct"
    doc = _quantize(src, dst, kind, "compressed-tensors")
    # the error report of every quantized tensor (the error of compressed-tensors' own decode vs the bf16 source:
    # FP_MANIFEST rms_err_vs_source, as for the native file in tests/ops/test_quantize_fp4.py)
    rows = {r["name"]: r for r in doc["tensors"]}
    assert sorted(rows) == sorted(NAMES)
    want_rms = {"mxfp4": 0.04785331338644028, "nvfp4": 0.03750482574105263}[kind]
    assert np.sqrt(rows[NAMES[1]]["mse"]) == pytest.approx(want_rms, rel=1e-6)
    got = _raw_safetensors(dst / "model.safetensors")
    for n in NAMES:
        p = n[: -len("weight")]
        assert got[p + "weight_packed"][2] == fx[f"{n}.{kind}.packed"].tobytes(), n
        assert got[p + "weight_scale"][0] == ("U8" if kind == "mxfp4" else "F8_E4M3")
        assert got[p + "weight_scale"][2] == fx[f"{n}.{kind}.scale"].tobytes(), n
        if kind == "nvfp4":  # the fused q/k/v 512.0, down_proj its own 936.0 (divisors, F32 [1])
            assert got[p + "weight_global_scale"][:2] == ("F32", [1])
            assert got[p + "weight_global_scale"][2] == fx[f"{n}.nvfp4.global"].tobytes(), n
        else:
            assert p + "weight_global_scale" not in got
    qc = json.loads((dst / "config.json").read_text())["quantization_config"]
    real = json.loads((SAMPLES / f"ct_{kind}_smollm2" / "config.json").read_text())["quantization_config"]
    assert qc["format"] == real["format"] == f"{kind}-pack-quantized"
    assert qc["config_groups"] == real["config_groups"]
    assert load(dst).format == "compressed-tensors"


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_mlx_rule_to_mlx_is_the_mlx_lm_sample(src, fx, tmp_path, kind):
    dst = tmp_path / "mlx"
    assert "warnings" not in _quantize(src, dst, kind, "mlx", rule="mlx")  # mlx_lm loads it
    got = _raw_safetensors(dst / "model.safetensors")
    real = _raw_safetensors(SAMPLES / f"mlx_{kind}_smollm2tiny" / "model.safetensors")
    assert not [k for k in got if k.endswith("global_scale")]  # mx.quantize(mode="nvfp4") without one
    rows = fx["down_rows"]
    for n in NAMES:
        p = n[: -len("weight")]
        for field in ("weight", "scales"):
            dt, shape, b = real[p + field]
            want = np.frombuffer(b, np.uint8).reshape(shape[0], -1)
            if "down_proj" in n:
                want = want[rows]
            assert got[p + field][0] == dt and got[p + field][2] == want.tobytes(), (n, field)
    qc = json.loads((dst / "config.json").read_text())
    want = json.loads((SAMPLES / f"mlx_{kind}_smollm2tiny" / "config.json").read_text())
    assert qc["quantization"] == want["quantization"]


@pytest.mark.parametrize("rule", ["ct", "mlx"])
def test_mxfp4_to_gguf_decodes_like_llama_cpp(src, fx, tmp_path, rule):
    dst = tmp_path / "q.gguf"
    _quantize(src, dst, "mxfp4", "gguf", rule=rule)
    names = load(dst).metadata["gguf_names"]
    tensors = {t.name: t for t in gguf.GGUFReader(dst).tensors}
    for n in NAMES:
        t = tensors[names[n]]
        assert t.tensor_type.name == "MXFP4"
        ggml = gguf.quants.dequantize(t.data, t.tensor_type)
        if rule == "ct":
            assert np.array_equal(ggml, _llama_permute(_by_hand(fx, n, "mxfp4"), n)), n
        # qckpt reads back what llama.cpp decodes (in HF row order)
        assert np.array_equal(ggml, _llama_permute(load(dst)[n].dequantize(), n)), n


def test_nvfp4_power_of_two_global_scale_to_gguf_and_mlx(src_qkv, fx, tmp_path):
    """q/k/v share the divisor 512.0: GGUF's multiplier 1/512 and MLX's amax 2688/512 = 5.25 are exact."""
    dst = tmp_path / "q.gguf"
    _quantize(src_qkv, dst, "nvfp4", "gguf")
    names = load(dst).metadata["gguf_names"]
    tensors = {t.name: t for t in gguf.GGUFReader(dst).tensors}
    for n in QKV:
        t = tensors[names[n]]
        assert t.tensor_type.name == "NVFP4"
        mult = np.asarray(tensors[names[n].replace(".weight", ".scale")].data, np.float32)
        assert mult.tolist() == [1 / 512]
        ggml = gguf.quants.dequantize(t.data, t.tensor_type) * mult[0]  # llama.cpp: ggml_mul by <name>.scale
        assert np.array_equal(ggml, _llama_permute(_by_hand(fx, n, "nvfp4"), n)), n
    mdst = tmp_path / "mlx"
    doc = _quantize(src_qkv, mdst, "nvfp4", "mlx")
    # exact, but mlx-lm 0.32.2 loads a global_scale only on switch (expert) layers: the report says so
    (w,) = doc["warnings"]
    assert "mlx_lm.load refuses it on a dense Linear" in w and "(3 tensors" in w
    got = _raw_safetensors(mdst / "model.safetensors")
    for n in QKV:
        p = n[: -len("weight")]
        assert np.frombuffer(got[p + "global_scale"][2], np.float32).tolist() == [5.25]
        assert got[p + "scales"][2] == fx[f"{n}.nvfp4.scale"].tobytes()
        assert np.array_equal(load(mdst)[n].dequantize(), _by_hand(fx, n, "nvfp4")), n


@pytest.mark.parametrize("to,reason", [("gguf", "has no float32 multiplier"), ("mlx", "has no float32 amax")])
def test_nvfp4_divisor_936_is_refused(src, tmp_path, to, reason):
    opts = QuantizeOptions(bits=4, granularity="group", group_size=16, scale_dtype="F8_E4M3", fp4="nvfp4")
    dst = tmp_path / "out"
    with pytest.raises(NotRepresentableError) as ei:
        quantize_model(load(src), dst, opts, to=to)
    e = ei.value
    assert reason in str(e) and "936.0" in str(e) and e.field == "global_scale"
    assert e.tensor == "model.layers.0.mlp.down_proj.weight" and e.file == str(src)
    assert "--to native" in e.hint and "2688 / amax" in e.hint
    assert not dst.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("kind,field,reason", [("nvfp4", "input_scale", "ModelOpt NVFP4 is W4A4"),
                                               ("mxfp4", "scheme", "MXFP4 uses E8M0")])
def test_modelopt_refuses_weight_only_fp4(src, tmp_path, kind, field, reason):
    dst = tmp_path / "out"
    r = run("quantize", src, dst, "--fp4", kind, "--to", "modelopt")
    assert r.exit_code == 3 and reason in r.output and str(src) in r.output, r.output
    opts = QuantizeOptions(bits=4, granularity="group", group_size=16 if kind == "nvfp4" else 32,
                           scale_dtype="F8_E4M3" if kind == "nvfp4" else "F8_E8M0", fp4=kind)
    with pytest.raises(NotRepresentableError) as ei:
        quantize_model(load(src), dst, opts, to="modelopt")
    assert ei.value.field == field
    if kind == "nvfp4":
        assert "weights only" in ei.value.hint and "compressed-tensors" in ei.value.hint
    assert not dst.exists()


@pytest.mark.parametrize("kind,rule,to", [("mxfp4", "ct", "compressed-tensors"), ("nvfp4", "ct", "compressed-tensors"),
                                          ("mxfp4", "mlx", "mlx"), ("mxfp4", "ct", "mlx"), ("nvfp4", "ct", "mlx"),
                                          ("mxfp4", "ct", "gguf"), ("mxfp4", "mlx", "gguf"), ("nvfp4", "ct", "gguf"),
                                          ("mxfp4", "ct", "native"), ("nvfp4", "ct", "native"),
                                          ("nvfp4", "mlx", "mlx"), ("nvfp4", "mlx", "gguf"),
                                          ("nvfp4", "mlx", "compressed-tensors")])
def test_every_written_file_validates_strict_and_reads_back(src_qkv, tmp_path, kind, rule, to):
    dst = tmp_path / ("q.gguf" if to == "gguf" else "q")
    _quantize(src_qkv, dst, kind, to, rule=rule)
    rep = validate(dst, strict=True)
    assert rep.exit_code == 0, [(f.severity, f.code, f.tensor, f.message) for f in rep.findings]
    # the same quantization in every format: each file decodes to the native file's bits (sign of zero too)
    nat = tmp_path / "native.safetensors"
    _quantize(src_qkv, nat, kind, "native", rule=rule)
    a, b = load(nat), load(dst)
    for n in QKV:
        assert np.array_equal(a[n].dequantize().view(np.uint32), b[n].dequantize().view(np.uint32)), n


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_mlx_target_defaults_to_the_mlx_rule(src, tmp_path, kind):
    """`quantize --fp4 K --to mlx` without --fp4-rule uses MLX's own quantizer (mx.quantize: what mlx-lm
    loads; nvfp4 without a global scale), not compressed-tensors' (whose 936 divisor has no MLX form):
    the same bytes as an explicit --fp4-rule mlx, and the report names the rule."""
    explicit = _quantize(src, tmp_path / "explicit", kind, "mlx", rule="mlx")
    r = run("quantize", src, tmp_path / "default", "--fp4", kind, "--to", "mlx", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["target"]["rule"] == explicit["target"]["rule"] == "mlx"
    assert _raw_safetensors(tmp_path / "default" / "model.safetensors") == \
        _raw_safetensors(tmp_path / "explicit" / "model.safetensors")
    r = run("quantize", src, tmp_path / "ct", "--fp4", kind, "--to", "compressed-tensors", "--json")
    assert r.exit_code == 0 and json.loads(r.output)["target"]["rule"] == "ct"  # other targets: ct


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_quantize_to_mlx_quantizes_the_embedding_as_mlx_lm(kind, tmp_path, fx):
    """Issue 15 (a new user's finding): mlx-lm's ``quantize_model`` runs ``nn.quantize`` on every module with
    ``to_quantized`` (``nn.Embedding`` included), so ``mlx_lm.convert --q-mode mxfp4 | nvfp4`` quantizes
    ``embed_tokens``; ``qckpt quantize --fp4 K --to mlx`` does too by default: the embedding's words and scale
    bytes equal the genuine mlx-lm 0.32.2 sample's (tests/data/fp4/README.md), and config.json has no
    per-module entry keeping it dense."""
    root = _source(tmp_path / "src", fx, QKV)
    emb = _raw_safetensors(HERE / "smollm2_tiny1L_embed.safetensors")
    words = {n: np.frombuffer(b, "<u2").reshape(shape) for n, (_, shape, b) in emb.items()}
    write_bf16(root / "model.safetensors", {**{n: fx[f"{n}.bf16"] for n in QKV}, **words})
    dst = tmp_path / "out"
    doc = _quantize(root, dst, kind, "mlx", rule="mlx")
    got = _raw_safetensors(dst / "model.safetensors")
    want = _raw_safetensors(SAMPLES / f"mlx_{kind}_smollm2tiny" / "model.safetensors")
    for name in ("model.embed_tokens.weight", "model.embed_tokens.scales"):
        assert got[name] == want[name], name  # dtype, shape and bytes
    assert "model.embed_tokens.weight" in {t["name"] for t in doc["tensors"]}
    q = json.loads((dst / "config.json").read_text())["quantization"]
    assert "model.embed_tokens" not in q and q["mode"] == kind
    # other targets keep the embedding dense by default (what GPTQ / AWQ / compressed-tensors tools do)
    ct = tmp_path / "ct"
    _quantize(root, ct, kind, "compressed-tensors")
    assert _raw_safetensors(ct / "model.safetensors")["model.embed_tokens.weight"][0] == "BF16"


def test_quantize_to_mlx_leaves_dense_what_mlx_lm_leaves_dense(tmp_path):
    """mlx-lm's predicate skips a module whose ``in`` is not a multiple of the group size (``weight.shape[-1] %
    group_size != 0``): a [10, 48] embedding stays dense under ``--fp4 mxfp4`` (groups of 32) instead of being
    refused, and a 64-wide Linear is quantized; config.json holds no entry for the dense one (mlx-lm reads a
    module without ``.scales`` as dense)."""
    import numpy as np
    from safetensors.numpy import save_file

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    save_file({"model.embed_tokens.weight": rng.standard_normal((10, 48)).astype(np.float32),
               "model.layers.0.mlp.up_proj.weight": rng.standard_normal((64, 64)).astype(np.float32)},
              str(src / "model.safetensors"))
    (src / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    _quantize(src, tmp_path / "out", "mxfp4", "mlx", rule="mlx")
    got = _raw_safetensors(tmp_path / "out" / "model.safetensors")
    assert got["model.embed_tokens.weight"][:2] == ("F32", [10, 48]) and "model.embed_tokens.scales" not in got
    assert got["model.layers.0.mlp.up_proj.scales"][:2] == ("U8", [64, 2])
