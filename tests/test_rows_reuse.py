"""Rows(t, reuse=True): each super-block of a row-local integer tensor is dequantized into one reused buffer
(the row quantizers read a block's rows before the next block): the same float32 values, bit for bit, as the
tensor's own dequantize, block after block; forks keep the rule with their own buffer; codebook tensors and
arrays read as before."""

import numpy as np

from converter.groups import GroupMap
from converter.quant.quantize import quantize
from converter.rows import Rows
from converter.scheme import QuantScheme, ZeroPoint


def _tensor(bits=4, asym=True):
    w = np.random.default_rng(bits).standard_normal((300, 96)).astype(np.float32)
    return quantize(w, QuantScheme(bits, False, zero_point=ZeroPoint.INTEGER if asym else ZeroPoint.NONE),
                    GroupMap.per_group(32))


def test_reused_blocks_hold_the_tensors_values(monkeypatch):
    from converter import rows as rows_mod
    monkeypatch.setattr(rows_mod, "SUPER_ELEMENTS", 96 * 64)  # blocks of 64 rows, a partial last one
    for t in (_tensor(4, True), _tensor(8, False), _tensor(2, True)):
        whole = t.dequantize()
        r = Rows(t, reuse=True)
        seen = []
        for r0 in range(0, 300, 64):
            got = r[r0:min(300, r0 + 64)]
            assert np.array_equal(got.view(np.uint32), whole[r0:r0 + 64].view(np.uint32))
            seen.append(got)
        assert all(np.shares_memory(seen[0], s) for s in seen[1:])  # one buffer, overwritten block by block
        f = r.fork()
        assert f.reuse and np.array_equal(f[64:128], whole[64:128])
        assert not np.shares_memory(f[64:128], seen[0])


def test_without_reuse_each_block_is_its_own_array_and_arrays_pass_through(monkeypatch):
    from converter import rows as rows_mod
    monkeypatch.setattr(rows_mod, "SUPER_ELEMENTS", 96 * 64)
    t = _tensor()
    r = Rows(t)
    a, b = r[0:64], r[64:128]
    assert not np.shares_memory(a, b) and np.array_equal(a, t.dequantize()[:64])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(Rows(x, reuse=True)[1:3], x[1:3])
