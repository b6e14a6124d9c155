"""nibble-order from the data alone, on the real SmolLM2-135M pattern (LLaMA, 30 layers, GGUF Q4_1 source).

The check used to sum positive Pearson correlations of raw column magnitudes over every sibling:
on qckpt's bit-exact MLX output of the real GGUF it reported 30 false ``nibble-order`` errors (and
23-30 on the GPTQ, AWQ and compressed-tensors outputs), exit status 1. The fixtures here come from
that model (provenance: ``data/make_smollm2_fixtures.py``):

- ``smollm2_column_rms.npz``: per-input-column RMS of the 24 tensors of layers 4-7 that read the
  576 hidden features, as gguf-py 0.19 decodes the real GGUF (``gguf.quants.dequantize``);
- ``smollm2_l5_mlp_pattern/``: a correct MLX affine 4-bit g32 checkpoint written by qckpt whose two
  64 x 576 weights carry layer 5's gate_proj / up_proj column profiles exactly. The old check
  reported ``nibble-order`` on its gate_proj ("best correlation 0.31 ... 'nibble order inverse AWQ
  interleave' order (declared order: -0.07)", validate at commit 53c8a49).
"""

from pathlib import Path

import numpy as np
import pytest

import converter
from converter.validate import validate
from converter.validate.nibble_order import check_nibble_order, column_profile, word_detail

DATA = Path(__file__).resolve().parent / "data"
PATTERN = DATA / "smollm2_l5_mlp_pattern"
GATE, UP = "model.layers.5.mlp.gate_proj.weight", "model.layers.5.mlp.up_proj.weight"
LAYERS = (4, 5, 6, 7)
READ_TOGETHER = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")

# In-word orders of 8 fields (FORMATS.md: MLX/GPTQ sequential, AutoAWQ GEMM [0,2,4,6,1,3,5,7]). An
# order o reads field k of each word as element o[k]; on words packed sequentially (field k holds
# element k) the profile it sees is p_o[8w + o[k]] = p[8w + k].
ORDERS = {"reversed": (7, 6, 5, 4, 3, 2, 1, 0), "AWQ interleave": (0, 2, 4, 6, 1, 3, 5, 7),
          "inverse AWQ interleave": (0, 4, 1, 5, 2, 6, 3, 7)}


def _perm(order, length=576):
    """Index map ``m`` with ``p[m]`` = the profile read in ``order`` (see ORDERS)."""
    m = np.empty(length, dtype=np.int64)
    for w in range(0, length, 8):
        for k, o in enumerate(order):
            m[w + o] = w + k
    return m


PERMS = {f"nibble order {label}": _perm(o) for label, o in ORDERS.items()}


def _profiles():
    rms = np.load(DATA / "smollm2_column_rms.npz")
    return {name: {"axis": "in", "length": 576, "word": 8, "profile": rms[name].astype(np.float64),
                   "perms": dict(PERMS)} for name in rms.files}


def test_hand_built_index_maps():
    assert _perm(ORDERS["reversed"], 8).tolist() == [7, 6, 5, 4, 3, 2, 1, 0]
    # AWQ order reads field 1 as element 2: element 2 of the re-read profile is declared element 1
    assert _perm(ORDERS["AWQ interleave"], 8).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_word_detail_by_hand():
    # ranks with ties averaged: 0 -> 0, 1 -> 1, 2 -> 2, 3 -> 3, 4 -> 4, 5 -> 5, the two 10s -> 6.5
    d = word_detail(np.array([1.0, 2, 3, 4, 10, 10, 0, 5]), 4)
    # minus the word means 2.5 and 4.5, over the norm sqrt(2.25+.25+.25+2.25+4+4+20.25+.25)
    want = np.array([-1.5, -0.5, 0.5, 1.5, 2.0, 2.0, -4.5, 0.5]) / np.sqrt(33.5)
    assert np.allclose(d, want, rtol=0, atol=1e-12)
    assert word_detail(np.array([1.0, 1, 1, 1, 3, 3, 3, 3]), 4) is None  # no variation inside words
    assert word_detail(np.array([1.0, np.nan, 1, 2]), 2) is None


