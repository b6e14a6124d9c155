"""The axis probes: exact declared decode, every alternative rejected; and a broken reader is caught."""

from dataclasses import replace

import numpy as np
import pytest

from converter.formats import registry
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import ZeroPoint
from converter.validate.interpretations import alternatives, decode
from converter.validate.probes import probe_tensor, run_probe, self_test


def test_probe_tensor_properties():
    t = probe_tensor(13, 40, 16, 4, False, ZeroPoint.INTEGER)
    assert t.shape == (13, 40) and t.scales.shape == (13, 3)  # partial tail: 40 = 16 + 16 + 8
    s = t.scales.astype(np.float32)
    assert np.all(np.log2(s) == np.round(np.log2(s)))  # powers of two
    assert len(np.unique(s[:, 0])) > 1 and len(np.unique(s[0, :])) > 1  # vary by row and by group
    assert all(len(np.unique(t.codes[o, :8])) == 8 for o in range(13))  # distinct within every word
    assert not np.any(t.zero_points == 8)


@pytest.mark.parametrize("fmt", [n for n in registry.writable() if n != "plain"])
def test_every_writable_format_passes(fmt):
    doc = self_test([fmt])
    assert doc["formats"][fmt] == "pass", doc
    assert all(p["declared_exact"] and all(p["alternatives"].values()) for p in doc["probes"])
    names = set().union(*(p["alternatives"] for p in doc["probes"]))
    if any(len(p["shape"]) == 2 for p in doc["probes"]):
        assert {"transposed storage", "reversed dims"} <= names
    if any(len(p["shape"]) == 3 for p in doc["probes"]):  # stacked experts (gpt-oss MXFP4)
        assert {"each expert stored transposed ([E, in, out])", "expert order reversed",
                "out rows de-interleaved (0::2 then 1::2)", "scales of the neighbouring expert"} <= names
    if any(not p["scheme"].endswith(" float") for p in doc["probes"]):  # a float element has no zero point
        assert {"zero +1", "zero -1"} <= names
    assert any(n.startswith("scales") for n in names)


def test_a_reader_that_reads_scales_transposed_fails_the_probe(tmp_path, monkeypatch):
    h = registry.get("gptq")

    def bad_read(src):
        ck = h.read(src)
        def load(name):
            t = ck[name]
            s = t.scales
            return t.replace(scales=np.ascontiguousarray(s.T).reshape(s.shape))
        return type(ck)({n: ck.spec(n) for n in ck.names()}, load, format="gptq")
    broken = replace(h, read=bad_read)
    res = run_probe(broken, probe_tensor(13, 40, 16, 4, False, ZeroPoint.NONE), tmp_path)
    assert not res.declared_exact and not res.passed
    # and the matching alternative is the one that undoes it
    assert res.alternatives["scales read in the other orientation"] is False


def test_a_reader_with_the_wrong_nibble_order_fails_the_probe(tmp_path):
    h = registry.get("gptq")

    def bad_read(src):
        ck = h.read(src)
        def load(name):
            t = ck[name]
            amap = t.stored["codes"]
            words = amap.to_stored(t.codes, t.axes)
            wrong = replace(amap, order=(7, 6, 5, 4, 3, 2, 1, 0)).to_logical(words, t.axes, dict(zip(t.axes, t.shape)))
            return t.replace(codes=wrong)
        return type(ck)({n: ck.spec(n) for n in ck.names()}, load, format="gptq")
    res = run_probe(replace(h, read=bad_read), probe_tensor(13, 40, 16, 4, False, ZeroPoint.NONE), tmp_path)
    assert not res.declared_exact
    assert res.alternatives["nibble order reversed"] is False  # reading it back reversed restores it


def test_b06_scales_copied_into_the_transposed_slot():
    from converter.scheme import QuantScheme
    from converter.tensor import QuantizedTensor
    # O=2, I=4, G=2, logical S = [[1,2],[10,20]], (q - z) = 1 everywhere
    t = QuantizedTensor("m", (OUT, IN), np.full((2, 4), 9, np.uint8), np.array([[1, 2], [10, 20]], np.float16),
                        QuantScheme(4, False, ZeroPoint.NONE, "F16"), GroupMap.per_group(2, IN))
    assert t.dequantize().tolist() == [[1, 1, 2, 2], [10, 10, 20, 20]]
    bad = t.replace(scales=np.array([[1, 10], [2, 20]], np.float16))  # the [G, O] tensor in the [O, G] slot
    assert bad.dequantize().tolist() == [[1, 1, 10, 10], [2, 2, 20, 20]]
    assert alternatives(bad)["scales transposed"].tolist() == t.dequantize().tolist()
    # zero offset: a v1-stored 7 must become 8; forgetting the +1 is the "zero -1" reading
    v = QuantizedTensor("v", (OUT, IN), np.array([[0, 8, 15]], np.uint8), np.array([[0.1]], np.float16),
                        QuantScheme(4, False, ZeroPoint.INTEGER, "F16"), GroupMap.per_channel(OUT),
                        zero_points=np.array([[8]], np.int16))
    assert np.allclose(v.dequantize(), [[-0.8, 0, 0.7]], atol=1e-3)
    assert np.allclose(decode(v, zero_shift=-1), [[-0.7, 0.1, 0.8]], atol=1e-3)


def test_nibble_alternatives_skip_unrepackable_layouts_but_not_bugs(monkeypatch):
    from converter.layout import AxisMap
    from converter.scheme import QuantScheme
    from converter.tensor import QuantizedTensor
    from converter.validate.interpretations import nibble_alternatives
    codes = np.tile(np.arange(16, dtype=np.uint8), (2, 1))
    t = QuantizedTensor("m", (OUT, IN), codes, np.ones((2, 1), np.float16), QuantScheme(4, False, ZeroPoint.NONE),
                        GroupMap.per_channel(OUT),
                        stored={"codes": AxisMap((OUT, IN), packed_axis=IN, bits=4, container="U32")})
    assert "nibble order reversed" in nibble_alternatives(t)
    narrow = t.replace(stored={"codes": AxisMap((OUT, IN), packed_axis=IN, bits=2, container="U8")})
    assert nibble_alternatives(narrow) == {}  # 4-bit codes cannot be repacked as 2-bit fields: no alternative

    def broken(self, logical, axes):
        raise TypeError("a bug, not a layout refusal")
    monkeypatch.setattr(AxisMap, "to_stored", broken)
    with pytest.raises(TypeError):  # was swallowed by `except Exception`
        nibble_alternatives(t)
