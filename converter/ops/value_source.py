"""Where an error's offending value came from: the data file and stored array of a source checkpoint."""

from __future__ import annotations

from pathlib import Path

from converter.errors import ConverterError
from converter.tensor import Checkpoint


def point_at_stored(ckpt: Checkpoint, exc: ConverterError) -> ConverterError:
    """Fill in where an error's value came from: when ``exc`` names a tensor of ``ckpt`` and a field that is a
    stored role of it (``scales``, ``zero_points`` ...) held by one stored array, the error names the data
    file holding it (``.../model.safetensors``) and, when that array is laid out as the logical parameter
    array the error indexes (MLX biases ``[out, groups]``), the array itself (``<p>.biases``), not the logical
    tensor and the source folder; a transposed or packed array (GPTQ scales ``[groups, out]``) keeps the
    logical tensor name so the index stays true, and so does a field interleaved in another array's blocks (GGUF
    ``d`` / ``m``, described as ``<tensor>:m``). Otherwise the checkpoint's path. Returns ``exc``."""
    spec = ckpt.spec(exc.tensor) if exc.file is None and exc.tensor and exc.tensor in ckpt else None
    held = [st for st in (spec.stored if spec is not None else ()) if st.role == exc.field]
    if len(held) == 1 and held[0].file:
        paths = [f for f in ckpt.files if Path(f).name == held[0].file]
        if len(paths) == 1:
            exc.file = paths[0]
            # a GGUF block field (``blk.0.attn_q.weight:m``) is no array of its own: the tensor keeps its name
            if spec.kind == "quantized" and ":" not in held[0].name and tuple(held[0].shape) == tuple(
                    spec.group_map.param_shape(spec.shape, spec.axes)):
                exc.tensor = held[0].name
    return exc.with_context(file=ckpt.path)