def test_the_fixture_profiles_are_gguf_pys_decode_of_the_real_file():
    p = _profiles()
    assert len(p) == 24 and all(v["profile"].shape == (576,) for v in p.values())
    # layer 5's gate/up profiles are flat (RMS 0.19 +- 25 %), the pattern that fooled the old check
    g, u = p[GATE]["profile"], p[UP]["profile"]
    assert 0.17 < np.median(g) < 0.21 and 0.17 < np.median(u) < 0.21 and g.max() / np.median(g) < 1.3


def test_real_profiles_in_the_declared_order_are_clean():
    assert check_nibble_order(_profiles()) == []


@pytest.mark.parametrize("label", sorted(PERMS))
@pytest.mark.parametrize("name", [f"model.layers.{layer}.{k}.weight" for layer in LAYERS for k in READ_TOGETHER])
def test_one_tensor_read_in_another_order_is_named(name, label):
    profs = _profiles()
    p = profs[name]["profile"]
    # packed in `label` order, read sequentially: re-reading in `label` order gives p back
    profs[name]["profile"] = p[np.argsort(PERMS[label])]
    assert np.array_equal(profs[name]["profile"][PERMS[label]], p)
    found = check_nibble_order(profs)
    assert [(f.tensor, f.evidence["best_alternative"]) for f in found] == [(name, label)]
    f = found[0]
    assert f.severity == "error" and "or_tensor" not in f.evidence
    assert f.evidence["alternative_correlation"] > f.evidence["declared_correlation"] + 0.3 or \
        f.evidence["pooled_excess"] >= 5


@pytest.mark.parametrize("layer", LAYERS)
def test_an_o_proj_read_in_another_order_never_blames_a_sibling(layer):
    # o_proj reads the attention heads' outputs, features no other tensor reads: nothing to compare
    name = f"model.layers.{layer}.self_attn.o_proj.weight"
    profs = _profiles()
    profs[name]["profile"] = profs[name]["profile"][PERMS["nibble order reversed"]]
    assert {f.tensor for f in check_nibble_order(profs)} <= {name}


def test_correct_checkpoint_with_the_real_pattern_validates_clean():
    rep = validate(PATTERN)
    assert rep.format == "mlx" and rep.findings == [] and rep.exit_code == 0
    assert sorted(rep.tensors) == [GATE, UP]
    ck = converter.load(PATTERN)
    prof = {n: column_profile(ck[n]) for n in (GATE, UP)}
    real = _profiles()
    for n in (GATE, UP):
        assert prof[n] is not None and prof[n]["word"] == 8  # the check did look at both
        # the real profile survived 64 rows and 4-bit quantization
        assert np.corrcoef(prof[n]["profile"], real[n]["profile"])[0, 1] > 0.8
    # the trap: a raw Pearson correlation of magnitudes that one in-word order raises by 0.3
    g, u = prof[GATE]["profile"], prof[UP]["profile"]
    declared = np.corrcoef(g, u)[0, 1]
    best = max(np.corrcoef(g[m], u)[0, 1] for m in PERMS.values())
    assert best - declared > 0.3 and best > 0.3


# -- zero pairing (the AWQ variant) is skipped only where it cannot tell orders apart ---------------
def test_zero_pairing_is_skipped_exactly_where_every_order_gives_the_same_group_means():
    from converter.validate.nibble_order import _words_within_groups, check_zero_pairing, zero_pairing_spread
    from converter.validate.interpretations import nibble_alternatives
    from tests.conftest import SAMPLES
    from tests.validate.helpers import OUTPUT
    # compressed-tensors asym: 8 codes per int32 along in, groups of 128 along in: words inside groups
    ct = converter.load(SAMPLES / "ct_pack_w4a16_group128_asym")[OUTPUT]
    assert _words_within_groups(ct) and check_zero_pairing(ct) == ([], None)
    declared = zero_pairing_spread(ct, ct.codes)
    alts = nibble_alternatives(ct)
    assert alts and all(zero_pairing_spread(ct, c) == declared for c in alts.values())
    # AutoAWQ GEMM packs 8 rows (out) into a word while groups run along in: words cross groups
    awq = converter.load(SAMPLES / "awq_gemm_w4_g128_zp")[OUTPUT]
    assert not _words_within_groups(awq)
    found, stats = check_zero_pairing(awq)
    assert found == [] and min(stats["alternatives"].values()) > 2 * stats["declared"]
