"""The one dequantize kernel: row blocks from packed words or parameters expanded per element,
bit-identical to the formula written out."""

from __future__ import annotations

import numpy as np
import pytest

from converter.groups import GroupMap
from converter.layout import IN, OUT, AxisMap, PackedCodes
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor
from converter.values import dequantize_parts


@pytest.mark.parametrize("granularity", ["tensor", "channel", "group", "partial"])
@pytest.mark.parametrize("zp", [ZeroPoint.NONE, ZeroPoint.INTEGER, ZeroPoint.FLOAT])
def test_blocked_dequantize_is_bit_exact(granularity, zp):
    rng = np.random.default_rng(7)
    O, I = 33, 200 if granularity == "partial" else 256
    gm = {"tensor": GroupMap.per_tensor(), "channel": GroupMap.per_channel(),
          "group": GroupMap.per_group(64), "partial": GroupMap.per_group(64)}[granularity]
    pshape = gm.param_shape((O, I), (OUT, IN))
    for bits, signed in [(4, False), (4, True), (8, True), (2, False), (3, False)]:
        s = QuantScheme(bits, signed, zp, "F16")
        codes = rng.integers(s.qmin, s.qmax + 1, size=(O, I)).astype(s.code_dtype)
        scales = (rng.random(pshape) + 0.01).astype(np.float16)
        zps = None
        if zp is ZeroPoint.INTEGER:
            zps = rng.integers(s.qmin, s.qmax + 1, size=pshape).astype(s.code_dtype)
        elif zp is ZeroPoint.FLOAT:
            zps = rng.standard_normal(pshape).astype(np.float16)
        amap = AxisMap((IN, OUT), packed_axis=IN, bits=bits, container="I32")
        packed = PackedCodes(amap.to_stored(codes, (OUT, IN)), amap, (OUT, IN), {OUT: O, IN: I}, signed=signed)
        t_arr = QuantizedTensor("w", (OUT, IN), codes, scales, s, gm, zero_points=zps)
        t_pk = QuantizedTensor("w", (OUT, IN), packed, scales, s, gm, zero_points=zps)
        tensors = [t_arr, t_pk]
        if bits == 4:  # fields stored with the top bit flipped (compressed-tensors' q + 8)
            words = amap.to_stored(codes, (OUT, IN)).view(np.uint32) ^ np.uint32(0x88888888)
            flipped = PackedCodes(words.view(np.int32), amap, (OUT, IN), {OUT: O, IN: I}, signed=signed, flip=True)
            tensors.append(QuantizedTensor("w", (OUT, IN), flipped, scales, s, gm, zero_points=zps))
        c = codes.astype(np.float32) - np.float32(s.center if zp is ZeroPoint.NONE else 0)
        if zp is ZeroPoint.INTEGER:
            c -= gm.expand(zps.astype(np.float32), (O, I), (OUT, IN))
        want = c * gm.expand(scales.astype(np.float32), (O, I), (OUT, IN))
        if zp is ZeroPoint.FLOAT:
            want += gm.expand(zps.astype(np.float32), (O, I), (OUT, IN))
        for t in tensors:
            got = t.dequantize()  # the row-blocked kernel, parameters as stored
            assert np.array_equal(got, want), (bits, signed)
            # the whole-array case of the same kernel: parameters expanded to every element
            assert np.array_equal(dequantize_parts(t.codes, scales, zps, s, gm, (OUT, IN)), want)


# -- hand-computed values (not the formula again) --------------------------------------------------
@pytest.mark.parametrize("axes", [(OUT, IN), ("expert", OUT, IN)])
def test_hand_computed_values(axes):
    """Rows path (2-D, packed and unpacked) and the one-block path (3-D) give the values worked out by hand."""
    lead = (1,) if len(axes) == 3 else ()

    def make(codes, scales, scheme, zps=None, packed=False):
        codes = np.asarray(codes, scheme.code_dtype).reshape(lead + (2, 4))
        gm = GroupMap.per_channel()
        ps = gm.param_shape(codes.shape, axes)
        sc = np.asarray(scales, np.float16).reshape(ps)
        zp = None if zps is None else np.asarray(zps, np.float16 if scheme.zero_point is ZeroPoint.FLOAT
                                                 else scheme.code_dtype).reshape(ps)
        if packed and len(axes) == 2:
            amap = AxisMap((IN, OUT), packed_axis=IN, bits=4, container="I32")
            codes = PackedCodes(amap.to_stored(codes, axes), amap, axes, {OUT: 2, IN: 4},
                                signed=scheme.signed)
        return QuantizedTensor("w", axes, codes, sc, scheme, gm, zero_points=zp)

    for packed in (False, True):
        sym = make([[0, 8, 15, 9], [1, 2, 3, 4]], [0.5, 2.0], QuantScheme(4, False, scale_dtype="F16"), packed=packed)
        assert sym.dequantize().reshape(2, 4).tolist() == [[-4.0, 0.0, 3.5, 0.5], [-14.0, -12.0, -10.0, -8.0]]
        integer = make([[0, 3, 15, 4], [0, 1, 2, 3]], [2.0, 0.25], QuantScheme(4, False, ZeroPoint.INTEGER, "F16"),
                       zps=[3, 1], packed=packed)
        assert integer.dequantize().reshape(2, 4).tolist() == [[-6.0, 0.0, 24.0, 2.0], [-0.25, 0.0, 0.25, 0.5]]
        bias = make([[0, 3, 15, 1], [0, 0, 1, 1]], [0.5, 1.0], QuantScheme(4, False, ZeroPoint.FLOAT, "F16"),
                    zps=[-1.0, 0.5], packed=packed)
        assert bias.dequantize().reshape(2, 4).tolist() == [[-1.0, 0.5, 6.5, -0.5], [0.5, 0.5, 1.5, 1.5]]


