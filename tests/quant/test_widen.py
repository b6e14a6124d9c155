"""MXFP4 -> FP8 lossless widening (converter/quant/widen.py, the requantize route it takes).

Expected values are written by hand: the E2M1 table of the OCP MX spec (0, 0.5, 1, 1.5, 2, 3, 4, 6)
times 2^k with ``math.ldexp``, and the E4M3 bytes of those values from the E4M3 bit layout
(sign | 4 exponent bits, bias 7 | 3 mantissa bits: 1.0 = 0x38).
"""

from __future__ import annotations

import json
import math

import ml_dtypes
import numpy as np
import pytest
from click.testing import CliRunner

from converter.cli import main
from converter.codebooks import E2M1, E4M3
from converter.errors import NotRepresentableError
from converter.formats import registry
from converter.groups import GroupMap
from converter.quant.classify import classify
from converter.quant.requant import Target, requantize
from converter.quant.widen import E2M1_TO_E4M3, widen_to_e4m3
from converter.scheme import QuantScheme
from converter.tensor import QuantizedTensor
from tests.conftest import SAMPLES

#: E2M1 code -> value (OCP MX v1.0 table 5.3.3) and the E4M3 byte of that value, by hand.
HAND = {0: (0.0, 0x00), 1: (0.5, 0x30), 2: (1.0, 0x38), 3: (1.5, 0x3C), 4: (2.0, 0x40), 5: (3.0, 0x44),
        6: (4.0, 0x48), 7: (6.0, 0x4C)}
MX = QuantScheme(bits=4, signed=False, scale_dtype="F8_E8M0", codebook=E2M1)
GROUPS = GroupMap.per_group(32, "in")
EXPONENTS = (-127, -9, 0, 7, 120)


def hand_tensor() -> QuantizedTensor:
    """One row per exponent k: codes 0..15 twice (32 = one MX group), E8M0 scale byte 127 + k."""
    codes = np.tile(np.arange(16, dtype=np.uint8), (len(EXPONENTS), 2))
    scales = np.array([[127 + k] for k in EXPONENTS], dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu)
    return QuantizedTensor("w", ("out", "in"), codes, scales, MX, GROUPS)


def test_table_by_hand():
    for q, (v, byte) in HAND.items():
        assert E2M1_TO_E4M3[q] == byte and E2M1_TO_E4M3[q | 8] == byte | 0x80
        assert float(np.uint8(byte).view(ml_dtypes.float8_e4m3fn)) == v


@pytest.mark.parametrize("scale_dtype,group_map", [("F8_E8M0", GROUPS), ("F32", GroupMap.per_block(1, 32)),
                                                   ("BF16", GroupMap.per_block(1, 32))])
def test_each_magnitude_times_power_of_two(scale_dtype, group_map):
    t = hand_tensor()
    target = QuantScheme(bits=8, signed=False, scale_dtype=scale_dtype, codebook=E4M3)
    w = widen_to_e4m3(t, target, group_map)
    got = np.asarray(w.dequantize(), dtype=np.float32)
    for r, k in enumerate(EXPONENTS):
        for c in range(32):
            q = c % 16
            v = math.ldexp(HAND[q & 7][0], k) * (-1 if q & 8 else 1)
            assert got[r, c] == np.float32(v) and math.copysign(1, got[r, c]) == math.copysign(1, v)
        assert list(w.codes[r, :16]) == [HAND[q][1] for q in range(8)] + [HAND[q][1] | 0x80 for q in range(8)]
        assert float(np.asarray(w.scales, dtype=np.float32)[r, 0]) == math.ldexp(1.0, k)
    src = np.asarray(t.dequantize(), dtype=np.float32)
    assert np.array_equal(src.view(np.uint32), got.view(np.uint32))


def test_scale_out_of_the_target_dtype_is_refused():
    """2^-127 and 2^120 are E8M0 values F16 cannot hold (2^-24 .. 2^15): refused, naming the group."""
    target = QuantScheme(bits=8, signed=False, scale_dtype="F16", codebook=E4M3)
    with pytest.raises(NotRepresentableError) as e:
        widen_to_e4m3(hand_tensor(), target, GroupMap.per_block(1, 32))
    assert e.value.tensor == "w" and e.value.field == "scales" and "[0, 0]" in str(e.value.found)
    assert "F16" in str(e.value.expected)


def test_nan_scale_is_refused():
    t = hand_tensor()
    t = t.replace(scales=np.array([[255]] * len(EXPONENTS), dtype=np.uint8).view(ml_dtypes.float8_e8m0fnu))
    with pytest.raises(NotRepresentableError):
        widen_to_e4m3(t, QuantScheme(bits=8, signed=False, scale_dtype="F32", codebook=E4M3), GROUPS)


def test_requantize_route_is_exact_and_carried():
    t = hand_tensor()
    target = Target(element="e4m3", granularity="block", block=(1, 32))
    assert classify(t, target)[0] == "exact"
    res = requantize(t, target)
    assert res.route == "carried" and res.identical
    assert classify(t, Target(element="e4m3", granularity="block", block=(1, 64)))[0] == "lossy"


def _decoded(path):
    ck = registry.load(path)
    return {s.name: np.asarray(ck[s.name].dequantize(), dtype=np.float32) for s in ck.specs() if s.kind == "quantized"}


