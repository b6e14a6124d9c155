"""The two-level (NVFP4) scale in the logical model: the global scale's direction is part of the
scheme, the stored value is kept, and the effective group scale is computed once in float32.

Values by hand: E2M1 codes 0x1 = 0.5, 0x2 = 1.0, 0xA = -1.0, 0x3 = 1.5, 0x7 = 6.0, 0xF = -6.0.
"""

import ml_dtypes
import numpy as np
import pytest

from converter.errors import LayoutError
from converter.groups import GroupMap
from converter.codebooks import E2M1_VALUES
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, QuantizedTensor, spec_of
from converter.tensor_rows import take_rows
from converter.values import effective_scales

E4M3 = ml_dtypes.float8_e4m3fn


def _nvfp4(codes, scales, g, direction):
    scheme = QuantScheme(bits=4, signed=False, scale_dtype="F8_E4M3", codebook=E2M1_VALUES, global_scale=direction)
    return QuantizedTensor("w", ("out", "in"), np.asarray(codes, np.uint8), np.asarray(scales, np.float32).astype(E4M3),
                           scheme, GroupMap.per_group(2), global_scale=np.float32(g) if g is not None else None)


def test_multiplier_b23_subnormal_scale():
    # CASES.md B23: s = 2^-8 (an E4M3 subnormal), g = 1, FP4 [0.5, -1, 1.5] -> q * s * g
    t = _nvfp4([[0x1, 0xA, 0x3, 0x0]], [[2 ** -8, 2 ** -8]], 1.0, "multiplier")
    assert t.dequantize().tolist() == [[2 ** -9, -(2 ** -8), 1.5 * 2 ** -8, 0.0]]
    # the rescaled pair s' = 2^-6, g' = 0.25 gives the same values (the invariant of the fix)
    r = _nvfp4([[0x1, 0xA, 0x3, 0x0]], [[2 ** -6, 2 ** -6]], 0.25, "multiplier")
    assert r.dequantize().tolist() == t.dequantize().tolist()


def test_divisor_is_compressed_tensors_direction():
    # compressed-tensors: effective = s / g; s = 448, g = 936 (its bf16-computed global scale)
    t = _nvfp4([[0x7, 0xF]], [[448.0]], 936.0, "divisor").replace(group_map=GroupMap.per_group(2))
    eff = np.float32(448.0) / np.float32(936.0)
    assert t.dequantize().tolist() == [[float(np.float32(6.0) * eff), float(np.float32(-6.0) * eff)]]
    # read the other way it would be off by g^2 = 876096
    m = _nvfp4([[0x7, 0xF]], [[448.0]], 936.0, "multiplier")
    assert m.dequantize()[0, 0] / t.dequantize()[0, 0] == pytest.approx(936.0 ** 2)


def test_effective_scales_and_bf16_rounding():
    s = np.array([[448.0, 2.75]], np.float32).astype(E4M3)
    assert effective_scales(s, np.float32(512.0), "divisor").tolist() == [[0.875, 2.75 / 512]]
    assert effective_scales(s, np.float32(2.0), "multiplier").tolist() == [[896.0, 5.5]]
    assert effective_scales(s, None, None).dtype == np.float32
    t = _nvfp4([[0x3, 0x1, 0x7, 0x2]], [[448.0, 2.75]], 512.0, "divisor")
    # bf16 output: the float32 values rounded once (0.875*1.5 = 1.3125, exact in bf16)
    assert t.dequantize(ml_dtypes.bfloat16).astype(np.float32).tolist() == [[1.3125, 0.4375, 6 * 2.75 / 512,
                                                                              1 * 2.75 / 512]]


def test_amax_is_mlx_direction():
    # MLX nvfp4: g is the tensor amax; effective = s * fp32(g / 2688). g = 2688 -> s itself; g = 3 ->
    # s * fp32(3/2688), which is not (s * 3) / 2688 in float32 for s = 320 (checked with mx.dequantize)
    t = _nvfp4([[0x2, 0x7]], [[320.0]], 2688.0, "amax").replace(group_map=GroupMap.per_group(2))
    assert t.dequantize().tolist() == [[320.0, 1920.0]]
    three = _nvfp4([[0x2, 0x7]], [[320.0]], 3.0, "amax").replace(group_map=GroupMap.per_group(2))
    m = np.float32(320.0) * (np.float32(3.0) / np.float32(2688.0))
    assert three.dequantize().tolist() == [[float(m), float(np.float32(6) * m)]]


