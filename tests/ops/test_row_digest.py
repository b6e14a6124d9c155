"""The read-back digest of a tensor fed in row blocks equals the digest of the whole tensor.

:class:`converter.ops.row_digest.RowDigest` must give exactly :func:`converter.ops.readback.digest`'s string for
any blocking, including the two choices ``digest`` makes from every value of the tensor: integer zero points
found in float biases (only when every group has one), and per-channel parameters (only when every row's
groups share its first group's). The reference is ``digest`` of the whole tensor, and ``zlib.crc32`` of the
joined bytes for :func:`crc32_combine`.
"""

import zlib

import numpy as np
import pytest

from converter.formats.gguf.requant import _requant_stored
from converter.formats.gguf.schemes import quantize_to_gguf
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.ops.readback import digest
from converter.ops.row_digest import RowDigest, crc32_combine
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import QuantizedTensor
from converter.tensor_rows import take_rows


def test_crc32_combine_is_zlib_crc_of_the_joined_bytes():
    rng = np.random.default_rng(1)
    for _ in range(200):
        a, b = rng.bytes(int(rng.integers(0, 700))), rng.bytes(int(rng.integers(0, 700)))
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)
    assert crc32_combine(0x12345678, 0, 0) == 0x12345678
    # lengths with high bits set (a row block of a large tensor is megabytes): every squaring step used
    for n in (1 << 20, 3_000_001):
        a, b = rng.bytes(999), rng.bytes(n)
        assert crc32_combine(zlib.crc32(a), zlib.crc32(b), n) == zlib.crc32(a + b), n


def _fed(t, step):
    d = RowDigest(t.shape, t.axes)
    for r0 in range(0, t.shape[0], step):
        d.add(take_rows(t, r0, min(t.shape[0], r0 + step)))
    return d.hexdigest()


X = (np.random.default_rng(0).standard_normal((24, 512)) * 0.02).astype(np.float32)


@pytest.mark.parametrize("ggml_type", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                       "Q8_0"])
@pytest.mark.parametrize("values", ["normal", "nonnegative", "row_constant", "zeros"])
def test_row_blocks_digest_equals_whole_digest(ggml_type, values):
    x = {"normal": X, "nonnegative": np.abs(X), "row_constant": np.repeat(X[:, :1], 512, axis=1),
         "zeros": np.zeros_like(X)}[values]
    t = _requant_stored(quantize_to_gguf(x, ggml_type, name="w"))  # the form the GGUF reader returns
    whole = digest(t)
    for step in (1, 5, 24):
        assert _fed(t, step) == whole, (ggml_type, values, step)


def _affine(biases_per_row):
    """uint4 codes with float biases: rows whose bias is -z * scale (an integer zero point) or not."""
    rows = len(biases_per_row)
    scheme = QuantScheme(4, signed=False, zero_point=ZeroPoint.FLOAT, scale_dtype="F32")
    gm = GroupMap.per_group(32, IN)
    codes = (np.arange(rows * 64) % 16).astype(np.uint8).reshape(rows, 64)
    scales = np.full((rows, 2), 0.5, np.float32)
    zp = np.array([[b, b] for b in biases_per_row], np.float32)
    return QuantizedTensor("w", (OUT, IN), codes, scales, scheme, gm, zero_points=zp)


def test_float_biases_that_are_integer_zero_points_in_every_block_give_the_parameter_digest():
    t = _affine([-0.5 * z for z in (3, 8, 0, 15, 7, 1)])  # -b/s = 3, 8, 0 ...: every group an integer point
    assert digest(t).startswith("p:")
    assert _fed(t, 1) == _fed(t, 4) == digest(t)


def test_float_biases_integer_in_some_blocks_only_give_the_values_digest():
    t = _affine([-1.5, -4.0, 0.3, -2.0, -0.5, -1.0])  # row 2: -b/s = -0.6, no integer point
    assert digest(t).startswith("v:")
    assert _fed(t, 1) == _fed(t, 2) == _fed(t, 6) == digest(t)


def test_per_channel_collapse_decided_by_every_block():
    t = _affine([-1.0] * 6)
    t2 = t.replace(scales=np.array([[0.5, 0.5]] * 5 + [[0.5, 0.25]], np.float32))  # the last row's groups differ
    assert digest(t) != digest(t2)
    for tt in (t, t2):
        assert _fed(tt, 1) == _fed(tt, 4) == digest(tt)


def test_missing_rows_are_refused():
    t = _affine([-1.0] * 6)
    d = RowDigest(t.shape, t.axes)
    d.add(take_rows(t, 0, 3))
    with pytest.raises(ValueError, match="3 of 6 rows"):
        d.hexdigest()
