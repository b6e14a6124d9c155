"""GGUF types without a qckpt codec (IQ*, TQ*): decoded by gguf.quants.dequantize (issue 16).

Test files are made here: TQ1_0 / TQ2_0 with gguf-py's own quantizer, the IQ types (which gguf-py
cannot quantize) from random block bytes with a finite fp16 ``d``; values are checked against
``gguf.quants.dequantize`` and, for one IQ4_NL block, against a decode written out by hand from
``dequantize_row_iq4_nl`` (``ggml-quants.c``): ``y[j] = d * kvalues_iq4nl[qs[j] & 0xf]``,
``y[j + 16] = d * kvalues_iq4nl[qs[j] >> 4]``.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from converter.errors import UnsupportedError
from converter.formats.gguf.fallback import FALLBACK, fallback_types
from converter.formats.registry import load
from converter.ops.audit import audit
from converter.ops.inspect import inspect
from converter.schemas import validate_document
from converter.validate.run import validate

KVALUES_IQ4NL = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113]


def _raw_blocks(type_name: str, rows: int, cols: int, seed: int, d: float = 0.25) -> np.ndarray:
    """Random block bytes (uint8 ``(rows, row bytes)``) with the fp16 ``d`` of every block set to ``d``."""
    qt = gguf.GGMLQuantizationType[type_name]
    block, size = gguf.GGML_QUANT_SIZES[qt]
    raw = np.random.default_rng(seed).integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    off = FALLBACK[type_name].d_offset
    if off is not None:
        raw[:, :, off:off + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def _tensor_bytes(type_name: str, rows: int, cols: int, seed: int) -> np.ndarray:
    qt = gguf.GGMLQuantizationType[type_name]
    if type_name in ("TQ1_0", "TQ2_0"):
        x = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
        return gguf.quants.quantize(x, qt)
    return _raw_blocks(type_name, rows, cols, seed)


def _write(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint32("llama.attention.head_count", 2)
    w.add_uint32("llama.embedding_length", 256)
    for name, (type_name, raw) in tensors.items():
        w.add_tensor(name, raw, raw_dtype=None if type_name == "F32" else gguf.GGMLQuantizationType[type_name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


TYPES = ["IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"]


def test_every_type_gguf_knows_is_decodable():
    assert set(fallback_types()) == set(TYPES)


@pytest.mark.parametrize("type_name", TYPES)
def test_decodes_like_gguf_py(tmp_path, type_name):
    raw = _tensor_bytes(type_name, 6, 512, seed=len(type_name))
    path = tmp_path / f"{type_name}.gguf"
    _write(path, {"blk.0.ffn_up.weight": (type_name, raw)})
    ck = load(path)
    spec = ck.spec("model.layers.0.mlp.up_proj.weight")
    assert spec.kind == "opaque" and spec.dtype == type_name and spec.decoded_by
    got = ck["model.layers.0.mlp.up_proj.weight"].data
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name])
    assert got.dtype == np.float32 and got.shape == (6, 512)
    assert np.array_equal(got, want, equal_nan=True)
    assert sum(a.nbytes for a in spec.stored) == raw.nbytes


def test_iq4_nl_block_decoded_by_hand(tmp_path):
    raw = _raw_blocks("IQ4_NL", 1, 32, seed=3, d=0.5)
    qs = raw[0, 2:18]
    want = [0.5 * KVALUES_IQ4NL[b & 0xF] for b in qs] + [0.5 * KVALUES_IQ4NL[b >> 4] for b in qs]
    path = tmp_path / "one.gguf"
    _write(path, {"output_norm.weight": ("IQ4_NL", raw)})
    got = load(path)["model.norm.weight"].data
    assert got.reshape(-1).tolist() == want


def test_tq2_0_block_decoded_by_hand(tmp_path):
    """TQ2_0: 2-bit codes q in 0..2 at ``qs[j] >> (2*l)``, value ``d * (q - 1)`` (dequantize_row_tq2_0)."""
    raw = _raw_blocks("TQ2_0", 1, 256, seed=4, d=0.125)
    qs = raw[0, :64]
    want = np.empty(256, np.float32)
    for j in range(2):  # two halves of 32 bytes, 4 shifts, 32 elements each
        for l_ in range(4):
            for m in range(32):
                q = (int(qs[j * 32 + m]) >> (2 * l_)) & 3
                want[j * 128 + l_ * 32 + m] = np.float32(0.125) * np.float32(q - 1)
    path = tmp_path / "tq.gguf"
    _write(path, {"output_norm.weight": ("TQ2_0", raw)})
    assert np.array_equal(load(path)["model.norm.weight"].data.reshape(-1), want)


def _mixed(tmp_path: Path, bad_d: bool = False) -> Path:
    raws = {"blk.0.ffn_up.weight": ("IQ4_XS", _raw_blocks("IQ4_XS", 4, 256, 1)),
            "blk.0.ffn_down.weight": ("TQ2_0", _tensor_bytes("TQ2_0", 4, 256, 2)),
            "blk.0.ffn_gate.weight": ("IQ1_M", _raw_blocks("IQ1_M", 4, 256, 3))}
    if bad_d:
        raw = raws["blk.0.ffn_up.weight"][1].reshape(4, 1, 136)
        raw[2, 0, 0:2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    path = tmp_path / ("bad.gguf" if bad_d else "mixed.gguf")
    _write(path, raws)
    return path


def test_validate_checks_every_fallback_tensor(tmp_path):
    rep = validate(_mixed(tmp_path)).to_json()
    validate_document(json.loads(json.dumps(rep)), "validation-report")
    s = rep["summary"]
    assert s["verdict"] == "clean" and s["tensors_checked"] == 3 and s["tensors_unchecked"] == 0


def test_validate_finds_a_nonfinite_block_scale(tmp_path):
    rep = validate(_mixed(tmp_path, bad_d=True)).to_json()
    bad = [f for f in rep["findings"] if f["code"] == "scale-nonfinite"]
    assert rep["summary"]["verdict"] not in ("clean", "incomplete") and len(bad) == 1 and rep["exit_code"] != 0
    assert bad[0]["tensor"] == "model.layers.0.mlp.up_proj.weight"


def test_audit_bytes_by_role(tmp_path):
    ck = load(_mixed(tmp_path))
    doc = audit(ck)
    validate_document(json.loads(json.dumps(doc)), "audit")
    validate_document(json.loads(json.dumps(inspect(ck))), "inspect")
    by = {t["name"]: t["bytes"] for t in doc["tensors"]}
    up = by["model.layers.0.mlp.up_proj.weight"]  # IQ4_XS: 4 blocks x (128 code + 8 scale bytes)
    assert (up["codes"], up["scales"], up.get("codes+scales", 0)) == (4 * 128, 4 * 8, 0)
    down = by["model.layers.0.mlp.down_proj.weight"]  # TQ2_0: 4 blocks x (64 code + 2 scale bytes)
    assert (down["codes"], down["scales"]) == (4 * 64, 4 * 2)
    gate = by["model.layers.0.mlp.gate_proj.weight"]  # IQ1_M: not separable, stated as such
    assert (gate["codes"], gate["scales"], gate["codes+scales"]) == (0, 0, 4 * 56)
    assert doc["totals"]["bytes_by_role"]["codes+scales"] == 4 * 56


def test_exact_convert_refuses_and_requantize_reads_values(tmp_path):
    from converter.ops.convert import convert_exact
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    src = _mixed(tmp_path)
    with pytest.raises(UnsupportedError, match="requantize"):
        convert_exact(src, tmp_path / "x.gguf", "gguf")
    rep = requantize_model(src, tmp_path / "q8.gguf", Target(bits=8, group_size=32, symmetric=True), to="gguf")
    rows = {r["name"]: r for r in rep["tensors"]}
    assert len(rows) == 3 and all(r["readback_bit_exact"] for r in rows.values())
    back = load(tmp_path / "q8.gguf")
    vals = load(src)["model.layers.0.mlp.down_proj.weight"].data
    want = gguf.quants.dequantize(gguf.quants.quantize(vals, gguf.GGMLQuantizationType.Q8_0),
                                  gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(back["model.layers.0.mlp.down_proj.weight"].dequantize(), want)


def test_requantize_to_a_format_without_its_own_quantizer(tmp_path):
    """Decoded values -> qckpt's round-to-nearest (native safetensors): every value within half a step."""
    from converter.errors import NotRepresentableError
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    src = _mixed(tmp_path)
    with pytest.raises(NotRepresentableError, match="no source group layout"):
        requantize_model(src, tmp_path / "n0", Target(bits=4), to="native")
    rep = requantize_model(src, tmp_path / "n4", Target(bits=4, group_size=32, symmetric=True), to="native")
    assert len(rep["tensors"]) == 3 and all(r["readback_bit_exact"] for r in rep["tensors"])
    back = load(tmp_path / "n4")
    for name in ("model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.gate_proj.weight"):
        x = load(src)[name].data
        t = back[name]
        step = np.repeat(np.abs(t.scales.astype(np.float32)), 32, axis=1)
        assert t.scheme.bits == 4 and np.all(np.abs(t.dequantize() - x) <= step / 2 * (1 + 1e-6) + 1e-30)