def test_stacked_and_blocked_decodes_equal_the_formula_per_element(monkeypatch):
    """Issue 15: an ``(expert, out, in)`` E2M1 stack decodes as rows in blocks, and ``dequantize_parts`` in blocks
    of its leading axis; both bit-identical with ``E2M1[q] * s`` written out per element (float32), partial final
    group and a Q4-style integer stack included."""
    import ml_dtypes

    import converter.values as values
    from converter.codebooks import E2M1_VALUES
    from converter.layout import EXPERT

    monkeypatch.setattr(values, "PARTS_ELEMENTS", 200)  # many blocks even on a small tensor
    rng = np.random.default_rng(15)
    E, O, I, G = 3, 5, 72, 32  # 72 = 2 whole groups + a partial group of 8
    e2m1 = np.array(E2M1_VALUES, dtype=np.float32)
    codes = rng.integers(0, 16, size=(E, O, I)).astype(np.uint8)
    sbytes = rng.integers(120, 131, size=(E, O, 3)).astype(np.uint8)
    scales = sbytes.view(ml_dtypes.float8_e8m0fnu)
    s32 = np.exp2(sbytes.astype(np.float64) - 127).astype(np.float32)  # E8M0 by hand: 2^(e - 127)
    expected = e2m1[codes] * np.repeat(s32, G, axis=-1)[..., :I]
    scheme = QuantScheme(4, False, scale_dtype="F8_E8M0", codebook=E2M1_VALUES)
    t = QuantizedTensor("w", (EXPERT, OUT, IN), codes, scales, scheme, GroupMap.per_group(G, IN))
    assert values._stacked_rows(t)
    assert np.array_equal(t.dequantize().view(np.uint32), expected.view(np.uint32))
    got = dequantize_parts(codes, scales, None, scheme, GroupMap.per_group(G, IN), (EXPERT, OUT, IN))
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    # integer codes, symmetric centre 8 (GGUF Q4_0-like), float16 scales
    q4 = QuantScheme(4, False, ZeroPoint.NONE, "F16")
    s16 = (rng.random((E, O, 3)) + 0.01).astype(np.float16)
    want = (codes.astype(np.float32) - np.float32(q4.center)) * np.repeat(s16.astype(np.float32), G, axis=-1)[..., :I]
    t4 = QuantizedTensor("w", (EXPERT, OUT, IN), codes, s16, q4, GroupMap.per_group(G, IN))
    assert np.array_equal(t4.dequantize().view(np.uint32), want.view(np.uint32))


def test_table_indices_go_through_one_reused_intp_buffer_per_thread():
    """dequantize_block's byte-table look-up hands np.take intp indices from a buffer reused call after call
    (numpy would convert byte indices into a new 8-bytes-per-index array each time: new pages to zero); the
    values are the codes' own, signed codes keep their sign (np.take's wrap mode maps -1 to the last entry)."""
    import threading

    from converter.kernels import dequant
    u = np.arange(256, dtype=np.uint8).reshape(16, 16)[:, ::2]  # a strided block
    a = dequant._indices(u)
    assert a.dtype == np.intp and np.array_equal(a, u.astype(np.intp))
    s = np.array([[-1, -128, 127]], dtype=np.int8)
    b = dequant._indices(s)
    assert np.array_equal(b, [[-1, -128, 127]]) and np.shares_memory(a, b)  # the same buffer, reused
    other = []
    t = threading.Thread(target=lambda: other.append(dequant._indices(u)))
    t.start()
    t.join()
    assert not np.shares_memory(other[0], b)  # each thread its own
    table = np.arange(256, dtype=np.float32) * np.float32(0.5)
    assert np.array_equal(np.take(table, b, mode="wrap"), table[s.astype(np.intp) % 256])
