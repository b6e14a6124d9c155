"""FP8 checks of the validator on the logical model (native files and in-memory checkpoints).

Correct inputs are the real samples (``fp8_data``: auto-round's DeepSeek-style 128 x 128 block FP8 and
llm-compressor's per-channel FP8, subsets of the files those tools wrote); each fault is crafted on a
copy of them and must fire, with the numbers computed here by hand or with numpy / ml_dtypes.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from converter import codebooks
from converter.groups import GroupMap
from converter.scheme import QuantScheme
from converter.spec import StoredArray
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec, spec_of
from converter.validate import float_checks, scale_direction, validate
from converter.validate.reference import compare, float_steps
from tests.validate import fp8_data as D

E4M3 = ml_dtypes.float8_e4m3fn
NON_INFO = ("error", "warning")


def decode(codes: np.ndarray, scales_full: np.ndarray) -> np.ndarray:
    """Independent decode: the bytes read as E4M3 by ml_dtypes, times the expanded scale (float32)."""
    return codes.view(E4M3).astype(np.float32) * scales_full.astype(np.float32)


def expand_blocks(s: np.ndarray, shape, b: int = 128) -> np.ndarray:
    return np.repeat(np.repeat(s.astype(np.float32), b, 0), b, 1)[:shape[0], :shape[1]]


def serious(rep):
    return [(f.code, f.severity, f.tensor) for f in rep.findings if f.severity in NON_INFO]


# -- the real samples are clean -------------------------------------------------------------------------
def test_real_block_fp8_is_clean_and_saturates_every_block(tmp_path):
    rep = validate(D.write_native(tmp_path / "ds.safetensors", D.deepseek_tensors()))
    assert rep.exit_code == 0 and serious(rep) == []
    assert {f.code for f in rep.findings} == {"block-tail"}  # partial edge blocks: info only
    for name in (D.K, D.V):
        st = rep.tensors[name]["float"]
        assert st["saturation"] == {"bound": 448.0, "groups": 10, "all_zero": 0, "unsaturated": 0,
                                    "unsaturated_fraction": 0.0, "first_unsaturated": []}


def test_cli_json_and_text_on_a_faulty_fp8_file(tmp_path):
    import json

    from click.testing import CliRunner

    from converter.cli import main
    from converter.schemas import validate_document
    k, v = D.deepseek_tensors()
    p = D.write_native(tmp_path / "inv.safetensors", [_inverted(k), v])
    r = CliRunner().invoke(main, ["validate", str(p), "--json"])
    doc = json.loads(r.output)
    validate_document(doc, "validation-report")
    assert r.exit_code == 1 and [f["tensor"] for f in doc["findings"] if f["code"] == "scale-direction"] == [D.K]
    text = CliRunner().invoke(main, ["validate", str(p)]).output
    assert "scale-direction" in text and "block-tail" in text


def test_real_channel_fp8_is_clean(tmp_path):
    rep = validate(D.write_native(tmp_path / "ct.safetensors", D.ct_tensors()))
    assert rep.exit_code == 0 and rep.findings == []
    assert all(rep.tensors[n]["float"]["saturation"]["unsaturated"] == 0 for n in (D.Q, D.K, D.V, D.DOWN))


def test_magnitudes_match_a_numpy_decode():
    k = D.deepseek_tensors()[0]
    w = decode(k.codes, expand_blocks(k.scales, k.shape))
    w_inv = k.codes.view(E4M3).astype(np.float64) / expand_blocks(k.scales, k.shape)
    m = scale_direction.magnitude(k)
    assert m["rms"] == pytest.approx(math.sqrt(np.mean(w.astype(np.float64) ** 2)), rel=1e-5)
    assert m["rms_reciprocal"] == pytest.approx(math.sqrt(np.mean(w_inv ** 2)), rel=1e-5)
    assert m["decades"] == pytest.approx(math.log10(m["rms"] * 24.0), abs=1e-3)  # sqrt(576) = 24


# -- block grid and partial edge blocks -----------------------------------------------------------------
def test_block_tail_names_the_partial_edges():
    f = float_checks.check_block_grid(spec_of(D.deepseek_tensors()[0]))
    assert [x.code for x in f] == ["block-tail"] and f[0].severity == "info"
    ev = f[0].evidence
    # 192 = 1 x 128 + 64, 576 = 4 x 128 + 64: 2 x 5 = 10 blocks, 1 x 4 = 4 whole, 6 partial
    assert ev["edges"] == {"out": 64, "in": 64} and ev["grid"] == [2, 5]
    assert ev["partial_blocks"] == 6 and ev["blocks_per_matrix"] == 10 and ev["padded"] == {"out": 256, "in": 640}


def test_no_block_tail_when_the_block_divides_the_shape():
    w = np.random.default_rng(1).standard_normal((256, 384)).astype(np.float32) * 0.05
    t = D.absmax_fp8("w", w, GroupMap.per_block(128, 128))
    assert float_checks.check_block_grid(spec_of(t)) == []


def _spec_with_scales(shape, scale_shape, block=(128, 128), axes=("out", "in")):
    n = int(np.prod(shape))
    stored = (StoredArray("w", "codes", "F8_E4M3", tuple(shape), n),
              StoredArray("w_scale_inv", "scales", "F32", tuple(scale_shape), 4 * int(np.prod(scale_shape))))
    return TensorSpec("w", "quantized", tuple(shape), stored, axes=axes, scheme=D.e4m3("F32"),
                      group_map=GroupMap.per_block(*block))


def test_block_grid_of_whole_blocks_only_is_a_shape_error():
    # 576 x 1536 with 128 blocks needs ceil: 5 x 12 = 60 scales; floor(576/128) x 12 = 48 drops the edge row
    f = [x for x in float_checks.check_block_grid(_spec_with_scales((576, 1536), (4, 12))) if x.code == "shape"]
    assert len(f) == 1 and f[0].severity == "error"
    assert f[0].evidence["expected"] == [5, 12] and f[0].evidence["found"] == [4, 12]
    assert f[0].evidence["expected_blocks"] == 60 and f[0].evidence["whole_blocks_only"] is True
    ok = float_checks.check_block_grid(_spec_with_scales((576, 1536), (5, 12)))
    assert [x.code for x in ok] == ["block-tail"]  # the right grid: only the info about the edge


def test_block_grid_per_expert():
    # 4 experts x (192 x 576): 4 x 2 x 5 = 40 scales
    bad = float_checks.check_block_grid(_spec_with_scales((4, 192, 576), (4, 1, 4), axes=("expert", "out", "in")))
    assert [x.code for x in bad if x.code == "shape"] and bad[0].evidence["expected_blocks"] == 40
    good = float_checks.check_block_grid(_spec_with_scales((4, 192, 576), (4, 2, 5), axes=("expert", "out", "in")))
    assert [x.code for x in good] == ["block-tail"] and good[0].evidence["partial_blocks"] == 6


def test_block_grid_error_through_validate(tmp_path):
    """A native file whose stored scale grid drops the partial edge blocks: the header check names it."""
    k = D.deepseek_tensors()[0]
    t = k.replace(scales=k.scales.astype(np.float32), scheme=D.e4m3("F32"))
    p = D.write_native(tmp_path / "k.safetensors", [t])
    from tests.validate.helpers import edit_tensors
    edit_tensors(tmp_path, lambda a: a.__setitem__(f"{D.K}.scales", a[f"{D.K}.scales"][:1, :4].copy()),
                 file="k.safetensors")
    rep = validate(p)
    grid = [f for f in rep.findings if f.code == "shape" and "whole block" in f.message]
    assert grid and grid[0].evidence["expected"] == [2, 5] and grid[0].evidence["found"] == [1, 4]
    assert rep.exit_code == 1


# -- codes that decode to NaN ---------------------------------------------------------------------------
def test_nan_codes_are_found_with_their_block(tmp_path):
    k, v = D.deepseek_tensors()
    codes = k.codes.copy()
    codes[5, 300] = 0x7F   # +NaN in E4M3
    codes[150, 10] = 0xFF  # -NaN
    assert np.isnan(np.array([0x7F, 0xFF], dtype=np.uint8).view(E4M3).astype(np.float32)).all()
    rep = validate(D.write_native(tmp_path / "nan.safetensors", [k.replace(codes=codes), v]))
    f = [x for x in rep.findings if x.code == "code-nonfinite"]
    assert len(f) == 1 and f[0].tensor == D.K and f[0].severity == "error"
    assert f[0].evidence["count"] == 2 and f[0].evidence["codes"] == {"0x7F": 1, "0xFF": 1}
    assert f[0].evidence["first_index"] == [5, 300] and f[0].evidence["first_block"] == [0, 2]  # 300 // 128 = 2


def test_e5m2_infinities_are_non_finite_codes():
    e5 = QuantScheme(8, False, scale_dtype="F32", codebook=codebooks.ELEMENTS["e5m2"].values)
    codes = np.full((4, 64), 0x3C, dtype=np.uint8)  # 1.0 in E5M2
    codes[2, 7] = 0x7C                              # +inf in E5M2
    assert np.isinf(np.uint8(0x7C).reshape(1).view(ml_dtypes.float8_e5m2).astype(np.float32))[0]
    t = QuantizedTensor("w", ("out", "in"), codes, np.ones((4, 1), np.float32), e5, GroupMap.per_channel("out"))
    f = float_checks.check_nonfinite_codes(t)
    assert f and f[0].evidence["codes"] == {"0x7C": 1} and f[0].evidence["first_block"] == [2, 0]


# -- scales: NaN, inf, zero, negative, with the block index ----------------------------------------------
def test_bad_block_scales_name_the_block(tmp_path):
    k = D.deepseek_tensors()[0]
    s = k.scales.astype(np.float32)
    s[1, 3] = np.nan
    s[0, 1] = 0.0
    s[1, 4] = -s[1, 4]
    t = k.replace(scales=s, scheme=D.e4m3("F32"))
    rep = validate(D.write_native(tmp_path / "s.safetensors", [t]))
    by = {f.code: f for f in rep.findings}
    assert by["scale-nonfinite"].evidence["first_index"] == [1, 3] and "block [1, 3]" in by["scale-nonfinite"].message
    assert by["scale-nonfinite"].evidence["blocks"] == [[1, 3]]
    # 1 of 10 scales zero: more than the 1 % of all-zero groups real weights have -> warning
    assert by["scale-zero"].severity == "warning" and by["scale-zero"].evidence["blocks"] == [[0, 1]]
    assert by["scale-negative"].evidence["blocks"] == [[1, 4]]
    assert rep.exit_code == 1


def test_e8m0_scale_0xff_is_nan():
    codes = np.full((2, 64), 0x38, dtype=np.uint8)  # 1.0 in E4M3
    e8 = np.array([[127, 127], [127, 0xFF]], dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    assert float(e8[0, 0].astype(np.float32)) == 1.0 and np.isnan(float(e8[1, 1].astype(np.float32)))
    t = QuantizedTensor("w", ("out", "in"), codes, e8, D.e4m3("F8_E8M0"), GroupMap.per_block(1, 32))
    from converter.validate.data_checks import check_scales
    f = [x for x in check_scales(t, negative_ok=False) if x.code == "scale-nonfinite"]
    assert f and f[0].evidence["first_index"] == [1, 1] and f[0].evidence["scale_dtype"] == "F8_E8M0"


# -- per-block saturation -------------------------------------------------------------------------------
def test_an_all_zero_block_is_not_unsaturated():
    k = D.deepseek_tensors()[0]
    codes = k.codes.copy()
    codes[:128, :128] = 0x00
    codes[:4, :4] = 0x80  # -0.0 is zero too
    f, st = float_checks.check_unsaturated(k.replace(codes=codes))
    assert f == [] and st["all_zero"] == 1 and st["unsaturated"] == 0


def test_a_block_that_never_reaches_448_is_reported():
    k = D.deepseek_tensors()[0]
    codes = k.codes.copy()
    blk = codes[128:192, 256:384].view(E4M3).astype(np.float32)
    codes[128:192, 256:384] = (blk * 0.5).astype(E4M3).view(np.uint8)  # max |code| 224
    f, st = float_checks.check_unsaturated(k.replace(codes=codes))
    assert st["unsaturated"] == 1 and st["first_unsaturated"] == [[1, 2]]
    assert [x.code for x in f] == ["unsaturated"] and f[0].severity == "info"  # 1 of 10: not most


def test_e5m2_bytes_read_as_e4m3_warn():
    """The same weights quantized to E5M2 (absmax: amax -> 57344) but declared E4M3: no block reaches 448."""
    w = D.source_k()
    S = np.zeros((2, 5), np.float32)
    codes = np.zeros(w.shape, np.uint8)
    for i in range(2):
        for j in range(5):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            S[i, j] = np.abs(blk).max() / 57344.0
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (blk / S[i, j]).astype(ml_dtypes.float8_e5m2).view(
                np.uint8)
    t = QuantizedTensor(D.K, ("out", "in"), codes, S, D.e4m3("F32"), GroupMap.per_block(128, 128))
    f, st = float_checks.check_unsaturated(t)
    assert st["unsaturated"] == 10 and f[0].severity == "warning"


def test_per_tensor_shared_scale_is_info_only():
    w = D.source_k()
    s = np.float32(2 * np.abs(w).max() / 448)  # a scale shared with a tensor twice as large (fused q/k/v)
    codes = (w / s).astype(E4M3).view(np.uint8)
    t = QuantizedTensor(D.K, ("out", "in"), codes, np.array([[s]], np.float32), D.e4m3("F32"), GroupMap.per_tensor())
    f, st = float_checks.check_unsaturated(t)
    assert st["groups"] == 1 and st["unsaturated"] == 1 and f[0].severity == "info"


def test_power_of_two_scales_need_only_half_the_range():
    """MX-style E8M0 scales (2^ceil(log2(amax / 448))): the largest code lies in (224, 448]."""
    w = D.source_k()
    g = w.reshape(192, 18, 32)
    e = np.ceil(np.log2(np.abs(g).max(-1) / 448.0))
    s = np.exp2(e).astype(np.float32)
    codes = (g / s[..., None]).astype(E4M3).view(np.uint8).reshape(192, 576)
    peak = np.abs(codes.view(E4M3).astype(np.float32)).reshape(192, 18, 32).max(-1)
    assert peak.min() >= 224 and (peak < 448).mean() > 0.5  # most groups stop short of 448: legal here
    t = QuantizedTensor(D.K, ("out", "in"), codes, s.astype(ml_dtypes.float8_e8m0fnu), D.e4m3("F8_E8M0"),
                        GroupMap.per_block(1, 32))
    f, st = float_checks.check_unsaturated(t)
    assert f == [] and st["bound"] == 224.0


def test_power_of_two_f32_scales_need_only_half_the_range():
    """DeepSeek V3.1 ``scale_fmt: ue8m0``: F32 ``weight_scale_inv = 2^ceil(log2(amax / 448))`` per 128x128
    block. Every block's largest code lies in [224, 448], most below 448: legal, no finding."""
    w = D.source_k()  # 256 x 576: 2 x 5 blocks
    S = np.zeros((2, 5), np.float32)
    codes = np.zeros(w.shape, np.uint8)
    for i in range(2):
        for j in range(5):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            S[i, j] = 2.0 ** np.ceil(np.log2(np.abs(blk).max() / 448.0))
            codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (blk / S[i, j]).astype(E4M3).view(np.uint8)
    peak = np.array([[np.abs(codes[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].view(E4M3).astype(np.float32)).max()
                      for j in range(5)] for i in range(2)])
    assert peak.min() >= 224 and (peak < 448).sum() >= 2  # the old bound (448) fired on these
    for dtype, scheme in ((np.float32, D.e4m3("F32")), (ml_dtypes.bfloat16, D.e4m3("BF16"))):
        t = QuantizedTensor(D.K, ("out", "in"), codes, S.astype(dtype), scheme, GroupMap.per_block(128, 128))
        f, st = float_checks.check_unsaturated(t)
        assert f == [] and st["bound"] == 224.0 and st["unsaturated"] == 0
    # one scale off a power of two: back to the full bound (448)
    S2 = S.copy()
    S2[0, 0] *= 1.5
    t = QuantizedTensor(D.K, ("out", "in"), codes, S2, D.e4m3("F32"), GroupMap.per_block(128, 128))
    assert float_checks.block_saturation(t)["bound"] == 448.0


