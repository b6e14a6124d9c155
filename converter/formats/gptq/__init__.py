"""GPTQ (AutoGPTQ, GPTQModel, ``gptq`` v1 and ``gptq_v2``): storage layout, config, reader, writer.

The handler is registered in :mod:`~converter.formats.gptq.format`.
"""
