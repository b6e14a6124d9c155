"""Run a conversion on a Ray or Dask cluster: one output shard per task, committed atomically.

- :mod:`~converter.distributed.executor`: the small executor interface (``ray`` / ``dask``, optional extras).
- :mod:`~converter.distributed.job`: the coordinator (:func:`run_command`): plan, stage, dispatch, prove, commit.
- :mod:`~converter.distributed.task`: what a worker node runs (one shard; its read-back).
- :mod:`~converter.distributed.staging`: the leased staging directory beside the destination.

The local process pool (:mod:`converter.write.engine`) stays the default engine. The object-store
design (later) is in the README's "Distributed conversion" section.
"""
