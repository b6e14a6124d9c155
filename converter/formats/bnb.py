"""bitsandbytes checkpoints saved by transformers ``save_pretrained`` (read only).

Storage (FORMATS.md section 6; bitsandbytes 0.50 ``nn/modules.py`` ``Linear8bitLt._save_to_state_dict``,
``Linear4bit._save_to_state_dict``, ``functional.py`` ``QuantState.as_dict`` / ``dequantize_4bit``,
``backends/default/ops.py`` ``int8_vectorwise_dequant``), for a Linear ``<p>`` of shape ``(out, in)``:

LLM.int8
    ``<p>.weight`` int8 ``[out, in]``, ``<p>.SCB`` float32 ``[out]`` (row absmax),
    ``<p>.weight_format`` uint8 scalar (0 = "row"; 1-3 are legacy tiled layouts: unsupported).
    Logical: 8-bit signed symmetric, per channel along ``out``, scale F32 = ``SCB * (1/127)``.
NF4 / FP4
    ``<p>.weight`` uint8 (or the ``quant_storage`` dtype) ``[ceil(out*in/2), 1]``: the row-major
    flattened codes, element ``2k`` in the HIGH nibble; ``<p>.weight.absmax`` float32
    ``[ceil(out*in/blocksize)]``; ``<p>.weight.quant_map`` float32 ``[16]`` (the codebook);
    ``<p>.weight.quant_state.bitsandbytes__nf4`` (or ``__fp4``) uint8 UTF-8 JSON with ``quant_type``,
    ``blocksize``, ``dtype``, ``shape`` (the blocksize is NOT in config.json). Blocks run over the
    flattened tensor and straddle rows (``GroupMap`` ``FLAT_BLOCK``).
    Double quant: ``absmax`` is uint8 with ``nested_absmax`` f32 ``[ceil(n_blocks/256)]``,
    ``nested_quant_map`` f32 ``[256]`` and ``nested_offset`` in the JSON; it is decoded to float32
    absmax exactly as ``dequantize_4bit`` does (``nested_quant_map[a] * nested_absmax[blk // nb]``,
    then ``+ nested_offset``, float32) and the tensor carries those float32 scales.
"""

from __future__ import annotations

import json

import numpy as np

from converter.double_quant import ScaleCoding
from converter.errors import CorruptFileError, FormatError, LayoutError, MissingTensorError, UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT, AxisMap
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, TensorSpec
from converter.formats.base import source_checkpoint
from converter.formats.registry import Detection, FormatHandler, register
from converter.formats.source import Source, module_prefix
from converter.formats.tool_decode import (ToolDecode, fixed_dtype, model_dtype, rounded_once, runtime_dtype,
                                           torch_dtype_name)

FORMAT = "bitsandbytes"
QS_PREFIX = ".weight.quant_state.bitsandbytes__"
INT8_SCHEME = QuantScheme(8, True, ZeroPoint.NONE, scale_dtype="F32")
#: bitsandbytes ``quantize_4bit`` into uint8: element ``2k`` in the high nibble (``(q[0::2] << 4) | q[1::2]``).
NIBBLE_ORDER = (1, 0)
#: Flattened 4-bit codes: one axis, high nibble first.
NIBBLE_MAP = AxisMap(stored_axes=(IN,), packed_axis=IN, bits=4, container="U8", order=NIBBLE_ORDER,
                     packing="stream")
_4BIT_PARTS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")


