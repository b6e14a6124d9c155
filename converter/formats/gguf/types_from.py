"""``--gguf-types-from FILE.gguf``: every tensor gets the ggml type its namesake has in an existing GGUF.

The GGUF handler's ``requant_targets`` hook for ``Target(types_from=FILE)``. The use: a model that came from a
GGUF (``qckpt dequantize SRC.gguf HF/``, then edited or not) goes back with the source's own per-tensor mix
(``qckpt convert HF/ OUT.gguf --to gguf --gguf-types-from SRC.gguf``), which no llama-quantize file type names
when the source was made with overrides (a Q8_0 token embedding in a Q4_1 file, ``--output-tensor-type``,
``--tensor-type``, an importance-matrix mix ...). The tensors are matched by their GGUF names, the names the writer
gives them (the GGUF source's own names, else :func:`~converter.formats.gguf.names.hf_to_gguf` for the
architecture); shapes are compared in logical ``(out, in)`` order (``reversed(ne)``).

Per tensor, with ``T`` the type in FILE:

- ``T`` a quantized type qckpt writes (:data:`~converter.formats.gguf.schemes.WRITE_TYPES`): the target names it
  (``Target(quant_type=T)``), resolved by the GGUF quantizer: a source already stored as ``T`` is carried
  (legacy types: the generic exact carry; K-quants / FP4: :func:`~converter.formats.gguf.requant._same_type`),
  anything else is quantized from its float32 values by llama.cpp's reference quantizer. Values that were
  themselves ``T`` blocks (the dequantized folder of FILE) give back FILE's bytes when that quantizer is
  idempotent on its own output: Q4_1 / Q8_0 are (the block's minimum / largest magnitude is an element of it, so
  the block scale and bias come back, and every code is half a step away from a rounding boundary);
  ``interop/gguf_types_roundtrip.py`` counts the differing blocks per type on a real file.
- ``T`` a float type (F32 / F16 / BF16): the tensor must be written as ``T`` already (a float source of that dtype,
  or a 1-D F16 / BF16 one, widened to F32 as ``convert_hf_to_gguf.py`` does); qckpt does not cast float tensors
  here, and does not write a quantized source tensor as float.

Refused (:class:`~converter.errors.NotRepresentableError`, naming FILE and the tensor): another architecture; a
tensor of the checkpoint with no namesake in FILE; a tensor of FILE the output would not have; a shape mismatch; a
type qckpt does not write (IQ*, TQ* ...); a float type the tensor is not stored in. The output's
``general.file_type`` is FILE's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from converter.errors import NotRepresentableError
from converter.formats.gguf.fp4 import scale_tensor_name
from converter.formats.gguf.hf_source import WIDENED_1D
from converter.formats.gguf.names import hf_to_gguf
from converter.formats.gguf.schemes import WRITE_TYPES
from converter.formats.ties import resolve_tied_head

__all__ = ["types_from_targets", "TYPES_FROM_OPTION", "FLOAT_TYPES"]

#: the command-line spelling (messages and hints)
TYPES_FROM_OPTION = "--gguf-types-from"
#: ggml float types a tensor can keep
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")


def _file_tensors(path: Path) -> tuple[str, int | None, dict[str, tuple[str, tuple[int, ...]]]]:
    """``(architecture, general.file_type, {gguf name: (ggml type, logical shape)})`` of the GGUF at ``path``
    (headers only)."""
    from converter.formats.registry import load

    ref = load(path, format="gguf")
    names = ref.metadata["gguf_names"]
    types = ref.metadata["ggml_types"]
    out = {names[s.name]: (types[s.name], tuple(int(d) for d in s.shape)) for s in ref.specs()}
    # an NVFP4 tensor's F32 ``<name>.scale`` multiplier is written with it, not on its own
    for gname, (t, _) in list(out.items()):
        if t == "NVFP4":
            out.pop(scale_tensor_name(gname) or gname + ".scale", None)
    ft = ref.metadata["gguf_kv"].get("general.file_type")
    return str(ref.metadata.get("architecture") or ""), ft if isinstance(ft, int) else None, out


def _written_float_type(spec) -> str:
    """The ggml type the writer gives a float tensor (1-D F16 / BF16 widened to F32)."""
    return "F32" if len(spec.shape) == 1 and spec.dtype in WIDENED_1D else spec.dtype


def types_from_targets(ckpt, path: str | Path) -> dict[str, tuple[Any, str]]:
    """``{name: (Target, reason)}``: each quantized tensor of ``ckpt``, and each float weight FILE stores quantized,
    gets FILE's type for its GGUF name; float tensors FILE stores in their own dtype get no target.

    Parameters
    ----------
    ckpt : Checkpoint
        The source as the GGUF writer will see it (after the handler's ``arrange`` and module policy).
    path : path of an existing GGUF file (one file, or the first part of a split set).

    Raises
    ------
    NotRepresentableError
        See the module docstring (the refusals), naming ``path`` and the tensor.
    """
    from converter.formats.gguf.mix_targets import FILE_TYPE_KEY, _arch_and_kv
    from converter.quant.requant import Target

    path = Path(path)
    file_arch, file_type, ref = _file_tensors(path)
    arch, _ = _arch_and_kv(ckpt)
    if file_arch != arch:
        raise NotRepresentableError(f"{TYPES_FROM_OPTION} names a GGUF of another architecture", file=path,
                                    field="general.architecture", expected=arch, found=file_arch)
    names = dict(ckpt.metadata.get("gguf_names") or {}) if ckpt.format == "gguf" else {}
    drop, _, _ = resolve_tied_head(ckpt, ckpt.config or None, ckpt.names())
    out: dict[str, tuple[Any, str]] = {}
    matched: set[str] = set()
    for s in ckpt.specs():
        if s.name in drop or s.kind not in ("dense", "quantized") and not s.decoded_by:
            continue
        gname = names.get(s.name) or hf_to_gguf(s.name, arch)
        where = f"{s.name} ({gname})" if gname != s.name else s.name
        if gname not in ref:
            raise NotRepresentableError(f"{TYPES_FROM_OPTION}: this tensor has no namesake in the GGUF", file=path,
                                        tensor=where, field="name", expected=gname, found=None,
                                        hint="give the GGUF this checkpoint was made from (same tensors)")
        matched.add(gname)
        t, shape = ref[gname]
        if shape != tuple(int(d) for d in s.shape):
            raise NotRepresentableError(f"{TYPES_FROM_OPTION}: shape differs from the GGUF's tensor", file=path,
                                        tensor=where, field="shape", expected=list(shape), found=list(s.shape))
        if t in FLOAT_TYPES:
            stored = _written_float_type(s) if s.kind == "dense" else s.dtype
            if s.kind != "dense" or stored != t:
                raise NotRepresentableError(f"{TYPES_FROM_OPTION}: the GGUF stores this tensor as {t}; qckpt writes "
                                            f"it as {stored} (float tensors are not cast, quantized ones not "
                                            "dequantized here)", file=path, tensor=where, field="ggml_type",
                                            expected=t, found=stored,
                                            hint=("1-D float tensors are written F32, as convert_hf_to_gguf.py "
                                                  "writes them" if len(s.shape) == 1 else
                                                  f"dequantize the source with --dtype {t.lower()} first"))
            continue
        if t not in WRITE_TYPES:
            raise NotRepresentableError(f"{TYPES_FROM_OPTION}: qckpt does not write the GGUF's type of this tensor",
                                        file=path, tensor=where, field="ggml_type", expected=list(WRITE_TYPES),
                                        found=t)
        out[s.name] = (Target(quant_type=t), f"{TYPES_FROM_OPTION} {path.name}: {gname} -> {t}")
    missing = sorted(set(ref) - matched)
    if missing:
        raise NotRepresentableError(f"{TYPES_FROM_OPTION}: the GGUF has tensors the output would not have "
                                    f"({len(missing)})", file=path, tensor=missing[0], field="name",
                                    expected="only tensors the output has", found=missing[:5],
                                    hint="give the GGUF this checkpoint was made from (same tensors)")
    if file_type is not None:  # the writer's general.file_type: the file's own (mix_targets.FILE_TYPE_KEY)
        ckpt.metadata[FILE_TYPE_KEY] = file_type
    return out
