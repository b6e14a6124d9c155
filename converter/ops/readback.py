"""The read-back proof of a requantized output: a digest of each tensor as written, and of the same
tensor read back from the staged output (renamed into place only when proven) through the target's reader.

:func:`digest` is a CRC-32 chain over what the dequantized values are a function of: the scheme (up
to the scale dtype and the rounding rule that made the codes), groups, shape, and the codes
(unsigned domain), float32 scales and float32 zero points (explicit integer zero points, so a
symmetric centre and its explicit zero agree). Equal digests mean identical dequantized float32
values (dequantize is a deterministic function of exactly these) up to a 2^-32 chance per tensor
of missing a corruption, at a quarter of the bytes of the values themselves; CRC-32
(:func:`converter.kernels.crc32.crc32`: zlib's, about 4 GB/s, or zlib-ng's with the ``fast`` extra, about
30 GB/s, the same values) costs little beside the requantization, where SHA-256 would cost more than it.
A tensor whose zero points have no integer form (float biases) is digested by its values instead.

The codes, the one full-size part, go through the CRC in row blocks of about :data:`converter.ops.code_crc.BLOCK_BYTES`
(:func:`crc_codes`): signed int8 codes are moved to the unsigned domain block by block in a reused
buffer, packed codes (a read-back tensor) are unpacked block by block, so the digest is one pass
over cache-sized blocks with no full-size temporary; the CRC of consecutive blocks chained is the CRC
of the whole array, so the digest is the same number as over the whole converted array.

:func:`digest_later` computes a digest on its own thread (:class:`converter.write.engine.Deferred`):
the requantizing loader hands it to the task while the writer encodes and writes the same tensor, so
on a machine with a spare core the write-side digest costs no wall time.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Mapping

import numpy as np

from converter.kernels.crc32 import crc32
from converter.groups import Granularity
from converter.ops.code_crc import BLOCK_BYTES, crc_codes, digest_parts
from converter.ops.row_digest import RowDigest
from converter.runtime import auto_workers, current
from converter.rows import Rows
from converter.tensor import Checkpoint, QuantizedTensor
from converter.tensor_rows import row_splittable
from converter.write.engine import Deferred, run_tasks

__all__ = ["digest", "digest_later", "crc_codes", "values_crc", "verify_readback", "BLOCK_BYTES"]

#: A row's ``readback`` when the written tensor and the one read back have no common digest: integer zero
#: points written, float biases stored and read back (MLX ``biases``); not proven, and not refused.
NOT_COMPARABLE = ("not proven: the target stores the zero points as float biases, so the tensor read back has "
                  "no integer zero points to digest")
#: Read-back tensors in flight besides the one waited for, in one process (:func:`verify_readback`).
READ_AHEAD = 1


def _crc(parts, c: int = 0) -> int:
    for p in parts:
        c = crc32(p, c)
    return c


def values_crc(t: QuantizedTensor) -> int:
    """CRC-32 of ``repr(shape)`` then ``t``'s dequantized float32 values in C order, produced in row blocks
    (:class:`converter.rows.Rows`) when the tensor can be cut into rows (a GGUF K-quant ``(out, in)``
    tensor: never whole), else whole; the same number either way (chained CRCs of consecutive blocks)."""
    shape = tuple(int(s) for s in t.shape)
    crc = crc32(repr(shape).encode())
    if len(shape) != 2 or not row_splittable(t):
        return crc32(memoryview(np.ascontiguousarray(t.dequantize())).cast("B"), crc)
    values = Rows(t)
    for r0 in range(0, shape[0], values.step):
        crc = crc32(memoryview(np.ascontiguousarray(values[r0:r0 + values.step])).cast("B"), crc)
    return crc


def digest(t: QuantizedTensor) -> str:
    """The read-back digest of ``t`` (module docstring): ``"p:<crc32 hex>"`` over its parameters and codes,
    ``"v:<crc32 hex>"`` over its dequantized float32 values when its zero points have no integer form."""
    parts = digest_parts(t)
    if parts is None:
        return f"v:{values_crc(t):08x}"
    scheme, zp, off, raw = parts
    gm = t.group_map  # (neither conversion changes the groups, the shape or the axes)
    groups = (gm.granularity.value, gm.axis, gm.group_size)
    scales = np.asarray(t.scales, dtype=np.float32)
    zp = None if zp is None else np.asarray(zp, dtype=np.float32)
    if (gm.granularity is Granularity.GROUP and gm.g_idx is None and len(t.shape) == 2 and gm.axis == t.axes[-1]
            and scales.ndim == 2 and bool((scales == scales[:, :1]).all())
            and (zp is None or bool((zp == zp[:, :1]).all()))):
        # every group of a row with the row's parameters (MLX has no per-channel: it repeats the channel's
        # scale over groups of 64 / 128) is per-channel: the same values, so the same digest
        groups, scales, zp = (Granularity.CHANNEL.value, t.axes[0], None), scales[:, :1], (
            None if zp is None else zp[:, :1])
    head = repr((t.shape, t.axes, scheme, *groups)).encode()
    crc = crc32(head)
    if gm.g_idx is not None:
        crc = crc32(np.ascontiguousarray(gm.g_idx, dtype=np.int64).data, crc)
    crc = crc_codes(raw, crc, offset=off)
    crc = _crc([np.ascontiguousarray(scales).data, np.ascontiguousarray(zp, dtype=np.float32).data], crc)
    return f"p:{crc:08x}"


def _row_digest(out: Checkpoint, name: str) -> "str | None":
    """:func:`digest` of ``out[name]`` from the reader's row blocks (:meth:`Checkpoint.row_blocks`, never
    decoded whole: :class:`~converter.ops.row_digest.RowDigest`), or None when the reader gives none."""
    spec = out.spec(name) if name in out else None
    if spec is None or spec.kind != "quantized" or len(spec.shape) != 2 or spec.group_map is None \
            or spec.group_map.granularity not in (Granularity.GROUP, Granularity.CHANNEL):
        return None
    blocks = out.row_blocks(name)
    if blocks is None:
        return None
    d = RowDigest(tuple(spec.shape), tuple(spec.axes))
    for _, block in blocks:
        d.add(block)
    return d.hexdigest()


def digest_later(t: QuantizedTensor) -> Deferred:
    """:func:`digest` of ``t`` computed on its own thread (``t`` must not change meanwhile)."""
    return Deferred(digest, t)


def verify_readback(out: Checkpoint, rows: dict[str, dict], written: Mapping[str, str]) -> None:
    """Set ``readback_bit_exact`` in each report row: the tensor read back from ``out`` (the
    staged output, through the target's reader) has the digest of the one computed.

    The tensors are read and digested in the worker processes of the options in force
    (:func:`converter.runtime.auto_workers` on the output's stored bytes), one per task. In one
    process, tensor ``i + 1`` is read and digested on its own thread while tensor ``i`` is
    (:data:`READ_AHEAD` tensors at most: reading back overlaps the digests, as the background writer
    overlaps the writes). A tensor the reader gives in row blocks (:meth:`Checkpoint.row_blocks`: GGUF block
    types) is digested block by block, never decoded whole.
    """
    total = sum(int(a.nbytes) for spec in out.specs() for a in spec.stored)

    def prove(names: list[str]) -> list[bool]:
        oks: list = [False] * len(names)

        def check(i: int) -> "bool | None":
            mine = written.get(names[i])
            theirs = _row_digest(out, names[i]) if mine is not None else None
            if theirs is None:
                back = out[names[i]] if names[i] in out else None
                if mine is None or not isinstance(back, QuantizedTensor):
                    return False
                theirs = digest(back)
            if theirs[:2] != mine[:2]:  # integer zero points written, float biases read back (MLX): no common
                return None             # digest; the values are compared by the error report, not proven here
            return theirs == mine

        def done(i: int, ok: "bool | None") -> None:
            oks[i] = ok
        workers = auto_workers(total, len(names))
        if workers > 1 or len(names) <= 1:
            run_tasks(len(names), check, workers=workers, on_result=done)
            return oks
        pending: deque[tuple[int, Deferred]] = deque()
        try:
            for i in range(len(names)):
                pending.append((i, Deferred(check, i)))
                if len(pending) > READ_AHEAD:
                    j, d = pending.popleft()
                    done(j, d.result())
            while pending:
                j, d = pending.popleft()
                done(j, d.result())
        finally:  # (after a failure: no thread outlives the proof)
            for _, d in pending:
                with contextlib.suppress(BaseException):
                    d.result()
        return oks
    job = current().shard_job  # --engine ray|dask: each node reads back its own shard's tensors
    names = list(rows)
    for name, ok in zip(names, job.prove_rows(names, prove) if job is not None else prove(names)):
        rows[name]["readback_bit_exact"] = bool(ok)
        if ok is None:
            rows[name]["readback"] = NOT_COMPARABLE