def test_powers_of_two():
    assert float_checks.powers_of_two(np.array([0.25, 1.0, 2.0 ** -20], np.float32))
    assert not float_checks.powers_of_two(np.array([0.25, 0.375], np.float32))
    assert not float_checks.powers_of_two(np.array([0.0, 1.0], np.float32))
    assert not float_checks.powers_of_two(np.array([np.nan], np.float32))


# -- scale direction ------------------------------------------------------------------------------------
def _inverted(t: QuantizedTensor) -> QuantizedTensor:
    """What a reader that divides by ``weight_scale_inv`` puts in the logical model: 1 / s as the multiplier."""
    return t.replace(scales=(1.0 / t.scales.astype(np.float32)).astype(np.float32), scheme=D.e4m3("F32"))


def test_weight_scale_inv_used_as_a_divisor_is_found(tmp_path):
    k, v = D.deepseek_tensors()
    rep = validate(D.write_native(tmp_path / "inv.safetensors", [_inverted(k), _inverted(v)]))
    f = {x.tensor: x for x in rep.findings if x.code == "scale-direction"}
    assert set(f) == {D.K, D.V} and all(x.severity == "error" for x in f.values())
    w_bad = k.codes.view(E4M3).astype(np.float64) / expand_blocks(k.scales, k.shape)
    assert f[D.K].evidence["rms"] == pytest.approx(math.sqrt(np.mean(w_bad ** 2)), rel=1e-5)
    assert f[D.K].evidence["decades"] > 5 and f[D.K].evidence["decades_reciprocal"] < 1


