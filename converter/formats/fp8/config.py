"""The ``quant_method: "fp8"`` config: where it is read from and what each field may hold.

Read from ``config.json["quantization_config"]``, else from a standalone
``quantization_config.json`` beside it (auto-round 0.15.1 writes both). Fields (transformers 5.24
``utils/quantization_config.py`` ``FineGrainedFP8Config``; DeepSeek-V3 ``config.json``):

- ``quant_method``: ``"fp8"``;
- ``fmt``: ``"e4m3"`` (default) or ``"e5m2"``: the element type of every FP8 weight;
- ``weight_block_size``: ``[block_out, block_in]`` (``[128, 128]`` in every released model), or
  null / absent: one scale per tensor (per expert for expert stacks);
- ``activation_scheme``: ``"dynamic"`` (activations scaled per token group at run time) or
  ``"static"`` (a stored activation scale per module);
- ``modules_to_not_convert``: modules kept dense (their weights are ordinary floats);
- ``scale_fmt``: ``"float"`` (default) or ``"ue8m0"`` (power-of-two scales, DeepSeek-V3.1).

A missing ``weight_block_size`` is ambiguous between the tools: transformers' ``FineGrainedFP8Config``
defaults it to ``(128, 128)`` (``utils/quantization_config.py``), while vLLM's ``Fp8Config.from_config``
reads an absent key as None, i.e. per-tensor scales (``model_executor/layers/quantization/fp8.py``).
The reader decides from the stored scale shapes (:func:`converter.formats.fp8.reader.infer_block`): a
scalar / ``[1]`` scale is per tensor, a 2-D grid is blocks of 128 x 128 checked against
``ceil(shape / 128)``. An explicit ``null`` means per tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from converter.codebooks import ELEMENTS, FloatElement, element_for_storage
from converter.errors import ErrorKind, FormatError
from converter.formats.source import Source, read_json

FORMAT = "fp8"
SIDE_CONFIG = "quantization_config.json"
#: ``fmt`` values and their elements (transformers' FineGrainedFP8 stores E4M3; E5M2 is accepted the same way).
FMTS = ("e4m3", "e5m2")
ACTIVATION_SCHEMES = ("dynamic", "static")
#: ``scale_fmt`` values (transformers 5.24 ``FineGrainedFP8Config.post_init``).
SCALE_FMTS = ("float", "ue8m0")
#: the block transformers' FineGrainedFP8Config assumes when ``weight_block_size`` is absent.
DEFAULT_BLOCK = (128, 128)


@dataclass(frozen=True)
class Fp8Config:
    """The parsed ``quantization_config`` of an fp8 checkpoint.

    Attributes
    ----------
    element : FloatElement
        The weights' element (``fmt``).
    block : tuple of (int, int) or None
        ``(block_out, block_in)`` from ``weight_block_size``; None: per-tensor scales.
    activation_scheme : str
        ``dynamic`` or ``static``.
    modules_to_not_convert : tuple of str
    file : Path
        Where the config was read (for error messages).
    raw : dict
        The config as found.
    block_given : bool
        Whether ``weight_block_size`` is present (an absent one is inferred from the scale shapes).
    """

    element: FloatElement
    block: tuple[int, int] | None
    activation_scheme: str
    modules_to_not_convert: tuple[str, ...]
    file: Path
    raw: dict
    block_given: bool = True


def raw_config(src: Source) -> tuple[dict | None, Path | None]:
    """The fp8 ``quantization_config`` dict of ``src`` and the file it came from, or (None, None)."""
    qc = src.quantization_config
    if isinstance(qc, dict) and qc:
        return (qc, src.directory / "config.json") if qc.get("quant_method") == FORMAT else (None, None)
    if src.kind == "directory" and not qc:
        side = src.directory / SIDE_CONFIG
        # only beside FP8 tensors: a stale copy next to float weights does not make them fp8
        if side.is_file() and any(element_for_storage(src.info(n).dtype) for n in src.tensor_names()):
            data = read_json(side)
            if isinstance(data, dict) and data.get("quant_method") == FORMAT:
                return data, side
    return None, None


def _block(value: Any, file: Path) -> tuple[int, int] | None:
    if value is None:
        return None
    ok = (isinstance(value, (list, tuple)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value))
    if not ok:
        raise FormatError("weight_block_size must be two positive integers [block_out, block_in] or null",
                          file=file, field="quantization_config.weight_block_size",
                          expected="[block_out, block_in] (e.g. [128, 128]) or null", found=value,
                          kind=ErrorKind.CONFIG_MISMATCH)
    return int(value[0]), int(value[1])


def parse_config(raw: dict, file: Path) -> Fp8Config:
    """Check the fields of an fp8 ``quantization_config``.

    Raises
    ------
    FormatError
        ``fmt`` not e4m3 / e5m2, ``weight_block_size`` not two positive integers (a block that
        cannot tile a matrix), ``activation_scheme`` unknown, ``modules_to_not_convert`` not a
        list of strings (each naming the field, ``kind=CONFIG_MISMATCH``).
    """
    fmt = raw.get("fmt", "e4m3")
    if fmt not in FMTS:
        raise FormatError("unknown fp8 element format", file=file, field="quantization_config.fmt",
                          expected=list(FMTS), found=fmt, kind=ErrorKind.CONFIG_MISMATCH)
    scheme = raw.get("activation_scheme", "dynamic")
    if scheme not in ACTIVATION_SCHEMES:
        raise FormatError("unknown activation scheme", file=file, field="quantization_config.activation_scheme",
                          expected=list(ACTIVATION_SCHEMES), found=scheme, kind=ErrorKind.CONFIG_MISMATCH)
    skip = raw.get("modules_to_not_convert") or []
    if not isinstance(skip, list) or not all(isinstance(m, str) for m in skip):
        raise FormatError("modules_to_not_convert must be a list of module names", file=file,
                          field="quantization_config.modules_to_not_convert", expected="list of str",
                          found=skip, kind=ErrorKind.CONFIG_MISMATCH)
    sfmt = raw.get("scale_fmt", "float")
    if sfmt not in SCALE_FMTS:
        raise FormatError("unknown scale_fmt", file=file, field="quantization_config.scale_fmt",
                          expected=list(SCALE_FMTS), found=sfmt, kind=ErrorKind.CONFIG_MISMATCH)
    return Fp8Config(ELEMENTS[fmt], _block(raw.get("weight_block_size"), file), scheme, tuple(skip), file, dict(raw),
                     "weight_block_size" in raw)


def read_config(src: Source) -> Fp8Config | None:
    """The fp8 config of ``src`` (None when it has none); raises FormatError on a malformed field."""
    raw, file = raw_config(src)
    return None if raw is None else parse_config(raw, file)


def write_config(element: str, block: tuple[int, int] | None, activation_scheme: str,
                 dense_modules: list[str], scale_fmt: str | None = None) -> dict:
    """The ``quantization_config`` a writer stores (the fields transformers' FineGrainedFP8Config reads;
    ``scale_fmt`` only when given)."""
    out = {"quant_method": FORMAT, "fmt": element, "weight_block_size": list(block) if block else None,
           "activation_scheme": activation_scheme, "modules_to_not_convert": list(dense_modules)}
    if scale_fmt is not None:
        out["scale_fmt"] = scale_fmt
    return out
