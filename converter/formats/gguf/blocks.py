"""GGUF / ggml block codecs in pure numpy, exposing codes and scales, not only floats.

Every codec works on whole tensors viewed as ``(rows, n_blocks, type_size)`` bytes, where a row is one
GGUF row of ``ne[0]`` elements (blocks never cross rows). There are no Python loops over elements or
blocks; bit shifts are broadcasts. ``encode`` walks the rows in chunks of about 64K
elements (a loop over row chunks, as gguf-py does) so temporaries stay in cache; results do not depend on
the chunking.

Layouts follow ``ggml/src/ggml-common.h`` (``block_q4_0``, ``block_q4_1``, ``block_q5_0``,
``block_q5_1``, ``block_q8_0``, ``block_q2_K``, ``block_q3_K``, ``block_q4_K``, ``block_q5_K``,
``block_q6_K``; ``block_mxfp4`` / ``block_nvfp4`` in :mod:`.block_fp4`); arithmetic follows
``ggml/src/ggml-quants.c`` (``quantize_row_q*_ref``, ``dequantize_row_q*``) and gguf-py
``gguf/quants.py`` (v0.19.0), with the same float32 operation order so results are bit-identical with
``gguf.quants.quantize``; ``decode`` exposes the fields, and the product's decode
(``tensor_from_fields(...).dequantize()``, what a read does) is bit-identical with
``gguf.quants.dequantize`` (MXFP4 / NVFP4: value-identical, ggml decodes E2M1 code 0x8 as +0.0).

Codes are exposed **unsigned with an implicit offset** (``Codec.code_offset``): the stored value
``q`` and the signed value ``q - code_offset``. Q8_0 is the exception: its codes are stored signed
(``int8``) and exposed as ``int8`` with offset 0.

Public API
----------
``codec_for(type_name)``, ``CODECS``, ``SUPPORTED_READ``, ``SUPPORTED_WRITE``, ``BlockFields``,
``LegacyCodec``, ``KQuantCodec``.
"""

from __future__ import annotations

from converter.errors import UnsupportedError
from converter.formats.gguf.block_fields import BlockFields, QK_K
from converter.formats.gguf.block_fp4 import FP4_CODECS, FP4Codec
from converter.formats.gguf.block_kquants import KQuantCodec
from converter.formats.gguf.block_legacy import LegacyCodec


__all__ = [
    "BlockFields", "LegacyCodec", "KQuantCodec", "FP4Codec", "CODECS", "SUPPORTED_READ", "SUPPORTED_WRITE",
    "codec_for", "QK_K",
]

# --------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------

def _build_registry() -> dict[str, LegacyCodec | KQuantCodec | FP4Codec]:
    legacy = [LegacyCodec("Q4_0", 4, False), LegacyCodec("Q4_1", 4, True), LegacyCodec("Q5_0", 5, False),
              LegacyCodec("Q5_1", 5, True), LegacyCodec("Q8_0", 8, False)]
    kquants = [KQuantCodec("Q2_K", 2, 84, 16, 0, True), KQuantCodec("Q3_K", 3, 110, 16, 4, False),
               KQuantCodec("Q4_K", 4, 144, 32, 0, True), KQuantCodec("Q5_K", 5, 176, 32, 0, True),
               KQuantCodec("Q6_K", 6, 210, 16, 32, False)]
    return {c.name: c for c in (*legacy, *kquants, *FP4_CODECS.values())}


CODECS: dict[str, LegacyCodec | KQuantCodec | FP4Codec] = _build_registry()
"""Every codec, keyed by GGML type name."""

SUPPORTED_READ: tuple[str, ...] = tuple(CODECS)
"""Type names :meth:`decode` handles."""

SUPPORTED_WRITE: tuple[str, ...] = tuple(n for n, c in CODECS.items() if isinstance(c, LegacyCodec))
"""Type names :meth:`encode` / :meth:`pack` handle."""


def codec_for(type_name: str) -> LegacyCodec | KQuantCodec | FP4Codec:
    """Return the codec for a GGML type name (``"Q4_0"``, ``"Q6_K"`` ...).

    Raises
    ------
    UnsupportedError
        If the name is not a supported block type; the message lists the supported ones.
    """
    try:
        return CODECS[type_name]
    except (KeyError, TypeError):
        raise UnsupportedError("GGML block type not supported", field="ggml_type",
                               expected=f"one of {', '.join(SUPPORTED_READ)}", found=type_name) from None
