"""``qckpt dequantize``: any checkpoint -> plain float safetensors, and its report (or its ``--dry-run`` plan)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from converter.errors import UnsupportedError
from converter.formats import registry
from converter.formats.plain import write_plain
from converter.ops.plan_doc import plan_document, tensor_rows
from converter.write.atomic import check_not_inside, refuse_existing
from converter.write.dry_run import DryRunPlanned
from converter.write.engine import collect_results

__all__ = ["dequantize"]


def check_destination(dst: str | Path) -> None:
    """A float checkpoint is one ``.safetensors`` file or a model directory: a DST with another file suffix
    (``out.gguf``, ``out.bin``) would become a directory of that name, so it is refused.

    Raises
    ------
    UnsupportedError
        ``dst`` ends in a file suffix other than ``.safetensors`` (the names to use instead in the hint).
    """
    suffix = Path(dst).suffix.lower()
    if suffix in registry.FILE_SUFFIXES and suffix != ".safetensors":
        raise UnsupportedError("dequantize writes one .safetensors file or a model directory", file=dst, field="DST",
                               expected="NAME.safetensors or a directory name", found=Path(dst).name,
                               hint=f"e.g. {Path(dst).with_suffix('')} (a folder) or "
                                    f"{Path(dst).with_suffix('.safetensors')}; "
                                    "GGUF: qckpt convert SRC DST.gguf --to gguf")


def dequantize(src: str | Path, dst: str | Path, *, dtype: str = "f32", overwrite: bool = False,
               source_format: str | None = None, match_tool: bool = False,
               tool_dtype: str | None = None) -> dict[str, Any]:
    """Write ``src`` as plain float safetensors at ``dst`` (a file when it ends in ``.safetensors``, else a
    model directory); ``dtype`` ``f32`` / ``f16`` / ``bf16``, or with ``match_tool`` each tensor as its
    producing tool decodes it. Returns ``schemas/dequantize-report.schema.json``, or under
    ``run_options(dry_run=True)`` the plan (``schemas/plan.schema.json``). A quantized tensor whose dequantized
    values hold NaN or inf (its scales or zero points are not finite, or a float16 / bfloat16 output overflowed) is
    written as decoded and named in the report's ``non_finite`` (name -> count of such values; dense tensors passed
    through are not counted; ``match_tool``'s decodes are).

    Raises
    ------
    ConverterError
        Unreadable input, an undecodable tensor, an existing ``dst`` without ``overwrite``.
    """
    check_not_inside(src, dst)
    refuse_existing(dst, overwrite)
    check_destination(dst)
    ckpt = registry.load(src, format=source_format)
    try:
        with collect_results() as got:
            res = write_plain(ckpt, dst, dtype="F32" if match_tool else dtype, overwrite=overwrite,
                              match_tool=match_tool, tool_dtype=tool_dtype)
    except DryRunPlanned as planned:
        written_dtype = "each tool's dtype" if match_tool else dtype
        rows = tensor_rows(ckpt, {s.name: ("dequantized", f"decoded to {written_dtype}") for s in ckpt.specs()
                                  if s.kind != "dense"})
        return plan_document("dequantize", source=str(src), source_format=ckpt.format, destination=str(dst),
                             target_format="plain", rows=rows, outputs=planned.outputs)
    doc = {"source": str(src), "source_format": ckpt.format, "destination": str(dst),
           "dtype": "tool" if match_tool else dtype, **res}
    # quantized tensors dequantized to NaN / inf (non-finite scales or zero points; a float16 / bfloat16 overflow):
    # written as decoded, and named (converter.formats.plain.counted)
    bad = {name: n for (kind, name), n in got.items() if kind == "non_finite" and n}
    if bad:
        doc["non_finite"] = {name: bad[name] for name in sorted(bad)}
    return doc