def test_dequantize_writes_gguf_py_values(tmp_path):
    from safetensors.numpy import load_file

    from converter.formats.plain import write_plain
    src = _mixed(tmp_path)
    write_plain(load(src), tmp_path / "deq.safetensors")
    got = load_file(str(tmp_path / "deq.safetensors"))
    raw = {t.name: t for t in gguf.GGUFReader(src).tensors}
    for gname, name in (("blk.0.ffn_up.weight", "model.layers.0.mlp.up_proj.weight"),
                        ("blk.0.ffn_gate.weight", "model.layers.0.mlp.gate_proj.weight")):
        want = gguf.quants.dequantize(np.asarray(raw[gname].data), raw[gname].tensor_type)
        assert got[name].dtype == np.float32 and np.array_equal(got[name], want)
    doc = audit(load(src))
    up = next(t for t in doc["tensors"] if t["name"] == "model.layers.0.mlp.up_proj.weight")
    assert up["bits_per_weight"] == 8 * 136 / 256  # IQ4_XS: 136 bytes per 256 weights = 4.25 bits


def test_quant_type_mix_from_decoded_types_equals_from_their_float_values(tmp_path):
    """--quant-type Q4_K_M on IQ4_XS / TQ2_0 / IQ1_M tensors gives the bytes (and types) it gives on an F32 GGUF of
    their decoded values: the decoded tensors enter llama-quantize's type choice and quantizer as float weights."""
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    src = _mixed(tmp_path)
    floats = tmp_path / "floats.gguf"
    raw = {t.name: t for t in gguf.GGUFReader(src).tensors}
    _write(floats, {n: ("F32", gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)) for n, t in raw.items()})
    for s, d in ((src, "a.gguf"), (floats, "b.gguf")):
        rep = requantize_model(s, tmp_path / d, Target(quant_type="Q4_K_M"), to="gguf")
        assert all(r["readback_bit_exact"] for r in rep["tensors"]) and len(rep["tensors"]) == 3
    def typed_bytes(path):
        return {t.name: (t.tensor_type.name, np.asarray(t.data).tobytes()) for t in gguf.GGUFReader(path).tensors}
    a, b = typed_bytes(tmp_path / "a.gguf"), typed_bytes(tmp_path / "b.gguf")
    assert a == b and {v[0] for v in a.values()} <= {"Q4_K", "Q6_K"}


def test_dequantize_names_a_fallback_tensor_decoded_to_inf(tmp_path):
    """An IQ4_XS block scale d = inf (row 2) decodes through gguf-py to inf / NaN: dequantize names the tensor in
    non_finite with the count of the written file (numpy, independently), as it does for qckpt's own decodes (the
    decoded_by plans were not counted: no non_finite, and the CLI hides numpy's warning)."""
    from safetensors.numpy import load_file

    from converter.ops.dequantize import dequantize
    out = tmp_path / "deq.safetensors"
    doc = dequantize(_mixed(tmp_path, bad_d=True), out)
    got = load_file(str(out))
    expected = {k: int(np.count_nonzero(~np.isfinite(v))) for k, v in got.items()}
    assert expected["model.layers.0.mlp.up_proj.weight"] > 0
    assert doc.get("non_finite") == {k: n for k, n in sorted(expected.items()) if n}
