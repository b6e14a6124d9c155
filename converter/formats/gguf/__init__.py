"""GGUF (llama.cpp / ggml): bounded header walk, block codecs, reader, writer, requantize targets.

The handler is registered in :mod:`~converter.formats.gguf.format`; the block codecs
(:mod:`~converter.formats.gguf.blocks`) translate GGUF's blocks to and from logical codes and scales.
"""
