"""GGUF (llama.cpp / ggml) reader and writer, format ``"gguf"``.

The header is first walked with bounds by :func:`~converter.formats.gguf.bounds.check_gguf_bounds`
(``n_dims <= 4``, element count without overflow, ``ne[0]`` a whole number of blocks, each
tensor's data aligned, inside the file and not overlapping another, zero padding between the
tensor infos and the data); container parsing is then gguf-py's ``GGUFReader``, every exception it
raises on a malformed file becomes a :class:`CorruptFileError` naming the file, and what it reports
is cross-checked against the bounded parse. Block bytes are decoded by
:mod:`converter.formats.gguf.blocks`.

Orientation (FORMATS.md section 5.2, pitfall 5): gguf-py's ``ReaderTensor.shape`` is the raw
``ne`` list (``ne[0]`` innermost = ``in``) while ``.data`` is numpy-ordered; the logical shape is
``reversed(ne)``: ``(out, in)``, or ``(expert, out, in)`` for stacked experts. Rows of ``ne[0]``
elements hold whole blocks, so the stored bytes are already in logical row order and no
transpose happens.

Types -> logical schemes (group of 32 (legacy) or the K-quant sub-block along ``in``):

=========  ==============================================================================
Q4_0/Q5_0  ``bits`` 4/5, unsigned, symmetric (implicit centre 8/16), F16 scales
Q8_0       8-bit signed symmetric, F16 scales
Q4_1/Q5_1  unsigned, float bias ``m`` (``x = d*q + m``), F16 scales and biases
Q2_K/Q4_K  unsigned, float bias; effective F32 scales ``d*sc`` and biases ``-(dmin*m)``
/Q5_K      computed in float32 as ``dequantize_row_q*_K`` does, plus a :class:`DoubleQuant`
           record of ``d``, ``dmin`` (F16) and the integer ``sc``, ``m``
Q3_K/Q6_K  3/6-bit unsigned symmetric (centre 4/32 = 2^(b-1)), effective F32 scales ``d*sc``
MXFP4      E2M1 codebook, F8_E8M0 scale per 32 (the byte ``e`` as is); split nibble order per block
NVFP4      E2M1 codebook, F8_E4M3 scale per 16 (UE4M3 bytes 0..0x7E), 64-element blocks; the F32
           ``<name>.scale`` tensor is the global scale, a multiplier (:mod:`.fp4`)
F32/F16/   :class:`DenseTensor` (also F64, I8..I64); any other ggml type (IQ*, TQ* ...)
BF16       is listed but raises UnsupportedError when loaded
=========  ==============================================================================

Names: llama.cpp names map to Hugging Face names per ``general.architecture``
(:mod:`converter.formats.gguf.names`); LLaMA q/k rows are un-permuted on read and permuted on
write (``LlamaModel.permute``). All key/values are kept in ``ckpt.metadata["gguf_kv"]`` (plain
JSON values) with their GGUF types in ``ckpt.metadata["gguf_kv_types"]``. ``ckpt.config`` is the
Hugging Face ``config.json`` the key/values describe (:mod:`converter.formats.gguf.hf_config`) and
``ckpt.side_files`` the tokenizer files (:mod:`converter.formats.gguf.hf_tokenizer`, built when a
directory writer asks for them); what could not be made is in ``metadata["side_files_skipped"]``
(file name -> reason). Writing GGUF from a GGUF source takes every key/value from the source,
never from that derived config.

From a Hugging Face source (no GGUF key/values), :mod:`converter.formats.gguf.hf_source` gives the
key/values llama.cpp's ``convert_hf_to_gguf.py`` writes: ``general.*`` (gguf-py ``Metadata``), the hyperparameters
(``rope_theta`` or transformers 5's ``rope_parameters.rope_theta``, per-architecture keys) and the tokenizer
(:mod:`converter.formats.gguf.tokenizer_kv`: ``tokenizer.json`` / ``tokenizer.model`` -> ``tokenizer.ggml.*``);
``gguf_metadata=FILE`` takes every key/value from an existing GGUF instead. Float tensors are written as they are
(F32 / F16 / BF16). A file without ``tokenizer.ggml.model`` gets ``"none"`` (``NO_VOCAB_KV``, llama.cpp's own key
for a model without a vocabulary, which llama.cpp loads). The result's ``side_files_skipped`` carries a warning
(``NO_VOCAB_WARNING`` / ``NO_TOKENIZER``) whenever the file written has no vocabulary, and one for a pre-tokenizer
llama.cpp's hash table does not know.
1-D F16 / BF16 tensors (norm weights, biases) are written F32, an exact widening, as
``convert_hf_to_gguf.py`` does (``WIDENED_1D``; the read-back proof calls them ``exact`` with
``widened``, not ``passthrough``).

Writing (``gguf.GGUFWriter``, streamed one tensor at a time into an atomic temporary file) packs
quantized tensors whose scheme *is* a legacy type, a K-quant (its super-block fields) or MXFP4 / NVFP4
(codes and scale bytes relaid, no requantization). :func:`quantize_to_gguf` is the explicit requantize
path (llama.cpp reference rounding).

Requantizing to GGUF (``qckpt convert --to gguf`` with requantize options) goes through
:data:`converter.formats.gguf.requant.GGUF_QUANTIZER` (:mod:`converter.quant.format_quant`): every target is put in
GGUF's form (:func:`requant_adapt`: fp16 block scales, asymmetric = float minimum as in Q4_1/Q5_1, a legacy
type's exact scheme at groups of 32 along ``in``), and a tensor that is not carried exactly is
quantized to its legacy type by :func:`quantize_to_gguf`, i.e. byte for byte what
``gguf.quants.quantize`` makes of the source's float32 dequantized values. The writer's LLaMA q/k
row permutation moves whole rows and blocks never cross rows, so quantizing the logical rows
and then permuting them equals quantizing the permuted rows.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import ErrorKind, FormatError, NotRepresentableError, UnsupportedError
from converter.runtime import current, parse_shard_size
from converter.write.atomic import atomic_output, atomic_outputs
from converter.write.dry_run import DryRunPlanned
from converter.tensor import Checkpoint
from converter.formats.gguf.names import ARCH_TABLES, HF_MODEL_TYPE_TO_ARCH
from converter.formats.registry import FormatHandler, OutputKind, ValidationHooks, register

from converter.formats.gguf.schemes import (DENSE_TYPES, K_TYPES, LEGACY_TYPES, FILE_TYPES,
                                            WRITE_TYPES, gguf_module, quantize_to_gguf, scheme_for,
                                            tensor_from_fields)
from converter.formats.gguf.reader import detect_gguf, read_gguf
from converter.formats.gguf.heads import with_head_count_kv
from converter.formats.gguf.targets import ACT_SCALE_DROPPED, check_target
from converter.formats.gguf.fp4 import FP4_TYPES, scale_tensor_name
from converter.formats.gguf.mix import FILE_TYPES as MIX_FILE_TYPES
from converter.formats.gguf.mix_targets import FILE_TYPE_KEY
from converter.formats.gguf.hf_source import (NO_TOKENIZER, VOCAB_NOT_CONVERTED, general_kv,  # noqa: E402
                                             no_vocab_kv, source_kv, tokenizer_warning)
from converter.formats.ties import resolve_tied_head
from converter.formats.base import dropped_activation_scales
from converter.formats.gguf.tensor_plan import TensorPlan, plan_tensor
from converter.formats.gguf.file_write import write_files
from converter.formats.gguf.split_write import check_staged, part_paths_for, split_parts
from converter.formats.gguf.mla import mtp_layers

__all__ = ["read_gguf", "write_gguf", "detect_gguf", "check_target", "quantize_to_gguf",
           "scheme_for", "tensor_from_fields", "legacy_type_for", "requant_adapt", "GGUF_QUANTIZER",
           "LEGACY_TYPES", "DENSE_TYPES", "NO_TOKENIZER"]

def _split_limit(value: Any, field: str) -> int:
    """A ``split_max_size`` / ``split_max_tensors`` given to the writer (the Python API; the CLI parses its own): an
    integer >= 0 (0: no limit); a size string (``"2GB"``) for ``split_max_size``, as ``--max-shard-size`` reads it.

    Raises
    ------
    FormatError
        Anything else (a negative count used to cut after every tensor; a size string raised a bare ValueError).
    """
    if field == "split_max_size" and isinstance(value, str):
        try:
            return parse_shard_size(value)
        except FormatError as exc:  # named as the keyword the caller gave, not the CLI's flag
            exc.field = field
            exc.args = (exc.render(),)
            raise
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise FormatError(f"{field} is not a limit", field=field,
                          expected="an integer >= 0 (0: no limit)" + (", or a size such as '2GB'"
                                                                     if field == "split_max_size" else ""),
                          found=repr(value))
    return int(value)


def write_gguf(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, gguf_type: str | None = None,
               arch: str | None = None, gguf_metadata: str | Path | None = None, split_max_size: int | None = None,
               split_max_tensors: int | None = None, **_: Any) -> dict:
    """Write ``ckpt`` as one ``.gguf`` file, or as the parts of a split GGUF (atomically; tensors streamed one at a
    time).

    Parameters
    ----------
    ckpt : Checkpoint
    dst : Path
        Output file.
    overwrite : bool
    gguf_type : str, optional
        Require every quantized tensor to be exactly this legacy type (``"Q4_0"`` ...).
    arch : str, optional
        ``general.architecture``; default: the source's GGUF value, else config.json ``model_type``.
    gguf_metadata : path, optional
        A GGUF whose key/values (tokenizer, hyperparameters) are written instead of those made from the source
        (:func:`converter.formats.gguf.hf_source.source_kv`).
    split_max_size, split_max_tensors : int, optional
        Split the output as ``convert_hf_to_gguf.py --split-max-size / --split-max-tensors`` does
        (:mod:`converter.formats.gguf.split_write`): bytes of tensor data (also a size string, ``"2GB"``) / tensors
        per part, integers >= 0, 0 no limit (else :class:`~converter.errors.FormatError`); default:
        the run options' ``gguf_split_size`` / ``gguf_split_tensors`` (``qckpt --max-shard-size``), 0.
        Parts ``<stem>-00001-of-0000N.gguf`` beside ``dst``; one file ``dst`` when everything fits in one part.

    Returns
    -------
    dict
        ``files`` (names, part order), ``path`` (the file to read: ``dst`` or the first part), ``tensors``,
        ``types`` (logical name -> ggml type), ``architecture``, ``file_type``,
        ``notes`` (tensor or key name -> list of str: widened 1-D tensors, key/values not written),
        ``side_files_skipped`` (``{"tokenizer.ggml.*": warning}`` when no vocabulary is written).

    Raises
    ------
    NotRepresentableError
        A tensor is not exactly a legacy type / GGUF dtype (nothing is written).
    FormatError
        No architecture, over-long names, missing head counts for LLaMA q/k.
    """
    ckpt.refuse_opaque("gguf")
    gguf = gguf_module()
    if gguf_type is not None and gguf_type not in WRITE_TYPES:
        raise UnsupportedError("unsupported GGUF output type", field="gguf_type", expected=list(WRITE_TYPES),
                               found=gguf_type)
    src_kv = dict(ckpt.metadata.get("gguf_kv") or {})
    src_types = dict(ckpt.metadata.get("gguf_kv_types") or {})
    arch = arch or src_kv.get("general.architecture") or HF_MODEL_TYPE_TO_ARCH.get(ckpt.config.get("model_type")) \
        or ckpt.config.get("model_type")
    if not isinstance(arch, str) or not arch:
        raise FormatError("no GGUF architecture: source has no general.architecture and config.json no model_type",
                          file=dst, field="general.architecture", kind=ErrorKind.CONFIG_MISMATCH,
                          hint="convert from a model folder whose config.json names its model_type (or from a GGUF "
                               "source); library: arch=...")
    source_warnings: dict[str, str] = {}
    made = not src_kv and gguf_metadata is None  # keys made from a Hugging Face source, as convert_hf_to_gguf.py
    if not src_kv or gguf_metadata is not None:  # convert_hf_to_gguf.py's keys, or a given GGUF's
        src_kv, more_types, source_warnings = source_kv(ckpt, arch, gguf_metadata)
        src_types.update(more_types)
    src_kv.update(no_vocab_kv(src_kv, arch))  # no vocabulary: declared 'none', as llama.cpp's converter does
    names = dict(ckpt.metadata.get("gguf_names") or {}) if ckpt.format == "gguf" else {}
    # tied embeddings (CASES.md B32/B33): an lm_head identical to the embedding is left out (llama.cpp
    # then uses token_embd); a different one is kept (GGUF has no tie flag: output.weight wins)
    drop, _, tie = resolve_tied_head(ckpt, ckpt.config or None, ckpt.names())
    plans = []
    # static activation scales (input_scale): llama.cpp has no tensor for them (ACT_SCALE_DROPPED)
    dropped = dropped_activation_scales(ckpt, ACT_SCALE_DROPPED)
    dropped.update(mtp_layers(ckpt, arch))  # DeepSeek's multi-token-prediction layers: not in llama.cpp's deepseek2
    for spec in ckpt.specs():
        if spec.name not in drop and spec.name not in dropped:
            plans.append(plan_tensor(ckpt, spec, arch, gguf_type, names, src_kv))
            if arch == "gemma2" and plans[-1].gguf_name == "output.weight":  # MODEL_TENSORS[GEMMA2] has no OUTPUT
                raise NotRepresentableError("llama.cpp's gemma2 has no output tensor (Gemma2Model drops lm_head: the "
                                            "head is the embedding); this lm_head differs from the embedding",
                                            tensor=spec.name, field="tie_word_embeddings", expected="tied head",
                                            found="a separate lm_head")
            if plans[-1].type_name == "NVFP4" and spec.scheme.global_scale is not None:
                plans[-1].scaled = True
                scale_name = scale_tensor_name(plans[-1].gguf_name) or plans[-1].gguf_name + ".scale"
                plans.append(TensorPlan(spec.name, scale_name, "F32", (1,), 4, None, global_of=True))
    seen: dict[str, str] = {}
    for p in plans:
        if p.gguf_name in seen:
            raise FormatError("two tensors map to one GGUF name", tensor=p.name, field="name",
                              found=f"{seen[p.gguf_name]} and {p.name} -> {p.gguf_name}")
        seen[p.gguf_name] = p.name
    src_kv = with_head_count_kv(src_kv, ckpt.config, arch, {p.gguf_name: p.shape for p in plans},
                                keep_default=ckpt.format == "gguf")
    types = {p.name: p.type_name for p in plans if not p.global_of}
    if made:  # general.type / name / size_label ... first, as ModelBase.prepare_metadata writes them
        general, general_types = general_kv(ckpt, arch, [(p.gguf_name, p.shape) for p in plans])
        src_kv = {**general, **{k: v for k, v in src_kv.items() if k not in general}}
        src_types.update(general_types)
    src_ggml = ckpt.metadata.get("ggml_types") or {}
    mix = ckpt.metadata.get(FILE_TYPE_KEY)
    if ckpt.format == "gguf" and src_ggml == types and isinstance(src_kv.get("general.file_type"), int):
        file_type = int(src_kv["general.file_type"])
    elif mix in MIX_FILE_TYPES:  # a --quant-type mix: llama-quantize's llama_ftype
        file_type = MIX_FILE_TYPES[mix][0]
    elif isinstance(mix, int) and not isinstance(mix, bool):  # --gguf-types-from: that file's general.file_type
        file_type = mix
    else:
        weight = Counter()
        for p in plans:
            weight[p.type_name] += int(np.prod(p.shape, dtype=np.int64)) if len(p.shape) >= 2 else 0
        quant = [t for t in weight if t in LEGACY_TYPES + FP4_TYPES] or [t for t in weight if t in K_TYPES]
        dom = (max(quant, key=lambda t: weight[t]) if quant
               else max(weight, key=lambda t: weight[t]) if weight else "F32")
        file_type = int(gguf.LlamaFileType[FILE_TYPES.get(dom, "ALL_F32")])
    alignment = int(ckpt.metadata.get("alignment") or src_kv.get("general.alignment") or 32) \
        if ckpt.format == "gguf" else 32
    notes = {p.name: [f"{p.widened_from} widened to F32 (values exact; convert_hf_to_gguf.py writes 1-D tensors F32)"]
             for p in plans if p.widened_from}
    offsets = {p.name: p.offset for p in plans if p.offset is not None}
    for name in offsets:
        notes.setdefault(name, []).append(f"stored as w + {offsets[name]:g} (llama.cpp's {arch} norm convention)")
    opts = current()
    split_size = opts.gguf_split_size if split_max_size is None else _split_limit(split_max_size, "split_max_size")
    split_tensors = (opts.gguf_split_tensors if split_max_tensors is None
                     else _split_limit(split_max_tensors, "split_max_tensors"))
    parts = split_parts([p.nbytes for p in plans], split_size, split_tensors)
    paths = part_paths_for(Path(dst), len(parts))
    if len(parts) > 1 and alignment != 32:  # later parts have no key/values: llama.cpp reads them aligned to 32
        notes["general.alignment"] = [f"{alignment} written 32: a split GGUF's later parts carry no key/values"]
        alignment = 32
    if opts.dry_run:  # the plan: the files, their tensor data (key/values and alignment padding not counted)
        raise DryRunPlanned({"files": [{"name": path.name, "bytes": sum(plans[i].nbytes for i in part),
                                        "tensors": len(part)} for path, part in zip(paths, parts)], "config": None,
                             "gguf": {"architecture": arch, "file_type": file_type, "types": types},
                             "dropped": {**{n: "identical to the token embedding: left out, llama.cpp uses token_embd"
                                            for n in drop}, **dropped}})
    if len(parts) == 1:
        with atomic_output(dst, overwrite=overwrite) as tmp:
            write_files(ckpt, plans, parts, [Path(tmp)], arch, src_kv, src_types, file_type, alignment, notes)
    else:
        with atomic_outputs(paths, overwrite=overwrite) as stage:
            staged = [stage / path.name for path in paths]
            write_files(ckpt, plans, parts, staged, arch, src_kv, src_types, file_type, alignment, notes,
                         split=(split_size, split_tensors))
            check_staged(staged[0], {p.gguf_name: p.type_name for p in plans if not p.global_of}, len(parts))
    result = {"files": [path.name for path in paths], "path": str(paths[0]), "tensors": len(plans), "types": types,
              "architecture": arch,
              "file_type": file_type, "notes": notes, **({"dropped": dropped} if dropped else {}),
              **({"offsets": offsets} if offsets else {})}
    skipped = {**tokenizer_warning(ckpt, src_kv, source_warnings),
               **{k: v for k, v in source_warnings.items() if k != VOCAB_NOT_CONVERTED}}
    if made and arch not in ARCH_TABLES:  # Hugging Face names written as they are: llama.cpp knows none of them
        skipped["tensor names"] = (f"warning: no llama.cpp tensor names for architecture {arch!r} (mapped: "
                                   f"{', '.join(sorted(ARCH_TABLES))}); the Hugging Face names are written as they "
                                   "are and llama.cpp will not load this file")
    if skipped:
        result["side_files_skipped"] = skipped
    if tie is not None:
        result["tied_head"] = tie
    return result


from converter.formats.gpt_oss import arrange as gpt_oss_arrange  # noqa: E402
from converter.formats.tool_decode import in_float32  # noqa: E402
from converter.formats.gguf.qk_proof import prove_qk_rows  # noqa: E402
from converter.formats.gguf.fallback import block_scales as fallback_block_scales  # noqa: E402
from converter.formats.gguf.experts import stack_experts  # noqa: E402
from converter.formats.gguf.mla import split_kv_b  # noqa: E402
from converter.formats.gguf.requant import GGUF_QUANTIZER, legacy_type_for, requant_adapt, requant_targets  # noqa: E402,F401

HANDLER = register(FormatHandler("gguf", "GGUF (llama.cpp): legacy Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 read+write, "
                                 "K-quants Q2_K..Q6_K, MXFP4, NVFP4 read+write, F32/F16/BF16 dense",
                                 detect_gguf, read_gguf, write_gguf,
                                 check_target=check_target, quantizer=GGUF_QUANTIZER,
                                 requant_targets=requant_targets,
                                 # llama.cpp's gpt-oss tensors: gate / up experts apart (GptOssModel)
                                 # and Qwen2/3-MoE float experts stacked (Qwen2MoeModel)
                                 arrange=lambda ckpt: split_kv_b(stack_experts(gpt_oss_arrange.for_stacked(ckpt))),
                                 # the stored q/k rows against llama.cpp's permute of the source (not via read_gguf)
                                 prove_written=prove_qk_rows,
                                 # ggml block scales are signed: Q4_0/Q5_0 use ``d = max / -8`` with ``max`` the
                                 # signed value of largest magnitude (``ggml-quants.c`` ``quantize_row_q4_0_ref``),
                                 # so about half the scales are negative.
                                 validation=ValidationHooks(negative_scales=True, block_scales=fallback_block_scales),
                                 # gguf-py 0.19 gguf.quants.dequantize (numpy float32, llama.cpp's block formulas)
                                 tool_decode=in_float32("gguf.quants.dequantize"),
                                 # a float Hugging Face model is written F32 / F16 / BF16 as convert_hf_to_gguf.py does
                                 output=OutputKind(suffix=".gguf", dense_source=True)))
