"""Independent proof of a written GGUF's LLaMA q/k rows (the read-back proof's second opinion).

The read-back proof compares the source with the output as qckpt's reader returns it, and that
reader undoes the q/k row permutation with the same code (:mod:`.heads`) and the head counts the
writer recorded: a wrong head count cancels out. This check does not use either. It reads the
stored rows of every permuted tensor from the file's bytes (the bounded header walk gives their offsets) and
decodes them with ``gguf.quants.dequantize``, no un-permutation, and compares them with llama.cpp's
``LlamaModel.permute`` written out on the source's logical values, with the head counts taken from
the *source* and the q / k shapes: ``n_head`` = config ``num_attention_heads`` (or the source's GGUF
``head_count``), ``n_head_kv`` = the count the source states (``num_key_value_heads`` /
``head_count_kv``), else ``k_rows / (q_rows / n_head)`` of the same layer (never the writer's derivation).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from converter.formats.gguf.bounds import check_gguf_bounds
from converter.formats.gguf.names import gguf_to_hf, permute_heads_key
from converter.formats.gguf.schemes import gguf_module
from converter.rows import Rows
from converter.runtime import auto_workers
from converter.tensor import Checkpoint, QuantizedTensor
from converter.tensor_rows import row_splittable
from converter.write.engine import run_tasks

__all__ = ["prove_qk_rows"]

_LAYER = re.compile(r"^blk\.(\d+)\.attn_(q|k)\.(weight|bias)$")


def _llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """``LlamaModel.permute(w, n_head, n_head)`` of ``convert_hf_to_gguf.py``, on a numpy array."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _values(t: Any) -> np.ndarray:
    return t.dequantize() if isinstance(t, QuantizedTensor) else np.asarray(t.data, dtype=np.float32)


