"""Findings: what the validator reports, and the one table of finding codes.

A finding is data, not an exception (DESIGN.md section 3): ``Finding(code, severity, tensor,
message, evidence)``. Exceptions are kept for inputs that cannot be read at all (exit status 3).
The table :data:`CODES` is the single place where codes are defined; ``qckpt validate --help``
and the README list it from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

SEVERITIES = ("error", "warning", "info")

#: code -> (default severity, group, one-line description). The only table of finding codes.
CODES: dict[str, tuple[str, str, str]] = {
    # files and shards
    "missing-shard": ("error", "files", "a shard named by model.safetensors.index.json is absent (B34)"),
    "extra-shard": ("warning", "files", "a shard-like .safetensors file on disk is not named by the index"),
    "stale-index": ("error", "files", "index and shards disagree: tensor absent, in another shard, unlisted, "
                                      "or total_size wrong"),
    "shard-corrupt": ("error", "files", "a shard of a model directory is not valid safetensors (truncated, bad "
                                        "header or offsets)"),
    "duplicate-tensor": ("error", "files", "a tensor is stored in two shards: which copy a loader takes depends on "
                                           "the loader (qckpt reads the one the index names)"),
    "checksum-mismatch": ("error", "files", "validate --checksums: a file's hash differs from its Hugging Face cache "
                                            "blob name, SHA256SUMS entry or LFS pointer (corrupt or truncated)"),
    "checksum-unverified": ("warning", "files", "validate --checksums: data files nothing vouches for (no cache blob "
                                                "name, SHA256SUMS entry or LFS pointer): hashed, not verified"),
    "lfs-pointer": ("error", "files", "a data file is a git-LFS pointer stub, not the weights (B36)"),
    # structure (headers, config, reader checks)
    "missing-tensor": ("error", "structure", "a partner array the format needs is absent (scales, zeros, g_idx)"),
    "shape": ("error", "structure", "stored shapes inconsistent with each other or with bits / group size"),
    "dtype": ("error", "structure", "a stored dtype the format does not use for that array"),
    "config-mismatch": ("error", "structure", "config contradicts the tensors (bits, group size, sym, actorder, "
                                              "format version, B12/B27)"),
    "config-missing": ("warning", "structure", "no quantization config (config.json quantization_config or "
                                               "quantize_config.json): the loaders that find the format by it will "
                                               "not load the checkpoint as quantized"),
    "shape-config": ("warning", "structure", "a quantized weight dimension is not a width named by config.json"),
    "format": ("error", "structure", "another layout rule of the format is broken"),
    "padding": ("error", "structure", "padding bits or padded fields are not zero"),
    "g-idx": ("error", "structure", "g_idx is not a valid group map, or contradicts the declared act-order"),
    "code-range": ("error", "structure", "codes outside the scheme's range"),
    "zero-range": ("error", "structure", "zero points outside the code range, or non-finite biases"),
    "scale-nonfinite": ("error", "scales", "a scale is NaN or infinite"),
    "scale-zero": ("error", "scales", "more than half of a tensor's scales are zero (misread scales); info for a "
                   "few (an all-zero group, a K-quant sub-block scale quantized to 0)"),
    "scale-negative": ("info", "scales", "negative scales in a format whose own quantizers write positive ones; "
                       "s*(q-z) decodes either sign (exact repacks of GGUF / MLX keep theirs): --reference rules "
                       "out negated weights"),
    "scale-subnormal": ("warning", "scales", "a scale is subnormal in its dtype (precision loss, kernel "
                                             "underflow)"),
    "scale-direction": ("error", "scales", "float-element weights decode orders of magnitude off the 1/sqrt(in) size "
                        "(or their layer's siblings) and the reciprocal scales fit: a divisor (*_scale_inv, global "
                        "scale) read as a multiplier, or the reverse"),
    "global-scale-direction": ("error", "scales", "FP4 global scale read in the wrong direction (multiplier vs "
                               "divisor): effective group scales beyond E4M3's 448 and weights g^2 off their "
                               "1/sqrt(in) size or siblings, while the other direction fits both"),
    "e8m0-bias": ("error", "scales", "MXFP4 E8M0 exponents follow another encoding than the file declares "
                  "(compressed-tensors 0.13.0 legacy 127 + log2 s - 2 vs standard): every weight 4 times off under "
                  "the declared rule; info when nothing decides it"),
    "degenerate": ("error", "structure", "every weight of the tensor decodes to the same value (B17)"),
    "group-tail": ("info", "groups", "partial final group: logical vs padded width and the legal group sizes "
                                     "(B13/B14/B15)"),
    "block-tail": ("info", "groups", "partial edge blocks of a 2-D block grid (legal: ceil(n / block) scales, the "
                                     "last covering the remainder); whole-block consumers need padding"),
    "group-size": ("info", "groups", "a group size outside the 16-256 powers of two that common kernels accept; "
                                     "the exact re-blocking (B38)"),
    "group-skip": ("info", "groups", "a Linear weight left unquantized whose width the model's group size does "
                                     "not divide (B15)"),
    "opaque": ("info", "structure", "a tensor stored in a type neither qckpt nor gguf-py decodes (GGUF Q8_1, "
                                    "Q8_K): not checked, and no writer accepts it"),
    "activation-scale": ("info", "structure", "static activation (input) scales stored beside weights: runtime "
                                              "metadata, never applied to the weights"),
    "tied-embeddings": ("error", "structure", "tie_word_embeddings contradicts the tensor set, or a kept head "
                                              "differs from the embedding (B32/B33)"),
    # data-driven, no reference
    "axis-swap": ("error", "data", "code saturation fits another grouping axis (or sequential groups) much "
                                   "better than the declared one"),
    "zero-convention": ("error", "data", "stored zero points follow the other GPTQ convention (v1 z-1 vs v2 z) "
                                         "than the config claims (B01)"),
    "zero-offset": ("error", "data", "codes sit about one step off the declared zero point on average"),
    "value-nonfinite": ("error", "data", "a dense (float) tensor holds NaN or infinite values (a bias, norm or "
                                         "embedding every converter passes through)"),
    "nibble-order": ("error", "data", "a tensor's per-index magnitude profile matches its siblings' only under "
                                      "another in-word nibble order (B09)"),
    "code-nonfinite": ("error", "data", "float-element codes that decode to NaN or infinity (E4M3 0x7F / 0xFF, E5M2 "
                                        "0x7C-0x7F / 0xFC-0xFF), named by element and block index"),
    "unsaturated": ("info", "data", "float-element blocks / channels whose largest |code| stays below the "
                                    "element's max (448 for E4M3) an absmax quantizer reaches; warning when most "
                                    "non-zero ones do"),
    # with --reference
    "reference-mismatch": ("error", "reference", "dequantized weights or dequant(W) @ x differ from the reference "
                                                 "beyond the scheme's error"),
    "layout-mismatch": ("error", "reference", "another interpretation of the stored arrays (transposed, other "
                                              "axis, nibble order, zero offset) matches the reference better"),
    "reference-missing": ("warning", "reference", "a quantized tensor has no same-shaped tensor in the reference"),
}


def codes_help() -> str:
    """The finding-code table as click epilog text (``\\b`` keeps click from rewrapping it)."""
    lines = ["\b", "Finding codes (severity):"]
    for code, (sev, _, text) in CODES.items():
        lines.append(f"  {code:<19}{sev:<9}{text}")
    return "\n".join(lines)


def codes_markdown() -> str:
    """The finding-code table as Markdown (README)."""
    rows = ["| code | severity | group | meaning |", "|---|---|---|---|"]
    rows += [f"| `{c}` | {s} | {g} | {t} |" for c, (s, g, t) in CODES.items()]
    return "\n".join(rows)


def jsonable(obj: Any) -> Any:
    """Evidence -> JSON-safe values (numpy scalars/arrays to Python; NaN/inf as strings)."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        if math.isnan(obj):
            return "nan"
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        return obj
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


@dataclass(frozen=True)
class Finding:
    """One problem found in a checkpoint.

    Parameters
    ----------
    code : str
        A key of :data:`CODES`.
    severity : {"error", "warning", "info"}
    tensor : str or None
        Logical tensor name (or stored array / file for file-level findings).
    message : str
        One sentence.
    evidence : dict
        The numbers behind the finding (JSON-safe after :func:`jsonable`).
    """

    code: str
    severity: str
    tensor: str | None
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"unknown finding code {self.code!r}; known: {sorted(CODES)}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")
        object.__setattr__(self, "evidence", jsonable(dict(self.evidence)))

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "severity": self.severity, "tensor": self.tensor, "message": self.message,
                "evidence": dict(self.evidence)}


def finding(code: str, tensor: str | None, message: str, severity: str | None = None, **evidence: Any) -> Finding:
    """A :class:`Finding` with the code's default severity unless ``severity`` is given."""
    return Finding(code, severity or CODES[code][0], tensor, message, evidence)