@pytest.mark.parametrize("to,scale_dtype", [("mlx", "F8_E8M0"), ("compressed-tensors", "F32")])
def test_real_mxfp4_sample_widened_exact(tmp_path, to, scale_dtype):
    src = SAMPLES / "ct_mxfp4_smollm2"
    out = tmp_path / "fp8"
    r = CliRunner().invoke(main, ["convert", str(src), str(out), "--to", to, "--fp8", "e4m3", "--block", "1x32",
                                  "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert {t["planned"] for t in doc["tensors"]} == {"exact"} and {t["result"] for t in doc["tensors"]} == {"exact"}
    assert all(t["readback_bit_exact"] for t in doc["tensors"])
    a, b = _decoded(src), _decoded(out)
    assert set(a) == set(b) and len(a) == 4
    ck = registry.load(out)
    for name in a:
        assert np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32)), name
        spec = ck.spec(name)
        assert spec.scheme.codebook == E4M3 and spec.scheme.scale_dtype == scale_dtype
    # independent of qckpt's decoders: compressed-tensors' own decode of the source (bf16) equals the widened values
    from converter.formats.safetensors_io import open_safetensors
    ref = open_safetensors(src / "reference_dequant.safetensors")
    for name in a:
        assert np.array_equal(np.asarray(ref.get(name)).astype(np.float32), b[name].astype(ml_dtypes.bfloat16)
                              .astype(np.float32)), name


def test_cli_refuses_a_scale_the_target_dtype_cannot_hold(tmp_path):
    src = tmp_path / "hand.safetensors"
    registry.get("native").write(
        __import__("converter.tensor", fromlist=["Checkpoint"]).Checkpoint.from_tensors(
            [hand_tensor().replace(name="model.layers.0.mlp.up_proj.weight")]), src)
    out = tmp_path / "fp8"
    r = CliRunner().invoke(main, ["convert", str(src), str(out), "--to", "compressed-tensors", "--fp8", "e4m3",
                                  "--block", "1x32", "--scale-dtype", "f16"])
    assert r.exit_code == 3 and "field 'scales'" in r.output and "[0, 0]" in r.output
    assert "2 of 5" in r.output  # 2^-127 and 2^120 of the five exponents (hand)
    assert not out.exists()


@pytest.mark.parametrize("axes,shape", [(("expert", "out", "in"), (3, 8, 64)), (("out", "in"), (4, 48))])
def test_experts_and_partial_final_group(axes, shape):
    """Expert stacks and a partial last group (48 = 32 + 16) widen the same way: value for value, by hand."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, shape, dtype=np.uint8)
    n_groups = -(-shape[-1] // 32)
    k = rng.integers(-20, 20, shape[:-1] + (n_groups,))
    scales = (k + 127).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    t = QuantizedTensor("w", axes, codes, scales, MX, GROUPS)
    w = widen_to_e4m3(t, QuantScheme(bits=8, signed=False, scale_dtype="F8_E8M0", codebook=E4M3), GROUPS)
    got = np.asarray(w.dequantize(), dtype=np.float32)
    for idx in np.ndindex(*shape):
        q = int(codes[idx])
        v = math.ldexp(HAND[q & 7][0], int(k[idx[:-1] + (idx[-1] // 32,)])) * (-1 if q & 8 else 1)
        assert got[idx] == np.float32(v)


def test_widened_output_validates_clean_under_strict(tmp_path):
    """Regression (review): `validate --strict` failed qckpt's own lossless MXFP4 -> FP8 output with
    'unsaturated' warnings (widened codes are E2M1 values, |v| <= 6, never the E4M3 bound 224); now an
    info finding naming the widening, and exit 0."""
    from click.testing import CliRunner

    from converter.cli import main
    from converter.validate import validate
    from tests.conftest import SAMPLES

    for to in ("compressed-tensors", "mlx"):
        dst = tmp_path / to
        r = CliRunner().invoke(main, ["convert", str(SAMPLES / "ct_mxfp4_smollm2"), str(dst), "--to", to, "--fp8",
                                      "e4m3", "--block", "1x32"])
        assert r.exit_code == 0, r.output
        rep = validate(dst, strict=True)
        assert rep.exit_code == 0, [(f.code, f.message) for f in rep.findings if f.severity != "info"]
        notes = [f for f in rep.findings if f.code == "unsaturated"]
        assert len(notes) == 4 and all(f.severity == "info" and "E2M1 value" in f.message for f in notes)


def test_report_costs_what_was_written(tmp_path):
    """Regression (review): MXFP4 -> MLX mxfp8 (E8M0 scales written) reported 9 bits per weight (the
    in-memory float32 scales); the written layout costs 8 + 8/32 = 8.25, as `qckpt audit` measures."""
    import json

    from click.testing import CliRunner

    from converter.cli import main
    from tests.conftest import SAMPLES

    rep = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["convert", str(SAMPLES / "mlx_mxfp4_smollm2tiny"), str(tmp_path / "o"), "--to",
                                  "mlx", "--fp8", "e4m3", "--block", "1x32", "--report", str(rep)])
    assert r.exit_code == 0, r.output
    for row in json.loads(rep.read_text())["tensors"]:
        after = row["metadata"]["after"]
        n = after["payload_bytes"]  # one byte per E4M3 code
        assert after["metadata_bytes"] == n // 32 and after["bits_per_weight"] == pytest.approx(8.25), row["name"]