def quant_state(src: Source, p: str) -> tuple[str, dict]:
    """The packed JSON of a 4-bit layer ``p``: ``(stored name, dict)``.

    Raises
    ------
    CorruptFileError
        Not UTF-8 JSON; FormatError when keys are missing or malformed.
    """
    names = [n for n in src.tensor_names() if n.startswith(p + QS_PREFIX)]
    name = names[0]
    raw = np.array(src.read(name)).astype(np.uint8).tobytes()
    try:
        qs = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(f"quant_state is not UTF-8 JSON: {exc}", file=src.file_of(name), tensor=name) from None
    for key in ("quant_type", "blocksize", "shape"):
        if key not in qs:
            raise FormatError("quant_state lacks a key", file=src.file_of(name), tensor=name, field=key,
                              expected="present", found="absent")
    if qs["quant_type"] != name.rsplit("__", 1)[1]:
        raise FormatError("quant_type differs from the quant_state tensor name", file=src.file_of(name), tensor=name,
                          field="quant_type", expected=name.rsplit("__", 1)[1], found=qs["quant_type"])
    bs = qs["blocksize"]
    if not isinstance(bs, int) or bs <= 0:
        raise FormatError("blocksize must be a positive integer", file=src.file_of(name), tensor=name,
                          field="blocksize", found=bs)
    shape = qs["shape"]
    if not (isinstance(shape, list) and len(shape) == 2 and all(isinstance(d, int) and d > 0 for d in shape)):
        raise FormatError("shape must be [out, in]", file=src.file_of(name), tensor=name, field="shape", found=shape)
    return name, qs


def _spec_int8(src: Source, p: str) -> TensorSpec:
    wname, scb = f"{p}.weight", f"{p}.SCB"
    w, s = src.info(wname), src.info(scb)
    if w.dtype != "I8" or len(w.shape) != 2:
        raise FormatError("int8 weight must be I8 [out, in]", file=src.file_of(wname), tensor=wname, field="dtype",
                          expected="I8 [out, in]", found=f"{w.dtype} {list(w.shape)}")
    if s.dtype != "F32" or tuple(s.shape) != (w.shape[0],):
        raise FormatError("SCB must be float32 [out]", file=src.file_of(scb), tensor=scb, field="shape",
                          expected=f"F32 [{w.shape[0]}]", found=f"{s.dtype} {list(s.shape)}")
    stored = [src.stored_array(wname, "codes"), src.stored_array(scb, "scales", "SCB")]
    if src.has(f"{p}.weight_format"):
        stored.append(src.stored_array(f"{p}.weight_format", "other", "weight_format"))
    return TensorSpec(wname, "quantized", tuple(w.shape), tuple(stored), axes=(OUT, IN), scheme=INT8_SCHEME,
                      group_map=GroupMap.per_channel(OUT), notes=("bnb LLM.int8: scale = SCB * (1/127)",))


def _load_int8(src: Source, spec: TensorSpec) -> QuantizedTensor:
    p = module_prefix(spec.name)
    if src.has(f"{p}.weight_format"):
        fmt = np.array(src.read(f"{p}.weight_format")).reshape(-1)
        if fmt.size != 1 or int(fmt[0]) != 0:
            raise UnsupportedError("only the 'row' int8 weight format is supported",
                                   file=src.file_of(f"{p}.weight_format"),
                                   tensor=f"{p}.weight_format", field="weight_format", expected=0,
                                   found=fmt.tolist(), hint="1/2/3 are legacy col32/col_turing/col_ampere tiles")
    codes = np.array(src.read(spec.name))
    scb = np.array(src.read(f"{p}.SCB"), dtype=np.float32)
    scales = (scb * np.float32(1.0 / 127.0)).astype(np.float32).reshape(-1, 1)
    return QuantizedTensor(spec.name, spec.axes, codes, scales, INT8_SCHEME, spec.group_map,
                           stored={"codes": AxisMap((OUT, IN)), "scales": AxisMap((OUT,))})