def test_one_inverted_tensor_among_its_siblings():
    ts = D.ct_tensors()
    ts[2] = _inverted(ts[2])  # v_proj only
    mags = {t.name: scale_direction.magnitude(t) for t in ts}
    f = scale_direction.check_scale_direction(mags)
    assert [x.tensor for x in f] == [D.V]
    assert sorted(mags[n]["decades"] for n in (D.Q, D.K, D.DOWN)) == f[0].evidence["sibling_decades"]


def test_large_weights_and_scales_near_one_do_not_fire():
    # scales 10x larger (one decade) are unusual but not inverted
    ts = [t.replace(scales=(t.scales.astype(np.float32) * 10).astype(np.float32), scheme=D.e4m3("F32"))
          for t in D.ct_tensors()]
    assert scale_direction.check_scale_direction({t.name: scale_direction.magnitude(t) for t in ts}) == []
    # weights of magnitude ~448 have scales ~1: both readings agree, nothing to tell
    w = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32) * 150
    t = D.absmax_fp8("model.layers.0.mlp.up_proj.weight", w, GroupMap.per_channel("out"))
    m = scale_direction.magnitude(t)
    assert m["decades"] > 3 and abs(m["decades"] - m["decades_reciprocal"]) < 1
    assert scale_direction.check_scale_direction({t.name: m}) == []


