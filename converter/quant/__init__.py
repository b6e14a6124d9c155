"""Typed operations on :class:`~converter.tensor.QuantizedTensor`: quantize, carry, requantize, error report.

Results come back as dataclasses (:mod:`~converter.quant.result`), never dicts with private keys.
"""
