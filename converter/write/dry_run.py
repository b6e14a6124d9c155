"""``--dry-run``: a write planned to the last byte count, and nothing written.

With :func:`converter.runtime.run_options` ``dry_run=True`` every writer still builds its plans (names,
dtypes, shapes, shards, config) but stops where the bytes would go: :func:`converter.write.atomic.atomic_output`
and the model-directory / single-file writers raise :class:`DryRunPlanned` carrying what would have been
written, before anything is created. No tensor is encoded (the plans' encoders never run), so a dry run
costs header reads and planning only. The command layer (``ops/``) catches it and returns the plan.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DryRunPlanned"]


class DryRunPlanned(Exception):
    """Raised by a writer under ``dry_run``: ``outputs`` is what it would write.

    ``outputs``: ``{"files": [{"name": str, "bytes": int, "tensors": int}], "config": dict or None}``
    (``bytes``: tensor data plus the safetensors header / GGUF key-values where the writer knows them;
    ``config``: the ``config.json`` it would write, if any).
    """

    def __init__(self, outputs: dict[str, Any]) -> None:
        self.outputs = outputs
        super().__init__("dry run: nothing written")