def test_layer_of():
    assert scale_direction.layer_of("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert scale_direction.layer_of("transformer.h.3.mlp.c_fc.weight") == "transformer.h.3"
    assert scale_direction.layer_of("lm_head.weight") == "lm_head.weight".rsplit(".", 2)[0]


# -- activation scales ----------------------------------------------------------------------------------
def test_activation_scales_are_listed(tmp_path, monkeypatch):
    k = D.deepseek_tensors()[0]
    st = spec_of(k)
    spec = TensorSpec(st.name, st.kind, st.shape, st.stored + (
        StoredArray(D.K[:-len("weight")] + "input_scale", "activation_scale", "F32", (), 4),), axes=st.axes,
        scheme=st.scheme, group_map=st.group_map)
    ckpt = Checkpoint({D.K: spec}, lambda name: k, format="memory")
    f = float_checks.check_activation_scales(ckpt)
    assert len(f) == 1 and f[0].severity == "info" and f[0].code == "activation-scale"
    assert f[0].evidence["arrays"] == ["model.layers.0.self_attn.k_proj.input_scale"]
    assert f[0].evidence["tensors"] == [D.K]
    assert float_checks.check_activation_scales(Checkpoint.from_tensors([k])) == []
    # wired into validate: a reader whose spec lists an input scale
    from converter.validate import run
    p = D.write_native(tmp_path / "k.safetensors", [k])
    monkeypatch.setattr(run.registry, "read", lambda source, fmt: ckpt)
    rep = validate(p)
    assert "activation-scale" in rep.codes() and rep.exit_code == 0


# -- with a float reference -----------------------------------------------------------------------------
def test_float_steps_by_hand():
    st = float_steps(codebooks.E4M3)
    assert st[0x38] == (0.0625 + 0.125) / 2  # 1.0: 0.9375 below (binade [0.5, 1): step 1/16), 1.125 above
    assert st[0x40] == (0.125 + 0.25) / 2  # 2.0: 1.875 below, 2.25 above
    assert st[0x7E] == 32.0              # 448: one-sided, 416 below
    assert st[0x00] == 2.0 ** -9         # 0: the smallest subnormals on either side
    assert st[0x7F] == 0.0 and st[0xFF] == 0.0  # NaN


def test_real_block_fp8_against_its_source():
    k = D.deepseek_tensors()[0]
    findings, stats = compare(k, D.source_k())
    assert findings == []
    # FP_MANIFEST.json numpy_verification, k_proj: max_abs_err_vs_source_bf16 0.171875
    assert stats["max_abs_error"] == 0.171875
    assert 0.28 < stats["rms_steps"] < 0.31  # round to nearest on the local E4M3 step: 1/sqrt(12) = 0.289
    assert stats["alternatives_rel_rms"]["scales as divisors (codebook[q] / s)"] > 1000


def test_divisor_reading_is_the_best_alternative():
    findings, stats = compare(_inverted(D.deepseek_tensors()[0]), D.source_k())
    assert [f.code for f in findings] == ["layout-mismatch"]
    assert findings[0].evidence["best_alternative"] == "scales as divisors (codebook[q] / s)"


def _quantize_regions(w: np.ndarray, rows: np.ndarray, cols: np.ndarray, grid) -> tuple[np.ndarray, np.ndarray]:
    """Absmax E4M3 quantization where element (i, j) uses scale [rows[i], cols[j]] of a ``grid`` array."""
    s = np.ones(grid, np.float32)
    for a in np.unique(rows):
        for b in np.unique(cols):
            s[a, b] = np.abs(w[np.ix_(rows == a, cols == b)]).max() / 448.0
    codes = (w / s[np.ix_(rows, cols)]).astype(E4M3).view(np.uint8)
    return codes, s


@pytest.mark.parametrize("factor, label", [(2, "block out 256 x in 256"), (0.5, "block out 64 x in 64")])
def test_block_size_off_by_two_is_the_best_alternative(factor, label):
    """The stored 2 x 5 grid was written by a quantizer whose block was 256 (or 64, clamped to the grid)."""
    w = D.source_k()
    b = int(128 * factor)
    rows, cols = np.minimum(np.arange(192) // b, 1), np.minimum(np.arange(576) // b, 4)
    codes, s = _quantize_regions(w, rows, cols, (2, 5))
    t = QuantizedTensor(D.K, ("out", "in"), codes, s, D.e4m3("F32"), GroupMap.per_block(128, 128))
    findings, stats = compare(t, w)
    assert [f.code for f in findings] == ["layout-mismatch"]
    assert findings[0].evidence["best_alternative"].startswith(label)


def test_transposed_blocks_is_the_best_alternative():
    w = np.random.default_rng(7).standard_normal((256, 256)).astype(np.float32) * np.linspace(0.01, 0.3, 256)
    stored = D.absmax_fp8("w", np.ascontiguousarray(w.T), GroupMap.per_block(128, 128))  # the file holds W^T
    findings, _ = compare(stored, w)
    assert [f.code for f in findings] == ["layout-mismatch"]
    assert findings[0].evidence["best_alternative"] == "transposed blocks (codes and scales)"


def test_fixture_is_the_documented_file():
    import hashlib
    digest = hashlib.sha256(D.SUBSET.read_bytes()).hexdigest()
    assert digest == "0b03b2630742ca415d3a358ccdba0e1ef26210b4b3adf7b5af2db55374f0a3a6"  # data/README.md


# -- row-blocked reductions (no full-size temporaries) -----------------------------------------------------
def _fp8(shape, gm, seed=0, nan_at=()):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 0x7E, size=shape, dtype=np.uint8) | (rng.integers(0, 2, size=shape, dtype=np.uint8) << 7)
    for i in nan_at:
        codes[i] = 0x7F
    ps = gm.param_shape(shape, ("expert", "out", "in")[-len(shape):])
    scales = np.exp2(rng.integers(-8, 2, size=ps)).astype(np.float32) * np.float32(1.25)
    return QuantizedTensor("m.layers.0.q.weight", ("expert", "out", "in")[-len(shape):], codes, scales,
                           D.e4m3("F32"), gm)


@pytest.mark.parametrize("shape,gm", [
    ((300, 96), GroupMap.per_block(128, 32)), ((300, 96), GroupMap.per_block(None, 32)),
    ((300, 96), GroupMap.per_channel("out")), ((300, 96), GroupMap.per_group(32, "in")),
    ((300, 96), GroupMap.per_tensor()), ((3, 130, 64), GroupMap.per_block(64, 64)),
    ((3, 130, 64), GroupMap.per_tensor())])
def test_row_blocked_reductions_equal_the_whole_tensor(monkeypatch, shape, gm):
    nan_at = [(0,) * len(shape), tuple(n - 1 for n in shape), tuple(n // 2 for n in shape)]
    t = _fp8(shape, gm, nan_at=nan_at)
    rank, _ = float_checks._rank_table(codebooks.ELEMENTS["e4m3"])
    sq = np.nan_to_num(np.square(np.asarray(codebooks.E4M3, np.float32)), nan=0.0)
    whole_max = gm.reduce(rank[t.codes], np.maximum, t.axes)  # the old full-size formulas
    whole_sum = gm.reduce(sq[t.codes], np.add, t.axes)
    steps = float_steps(codebooks.E4M3).astype(np.float32)[t.codes] * gm.expand(t.scales, t.shape, t.axes)
    old_rms = float(np.sqrt(np.mean(np.square(steps, dtype=np.float64))))
    before = (float_checks.block_saturation(t), float_checks.check_nonfinite_codes(t))
    monkeypatch.setattr(float_checks, "CHUNK_ELEMENTS", 500)  # many row blocks
    import converter.rows as rows
    monkeypatch.setattr(rows, "SUPER_ELEMENTS", 500)
    np.testing.assert_array_equal(float_checks.reduce_codes(t, rank, np.maximum), whole_max)
    np.testing.assert_allclose(float_checks.reduce_codes(t, sq, np.add), whole_sum, rtol=1e-6)
    assert float_checks.block_saturation(t) == before[0]
    f = float_checks.check_nonfinite_codes(t)
    assert f[0].evidence == before[1][0].evidence and f[0].evidence["count"] == 3
    assert f[0].evidence["first_index"] == [0] * len(shape) and f[0].evidence["codes"] == {"0x7F": 3}
    from converter.validate.reference import step_rms
    assert step_rms(t) == pytest.approx(old_rms, rel=1e-12)
    if len(shape) == 2 and gm.granularity.value == "block":
        from converter.validate.interpretations import _reblocked
        s = np.asarray(t.scales, np.float32)
        for factor in (2.0, 0.5):
            idx = [np.minimum(np.arange(n) // max(1, int(b * factor)), s.shape[ax] - 1) if b else np.zeros(n, int)
                   for ax, (n, b) in enumerate(zip(shape, (gm.extent("out"), gm.extent("in"))))]
            want = np.asarray(codebooks.E4M3, np.float32)[t.codes] * s[np.ix_(*idx)]
            np.testing.assert_array_equal(_reblocked(t, factor), want)