def _spec_4bit(src: Source, p: str) -> tuple[TensorSpec, dict]:
    qs_name, qs = quant_state(src, p)
    wname = f"{p}.weight"
    file = src.file_of(wname)
    out_f, in_f = qs["shape"]
    n, bs = out_f * in_f, qs["blocksize"]
    n_blocks = -(-n // bs)
    w = src.info(wname)
    if w.nbytes != -(-n // 2):
        raise FormatError("packed 4-bit weight size contradicts quant_state shape", file=file, tensor=wname,
                          field="shape", expected=f"{-(-n // 2)} bytes for {qs['shape']}",
                          found=f"{w.nbytes} bytes {list(w.shape)}")
    for part in ("absmax", "quant_map"):
        if not src.has(f"{wname}.{part}"):
            raise MissingTensorError("4-bit weight lacks a partner", file=file, tensor=f"{wname}.{part}",
                                     expected="present", found="absent")
    qm = src.info(f"{wname}.quant_map")
    if qm.dtype != "F32" or tuple(qm.shape) != (16,):
        raise FormatError("quant_map must be float32 [16]", file=file, tensor=f"{wname}.quant_map", field="shape",
                          expected="F32 [16]", found=f"{qm.dtype} {list(qm.shape)}")
    am = src.info(f"{wname}.absmax")
    nested = am.dtype == "U8"
    if tuple(am.shape) != (n_blocks,) or am.dtype not in ("F32", "U8"):
        raise FormatError("absmax must be [ceil(out*in/blocksize)] float32 (uint8 when nested)", file=file,
                          tensor=f"{wname}.absmax", field="shape", expected=f"F32/U8 [{n_blocks}]",
                          found=f"{am.dtype} {list(am.shape)}")
    # each side array under its bitsandbytes name (QuantState.as_dict keys), not an anonymous "other"
    stored = [src.stored_array(wname, "codes"), src.stored_array(f"{wname}.absmax", "scales", "absmax"),
              src.stored_array(f"{wname}.quant_map", "other", "quant_map"),
              src.stored_array(qs_name, "other", "quant_state")]
    coding = None
    notes = [f"bnb {qs['quant_type']} blocksize {bs} (flat blocks over the row-major tensor)",
             f"decodes to {qs.get('dtype')}"]
    if nested:
        for part in ("nested_absmax", "nested_quant_map"):
            if not src.has(f"{wname}.{part}"):
                raise MissingTensorError("double-quant absmax lacks a partner", file=file, tensor=f"{wname}.{part}",
                                         expected="present", found="absent")
            stored.append(src.stored_array(f"{wname}.{part}", "scales" if part == "nested_absmax" else "other", part))
        if "nested_offset" not in qs:
            raise FormatError("double-quant quant_state lacks nested_offset", file=file, tensor=qs_name,
                              field="nested_offset", expected="a float", found="absent")
        # the scales' stored cost: an 8-bit absmax code per block, a float32 nested absmax per nested block
        # (nested_blocksize, 256 by default) and the float32 nested_offset (quantize_4bit compress_statistics)
        coding = ScaleCoding(code_bits=8, super_groups=int(qs.get("nested_blocksize", 256)), super_bytes=4,
                             tensor_bytes=4)
        notes.append("double quant: absmax decoded to float32 (nested_quant_map[a]*nested_absmax[blk]+offset)")
    # Scheme needs the codebook: a 16-float array (64 bytes), read with the headers.
    codebook = tuple(float(v) for v in np.array(src.read(f"{wname}.quant_map"), dtype=np.float32))
    scheme = QuantScheme(4, False, ZeroPoint.NONE, scale_dtype="F32", codebook=codebook)
    spec = TensorSpec(wname, "quantized", (out_f, in_f), tuple(stored), axes=(OUT, IN), scheme=scheme,
                      group_map=GroupMap(Granularity.FLAT_BLOCK, group_size=bs), scale_coding=coding,
                      notes=tuple(notes))
    return spec, qs


def decode_nested_absmax(codes: np.ndarray, nested_quant_map: np.ndarray, nested_absmax: np.ndarray,
                         nested_offset: float, nested_blocksize: int = 256) -> np.ndarray:
    """Double-quant absmax -> float32, as bitsandbytes ``dequantize_4bit`` does.

    ``absmax[k] = nested_quant_map[codes[k]] * nested_absmax[k // nested_blocksize] + nested_offset``,
    each step in float32 (``functional.py`` ``dequantize_blockwise`` then ``absmax += offset``).

    Parameters
    ----------
    codes : uint8, ``[n_blocks]``
    nested_quant_map : float32, ``[256]``
    nested_absmax : float32, ``[ceil(n_blocks / nested_blocksize)]``
    """
    vals = nested_quant_map.astype(np.float32)[codes]
    scale = np.repeat(nested_absmax.astype(np.float32), nested_blocksize)[: codes.size]
    out = vals * scale
    out += np.float32(nested_offset)
    return out.astype(np.float32)


def _load_4bit(src: Source, spec: TensorSpec, qs: dict) -> QuantizedTensor:
    wname = spec.name
    n = spec.shape[0] * spec.shape[1]
    try:
        raw = np.ascontiguousarray(src.read(wname)).view(np.uint8).reshape(-1)
        flat = NIBBLE_MAP.to_logical(raw, (IN,), {IN: n})
        codes = flat.reshape(spec.shape)
        absmax = np.array(src.read(f"{wname}.absmax"))
        if absmax.dtype == np.uint8:
            nbs = int(qs.get("nested_blocksize", 256))
            nabs = np.array(src.read(f"{wname}.nested_absmax"), dtype=np.float32).reshape(-1)
            if nabs.size != -(-absmax.size // nbs):
                raise FormatError("nested_absmax length contradicts nested_blocksize", file=src.file_of(wname),
                                  tensor=f"{wname}.nested_absmax", field="shape",
                                  expected=-(-absmax.size // nbs), found=nabs.size)
            absmax = decode_nested_absmax(absmax, np.array(src.read(f"{wname}.nested_quant_map"), dtype=np.float32),
                                          nabs, float(qs["nested_offset"]), nbs)
        return QuantizedTensor(wname, spec.axes, codes, absmax.astype(np.float32), spec.scheme, spec.group_map,
                               stored={"codes": NIBBLE_MAP})
    except LayoutError as exc:
        exc.with_context(file=src.file_of(wname), tensor=wname)
        raise


def read_bnb(src: Source) -> Checkpoint:
    """Read a transformers + bitsandbytes checkpoint into a lazily loaded :class:`Checkpoint`.

    Raises
    ------
    FormatError, MissingTensorError, CorruptFileError
        Shapes contradicting each other or the quant_state; absent partners.
    UnsupportedError
        Legacy int8 ``weight_format`` (raised when the tensor is loaded).
    """
    names = src.tensor_names()
    specs: dict[str, TensorSpec] = {}
    states: dict[str, dict] = {}
    owned: set[str] = set()
    for n in names:
        if n.endswith(".SCB"):
            p = n[: -len(".SCB")]
            if not src.has(f"{p}.weight"):
                raise MissingTensorError("SCB without an int8 weight", file=src.file_of(n), tensor=f"{p}.weight",
                                         expected="present", found="absent")
            specs[f"{p}.weight"] = _spec_int8(src, p)
            owned.update({f"{p}.weight", n, f"{p}.weight_format"})
        elif QS_PREFIX in n:
            p = n.split(QS_PREFIX)[0]
            if not src.has(f"{p}.weight"):
                raise MissingTensorError("quant_state without a packed weight", file=src.file_of(n),
                                         tensor=f"{p}.weight",
                                         expected="present", found="absent")
            spec, qs = _spec_4bit(src, p)
            specs[spec.name], states[spec.name] = spec, qs
            owned.update({f"{p}.weight", n}, {f"{p}.weight.{k}" for k in _4BIT_PARTS})
    for n in names:
        if n in owned:
            continue
        if n.endswith((".weight_format",) + tuple(f".weight.{k}" for k in _4BIT_PARTS)):
            raise MissingTensorError("quantization partner without its layer", file=src.file_of(n), tensor=n,
                                     expected="SCB or quant_state beside it", found="absent")
        specs[n] = src.dense_spec(n)
    def decode(name: str):
        if name in states:
            return _load_4bit(src, specs[name], states[name])
        return _load_int8(src, specs[name])

    quantized = {n for n, s in specs.items() if s.kind != "dense"}
    return source_checkpoint(src, FORMAT, specs, decode, quantized,
                             {"quantization_config": src.quantization_config,
                              "bnb_4bit_dtype": {n: qs.get("dtype") for n, qs in states.items()}})


#: ``int8_vectorwise_dequant``'s constant (bitsandbytes 0.50 ``backends/default/ops.py``): 1/127 as float32.
INT8_RECIPROCAL = np.float32(7.874015718698502e-3)


def bnb_tool_decode(ckpt: Checkpoint, spec: TensorSpec, runtime: str | None) -> ToolDecode:
    """How bitsandbytes 0.50 dequantizes a tensor (``qckpt dequantize --match-tool``).

    LLM.int8
        ``int8_vectorwise_dequant(weight, SCB)``: ``(weight * SCB) * 7.874015718698502e-3`` in float32, two
        roundings in that order (qckpt's exact decode folds ``SCB / 127`` into one scale first: up to an ulp
        apart). The result is float32 (fixed). Reads ``SCB`` from the source again: whole tensors only.
    NF4 / FP4
        ``dequantize_4bit``: ``quant_map[q] * absmax`` in float32 rounded once to ``quant_state.dtype``
        (``csrc/cpu_ops.cpp`` ``dequantizeBlockwise4bitCpu``: float product, one conversion to ``T``; bf16 by
        round to nearest even). That dtype is the model's at quantization time, recorded in the file's
        quant_state JSON (else config.json's ``dtype``); ``--tool-dtype`` overrides it (``dequantize_4bit``
        with that ``quant_state.dtype``: one rounding). Not reproduced: ``matmul_4bit``'s forward casts the
        decoded weight once more to the activations' (compute) dtype when that differs from
        ``quant_state.dtype`` (float16 decode, then bfloat16: two roundings).
    """
    if spec.scheme.codebook is None:
        tool = "bitsandbytes int8_vectorwise_dequant: (weight * SCB) * float32(1/127)"
        fixed_dtype(tool, "F32", runtime, "its result is float32", spec.name)
        scb = np.array(Source(ckpt.path).read(module_prefix(spec.name) + ".SCB"), dtype=np.float32).reshape(-1, 1)

        def decode(t: QuantizedTensor) -> np.ndarray:
            return (np.asarray(t.codes).astype(np.float32) * scb) * INT8_RECIPROCAL
        return ToolDecode(tool, "F32", decode, row_local=False)
    recorded = torch_dtype_name((ckpt.metadata.get("bnb_4bit_dtype") or {}).get(spec.name))
    dt = runtime_dtype("dequantize_4bit", runtime, recorded or model_dtype(ckpt.config), "F32")
    return rounded_once(f"bitsandbytes dequantize_4bit: round({dt.lower()}, quant_map[q] * absmax)", dt)


def detect_bnb(src: Source) -> Detection | None:
    """``quant_method: bitsandbytes`` -> 90; ``.SCB`` / ``quant_state.bitsandbytes__*`` names -> 60."""
    if src.kind == "gguf":
        return None
    if src.quantization_config.get("quant_method") == "bitsandbytes":
        return Detection(FORMAT, 90, "quantization_config.quant_method = bitsandbytes")
    if any(n.endswith(".SCB") or QS_PREFIX in n for n in src.tensor_names()):
        return Detection(FORMAT, 60, "bitsandbytes tensor names (.SCB / quant_state)")
    return None


HANDLER = register(FormatHandler(FORMAT, "bitsandbytes LLM.int8 / NF4 / FP4 (transformers save_pretrained; read only)",
                                 detect_bnb, read_bnb, tool_decode=bnb_tool_decode))
