"""A Hugging Face model directory for a format's plans: the tied-head rule, then the write engine.

Tied embeddings (:mod:`converter.formats.ties`, CASES.md B32/B33): when the config says
``tie_word_embeddings: true`` and an ``lm_head.weight`` is planned, a head identical to the
embedding is stored once (its plan dropped); a different one is kept and the written config says
``tie_word_embeddings: false``. Either way the summary's ``tied_head`` says so. The files
themselves are written by :func:`converter.write.files.write_model_dir`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from converter.formats.ties import resolve_tied_head
from converter.write import files
from converter.write.plan import TensorPlan

__all__ = ["write_model_dir"]


def write_model_dir(dst: Path, plans: Sequence[TensorPlan], ckpt, *, metadata: Mapping[str, str] | None,
                    config: Mapping[str, Any] | None, extra_json: Mapping[str, Any] | None = None,
                    extra_files: Sequence[str | Path] = (), max_shard_bytes: int | None = None,
                    overwrite: bool = False) -> dict:
    """Apply the tied-head rule to ``plans`` and ``config``, then write the directory atomically.

    Returns
    -------
    dict
        :func:`converter.write.files.write_model_dir`'s summary; ``tied_head`` (head, embedding,
        identical, max_abs_diff, note) when the rule applied.
    """
    drop, config, tie = resolve_tied_head(ckpt, config, {p.source for p in plans})
    plans = [p for p in plans if p.source not in drop]
    return files.write_model_dir(dst, plans, ckpt, metadata=metadata, config=config, extra_json=extra_json,
                                 extra_files=extra_files, max_shard_bytes=max_shard_bytes, overwrite=overwrite,
                                 tied_head=tie)