def _source_heads(src: Checkpoint, config_key: str = "num_attention_heads", kv_key: str = "head_count") -> int | None:
    """A head count the source states: its config's ``config_key``, else its GGUF ``{arch}.attention.{kv_key}``."""
    n = (src.config or {}).get(config_key)
    if n is None:
        arch = (src.metadata or {}).get("architecture")
        n = ((src.metadata or {}).get("gguf_kv") or {}).get(f"{arch}.attention.{kv_key}")
    return int(n) if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def prove_qk_rows(src: Checkpoint, dst: Path, out: Checkpoint | None = None) -> dict[str, str]:
    """``{source tensor name: why it failed}`` for the permuted q/k tensors of GGUF file ``dst`` whose
    stored rows are not llama.cpp's permute of ``src``'s logical rows; ``{}`` when all agree (or none is
    permuted). A tensor whose head count cannot be taken from the source is reported too.

    ``out``: ``dst`` already read back (its ``general.architecture`` is taken from it instead of parsing the
    key/values again, which costs seconds with a 50k-token vocabulary); the stored rows are always read from
    the file's bytes (the bounded header walk, :func:`~converter.formats.gguf.bounds.check_gguf_bounds`), of every
    part when ``out`` is a split GGUF (``dst`` its first part).
    """
    gguf = gguf_module()
    if out is not None:
        arch = (out.metadata or {}).get("architecture")
    else:
        field = gguf.GGUFReader(dst, "r").fields.get("general.architecture")
        arch = field.contents() if field is not None else None
    parts = ((out.metadata or {}).get("gguf_split") or {}).get("files") if out is not None else None
    located = {}  # GGUF name -> (file, its data start, tensor info); a split output: every part's tensors
    for path in [dst.with_name(f) for f in parts] if parts else [dst]:
        bounds = check_gguf_bounds(path)
        located.update({t.name: (path, bounds.data_start, t) for t in bounds.tensors})
    by_name = {name: t for name, (_, _, t) in located.items()}
    stored = {name: t for name, t in by_name.items() if permute_heads_key(name, arch)}
    if not stored:
        return {}

    def stored_values(t, r0: int = 0, r1: "int | None" = None) -> np.ndarray:
        """Stored rows ``r0:r1`` (all: ``r1`` None) of GGUF tensor ``t``, decoded by gguf-py."""
        path, data_start, _ = located[t.name]
        rows = int(np.prod(t.ne[1:], dtype=np.int64)) if len(t.ne) > 1 else 1
        r1 = rows if r1 is None else r1
        row_bytes = t.nbytes // rows
        raw = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start + t.offset + r0 * row_bytes,
                        shape=((r1 - r0) * row_bytes,))
        return gguf.quants.dequantize(np.array(raw).reshape(r1 - r0, -1), gguf.GGMLQuantizationType[t.type_name])

    names = {v: k for k, v in ((src.metadata or {}).get("gguf_names") or {}).items()} if src.format == "gguf" else {}
    n_head = _source_heads(src)
    rows_of = {}
    for g in stored:
        m = _LAYER.match(g)
        name = names.get(g) or gguf_to_hf(g, arch)
        if name in src:
            rows_of[(m.group(1), m.group(2), m.group(3))] = (g, name, int(src.spec(name).shape[0]))
    n_kv = _source_heads(src, "num_key_value_heads", "head_count_kv")
    items = list(rows_of.items())

    def check(i: int) -> "tuple[str, str] | None":
        """``(source name, why)`` when item ``i``'s stored rows are not the source's, permuted; else None."""
        (layer, which, kind), (g, name, rows) = items[i]
        q = rows_of.get((layer, "q", kind)) or rows_of.get((layer, "q", "weight"))
        heads = n_head if which == "q" else n_kv
        if heads is None and n_head is not None and q is not None and q[2] % n_head == 0 \
                and (rows * n_head) % q[2] == 0:
            heads = rows * n_head // q[2]  # k rows over the head size the q shape gives
        if heads is None or rows % (2 * heads):
            return name, ("q/k rows not proven: the source's head counts and q shape do not give the heads "
                          f"of {rows} rows")
        sname = g[: -len(".weight")] + ".scale" if g.endswith(".weight") else None
        multiplier = by_name.get(sname) if sname else None
        scale = stored_values(multiplier).reshape(-1)[0] if multiplier is not None else None
        bad, differ = 0, False
        for r0, want in _head_blocks(src, name, rows, rows // heads):
            want = _llamacpp_permute(want, want.shape[0] // (rows // heads))
            got = (stored_values(stored[g], r0, r0 + want.shape[0]) if want.ndim > 1 else
                   stored_values(stored[g])).reshape(want.shape)
            if scale is not None:  # NVFP4's global scale: ggml_mul after the block decode (another rounding
                # order than qckpt's effective scale): values agree to float32 rounding, rows either match or not
                got = got * scale
                same = np.allclose(got, want, rtol=1e-6, atol=0, equal_nan=True)
            else:
                same = np.array_equal(got, want, equal_nan=True)
            if not same:
                differ = True
                n = want.shape[0]  # (rows; a 1-D bias: its values, one per row)
                bad += int(np.count_nonzero(np.any(got.reshape(n, -1) != want.reshape(n, -1), axis=1)))
        if differ:
            return name, (f"stored rows of {g} are not llama.cpp's permute of the source with {heads} heads "
                          f"({bad} of {rows} rows differ)")
        return None

    # one tensor per task, in the worker processes of the options in force (the source, a requantizing view,
    # makes each tensor again: the costly part)
    found: list = [None] * len(items)
    total = sum(stored[g].nbytes for _, (g, _, _) in items)
    run_tasks(len(items), check, workers=auto_workers(total, len(items)),
              on_result=lambda i, r: found.__setitem__(i, r))
    return dict(r for r in found if r is not None)


#: Elements of source values compared at a time (whole heads; at least one head).
BLOCK_ELEMENTS = 1 << 21


def _head_blocks(src: Checkpoint, name: str, rows: int, head_rows: int):
    """``(r0, float32 values of rows r0:r0 + k * head_rows)`` of ``src[name]`` in row order, whole heads at a
    time, never the whole matrix: from the checkpoint's row blocks when it makes the tensor so (a requantized
    view), else its rows dequantized block by block (:class:`converter.rows.Rows`); a 1-D tensor whole."""
    blocks = src.row_blocks(name, values_only=True) if hasattr(src, "row_blocks") else None
    if blocks is not None:
        chunks = (b.dequantize() for _, b in blocks)
    else:
        t = src[name]
        if len(t.shape) != 2 or not row_splittable(t):
            yield 0, _values(t)
            return
        vals = Rows(t.data if not isinstance(t, QuantizedTensor) else t)
        step = max(head_rows, BLOCK_ELEMENTS // max(1, t.shape[1]) // head_rows * head_rows)
        chunks = (vals[r0:r0 + step] for r0 in range(0, rows, step))
    r0, pending = 0, None
    for chunk in chunks:
        buf = chunk if pending is None else np.concatenate([pending, chunk])
        k = buf.shape[0] // head_rows * head_rows
        if k:
            yield r0, buf[:k]
            r0 += k
        pending = buf[k:]
    if pending is not None and pending.shape[0]:
        yield r0, pending
