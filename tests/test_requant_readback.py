"""The read-back check of requantize_model: its digest tells a changed code or scale apart and
agrees across equivalent representations (signed vs unsigned codes, implicit vs explicit zero)."""

import numpy as np
import pytest

from converter.groups import GroupMap
from converter.ops import code_crc
from converter.ops.readback import digest as _digest
from converter.quant.quantize import quantize
from converter.quant.recode import as_integer_zero, as_unsigned
from converter.scheme import QuantScheme


def _t():
    w = np.random.default_rng(3).standard_normal((6, 40)).astype(np.float32)
    return quantize(w, QuantScheme(8, True), GroupMap.per_group(16))


def test_digest_sees_one_changed_code_and_scale():
    t = _t()
    d = _digest(t)
    codes = t.codes.copy()
    codes[5, 39] ^= 1
    assert _digest(t.replace(codes=codes)) != d
    scales = t.scales.copy()
    scales[0, 0] = np.nextafter(scales[0, 0], np.float16(np.inf))
    assert _digest(t.replace(scales=scales)) != d


def test_digest_equal_for_equivalent_representations():
    t = _t()
    assert _digest(as_unsigned(t)) == _digest(t)
    assert _digest(as_integer_zero(as_unsigned(t))) == _digest(t)
    assert np.array_equal(as_integer_zero(as_unsigned(t)).dequantize(), t.dequantize())


def test_digest_ignores_the_rounding_label():
    """The rule that made the codes is not an input of dequantize: a GGUF output read back (scheme
    labelled with llama.cpp's rounding) proves a tensor requantized half-to-even (regression: every
    requantized GGUF tensor reported readback_bit_exact false)."""
    t = _t()
    assert t.scheme.rounding == "half_even"
    away = t.replace(scheme=t.scheme.replace(rounding="half_away"))
    assert np.array_equal(away.dequantize(), t.dequantize())
    assert _digest(away) == _digest(t)


# -- the blocked digest (issue 19): the same number as the one-pass formula it replaced -------------

def _reference_digest(t) -> str:
    """The digest as first defined: whole arrays converted (as_unsigned, as_integer_zero), then CRC-32
    over head, g_idx, codes, float32 scales and float32 zero points (values when there is no integer zero)."""
    import zlib

    from converter.errors import ConverterError

    def crc(parts) -> str:
        c = 0
        for p in parts:
            c = zlib.crc32(p, c)
        return f"{c:08x}"
    try:
        c = as_integer_zero(as_unsigned(t))
    except ConverterError:
        d = np.ascontiguousarray(t.dequantize())
        return "v:" + crc([repr(d.shape).encode(), memoryview(d).cast("B")])
    gm = c.group_map
    scheme = c.scheme.replace(scale_dtype="F32", rounding="half_even")
    parts = [repr((c.shape, c.axes, scheme, gm.granularity.value, gm.axis, gm.group_size)).encode()]
    if gm.g_idx is not None:
        parts.append(np.ascontiguousarray(gm.g_idx, dtype=np.int64).data)
    parts += [np.ascontiguousarray(c.codes).data, np.ascontiguousarray(c.scales, dtype=np.float32).data,
              np.ascontiguousarray(c.zero_points, dtype=np.float32).data]
    return "p:" + crc(parts)


@pytest.mark.parametrize("block", [1, 100, 1 << 20])
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("signed,zero", [(True, "none"), (True, "integer"), (True, "float"), (False, "integer"),
                                         (False, "float")])
def test_blocked_digest_is_the_one_pass_digest(monkeypatch, block, bits, zero, signed):
    """Row blocks of 1 byte (one row each), 100 bytes (partial last block) and 1 MiB (whole); the
    extreme codes of the range are present (qmin and qmax, -128 / 127 at 8 bits)."""
    from converter.scheme import ZeroPoint
    zp = ZeroPoint(zero)
    monkeypatch.setattr(code_crc, "BLOCK_BYTES", block)
    rng = np.random.default_rng(bits)
    w = rng.standard_normal((37, 48)).astype(np.float32)
    t = quantize(w, QuantScheme(bits, signed, zero_point=zp), GroupMap.per_group(16))
    codes = t.codes.copy()
    codes[0, 0], codes[0, 1], codes[36, 47] = t.scheme.qmin, t.scheme.qmax, t.scheme.qmin  # the extreme codes
    t = t.replace(codes=codes)
    assert _digest(t) == _reference_digest(t)
    if zp is not ZeroPoint.FLOAT:  # (a signed float-bias tensor has no exact unsigned form: digested by values)
        assert _digest(as_unsigned(t)) == _reference_digest(as_unsigned(t)) == _digest(t)


