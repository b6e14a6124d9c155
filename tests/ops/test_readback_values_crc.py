"""The read-back digest of a tensor digested by its values (GGUF K-quants: float mins) is computed in row
blocks, never on the whole float32 matrix (a 32000 x 4096 Q6_K head was 524 MB per read-back thread), and is
the same number as over the whole array."""

from __future__ import annotations

import zlib

import numpy as np

from converter.formats import registry
from converter.ops.readback import digest, values_crc
from converter.rows import Rows
from converter.tensor_rows import row_splittable, take_rows
from tests.conftest import SAMPLES

import pytest
from click.testing import CliRunner

from converter.cli import main


@pytest.fixture(scope="module")
def kquant_file(tmp_path_factory):
    """The shipped F16 MiniLM GGUF as --quant-type Q4_K (llama-quantize --pure): its 1536-wide rows are Q4_K
    (float mins), the 384-wide ones fall back to Q5_0."""
    out = tmp_path_factory.mktemp("q4k") / "m.gguf"
    r = CliRunner().invoke(main, ["convert", str(SAMPLES / "gguf" / "minilm_gguf_F16.gguf"), str(out), "--to", "gguf",
                                  "--quant-type", "Q4_K", "--quiet"])
    assert r.exit_code == 0, r.output
    return out


def _kquant_tensors(path):
    ckpt = registry.load(path)
    out = [t for t in (ckpt[n] for n in ckpt.quantized_names()) if t.double_quant is not None]
    assert out, "the file holds K-quant tensors"
    return out


def test_kquant_rows_cut_with_their_records_and_give_the_same_values(kquant_file):
    for t in _kquant_tensors(kquant_file)[:6]:
        assert row_splittable(t)
        whole = t.dequantize()
        part = take_rows(t, 5, 17)
        assert part.double_quant.sub_scales.shape[0] == 12 and part.double_quant.super_scales.shape[0] == 12
        assert np.array_equal(part.dequantize(), whole[5:17])
        rows = Rows(t)
        assert rows._lazy
        assert np.array_equal(rows[0:rows.shape[0]], whole)


def test_values_crc_is_the_crc_of_the_whole_array(kquant_file, monkeypatch):
    import converter.rows as rows_mod
    monkeypatch.setattr(rows_mod, "SUPER_ELEMENTS", 1536 * 7)  # several blocks on the small sample
    by_values = 0
    for t in _kquant_tensors(kquant_file):
        whole = np.ascontiguousarray(t.dequantize())
        expected = zlib.crc32(memoryview(whole).cast("B"), zlib.crc32(repr(tuple(whole.shape)).encode()))
        assert values_crc(t) == expected
        assert Rows(t).step < t.shape[0]  # (the blocks were really cut)
        if t.zero_points is not None:  # Q4_K / Q5_K mins: float biases, digested by the values
            assert digest(t) == f"v:{expected:08x}"
            by_values += 1
    assert by_values


def test_mlx_per_channel_requantize_is_proven(tmp_path):
    """MLX has no per-channel layout: a per-channel target is stored as groups of 128 repeating each row's scale.
    The read-back digest treats a row whose groups all share its parameters as per-channel (same values), so the
    proof holds; it used to flag every tensor ('!', readback_bit_exact false) and now would refuse the output."""
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target

    rep = requantize_model(SAMPLES / "gptq_w4_g128_sym", tmp_path / "m", Target(bits=8, granularity="channel"),
                           to="mlx")
    assert rep["tensors"] and all(r["readback_bit_exact"] and "readback" not in r for r in rep["tensors"])
    back = registry.load(tmp_path / "m")
    t = back[rep["tensors"][0]["name"]]
    assert t.group_map.granularity.value == "group" and t.scales.shape[1] > 1  # stored as repeated groups
    assert digest(t).startswith("p:")


def test_a_digest_with_no_common_form_is_reported_unproven_not_refused():
    """Written with integer zero points, read back with float biases that have no integer form (a real MLX
    affine file's biases): no common digest, so the row says why it is not proven, and the proof does not refuse."""
    from converter.ops.readback import NOT_COMPARABLE, verify_readback
    from converter.ops.requantize_model import refuse_unproven

    out = registry.load(SAMPLES / "mlx_affine_g64_b4")
    name = out.quantized_names()[0]
    assert digest(out[name]).startswith("v:")
    rows = {name: {}}
    verify_readback(out, rows, {name: "p:00000000"})
    assert rows[name] == {"readback_bit_exact": False, "readback": NOT_COMPARABLE}
    refuse_unproven(rows, [], "dst")  # (no ProofFailedError)
    rows = {name: {}}
    verify_readback(out, rows, {name: "v:00000000"})  # same form, other digest: refused
    assert rows[name] == {"readback_bit_exact": False}
    with pytest.raises(Exception, match="read-back proof"):
        refuse_unproven(rows, [], "dst")
