"""gpt-oss MXFP4 (``quant_method: "mxfp4"``): the fixture relabelled from the real compressed-tensors MXFP4 bytes
(its decode against compressed-tensors' and transformers' own), hand-computed layouts (nibble order, E8M0 bias,
the gate / up interleave, orientation, partial final groups), typed errors, the writer and exact repacks.

Expected values are written by hand from the E2M1 table (code i: 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 = sign) and
E8M0 (``2^(b - 127)``), or come from the tools: compressed-tensors 0.19.0's ``reference_dequant.safetensors`` and
transformers 5.24's ``convert_moe_packed_tensors`` (``tests/data/gpt_oss/reference_transformers.safetensors``,
``[E, in, out]``).
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner
from safetensors.numpy import load_file, save_file

from converter.cli import main as cli
from converter.codebooks import E2M1_VALUES
from converter.errors import FormatError, LayoutError, MissingTensorError, NotRepresentableError, UnsupportedError
from converter.formats.gpt_oss import linears
from converter.formats.gpt_oss.config import kept_dense
from converter.formats.gpt_oss.interleave import GATE_UP, Interleave, fuse, fuse_rows, split, split_rows
from converter.formats.registry import get, load
from converter.groups import GroupMap
from converter.layout import EXPERT, IN, OUT
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, DenseTensor, QuantizedTensor, spec_of
from converter.validate import validate
from tests.conftest import SAMPLES
from tests.formats.conformance import ModelDirConformance, QuantizedFormatConformance, ToolDecodeConformance

DATA = Path(__file__).resolve().parents[1] / "data" / "gpt_oss"
FIXTURE = DATA / "tiny_mxfp4"
CT_MX = SAMPLES / "ct_mxfp4_smollm2"
GO = get("gpt-oss")
E8M0 = ml_dtypes.float8_e8m0fnu
P = "model.layers.0.mlp.experts"
SCHEME = QuantScheme(4, False, scale_dtype="F8_E8M0", codebook=E2M1_VALUES)


class TestGptOssConformance(QuantizedFormatConformance, ToolDecodeConformance, ModelDirConformance):
    """The fixture decoded like transformers 5.24 ``convert_moe_packed_tensors`` (BF16, ``[E, in, out]``)."""

    FORMAT = "gpt-oss"
    SAMPLES = ((FIXTURE, DATA / "reference_transformers.safetensors"),)

    def decode_like_tool(self, t):
        return np.ascontiguousarray(t.dequantize().transpose(0, 2, 1)).astype(ml_dtypes.bfloat16)


def _dir(tmp_path: Path, tensors: dict, name: str = "m", qc: dict | None = None, **cfg) -> Path:
    d = tmp_path / name
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    config = {"model_type": "gpt_oss", **cfg,
              "quantization_config": qc if qc is not None else {"quant_method": "mxfp4", "modules_to_not_convert": [
                  "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
    (d / "config.json").write_text(json.dumps(config))
    return d


def _pair(blocks: np.ndarray, scales: np.ndarray, proj: str = "down_proj") -> dict:
    return {f"{P}.{proj}_blocks": np.asarray(blocks, np.uint8), f"{P}.{proj}_scales": np.asarray(scales, np.uint8)}


# -- the fixture: a relabelling of the real compressed-tensors MXFP4 bytes ------------------------------------------
def _ct_rows(ref: dict, module: str, start: int, n: int, cols: int = 64) -> np.ndarray:
    return ref[f"model.layers.0.{module}.weight"][start:start + n, :cols].astype(np.float32)


@pytest.mark.parametrize("source", ["qckpt", "tool"])
def test_fixture_decodes_like_compressed_tensors_on_the_same_bytes(source):
    # make_fixture.py: gate row j of layer L expert e = CT q_proj row (2L+e)*64 + j, up row j = k_proj (e 0) /
    # v_proj (e 1) row 64L + j, down row r = CT down_proj row (2L+e)*64 + r; first 64 inputs (2 groups) of each
    if source == "tool":  # compressed-tensors 0.19.0's own MXFP4PackedCompressor.decompress (bf16)
        ref = load_file(str(CT_MX / "reference_dequant.safetensors"))
    else:  # qckpt's compressed-tensors reader (itself checked against that reference)
        ct = load(CT_MX)
        ref = {n: ct[n].dequantize() for n in ct.quantized_names()}
    ck = load(FIXTURE)
    assert ck.format == "gpt-oss" and sorted(ck.quantized_names()) == sorted(
        f"model.layers.{L}.mlp.experts.{j}" for L in (0, 1) for j in ("gate_up_proj", "down_proj"))
    for L in (0, 1):
        gu = ck[f"model.layers.{L}.mlp.experts.gate_up_proj"].dequantize()
        dn = ck[f"model.layers.{L}.mlp.experts.down_proj"].dequantize()
        assert gu.shape == (2, 128, 64) and dn.shape == (2, 64, 64)
        for e in (0, 1):
            assert np.array_equal(gu[e, 0::2], _ct_rows(ref, "self_attn.q_proj", (2 * L + e) * 64, 64))
            assert np.array_equal(gu[e, 1::2], _ct_rows(ref, ("self_attn.k_proj", "self_attn.v_proj")[e], 64 * L, 64))
            assert np.array_equal(dn[e], _ct_rows(ref, "mlp.down_proj", (2 * L + e) * 64, 64))


def test_fixture_equals_transformers_dequantize_in_its_orientation():
    ref = load_file(str(DATA / "reference_transformers.safetensors"))  # convert_moe_packed_tensors: [E, in, out]
    ck = load(FIXTURE)
    assert sorted(ref) == sorted(ck.quantized_names())
    for name, want in ref.items():
        got = ck[name].dequantize()
        assert want.shape == (got.shape[0], got.shape[2], got.shape[1])
        assert np.array_equal(got.transpose(0, 2, 1), want.astype(np.float32)), name


def test_fixture_specs_metadata_and_clean_validation():
    ck = load(FIXTURE)
    s = ck.spec(f"{P}.gate_up_proj")
    assert s.axes == (EXPERT, OUT, IN) and s.group_map.describe() == "group(in, 32)"
    assert s.scheme.scale_dtype == "F8_E8M0"
    assert [(a.role, a.dtype, a.shape) for a in s.stored] == [("codes", "U8", (2, 128, 2, 16)),
                                                             ("scales", "U8", (2, 128, 2))]
    assert any("interleaved" in n for n in s.notes)
    assert ck.metadata["fused"][f"{P}.gate_up_proj"] == {"layout": "interleaved", "axis": "out",
                                                         "parts": ["gate_proj", "up_proj"], "stride": 2}
    assert ck.metadata["modules_to_not_convert"][0] == "model.layers.*.self_attn"
    assert ck.spec(f"{P}.gate_up_proj_bias").kind == "dense"
    assert ck.spec("model.layers.0.mlp.router.weight").kind == "dense"
    rep = validate(FIXTURE, strict=True)
    assert rep.exit_code == 0 and not rep.findings


# -- hand-computed layouts -----------------------------------------------------------------------------------------
def test_nibble_order_e8m0_bias_and_orientation_by_hand(tmp_path):
    # one expert, 2 rows, 32 inputs: byte 0x21 = low nibble code 1 (0.5) for element 0, high nibble code 2 (1.0)
    # for element 1; byte 0xA7 = code 7 (6.0) then code 10 (-1.0); scale byte 128 = 2^1, byte 126 = 2^-1
    blocks = np.zeros((1, 2, 1, 16), np.uint8)
    blocks[0, 0, 0, 0], blocks[0, 0, 0, 1] = 0x21, 0xA7
    blocks[0, 1, 0, 15] = 0x9F  # elements 30, 31 of row 1: code 15 (-6.0), code 9 (-0.5)
    w = load(_dir(tmp_path, _pair(blocks, [[[128], [126]]])))[f"{P}.down_proj"].dequantize()
    assert w.shape == (1, 2, 32)  # [expert, out, in]: rows are the stored out axis
    assert w[0, 0, :4].tolist() == [1.0, 2.0, 12.0, -2.0] and not w[0, 0, 4:].any()
    assert w[0, 1, 30:].tolist() == [-3.0, -0.25] and not w[0, 1, :30].any()


@pytest.mark.parametrize("byte,value", [(127, 1.0), (0, 2.0 ** -127), (254, 2.0 ** 127), (1, 2.0 ** -126),
                                        (130, 8.0)])
def test_e8m0_scale_bytes_by_hand(tmp_path, byte, value):
    blocks = np.full((1, 1, 1, 16), 0x22, np.uint8)  # every element code 2 = 1.0
    w = load(_dir(tmp_path, _pair(blocks, [[[byte]]])))[f"{P}.down_proj"].dequantize()
    assert (w == np.float32(value)).all()


def test_e8m0_nan_byte_decodes_nan_and_validate_flags_it(tmp_path):
    # OCP E8M0 0xFF is NaN (transformers' ldexp would give 2^128 = inf); no real checkpoint stores it
    blocks = np.full((1, 2, 1, 16), 0x22, np.uint8)
    d = _dir(tmp_path, _pair(blocks, [[[127], [255]]]))
    w = load(d)[f"{P}.down_proj"].dequantize()
    assert (w[0, 0] == 1.0).all() and np.isnan(w[0, 1]).all()
    assert validate(d).exit_code


def test_interleave_split_and_fuse_by_hand():
    # 1 expert, 4 fused rows: row r has every code = r + 1 (0.5, 1.0, 1.5, 2.0), scale 2^r
    codes = np.repeat(np.arange(1, 5, dtype=np.uint8)[None, :, None], 32, axis=2)
    scales = (np.arange(4, dtype=np.uint8) + 127).reshape(1, 4, 1).view(E8M0)
    t = QuantizedTensor(f"{P}.gate_up_proj", (EXPERT, OUT, IN), codes, scales, SCHEME, GroupMap.per_group(32, IN))
    gate, up = split(t, ["g", "u"])
    assert gate.dequantize()[0, :, 0].tolist() == [0.5 * 1, 1.5 * 4]  # rows 0, 2
    assert up.dequantize()[0, :, 0].tolist() == [1 * 2, 2 * 8]  # rows 1, 3
    back = fuse([gate, up], t.name)
    assert np.array_equal(back.codes, codes) and np.array_equal(back.scales.view(np.uint8), scales.view(np.uint8))
    b = np.array([[10, 11, 20, 21]], np.float32)
    assert [x.tolist() for x in split_rows(b, -1)] == [[[10, 20]], [[11, 21]]]
    assert np.array_equal(fuse_rows(split_rows(b, -1), -1), b)
    assert Interleave.from_json(GATE_UP.to_json()) == GATE_UP
    with pytest.raises(LayoutError, match="multiple of the interleave stride"):
        split(t.replace(codes=codes[:, :3], scales=scales[:, :3]), ["g", "u"])


def test_interleave_split_keeps_packed_words(tmp_path):
    ck = load(FIXTURE)
    t = ck[f"{P}.gate_up_proj"]
    gate, up = split(t, ["g", "u"])
    assert gate.packed is not None and up.packed is not None  # whole rows cut: the E2M1 bytes are not unpacked
    raw = load_file(str(FIXTURE / "model.safetensors"))[f"{P}.gate_up_proj_blocks"]
    assert np.array_equal(gate.packed.words, raw[:, 0::2].reshape(2, 64, 32))
    assert np.array_equal(fuse([gate, up], t.name).packed.words, raw.reshape(2, 128, 32))


def test_partial_final_group_is_refused(tmp_path):
    # blocks always decode to 32 G inputs: a config hidden_size 48 cannot match G = 2 (transformers cannot load it)
    blocks = np.zeros((1, 48, 2, 16), np.uint8)
    d = _dir(tmp_path, _pair(blocks, np.full((1, 48, 2), 127), "down_proj"), hidden_size=48, intermediate_size=48)
    with pytest.raises(UnsupportedError, match="partial final group"):
        load(d)
    q = QuantizedTensor(f"{P}.down_proj", (EXPERT, OUT, IN), np.zeros((1, 2, 48), np.uint8),
                        np.full((1, 2, 2), 127, np.uint8).view(E8M0), SCHEME, GroupMap.per_group(32, IN))
    assert "partial" in GO.target_reason(spec_of(q)) and GO.partial_groups is False


def test_bad_inputs_raise_typed_errors(tmp_path):
    ok = np.zeros((2, 4, 1, 16), np.uint8)
    with pytest.raises(MissingTensorError, match="_scales"):
        load(_dir(tmp_path, {f"{P}.down_proj_blocks": ok}, "a"))
    with pytest.raises(FormatError, match="blocks.shape"):
        load(_dir(tmp_path, _pair(ok, np.zeros((2, 4, 2))), "b"))
    with pytest.raises(FormatError, match="16"):
        load(_dir(tmp_path, _pair(np.zeros((2, 4, 1, 8)), np.zeros((2, 4, 1))), "c"))
    with pytest.raises(FormatError, match="out must be even"):
        load(_dir(tmp_path, _pair(np.zeros((2, 3, 1, 16)), np.zeros((2, 3, 1)), "gate_up_proj"), "d"))
    with pytest.raises(FormatError, match="num_local_experts"):
        load(_dir(tmp_path, _pair(ok, np.zeros((2, 4, 1))), "e", num_local_experts=3))
    with pytest.raises(FormatError, match="hidden_size"):
        load(_dir(tmp_path, _pair(ok, np.zeros((2, 4, 1))), "f", hidden_size=8))
    with pytest.raises(FormatError, match="modules_to_not_convert names an expert module"):
        load(_dir(tmp_path, _pair(ok, np.zeros((2, 4, 1))), "g", qc={"quant_method": "mxfp4",
                                                                  "modules_to_not_convert": ["model.layers.0.mlp"]}))
    with pytest.raises(FormatError, match="regular expression"):
        load(_dir(tmp_path, _pair(ok, np.zeros((2, 4, 1))), "h", qc={"quant_method": "mxfp4",
                                                                  "modules_to_not_convert": ["model.(layers"]}))


def test_modules_to_not_convert_matches_like_transformers():
    pats = ("model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head")
    assert kept_dense("model.layers.11.self_attn", pats) and kept_dense("model.layers.0.mlp.router", pats)
    assert not kept_dense("model.layers.0.mlp.experts", pats)
    assert not kept_dense("model.layers.1.mlp.gate_proj", ("mlp.gate",))  # boundary: not a prefix of a word
    assert kept_dense("model.decoder.layers.23.fc1", ("fc1",))  # suffix rule


# -- writer ---------------------------------------------------------------------------------------------------------
def test_round_trip_is_byte_identical_and_config_as_mxfp4config(tmp_path):
    GO.write(load(FIXTURE), tmp_path / "rt")
    a, b = load_file(str(FIXTURE / "model.safetensors")), load_file(str(tmp_path / "rt" / "model.safetensors"))
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in a)
    assert json.loads((tmp_path / "rt" / "config.json").read_text())["quantization_config"] == {
        "quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                            "model.embed_tokens", "lm_head"]}


def test_writer_refuses_what_transformers_would_not_load(tmp_path):
    q2 = QuantizedTensor("model.layers.0.self_attn.q_proj.weight", (OUT, IN), np.zeros((2, 32), np.uint8),
                         np.full((2, 1), 127, np.uint8).view(E8M0), SCHEME, GroupMap.per_group(32, IN))
    assert "loads BF16" in GO.target_reason(spec_of(q2))
    nv = QuantizedTensor(f"{P}.down_proj", (EXPERT, OUT, IN), np.zeros((1, 2, 32), np.uint8),
                         np.ones((1, 2, 2), np.float32).astype(ml_dtypes.float8_e4m3fn),
                         QuantScheme(4, False, scale_dtype="F8_E4M3", codebook=E2M1_VALUES), GroupMap.per_group(16, IN))
    assert "E8M0" in GO.target_reason(spec_of(nv))
    assert GO.keep_dense(spec_of(q2)) and GO.keep_dense(load(FIXTURE).spec(f"{P}.down_proj")) is None
    dense = DenseTensor(f"{P}.down_proj", np.zeros((1, 32, 32), np.float32))
    with pytest.raises(NotRepresentableError, match="quantiz"):
        GO.write(Checkpoint.from_tensors([dense, _fixture_tensor()], format="memory", config={}), tmp_path / "x")
    assert not (tmp_path / "x").exists()


def _fixture_tensor():
    return load(FIXTURE)[f"{P}.gate_up_proj"]


def test_exact_repack_gpt_oss_to_compressed_tensors_and_back(tmp_path):
    src = load(FIXTURE)
    lin = linears.linear(src)
    assert f"{P}.experts.1.up_proj.weight" in lin and lin.spec(f"{P}.experts.1.up_proj.weight").axes == (OUT, IN)
    get("compressed-tensors").write(lin, tmp_path / "ct")
    ct = load(tmp_path / "ct")
    assert ct.format == "compressed-tensors"
    gu, ctg = src[f"{P}.gate_up_proj"].dequantize(), ct[f"{P}.experts.1.up_proj.weight"].dequantize()
    assert np.array_equal(ctg, gu[1, 1::2])
    raw = load_file(str(tmp_path / "ct" / "model.safetensors"))
    want = load_file(str(FIXTURE / "model.safetensors"))
    assert np.array_equal(raw[f"{P}.experts.0.gate_proj.weight_packed"],
                          want[f"{P}.gate_up_proj_blocks"][0, 0::2].reshape(64, 32))
    assert np.array_equal(raw[f"{P}.experts.0.gate_proj.bias"].view(np.uint16),
                          want[f"{P}.gate_up_proj_bias"][0, 0::2].view(np.uint16))
    GO.write(linears.fused(ct), tmp_path / "back")
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(back) == sorted(want) and all(np.array_equal(back[k].view(np.uint8), want[k].view(np.uint8))
                                                for k in want)


def test_fused_refuses_a_gap_in_the_experts():
    t = _fixture_tensor()
    lin = linears.linear(Checkpoint.from_tensors([t], format="memory", config={}))
    kept = [lin[n] for n in lin.names() if ".experts.0." not in n]
    with pytest.raises(MissingTensorError, match="expert missing"):
        linears.fused(Checkpoint.from_tensors(kept, format="memory", config={}))


def test_convert_cli_to_gpt_oss_proves_the_read_back(tmp_path):
    res = CliRunner().invoke(cli, ["convert", str(FIXTURE), str(tmp_path / "out"), "--to", "gpt-oss", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert json.dumps(doc).count("gate_up_proj") >= 2
    assert load(tmp_path / "out").format == "gpt-oss"


def test_float_export_uses_the_bf16_parameter_orientation(tmp_path):
    # transformers' BF16 GptOssExperts: gate_up_proj [E, hidden, 2I], down_proj [E, I, hidden] ([expert, in, out]);
    # down_proj is square per expert in gpt-oss-20b (2880 x 2880), so [E, out, in] would load silently transposed
    from converter.ops.convert import convert_exact
    rep = convert_exact(FIXTURE, tmp_path / "plain", "plain")
    assert rep["summary"]["all_exact"]
    rows = {r["name"]: r for r in rep["tensors"]}
    assert rows[f"{P}.down_proj"]["dense_axes"] == ["expert", "in", "out"] and rows[f"{P}.down_proj"]["bit_exact"]
    got = load_file(str(tmp_path / "plain" / "model.safetensors"))
    src = load(FIXTURE)
    assert got[f"{P}.gate_up_proj"].shape == (2, 64, 128)
    for name in (f"{P}.gate_up_proj", f"{P}.down_proj"):
        assert np.array_equal(got[name], src[name].dequantize().transpose(0, 2, 1))


def test_exact_convert_to_gpt_oss_names_the_module_policy_when_nothing_stays_quantized(tmp_path):
    # regression: the refusal said "the source has no quantized tensors" for a source whose quantized Linear
    # weights the target keeps BF16
    from converter.ops.convert import convert_exact
    with pytest.raises(NotRepresentableError, match="keeps every quantized module of this source dense") as info:
        convert_exact(CT_MX, tmp_path / "out", "gpt-oss")
    assert "GptOssExperts" in str(info.value) and not (tmp_path / "out").exists()


def test_validate_reference_in_the_bf16_orientation_is_clean():
    # regression: a BF16 gpt-oss reference stores experts [E, in, out]; it was reported "reference-missing"
    # (gate_up_proj) and "layout-mismatch" (the square down_proj), a false alarm on a correct decode
    rep = validate(FIXTURE, reference=DATA / "reference_transformers.safetensors", strict=True)
    assert rep.exit_code == 0 and not rep.findings
    assert set(rep.tensors) == set(load(FIXTURE).quantized_names())
    assert all(s["reference"]["rel_rms"] == 0.0 for s in rep.tensors.values())


@pytest.mark.parametrize("fault", ["high nibble first", "gate/up as halves", "experts transposed"])
def test_self_test_probe_catches_a_wrong_reader(tmp_path, fault):
    from dataclasses import replace

    from converter.validate.probes import mx_expert_probe_tensor, run_probe

    def bad_read(src):
        ck = GO.read(src)

        def broken(name):
            t = ck[name]
            if not isinstance(t, QuantizedTensor):
                return t
            q, s = t.codes, t.scales
            if fault == "high nibble first":
                e, o, i = q.shape
                q = q.reshape(e, o, i // 2, 2)[..., ::-1].reshape(e, o, i)
            elif fault == "gate/up as halves":
                perm = np.r_[0:q.shape[1]:2, 1:q.shape[1]:2]
                q, s = q[:, perm], s[:, perm]
            else:
                q = q.transpose(0, 2, 1).reshape(q.shape)
            return t.replace(codes=np.ascontiguousarray(q), scales=np.ascontiguousarray(s))
        return type(ck)({n: ck.spec(n) for n in ck.names()}, broken, format="gpt-oss")
    res = run_probe(replace(GO, read=bad_read), mx_expert_probe_tensor(), tmp_path)
    assert res.error is None and not res.declared_exact
    assert run_probe(GO, mx_expert_probe_tensor(), tmp_path).passed
