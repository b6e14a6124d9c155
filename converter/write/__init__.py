"""The write engine, below the formats: a format says *what* to write, this package writes it.

- :mod:`~converter.write.plan`: what to write (``TensorPlan``: output arrays known from specs,
  row splits, shards).
- :mod:`~converter.write.engine`: the task runner (inline, or forked worker processes), task
  results returned explicitly, worker errors with their type and traceback.
- :mod:`~converter.write.files`: outputs as tasks: one safetensors file, a model directory
  (shards with an index), a file of fixed offsets (GGUF).
- :mod:`~converter.write.safetensors`: the safetensors header plan and file writer.
- :mod:`~converter.write.atomic`: temporary sibling, renamed into place on success.
- :mod:`~converter.write.background`, :mod:`~converter.write.writeback`: ``pwrite`` on a
  background thread, early writeback; :mod:`~converter.write.progress`: the progress bar.

Nothing here imports :mod:`converter.formats` or :mod:`converter.quant`.
"""