def test_invariants():
    with pytest.raises(LayoutError, match="global scale is stored exactly when"):
        _nvfp4([[1, 2]], [[1.0]], None, "multiplier")
    scheme = QuantScheme(bits=4, signed=False, scale_dtype="F8_E4M3", codebook=E2M1_VALUES)
    with pytest.raises(LayoutError, match="global scale is stored exactly when"):
        QuantizedTensor("w", ("out", "in"), np.zeros((1, 2), np.uint8), np.ones((1, 1), E4M3), scheme,
                        GroupMap.per_group(2), global_scale=np.float32(2))
    with pytest.raises(LayoutError, match="one float32 value"):
        QuantizedTensor(
            "w", ("out", "in"), np.zeros((1, 2), np.uint8), np.ones((1, 1), E4M3),
            scheme.replace(global_scale="divisor"), GroupMap.per_group(2), global_scale=np.ones(1, np.float64))
    with pytest.raises(LayoutError, match="unknown global-scale direction"):
        QuantScheme(bits=4, signed=False, codebook=E2M1_VALUES, global_scale="inverse")


def test_scheme_json_and_rows_and_spec(tmp_path):
    t = _nvfp4([[0x1, 0x2], [0x7, 0xF]], [[1.0], [2.0]], 4.0, "divisor").replace(group_map=GroupMap.per_group(2))
    j = t.scheme.to_json()
    assert j["global_scale"] == "divisor" and QuantScheme.from_json(j) == t.scheme
    assert "global_scale" not in t.scheme.replace(global_scale=None).to_json()
    row = take_rows(t, 1, 2)
    assert row.global_scale == np.float32(4.0) and row.dequantize().tolist() == [[3.0, -3.0]]
    roles = [a.role for a in spec_of(t).stored]
    assert roles.count("global_scale") == 1
    # the native format keeps it: written and read back bit-exact
    from converter import save, load
    path = tmp_path / "n.safetensors"
    save(Checkpoint.from_tensors([t]), str(path))
    back = load(str(path))["w"]
    assert back.scheme == t.scheme and back.global_scale == np.float32(4.0)
    assert back.dequantize().tolist() == t.dequantize().tolist()


# -- re-expressing a global scale in another direction: exact or None --------------------------
from converter.global_scales import equivalent_global_scale  # noqa: E402


def test_equivalent_global_scale_pairs():
    # compressed-tensors 512 (a power of two) <-> ModelOpt 1/512: exact both ways
    assert equivalent_global_scale(np.float32(512), "divisor", "multiplier") == np.float32(2 ** -9)
    assert equivalent_global_scale(np.float32(2 ** -9), "multiplier", "divisor") == np.float32(512)
    # 936 (the real down_proj value): s / 936 differs from s * fp32(1/936) for some E4M3 s -> refused
    assert equivalent_global_scale(np.float32(936), "divisor", "multiplier") is None
    s = np.arange(256, dtype=np.uint8).view(E4M3).astype(np.float32)
    s = s[np.isfinite(s)]
    assert not np.array_equal(s / np.float32(936), s * (np.float32(1) / np.float32(936)))
    # MLX amax -> ModelOpt multiplier: always exact, w = fp32(g / 2688)
    w = equivalent_global_scale(np.float32(3.0), "amax", "multiplier")
    assert w == np.float32(3.0) / np.float32(2688.0)
    assert equivalent_global_scale(np.float32(7.25), "divisor", "divisor") == np.float32(7.25)
    assert equivalent_global_scale(np.float32(0.0), "divisor", "multiplier") is None


def test_compare_sees_a_changed_global_scale():
    """Regression: a read-back with the same codes and group scales but another global scale value
    is not "exact" (compare_tensors' shortcut once skipped the value): s=1, codes 0b0010 (E2M1 1.0),
    g 4 -> 4.0, g 2 -> 2.0, so max |diff| is 2."""
    from converter.ops.compare import compare_tensors

    a, b = _nvfp4([[2, 2]], [[1.0]], 4.0, "multiplier"), _nvfp4([[2, 2]], [[1.0]], 2.0, "multiplier")
    row = compare_tensors(a, b)
    assert row["mode"] == "changed" and not row["bit_exact"] and row["max_abs_diff"] == 2.0
    assert compare_tensors(a, _nvfp4([[2, 2]], [[1.0]], 4.0, "multiplier"))["mode"] == "exact"


def test_many_subnormal_nvfp4_scales_under_a_global_scale_warn():
    """Subnormal E4M3 group scales are routine without a global scale (mx.quantize nvfp4: info), but a
    global scale stretches them into E4M3's normal range (0 subnormal in the real ModelOpt and
    compressed-tensors samples), so half of them subnormal there is a warning (review)."""
    from converter.validate.data_checks import check_scales

    sub = float(2 ** -9)  # E4M3's smallest subnormal
    scales = [[sub], [1.0]]
    for g, direction, severity in ((None, None, "info"), (1.0, "divisor", "info"), (2.0, "multiplier", "warning")):
        t = _nvfp4([[2, 2], [2, 2]], scales, g, direction)
        f = [x for x in check_scales(t, negative_ok=False) if x.code == "scale-subnormal"]
        assert len(f) == 1 and f[0].severity == severity and f[0].evidence["count"] == 1
