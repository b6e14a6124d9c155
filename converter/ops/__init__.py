"""The commands as library calls: inspect, audit, quantize_model, convert, requantize_model.

Each builds its command's report document (a dict conforming to ``schemas/``) with the helpers
:mod:`~converter.ops.compare` (the read-back proof) and :mod:`~converter.ops.module_policy`;
rendering is :mod:`converter.report`'s.
"""
