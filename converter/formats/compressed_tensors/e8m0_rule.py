"""Which E8M0 encoding a compressed-tensors ``mxfp4-pack-quantized`` checkpoint uses: by version, checked by data.

compressed-tensors changed what the ``weight_scale`` byte of MXFP4 means (its git history,
github.com/vllm-project/compressed-tensors):

- **legacy** (release 0.13.0; PR #502 / #509, ``compressors/quantized_compressors/fp4_quantized.py``
  ``MXFP4PackedCompressor.compress_scale``): ``byte = 127 + floor(log2 s) - 2`` where ``s`` is the
  float scale the weights were quantized with (itself ``2^(floor(log2 pow2(amax)) - 2)``,
  ``mxfp4_utils.generate_mxfp4_scales``). The true multiplier is ``2^(byte + 2 - 127)``; read with
  bias 127 every weight comes out 4 times too small. 0.13.0 could not decompress MXFP4 at all
  (``decompress_weight`` raises ``NotImplementedError``).
- **standard** (0.14.0 and later; PR #538 "Use standard E8M0 scale format for MXFP4", commit
  a333c877, 2026-01-09; 0.15+ ``compressors/mx_utils.py`` ``compress_mx_scale`` /
  ``decompress_mx_scale``): ``byte = 127 + floor(log2 s)``, ``s = 2^(byte - 127)`` (OCP E8M0).
  ``MXFP4PackedCompressor.decompress`` raises ``NotImplementedError`` up to 0.15.x and exists from
  0.16.0 (PR #683); the real sample (0.19.0) was decoded with it.

Pre-releases of 0.13.1 (nightly ``0.13.1a<date>``: two commits separate 0.13.0 from #538) and versions
before 0.13 (no ``mxfp4-pack-quantized`` release) say nothing reliable; a missing version neither.

The codes are the same under both encodings (only the scale exponent moves by 2), so the data check
compares the magnitude of the decoded weights with sibling tensors stored dense (embeddings, an
unquantized head or Linear): the encoding whose decoded RMS lies within a factor 2 of the siblings'
wins. It decides when the version is missing or ambiguous, and overrides a version it contradicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from converter.codebooks import E2M1_VALUES
from converter.formats.source import Source

STANDARD = "standard"
LEGACY = "legacy"
#: First release with the standard encoding (PR #538).
STANDARD_SINCE = (0, 14)
#: The release whose MXFP4 compressor stored ``127 + floor(log2 s) - 2``.
LEGACY_RELEASE = (0, 13, 0)
#: The legacy encoding's exponent offset (bytes are this much below the standard ones).
LEGACY_OFFSET = 2
#: Rows sampled per tensor by the data check, and tensors sampled per side.
SAMPLE_ROWS = 128
SAMPLE_TENSORS = 16
#: The winner's decoded RMS must lie within this log2 distance of the siblings' (a factor 2).
MAX_LOG2_DISTANCE = 1.0
#: The data overrule a *declared* version only when the declared rule puts the decoded RMS at least this
#: far (log2: a factor 4) from the siblings'. Real layers spread widely (SmolLM2 layer 0: v_proj RMS
#: 0.045, k_proj 0.41, embedding 0.118), so a weaker contradiction is left to the version: the data
#: check once decoded a correct 0.19.0 file holding only v_proj 4x too large.
STRONG_CONTRADICTION_LOG2 = 2.0
_DENSE_FLOATS = ("F16", "BF16", "F32")


def rule_for_version(version: tuple[int, ...] | None) -> str | None:
    """``standard`` (>= 0.14), ``legacy`` (0.13.0 exactly) or None (missing, < 0.13, 0.13.x pre-releases)."""
    if version is None:
        return None
    if version[:2] >= STANDARD_SINCE:
        return STANDARD
    if tuple(version[:3]) in (LEGACY_RELEASE, LEGACY_RELEASE[:2]):
        return LEGACY
    return None


def _rms(a: np.ndarray) -> float | None:
    a = a[np.isfinite(a)]
    return float(np.sqrt(np.mean(np.square(a, dtype=np.float64)))) if a.size else None


def mx_rms_standard(src: Source, prefix: str, group: int) -> float | None:
    """RMS of the first rows of MXFP4 module ``prefix`` decoded with the standard bias (``2^(byte - 127)``)."""
    packed = np.asarray(src.read(prefix + ".weight_packed"))[:SAMPLE_ROWS]
    raw = np.asarray(src.read(prefix + ".weight_scale"))[:SAMPLE_ROWS].view(np.uint8)
    codes = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(packed.shape[0], -1)
    scale = np.where(raw == 255, np.nan, np.exp2(raw.astype(np.float64) - 127))
    values = np.asarray(E2M1_VALUES, dtype=np.float64)[codes] * np.repeat(scale, group, axis=1)[:, :codes.shape[1]]
    return _rms(values)


def sibling_names(src: Source, owned: set[str]) -> list[str]:
    """Dense 2-D float ``*.weight`` tensors (embeddings, unquantized Linear / head): the magnitude reference."""
    out = []
    for n in src.tensor_names():
        if n in owned or not n.endswith(".weight"):
            continue
        info = src.info(n)
        if info.dtype in _DENSE_FLOATS and len(info.shape) == 2 and min(info.shape) > 1:
            out.append(n)
    return out[:SAMPLE_TENSORS]


@dataclass(frozen=True)
class RuleDecision:
    """The encoding used (``rule``), what decided it (``by``: version / data / default) and the evidence."""

    rule: str
    by: str
    version_rule: str | None
    data_rule: str | None
    evidence: str

    @property
    def offset(self) -> int:
        """Exponent steps added to a stored byte to get the true E8M0 byte (2 for legacy, else 0)."""
        return LEGACY_OFFSET if self.rule == LEGACY else 0

    def note(self) -> str:
        rule = ("legacy: byte = 127 + log2(s) - 2 (compressed-tensors 0.13.0), s = 2^(byte + 2 - 127)"
                if self.rule == LEGACY else "standard: s = 2^(byte - 127) (compressed-tensors >= 0.14.0)")
        return f"MXFP4 E8M0 rule {rule}; decided by {self.by} ({self.evidence})"


def data_rule(src: Source, mx_prefixes: list[str], owned: set[str],
              group: int = 32) -> tuple[str | None, str, dict[str, float]]:
    """The encoding the data support (None when no dense sibling exists or the magnitudes are ambiguous),
    the evidence text, and the log2 distance of each rule's decoded RMS from the siblings' (``{}`` when
    nothing was measured)."""
    sib = [r for r in (_rms(np.asarray(src.read(n))[:SAMPLE_ROWS].astype(np.float64))
                       for n in sibling_names(src, owned)) if r]
    if not sib:
        return None, "no dense 2-D sibling weight to compare magnitudes with", {}
    mx = [r for r in (mx_rms_standard(src, p, group) for p in mx_prefixes[:SAMPLE_TENSORS]) if r]
    if not mx:
        return None, "no finite MXFP4 value to measure", {}
    ref, got = float(np.median(sib)), float(np.median(mx))
    factor = 2.0 ** LEGACY_OFFSET  # legacy bytes decode 4x larger than standard ones
    d_std, d_leg = abs(np.log2(got / ref)), abs(np.log2(factor * got / ref))
    text = (f"median RMS of {len(mx)} MXFP4 tensor(s) {got:.4g} (standard) / {4 * got:.4g} (legacy) vs "
            f"{ref:.4g} of {len(sib)} dense sibling(s)")
    best, dist = (STANDARD, d_std) if d_std <= d_leg else (LEGACY, d_leg)
    return ((best if dist < MAX_LOG2_DISTANCE else None), text + f" (log2 distance {d_std:.2f} / {d_leg:.2f})",
            {STANDARD: float(d_std), LEGACY: float(d_leg)})


def decide(src: Source, version_text: str | None, version: tuple[int, ...] | None, mx_prefixes: list[str],
           owned: set[str]) -> RuleDecision:
    """The E8M0 encoding of the MXFP4 modules ``mx_prefixes``: the data check wins when it has an answer
    the version lacks, or contradicts the version strongly (:data:`STRONG_CONTRADICTION_LOG2`); else the
    version; else the standard encoding (stated)."""
    by_version = rule_for_version(version)
    by_data, evidence, distance = data_rule(src, mx_prefixes, owned) if mx_prefixes else (None, "no MXFP4 module", {})
    vtext = f"quantization_config.version {version_text!r}"
    if by_data is not None and by_version is not None and by_data != by_version:
        if distance.get(by_version, 0.0) < STRONG_CONTRADICTION_LOG2:  # weak: the declaration stands
            return RuleDecision(by_version, "version", by_version, None,
                                f"{vtext}; the data lean to {by_data} but too weakly to overrule it: {evidence}")
    if by_data is not None and by_data != by_version:
        why = "missing or ambiguous" if by_version is None else f"says {by_version}, contradicted by the data"
        return RuleDecision(by_data, "data check", by_version, by_data, f"{vtext} {why}; {evidence}")
    if by_version is not None:
        agree = f"; data check agrees: {evidence}" if by_data is not None else f"; data check: {evidence}"
        return RuleDecision(by_version, "version", by_version, by_data, vtext + agree)
    return RuleDecision(STANDARD, "default", None, None,
                        f"{vtext} says nothing and the data cannot tell ({evidence}): assumed the current encoding")
