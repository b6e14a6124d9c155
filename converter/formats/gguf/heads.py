"""Attention head counts of a GGUF model and the LLaMA q/k row permutation they decide (reader and writer).

llama.cpp's ``convert_hf_to_gguf.py`` ``LlamaModel.modify_tensors`` row-permutes ``q_proj`` with
``num_attention_heads`` and ``k_proj`` with ``num_key_value_heads`` (``LlamaModel.permute``:
:func:`~converter.formats.gguf.names.llama_row_permutation`); llama.cpp then reads
``{arch}.attention.head_count`` / ``head_count_kv`` and requires ``attn_k`` to have
``head_count_kv * n_embd_head_k`` rows (``llama-model.cpp``: ``n_embd_k_gqa``; the head size
``n_embd_head_k`` is ``{arch}.attention.key_length``, else ``embedding_length / head_count``).

Rule here (one function, :func:`qk_permutation`, used by the reader to undo and by the writer to apply):
q uses ``head_count``; k uses ``head_count_kv`` when recorded, else the number of heads its row count
holds (``rows / head size``), refused when that is not a whole number (never ``head_count``: for a
grouped-query k that un-permutes half the rows into the wrong place).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from converter.errors import FormatError
from converter.formats.gguf.names import llama_row_permutation, permute_heads_key

__all__ = ["head_size", "kv_head_count", "qk_heads", "qk_permutation", "with_head_count_kv"]


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        return None
    return int(v)


def head_size(kv: Mapping[str, Any], config: Mapping[str, Any], arch: str) -> int | None:
    """Elements per attention head (``n_embd_head_k``): ``{arch}.attention.key_length`` (config
    ``head_dim``), else ``embedding_length / head_count`` (``hidden_size / num_attention_heads``)
    when that divides; None when unknown."""
    a = f"{arch}.attention."
    size = _int(kv.get(a + "key_length", config.get("head_dim")))
    if size:
        return size
    n_embd = _int(kv.get(f"{arch}.embedding_length", config.get("hidden_size")))
    n_head = _int(kv.get(a + "head_count", config.get("num_attention_heads")))
    if n_embd and n_head and n_embd % n_head == 0:
        return n_embd // n_head
    return None


def kv_head_count(kv: Mapping[str, Any], config: Mapping[str, Any], arch: str, k_rows: int, *,
                  file: Any = None, tensor: str | None = None) -> int:
    """``head_count_kv``: recorded (GGUF key, else config ``num_key_value_heads``) or derived from the
    k projection's ``k_rows`` (``out``) and the head size.

    Raises
    ------
    FormatError
        Not recorded and the head size is unknown, or ``k_rows`` is not a whole number of heads.
    """
    field = f"{arch}.attention.head_count_kv"
    recorded = kv.get(field, config.get("num_key_value_heads"))
    if recorded is not None:
        n = _int(recorded)
        if n is None:  # per-layer arrays: not handled
            raise FormatError("per-layer head counts are not supported", file=file, tensor=tensor, field=field,
                              expected="one integer", found=recorded)
        return n
    size = head_size(kv, config, arch)
    if size is None:
        raise FormatError("head_count_kv is absent and the head size is unknown: the k rows cannot be grouped "
                          "into heads", file=file, tensor=tensor, field=field, expected="an integer head count",
                          found=None, hint=f"record {field} (or {arch}.attention.key_length / embedding_length)")
    if k_rows <= 0 or k_rows % size:
        raise FormatError("head_count_kv is absent and the k rows are not a whole number of heads", file=file,
                          tensor=tensor, field=field, expected=f"rows a multiple of the head size {size}",
                          found=k_rows)
    return k_rows // size


def qk_heads(gguf_name: str, rows: int, arch: str | None, kv: Mapping[str, Any], config: Mapping[str, Any], *,
             file: Any = None, tensor: str | None = None) -> int | None:
    """The head count that permutes LLaMA q/k tensor ``gguf_name`` of ``rows`` rows; None if not permuted.

    Raises
    ------
    FormatError
        Head count unknown (q) or not derivable (k, :func:`kv_head_count`); ``rows`` not a whole number
        of (2 x head_dim/2) pairs per head (:func:`~converter.formats.gguf.names.llama_row_permutation`).
    """
    which = permute_heads_key(gguf_name, arch)
    if which is None:
        return None
    field = f"{arch}.attention.head_count" + ("_kv" if which == "k" else "")
    if which == "q":
        heads = _int(kv.get(f"{arch}.attention.head_count", config.get("num_attention_heads")))
        if heads is None:
            raise FormatError("LLaMA q/k rows are permuted in GGUF but the head count is unknown", file=file,
                              tensor=tensor, field=field, expected="an integer head count",
                              found=kv.get(field, config.get("num_attention_heads")))
    else:
        heads = kv_head_count(kv, config, arch, rows, file=file, tensor=tensor)
    return heads


def qk_permutation(gguf_name: str, rows: int, arch: str | None, kv: Mapping[str, Any],
                   config: Mapping[str, Any], *, file: Any = None, tensor: str | None = None) -> np.ndarray | None:
    """``gguf_rows = logical_rows[perm]`` for a LLaMA q/k tensor (:func:`qk_heads` heads); None if not permuted."""
    heads = qk_heads(gguf_name, rows, arch, kv, config, file=file, tensor=tensor)
    return None if heads is None else llama_row_permutation(rows, heads, tensor=tensor)


_K_WEIGHT = re.compile(r"^blk\.(\d+)\.attn_k\.weight$")


def with_head_count_kv(kv: Mapping[str, Any], config: Mapping[str, Any], arch: str,
                       shapes: Mapping[str, tuple[int, ...]], *, keep_default: bool = False) -> dict[str, Any]:
    """``kv`` with ``{arch}.attention.head_count_kv`` recorded (right after ``head_count``) when it has
    ``head_count`` but no ``head_count_kv``: the writer's count, from config ``num_key_value_heads``
    or derived from the first ``blk.N.attn_k.weight`` of ``shapes`` (GGUF name -> logical shape,
    ``out`` first) as :func:`kv_head_count` does. llama.cpp defaults an absent count to
    ``head_count``, which is wrong for a grouped-query k projection. ``keep_default`` (a GGUF source
    copied as it is): add the key only when the count differs from ``head_count``, so a file without it
    that llama.cpp reads correctly is written byte for byte.

    Raises
    ------
    FormatError
        From :func:`kv_head_count` (k rows not a whole number of heads).
    """
    a = f"{arch}.attention."
    if _int(kv.get(a + "head_count")) is None or a + "head_count_kv" in kv:  # absent, or per-layer counts
        return dict(kv)
    k = sorted(((int(m.group(1)), n) for n in shapes if (m := _K_WEIGHT.match(n))), key=lambda x: x[0])
    if not k and config.get("num_key_value_heads") is None:
        return dict(kv)
    name = k[0][1] if k else None
    n = kv_head_count(kv, config, arch, shapes[name][0] if name else 0, tensor=name)
    if keep_default and n == kv.get(a + "head_count"):
        return dict(kv)
    out: dict[str, Any] = {}
    for key, value in kv.items():
        out[key] = value
        if key == a + "head_count":
            out[a + "head_count_kv"] = n
    return out
