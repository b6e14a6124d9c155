"""Audit of FP4 checkpoints: codes, group scales and the NVFP4 global scale by role, bits per weight
(4.25 MXFP4 = 4 + 8/32; 4.5 NVFP4 = 4 + 8/16, plus 4 bytes of F32 global scale per tensor), the
theoretical figure next to the measured one, and the FP4 what-if rows. Values by hand."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.formats.registry import load
from converter.groups import GroupMap
from converter.ops.audit import audit, what_if_layouts
from converter.scheme import QuantScheme
from converter.schemas import validate_document
from converter.tensor import StoredArray, TensorSpec
from tests.kernels.test_fp4_rtn import NAMES, load_fixture
from tests.ops.test_quantize_fp8 import write_bf16

Q = NAMES[0]  # q_proj [576, 576]: 331776 weights


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    fx = load_fixture()
    root = tmp_path_factory.mktemp("fp4audit")
    write_bf16(root / "f.safetensors", {n: fx[f"{n}.bf16"] for n in NAMES})
    for kind in ("mxfp4", "nvfp4"):
        r = CliRunner().invoke(main, ["quantize", str(root / "f.safetensors"), str(root / f"{kind}.safetensors"),
                                      "--fp4", kind])
        assert r.exit_code == 0, r.output
    return root


def test_nvfp4_roles_and_bits_per_weight(native):
    doc = audit(load(native / "nvfp4.safetensors"), what_if=True)
    validate_document(doc, "audit")
    row = {r["name"]: r for r in doc["tensors"]}[Q]
    # codes 331776 * 4 / 8 = 165888 bytes; scales 576 x 36 E4M3 = 20736; global scale 4
    assert row["bytes"]["codes"] == 165888 and row["bytes"]["padding"] == 0
    assert row["bytes"]["scales"] == 20736 and row["bytes"]["global_scale"] == 4
    assert row["bits_per_weight"] == pytest.approx(8 * (165888 + 20736 + 4) / 331776)  # 4.5 + 32/331776
    assert row["theoretical"]["total_bytes"] == 165888 + 20736 + 4
    assert row["theoretical"]["bits_per_weight"] == pytest.approx(4.5 + 32 / 331776)
    assert doc["totals"]["bytes_by_role"]["global_scale"] == 4 * 4  # one per tensor
    wi = {r["layout"]: r for r in row["what_if"]}
    nv = wi["nvfp4: E2M1, group 16, F8_E4M3 scales + F32 global scale"]
    mx = wi["mxfp4: E2M1, group 32, F8_E8M0 scales"]
    assert nv["current"] and nv["bytes"] == 186628 and not mx["current"] and mx["bytes"] == 165888 + 10368
    assert mx["bits_per_weight"] == 4.25
    assert sum(r["current"] for r in row["what_if"]) == 1  # its own layout is not listed twice


def test_mxfp4_roles_and_bits_per_weight(native):
    doc = audit(load(native / "mxfp4.safetensors"))
    row = {r["name"]: r for r in doc["tensors"]}[Q]
    assert row["bytes"]["scales"] == 576 * 18 and "global_scale" not in row["bytes"]
    assert row["bits_per_weight"] == 4.25 and row["theoretical"]["bits_per_weight"] == 4.25
    assert "global_scale" not in doc["totals"]["bytes_by_role"]


def test_integer_tensor_gets_fp4_what_if_rows():
    # int4 group 128 of a [64, 256] weight; FP4 what-if: MXFP4 8192 + 64*8 = 8704 bytes (4.25 bits),
    # NVFP4 8192 + 64*16 + 4 = 9220 bytes
    spec = TensorSpec("w", "quantized", (64, 256), (StoredArray("w", "codes", "I32", (64, 32), 8192),),
                      axes=("out", "in"), scheme=QuantScheme(4, False), group_map=GroupMap.per_group(128))
    rows = {r["layout"]: r for r in what_if_layouts(spec)}
    assert rows["mxfp4: E2M1, group 32, F8_E8M0 scales"]["bytes"] == 8704
    assert rows["nvfp4: E2M1, group 16, F8_E4M3 scales + F32 global scale"]["bytes"] == 9220
    assert all("current" not in r for r in rows.values())


@pytest.mark.parametrize("sample,group,global_bytes", [("ct_mxfp4_smollm2", 32, 0), ("ct_nvfp4_smollm2", 16, 4),
                                                       ("modelopt_nvfp4_smollm2tiny", 16, 4)])
def test_real_fp4_samples_bits_per_weight(sample, group, global_bytes):
    """The files the real tools wrote: 4 + 8/32 = 4.25 (MXFP4, E8M0 per 32); 4 + 8/16 = 4.5 plus the 4-byte
    F32 global scale of each tensor (NVFP4: compressed-tensors weight_global_scale [1], ModelOpt
    weight_scale_2 []), by hand from each tensor's shape."""
    from tests.conftest import SAMPLES
    doc = audit(load(SAMPLES / sample))
    validate_document(doc, "audit")
    rows = [r for r in doc["tensors"] if r["kind"] == "quantized"]
    assert rows
    total_bytes = total_n = 0
    for r in rows:
        n = r["numel"]
        want = n // 2 + n // group + global_bytes
        assert r["bytes"]["codes"] == n // 2 and r["bytes"]["scales"] == n // group
        assert r["bytes"].get("global_scale", 0) == global_bytes
        assert r["bits_per_weight"] == pytest.approx(8 * want / n, rel=1e-12)
        assert r["bits_per_weight"] == pytest.approx((4.25 if group == 32 else 4.5) + 8 * global_bytes / n, rel=1e-12)
        total_bytes, total_n = total_bytes + want, total_n + n
    assert doc["totals"]["quantized_bits_per_weight"] == pytest.approx(8 * total_bytes / total_n, rel=1e-12)
    if group == 32:
        assert doc["totals"]["quantized_bits_per_weight"] == 4.25
