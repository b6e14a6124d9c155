"""Faults injected into copies of the real samples: each is flagged with the right code, naming the tensor.

Faults the data alone reveals (transposed codes, relabeled zero convention, bad scales, shards,
g_idx) are caught without --reference; scales on the wrong groups and flipped nibble order need it.
"""

from dataclasses import replace

import numpy as np
import pytest

import converter
from converter.formats.gptq import format as gptq
from converter.layout import IN, OUT
from converter.validate import validate
from tests.conftest import SAMPLES
from tests.validate.helpers import FP16, OUTPUT, QUERY, assert_finding, copy_sample, edit_config, edit_tensors

GPTQ = "gptq_w4_g128_sym"
P = QUERY[: -len(".weight")]


def _logical(name, sample=GPTQ):
    return converter.load(SAMPLES / sample)[name]


# -- structure -----------------------------------------------------------------------------------
def test_qweight_stored_transposed_is_a_shape_finding(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    edit_tensors(d, lambda t: t.__setitem__(f"{P}.qweight", t[f"{P}.qweight"].T.copy()))
    rep = validate(d)
    f = assert_finding(rep, "shape")
    assert f.evidence["stored_tensor"] == f"{P}.qweight" and rep.exit_code == 1


def test_scales_moved_to_the_other_axis_is_a_shape_finding(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    edit_tensors(d, lambda t: t.__setitem__(f"{P}.scales", t[f"{P}.scales"].T.copy()))
    f = assert_finding(validate(d), "shape")
    # the reader checks qweight against the scales' out width first: 3 columns of scales vs 384 of qweight
    assert f.tensor == f"{P}.qweight" and f.evidence["expected"] == ["ceil(I*b/32)", 3]


def test_transposed_codes_of_a_square_layer_are_caught_by_saturation(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    t = _logical(QUERY)
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.qweight", gptq.codes_map(4).to_stored(t.codes.T.copy(), (OUT, IN))))
    rep = validate(d)
    f = assert_finding(rep, "axis-swap", QUERY)
    assert f.evidence["declared_saturation"] < 0.97 and f.evidence["alternative_saturation"] == 1.0
    assert [x.tensor for x in rep.findings if x.code == "axis-swap"] == [QUERY]


def test_transposed_codes_per_channel_compressed_tensors(tmp_path):
    d = copy_sample("ct_pack_w4a16_channel_sym", tmp_path)
    from converter.formats.compressed_tensors.int_layout import codes_map
    t = _logical(QUERY, "ct_pack_w4a16_channel_sym")
    # compressed-tensors stores signed codes as q + 8 (unsigned fields)
    u = (t.codes.T.astype(np.int16) + 8).astype(np.uint8)
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.weight_packed", codes_map(4, "stream").to_stored(u, (OUT, IN))))
    f = assert_finding(validate(d), "axis-swap", QUERY)
    assert f.evidence["best_alternative"] == "one scale per in index"


def test_scale_nan_and_zero(tmp_path):
    d = copy_sample(GPTQ, tmp_path)

    def hurt(s):
        sc = s[f"{P}.scales"].copy()
        sc[1, 5] = np.nan
        sc[2, 7] = 0
        s[f"{P}.scales"] = sc
    edit_tensors(d, hurt)
    rep = validate(d)
    assert assert_finding(rep, "scale-nonfinite", QUERY).evidence["first_index"] == [5, 1]  # logical (out, group)
    assert assert_finding(rep, "scale-zero", QUERY).evidence["count"] == 1


def test_negative_scale_where_the_format_forbids_it_but_not_in_mlx(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.scales", -s[f"{P}.scales"]))
    assert_finding(validate(d), "scale-negative", QUERY)
    m = copy_sample("mlx_affine_g64_b4", tmp_path)
    edit_tensors(m, lambda s: s.update({f"{P}.scales": -s[f"{P}.scales"], f"{P}.biases": -s[f"{P}.biases"]}))
    assert not [f for f in validate(m).findings if f.code == "scale-negative"]


def test_all_zero_qweight_is_degenerate_b17(tmp_path):
    d = copy_sample("gptq_w4_gchan_sym", tmp_path)
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.qweight", np.zeros_like(s[f"{P}.qweight"])))
    assert_finding(validate(d), "degenerate", QUERY)


# -- zero convention ----------------------------------------------------------------------------------
def test_v1_relabeled_v2_is_caught_from_the_data(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    edit_config(d, lambda qc: qc.update(checkpoint_format="gptq_v2", format="gptq_v2"))
    rep = validate(d)
    f = assert_finding(rep, "zero-convention", QUERY)
    assert f.evidence["claimed"] == "gptq_v2" and f.evidence["inferred"] == "gptq"
    assert f.evidence["raw_field_counts"] == {"7": 384 * 3}
    assert_finding(rep, "zero-offset", QUERY)
    assert_finding(rep, "config-mismatch", QUERY)
    assert rep.exit_code == 1


def test_asymmetric_v2_relabeled_v1_is_caught_by_the_zero_offset(tmp_path):
    src = converter.load(SAMPLES / "ct_pack_w4a16_group128_asym")
    d = tmp_path / "gptq_asym"
    converter.save(src, d, format="gptq", checkpoint_format="gptq_v2")
    assert validate(d).findings == []
    edit_config(d, lambda qc: qc.update(checkpoint_format="gptq", format="gptq"))
    rep = validate(d)
    f = assert_finding(rep, "zero-offset", QUERY)
    assert -1.2 < f.evidence["mean_code_offset"] < -0.8 and f.evidence["suggested_zero_shift"] == -1
    assert not [x for x in rep.findings if x.code == "zero-convention"]  # asym zeros carry no marker


# -- g_idx -----------------------------------------------------------------------------------------------
def test_g_idx_dropped(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    edit_tensors(d, lambda s: [s.pop(k) for k in list(s) if k.endswith(".g_idx")])
    rep = validate(d)
    f = assert_finding(rep, "missing-tensor", QUERY)
    assert f.severity == "warning" and rep.exit_code == 0 and validate(d, strict=True).exit_code == 1
    edit_config(d, lambda qc: qc.update(desc_act=True))
    f = assert_finding(validate(d), "missing-tensor", QUERY)
    assert f.severity == "error"


def test_g_idx_scrambled_permutation(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    perm = np.random.default_rng(0).permutation(384)
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.g_idx", s[f"{P}.g_idx"][perm].copy()))
    rep = validate(d)
    assert "act-order" in assert_finding(rep, "g-idx", QUERY).message
    f = assert_finding(rep, "axis-swap", QUERY)
    assert f.evidence["best_alternative"] == "sequential groups (g_idx ignored)"


def test_g_idx_scrambled_values(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    g = np.random.default_rng(1).integers(0, 3, 384).astype(np.int32)
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.g_idx", g))
    hits = [f for f in validate(d).findings if f.code == "g-idx" and f.tensor == QUERY]
    assert any("members_of_first_bad" in f.evidence for f in hits)


def test_g_idx_out_of_range_is_a_finding_not_a_crash(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.g_idx", s[f"{P}.g_idx"] + 1))
    f = assert_finding(validate(d), "g-idx", QUERY)
    assert f.evidence["found"] == "[1, 3]"


# -- with --reference --------------------------------------------------------------------------------------
def test_nibble_order_flipped_needs_the_reference(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    t = _logical(OUTPUT)
    flipped = replace(gptq.codes_map(4), order=(7, 6, 5, 4, 3, 2, 1, 0))
    edit_tensors(d,
                 lambda s: s.__setitem__("encoder.layer.0.output.dense.qweight", flipped.to_stored(t.codes, (OUT, IN))))
    f = assert_finding(validate(d, reference=FP16), "layout-mismatch", OUTPUT)
    assert f.evidence["best_alternative"] == "nibble order reversed"
    assert f.evidence["alternative_rel_rms"] < 0.2 < f.evidence["declared_rel_rms"]


def test_nibble_order_flipped_on_one_of_q_k_v_is_caught_from_the_data(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    t = _logical(QUERY)
    flipped = replace(gptq.codes_map(4), order=(7, 6, 5, 4, 3, 2, 1, 0))
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.qweight", flipped.to_stored(t.codes, (OUT, IN))))
    rep = validate(d)
    f = assert_finding(rep, "nibble-order", QUERY)
    assert f.evidence["best_alternative"] == "nibble order reversed"
    assert f.evidence["alternative_correlation"] > 0.6 > 0.2 > f.evidence["declared_correlation"]
    assert [x.tensor for x in rep.findings if x.code == "nibble-order"] == [QUERY]


def test_scales_on_the_wrong_groups_need_the_reference(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.scales", np.roll(s[f"{P}.scales"], 1, axis=0)))
    f = assert_finding(validate(d, reference=FP16), "layout-mismatch", QUERY)
    assert f.evidence["best_alternative"] == "scales shifted one group back"


def test_scales_written_in_the_other_orientation_need_the_reference(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    t = _logical(OUTPUT)  # logical scales (out=384, groups=12): C-order bytes stored in the [12, 384] slot
    edit_tensors(d, lambda s: s.__setitem__("encoder.layer.0.output.dense.scales", t.scales.reshape(12, 384).copy()))
    f = assert_finding(validate(d, reference=FP16), "layout-mismatch", OUTPUT)
    assert f.evidence["best_alternative"] == "scales stored in the other orientation"


def test_transposed_codes_with_reference_name_the_transposition(tmp_path):
    d = copy_sample(GPTQ, tmp_path)
    t = _logical(QUERY)
    edit_tensors(d, lambda s: s.__setitem__(f"{P}.qweight", gptq.codes_map(4).to_stored(t.codes.T.copy(), (OUT, IN))))
    f = assert_finding(validate(d, reference=FP16), "layout-mismatch", QUERY)
    assert f.evidence["best_alternative"] == "transposed codes"


# -- shards ------------------------------------------------------------------------------------------------
@pytest.fixture
def sharded(tmp_path):
    d = tmp_path / "sharded"
    gptq.write_gptq(converter.load(SAMPLES / GPTQ), d, checkpoint_format="gptq", max_shard_bytes=300_000)
    shards = sorted(d.glob("model-*.safetensors"))
    assert len(shards) >= 3
    return d, shards


def test_sharded_copy_is_clean(sharded):
    d, _ = sharded
    assert validate(d).findings == []


def test_missing_shard(sharded):
    d, shards = sharded
    shards[1].unlink()
    rep = validate(d)
    f = assert_finding(rep, "missing-shard", shards[1].name)
    assert f.evidence["tensors"] > 0 and rep.exit_code == 1 and rep.format is None


def test_truncated_shard(sharded):
    d, shards = sharded
    data = shards[0].read_bytes()
    shards[0].write_bytes(data[:-100])
    f = assert_finding(validate(d), "shard-corrupt", shards[0].name)
    assert "truncated" in f.evidence["reader_error"] or "data_offsets" in f.evidence["reader_error"]


def test_lfs_stub_shard_b36(sharded):
    d, shards = sharded
    shards[2].write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 912345\n")
    f = assert_finding(validate(d), "lfs-pointer", shards[2].name)
    assert f.evidence["bytes"] < 200 and "git lfs pull" in f.evidence["hint"]


def test_stale_index(sharded):
    import json
    d, shards = sharded
    ipath = d / "model.safetensors.index.json"
    idx = json.loads(ipath.read_text())
    name = f"{P}.scales"
    other = next(s.name for s in shards if s.name != idx["weight_map"][name])
    idx["weight_map"][name] = other
    del idx["weight_map"][f"{P}.qzeros"]
    ipath.write_text(json.dumps(idx))
    rep = validate(d)
    msgs = [f.message for f in rep.findings if f.code == "stale-index"]
    assert any("another shard" in m for m in msgs) and any("does not list" in m for m in msgs)


def test_extra_shard_and_total_size(sharded):
    import json
    import shutil
    d, shards = sharded
    shutil.copy(shards[0], d / "model-00009-of-00009.safetensors")
    ipath = d / "model.safetensors.index.json"
    idx = json.loads(ipath.read_text())
    idx["metadata"]["total_size"] += 1
    ipath.write_text(json.dumps(idx))
    rep = validate(d)
    assert_finding(rep, "extra-shard", "model-00009-of-00009.safetensors")
    assert assert_finding(rep, "stale-index").severity == "warning"


@pytest.mark.parametrize("zeros,severity", [(1, "info"), (40, "warning"), (700, "error")])
def test_zero_scales_by_fraction(tmp_path, zeros, severity):
    # the query weight has 384 x 3 = 1152 group scales: 1 zero (an all-zero group, a K-quant sub-block
    # scale quantized to 0) is info; 40 (3.5 %, above 1 %) a warning; 700 (61 %, above half) an error
    d = copy_sample(GPTQ, tmp_path)

    def hurt(s):
        sc = s[f"{P}.scales"].copy()
        sc.reshape(-1)[:zeros] = 0
        s[f"{P}.scales"] = sc
    edit_tensors(d, hurt)
    f = next(f for f in validate(d).findings if f.code == "scale-zero" and f.tensor == QUERY)
    assert f.evidence["count"] == zeros and f.severity == severity
