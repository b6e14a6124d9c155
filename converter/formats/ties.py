"""Tied input/output embeddings (CASES.md B32, B33).

When ``config.json`` says ``tie_word_embeddings: true`` the model's output head *is* the input
embedding, so loaders either ignore a stored ``lm_head.weight`` (transformers re-ties it) or refuse
it as an unexpected parameter (mlx-lm, B33). A checkpoint may nevertheless carry one:

- identical to the embedding: storing it again is redundant (B33: an untied 4-bit head of
  Qwen1.5-0.5B costs ~87.5 MB); writers store one copy (the head is dropped, with a note);
- different (a LoRA-targeted or separately quantized head, B32 / llama.cpp #9065): it is the real
  head and must never be dropped. Writers keep it and write ``tie_word_embeddings: false`` so that
  loaders do not silently replace it with the embedding; the note gives the largest difference.

"Identical" means the same logical values bit for bit: same codes, scales and zero points for two
quantized tensors, same bytes for two dense ones, otherwise equal float32 dequantizations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from converter.formats.modules import token_embedding_name
from converter.tensor import Checkpoint, QuantizedTensor

HEAD = "lm_head.weight"


@dataclass(frozen=True)
class TieCheck:
    """Outcome of comparing a stored head with the embedding under ``tie_word_embeddings: true``.

    Attributes
    ----------
    head, embedding : str
        Tensor names.
    identical : bool
    max_abs_diff : float or None
        Largest ``|head - embedding|`` of the float32 values (None when the shapes differ).
    note : str
        One line for reports.
    """

    head: str
    embedding: str
    identical: bool
    max_abs_diff: float | None
    note: str


def embedding_name(ckpt: Checkpoint) -> str | None:
    """The input token embedding's name in ``ckpt``
    (:func:`converter.formats.modules.token_embedding_name`), or None."""
    return token_embedding_name(ckpt.names())


def _same(a, b) -> tuple[bool, float | None]:
    if isinstance(a, QuantizedTensor) and isinstance(b, QuantizedTensor) and a.scheme == b.scheme \
            and a.group_map.describe() == b.group_map.describe() and a.codes.shape == b.codes.shape:
        zp_same = (a.zero_points is None and b.zero_points is None) or (
            a.zero_points is not None and b.zero_points is not None and np.array_equal(a.zero_points, b.zero_points))
        if np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales) and zp_same:
            return True, 0.0
    if not isinstance(a, QuantizedTensor) and not isinstance(b, QuantizedTensor) and a.data.dtype == b.data.dtype \
            and a.data.shape == b.data.shape and a.data.tobytes() == b.data.tobytes():
        return True, 0.0
    va = a.dequantize() if isinstance(a, QuantizedTensor) else np.asarray(a.data, dtype=np.float32)
    vb = b.dequantize() if isinstance(b, QuantizedTensor) else np.asarray(b.data, dtype=np.float32)
    if va.shape != vb.shape:
        return False, None
    diff = float(np.max(np.abs(va - vb))) if va.size else 0.0
    return bool(np.array_equal(va, vb)), diff


def check_tied_head(ckpt: Checkpoint, config: Mapping[str, Any] | None = None) -> TieCheck | None:
    """Compare ``lm_head.weight`` with the embedding when the config ties them, else None.

    Parameters
    ----------
    ckpt : Checkpoint
    config : mapping, optional
        The config to judge by (default ``ckpt.config``); only an explicit
        ``tie_word_embeddings: true`` counts.

    Reads the two tensors (one at a time is not possible here: both are needed).
    """
    cfg = ckpt.config if config is None else config
    if not cfg or cfg.get("tie_word_embeddings") is not True or HEAD not in ckpt:
        return None
    emb = embedding_name(ckpt)
    if emb is None:
        return None
    same, diff = _same(ckpt[HEAD], ckpt[emb])
    if same:
        note = f"{HEAD} is identical to {emb} and tie_word_embeddings is true: stored once (CASES.md B33)"
    else:
        found = "a different shape" if diff is None else f"max |diff| {diff:.6g}"
        note = (f"{HEAD} differs from {emb} ({found}) although tie_word_embeddings is true: kept as an untied "
                f"head and tie_word_embeddings written as false (CASES.md B32)")
    return TieCheck(HEAD, emb, same, diff, note)


def resolve_tied_head(ckpt: Checkpoint, config: Mapping[str, Any] | None, planned: set[str] | list[str]):
    """Apply the tie rule for a writer: what to drop, the config to write, and the report entry.

    Parameters
    ----------
    ckpt : Checkpoint being written.
    config : the config the writer will store (None when it stores none; ``ckpt.config`` is judged).
    planned : names of the tensors the writer plans to store.

    Returns
    -------
    (drop, config, summary)
        ``drop``: tensor names to leave out (the head, when identical to the embedding);
        ``config``: ``config`` with ``tie_word_embeddings: false`` when a different head is kept;
        ``summary``: dict for the writer's result (``tied_head``), or None when the rule did not apply.
    """
    tie = check_tied_head(ckpt, config if config is not None else ckpt.config) if HEAD in planned else None
    if tie is None:
        return set(), config, None
    drop: set[str] = set()
    if tie.identical:
        drop.add(tie.head)
    elif config is not None:
        config = {**config, "tie_word_embeddings": False}
    summary = {"head": tie.head, "embedding": tie.embedding, "identical": tie.identical,
               "max_abs_diff": tie.max_abs_diff, "note": tie.note}
    return drop, config, summary