@pytest.mark.parametrize("sample", ["gptq_w4_g128_sym", "ct_pack_w4a16_channel_sym", "gptq_w4_gchan_sym"])
def test_packed_read_back_tensor_digest_unpacks_in_blocks(monkeypatch, sample):
    """A tensor as a reader returns it (codes still in their stored words, cut into row blocks and
    unpacked block by block) has the digest of its unpacked codes."""
    from pathlib import Path

    from converter.formats import registry
    from converter.layout import PackedCodes
    monkeypatch.setattr(code_crc, "BLOCK_BYTES", 1000)
    ckpt = registry.load(Path(__file__).resolve().parents[1] / "sample_checkpoints" / sample)
    names = ckpt.quantized_names()
    assert names
    for name in names:
        t = ckpt[name]
        assert isinstance(t.__dict__["_codes"], PackedCodes)
        blocked = _digest(t)
        assert blocked == _reference_digest(t.replace(codes=np.array(t.codes)))
        codes = np.array(t.codes)
        codes.reshape(-1)[codes.size // 2] ^= 1
        assert _digest(t.replace(codes=codes)) != blocked


def test_read_ahead_proof_flags_the_changed_tensor_and_raises_a_reader_error(monkeypatch):
    """In one process the read-back runs a tensor ahead on its own thread: every row still gets its
    own verdict (a changed digest is False, the others True), and an error reading one tensor is
    raised once every thread has finished."""
    import threading
    from pathlib import Path

    from converter.errors import CorruptFileError
    from converter.formats import registry
    from converter.ops import readback
    from converter.runtime import run_options
    out = registry.load(Path(__file__).resolve().parent.parent / "sample_checkpoints" / "gptq_w4_g128_sym")
    names = out.quantized_names()
    assert len(names) >= 3
    written = {n: _digest(out[n]) for n in names}
    written[names[1]] = "p:00000000"
    rows = {n: {} for n in names}
    with run_options(workers=1):
        readback.verify_readback(out, rows, written)
    assert [rows[n]["readback_bit_exact"] for n in names] == [n != names[1] for n in names]

    real = readback.digest

    def failing(t):
        if t.name == names[0]:
            raise CorruptFileError("unreadable words", tensor=t.name)
        return real(t)
    monkeypatch.setattr(readback, "digest", failing)
    with run_options(workers=1), pytest.raises(CorruptFileError) as info:
        readback.verify_readback(out, {n: {} for n in names}, written)
    assert info.value.tensor == names[0]
    assert not [t for t in threading.enumerate() if t.name == "qckpt-deferred"]


def test_eight_bit_words_read_back_are_digested_as_their_bytes(monkeypatch, tmp_path):
    """compressed-tensors' 8-bit weight_packed read back: the words' bytes are the unsigned codes in order, so
    the digest reads them without unpacking (in row blocks, a partial last one) and equals the digest of the
    unpacked codes; one changed byte changes it. Other packings (4-bit) keep the unpacking path."""
    from pathlib import Path

    from converter.formats import registry
    from converter.layout import PackedCodes
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    root = Path(__file__).resolve().parents[1] / "sample_checkpoints"
    requantize_model(root / "gptq_w4_g128_sym", tmp_path / "ct8", Target(bits=8, granularity="channel"),
                     to="compressed-tensors")
    monkeypatch.setattr(code_crc, "BLOCK_BYTES", 1000)
    out = registry.load(tmp_path / "ct8")
    names = out.quantized_names()
    assert names
    for name in names:
        t = out[name]
        pc = t.__dict__["_codes"]
        u = as_integer_zero(as_unsigned(t))
        assert code_crc._byte_fields(u.__dict__["_codes"]) is not None
        fast = _digest(t)
        assert fast == _reference_digest(t.replace(codes=np.array(t.codes)))
        words = np.array(pc.words)
        words.view(np.uint8).reshape(-1)[words.nbytes // 2] ^= 1
        changed = t.replace(codes=PackedCodes(words, pc.amap, pc.axes, pc.sizes, signed=pc.signed, flip=pc.flip))
        assert _digest(changed) != fast
    four = registry.load(root / "ct_pack_w4a16_channel_sym")
    t4 = four[four.quantized_names()[0]]
    assert code_crc._byte_fields(as_integer_zero(as_unsigned(t4)).__dict__["_codes"]) is None
