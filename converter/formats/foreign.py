"""Checkpoint formats qckpt recognises but does not read: refused by name, with what reads them.

A user who points qckpt at an EXL2 folder or an ONNX file should hear "this is EXL2, read it with
exllamav2", not "no registered format recognises this input" or a safetensors header error. This
module only *recognises*; it decodes nothing.

Signatures (each from the producing tool's own files; checked from the cheapest evidence up):

========================  ===================================================================
format                    recognised by
========================  ===================================================================
ONNX                      a ``.onnx`` file, or a directory whose only model files are ``.onnx``
                          (onnx ``ModelProto``; external data in ``*.onnx_data`` / ``*.data``)
Core ML                   a ``.mlmodel`` file or a ``.mlpackage`` directory (coremltools)
EXL2                      ``quantization_config.quant_method == "exl2"`` (exllamav2), or tensors
                          ``<module>.q_weight`` with ``.q_scale_max`` / ``.q_groups`` / ``.q_invperm``
EXL3                      ``quant_method == "exl3"`` (exllamav3), or ``<module>.trellis`` with
                          ``.suh`` / ``.svh``
AQLM                      ``quant_method == "aqlm"`` (transformers ``AqlmConfig``), or
                          ``<module>.codes`` with ``.codebooks``
HQQ                       ``quant_method == "hqq"`` (transformers ``HqqConfig``), or ``<module>.W_q``
torchao                   ``quant_method == "torchao"`` (transformers ``TorchAoConfig``), or
                          ``<module>._weight_qdata`` (torchao's safetensors flattening)
Marlin-packed GPTQ        ``checkpoint_format == "marlin"`` or ``is_marlin_format`` (AutoGPTQ /
                          GPTQModel), or tensors ``<module>.B`` with ``<module>.s``
Marlin-packed AWQ         AWQ ``version == "marlin"`` (AutoAWQ ``WQLinear_Marlin``)
========================  ===================================================================

Every refusal is an :class:`~converter.errors.UnsupportedError` (exit status 3) naming the file,
the field that gave the format away, and what reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from converter.errors import UnsupportedError

__all__ = ["ForeignFormat", "FOREIGN", "recognise_path", "recognise_config", "recognise_tensors",
           "refuse_path", "refuse_config", "refuse_tensors"]


@dataclass(frozen=True)
class ForeignFormat:
    """A format qckpt does not read.

    Attributes
    ----------
    name : str
        The format's usual name (``"EXL2"``).
    readers : str
        What reads it (libraries / runtimes), for the hint.
    why : str
        Why qckpt does not read it, in a few words.
    """

    name: str
    readers: str
    why: str


ONNX = ForeignFormat("ONNX", "onnx / onnxruntime (its QuantizeLinear / MatMulNBits initializers)",
                     "a protobuf graph, not a tensor file")
COREML = ForeignFormat("Core ML", "coremltools", "an Apple model package, not a tensor file")
EXL2 = ForeignFormat("EXL2", "exllamav2 (or TabbyAPI)", "a mixed-bitrate, row-permuted layout")
EXL3 = ForeignFormat("EXL3", "exllamav3 (or TabbyAPI)", "trellis (QTIP) codes under Hadamard rotations")
AQLM = ForeignFormat("AQLM", "the aqlm package (transformers AqlmConfig)", "additive codebook quantization")
HQQ = ForeignFormat("HQQ", "the hqq package (transformers HqqConfig)", "float zero points and its own packings")
TORCHAO = ForeignFormat("torchao", "torchao (transformers TorchAoConfig)", "tensor subclasses in device layouts")
MARLIN_GPTQ = ForeignFormat("Marlin-packed GPTQ", "GPTQModel or vLLM (gptq_marlin)", "a kernel-tiled layout")
MARLIN_AWQ = ForeignFormat("Marlin-packed AWQ", "AutoAWQ (WQLinear_Marlin) or vLLM (awq_marlin)",
                           "a kernel-tiled layout")

#: Every foreign format, for listings and tests.
FOREIGN: tuple[ForeignFormat, ...] = (ONNX, COREML, EXL2, EXL3, AQLM, HQQ, TORCHAO, MARLIN_GPTQ, MARLIN_AWQ)

_BY_QUANT_METHOD = {"exl2": EXL2, "exl3": EXL3, "aqlm": AQLM, "hqq": HQQ, "torchao": TORCHAO}

#: Per format, (a tensor-name suffix that must occur, suffixes of which one must also occur).
_TENSOR_SIGNATURES: tuple[tuple[ForeignFormat, str, tuple[str, ...]], ...] = (
    (EXL2, ".q_weight", (".q_scale_max", ".q_groups", ".q_invperm")),
    (EXL3, ".trellis", (".suh", ".svh")),
    (AQLM, ".codes", (".codebooks",)),
    (HQQ, ".W_q", (".scale", ".zero", ".meta")),
    (TORCHAO, "._weight_qdata", ("._weight_qdata",)),
    (MARLIN_GPTQ, ".B", (".s",)),
)

_ONNX_SUFFIXES = (".onnx", ".ort")
_COREML_FILE = ".mlmodel"
_COREML_PACKAGE = ".mlpackage"


def _error(fmt: ForeignFormat, file: Path | str, field: str, found: object) -> UnsupportedError:
    return UnsupportedError(
        f"{fmt.name} checkpoint, which qckpt does not read ({fmt.why})", file=file, field=field,
        found=found,
        hint=f"read it with {fmt.readers}; to bring it to qckpt, dequantize it there to float safetensors "
             f"(qckpt reads those and can quantize them to any format it writes)")


def recognise_path(path: Path) -> tuple[ForeignFormat, str, str] | None:
    """The foreign format a path's name or folder contents give away, without reading tensor data.

    Returns ``(format, field, found)`` (``field`` names the evidence: ``"file suffix"``, ``"directory
    contents"``, ``"quantization_config.quant_method"`` ...), or None.
    """
    suffix = path.suffix.lower()
    if suffix in _ONNX_SUFFIXES:
        return ONNX, "file suffix", suffix
    if suffix == _COREML_FILE or (suffix == _COREML_PACKAGE and path.is_dir()):
        return COREML, "file suffix", suffix
    if not path.is_dir():
        return None
    cfg = _read_config(path / "config.json")
    if cfg is not None and (hit := recognise_config(cfg)) is not None:
        return hit
    try:
        names = [p.name for p in path.iterdir()]
    except OSError:
        return None
    if any(n.endswith(".safetensors") or n.endswith(".gguf") for n in names):
        return None
    for n in sorted(names):
        low = n.lower()
        if low.endswith(_ONNX_SUFFIXES):
            return ONNX, "directory contents", n
        if low.endswith(_COREML_FILE) or low.endswith(_COREML_PACKAGE):
            return COREML, "directory contents", n
    return None


def _read_config(path: Path) -> dict | None:
    """``config.json`` as a dict, or None when absent or unreadable (the readers report that later)."""
    try:
        if not path.is_file() or path.stat().st_size > 16 * 2**20:
            return None
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def recognise_config(config: dict) -> tuple[ForeignFormat, str, str] | None:
    """The foreign format a ``config.json`` declares (``quantization_config``), or None."""
    qc = config.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    qm = str(qc.get("quant_method", "")).lower()
    if qm in _BY_QUANT_METHOD:
        return _BY_QUANT_METHOD[qm], "quantization_config.quant_method", qm
    if qm == "gptq" or (not qm and "checkpoint_format" in qc):
        if str(qc.get("checkpoint_format", "")).lower() == "marlin":
            return MARLIN_GPTQ, "quantization_config.checkpoint_format", "marlin"
        if qc.get("is_marlin_format") is True:
            return MARLIN_GPTQ, "quantization_config.is_marlin_format", "true"
    if qm == "awq" and str(qc.get("version", "")).lower() == "marlin":
        return MARLIN_AWQ, "quantization_config.version", "marlin"
    return None


def recognise_tensors(names: Iterable[str]) -> tuple[ForeignFormat, str, str] | None:
    """The foreign format a set of stored tensor names gives away, or None.

    A signature needs its defining suffix and one of its companions on the same module prefix
    (``m.q_weight`` with ``m.q_groups``), so a float model with an unlucky tensor name is not refused.
    """
    names = set(names)
    for fmt, key, companions in _TENSOR_SIGNATURES:
        for n in names:
            if not n.endswith(key):
                continue
            prefix = n[: -len(key)]
            if key in companions or any(prefix + c in names for c in companions):
                return fmt, "tensor names", n
    return None


def refuse_path(path: Path) -> None:
    """Raise the named refusal when ``path`` (file or directory) is a foreign format.

    Raises
    ------
    UnsupportedError
        ``path`` is ONNX, Core ML, or a directory whose config declares a foreign quantization.
    """
    if (hit := recognise_path(path)) is not None:
        raise _error(hit[0], path, hit[1], hit[2])


def refuse_config(config: dict | None, file: Path) -> None:
    """Raise the named refusal when ``config`` declares a foreign quantization (see :func:`refuse_path`)."""
    if config and (hit := recognise_config(config)) is not None:
        raise _error(hit[0], file, hit[1], hit[2])


def refuse_tensors(names: Iterable[str], file: Path) -> None:
    """Raise the named refusal when the stored tensor names are a foreign format's (see :func:`refuse_path`)."""
    if (hit := recognise_tensors(names)) is not None:
        raise _error(hit[0], file, hit[1], hit[2])
