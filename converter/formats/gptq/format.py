"""GPTQ checkpoints (AutoGPTQ, GPTQModel): ``checkpoint_format`` ``"gptq"`` (v1) and ``"gptq_v2"``.

Storage of one linear layer ``<p>`` (FORMATS.md section 1.1; AutoGPTQ
``qlinear_cuda_old.QuantLinear.__init__``, GPTQModel ``GPTQQuantLinear._register_gptq_buffers``):

============== ===== ================================ ===================================================
name           dtype stored shape                     meaning
============== ===== ================================ ===================================================
``<p>.qweight`` I32  ``[ceil(I*b/32), O]`` (in, out)  codes packed along ``in``, LSB-first stream
``<p>.qzeros``  I32  ``[nG, ceil(O*b/32)]`` (grp, out) zero points packed along ``out``; v1 stores ``z - 1``
``<p>.scales``  F16  ``[nG, O]`` (group, out)         one scale per (group, output) — transposed vs ``[O, nG]``
``<p>.g_idx``   I32  ``[I]``                          group of each input column (act-order map)
============== ===== ================================ ===================================================

``b`` in {2, 3, 4, 8}; 3-bit is a 96-bit stream per 3 words (AutoGPTQ ``QuantLinear.pack``'s
10/1/10/1/10 loop). Dequantization ``W[o, i] = scales[g_idx[i], o] * (q[i, o] - z[g_idx[i], o])``
(AutoGPTQ ``qlinear_cuda.QuantLinear.forward``; GPTQModel ``_dequantize_from_codes``).

Logical model produced by the reader: ``(out, in)`` unsigned codes; group map ``group(in, G)``
(with ``g_idx`` only when it is not the trivial ``i // G``) or ``channel(out)`` for
``group_size = -1`` (one scale per output channel, ``nG = 1``); scheme ``ZeroPoint.NONE`` when the
config says ``sym`` and every zero point equals ``2^(b-1)``, else ``ZeroPoint.INTEGER`` with the
zero points kept (a validator flags ``sym`` configs with other zeros).

v1 zero points
--------------
GPTQModel 7.x writes v1 by packing true zeros and then subtracting the packed constant
``0x55555555`` / ``0x11111111`` / ``0x01010101`` (2/4/8-bit) from each *word*
(``gptqmodel/utils/model.py`` ``convert_gptq_v2_to_v1_format_module``), and reads v1 by adding it
back to each word (``convert_gptq_v1_to_v2_format_module``); 3-bit uses a per-field ``(z - 1) & 7``
shift (``_correct_gptq_v1_qzeros``). This reader decodes v1 the same way (word-level, modulo 2^32),
which is the exact inverse of GPTQModel's writer even when a zero point of 0 borrowed from its
neighbour: the real samples were written by GPTQModel and need this rule
(sample_checkpoints/MANIFEST.json notes). AutoGPTQ's torch kernels instead add 1 per field and mask
(``zeros = (field + 1) & (2^b - 1)``); the two rules agree whenever no stored field is all ones.
:func:`decode_qzeros` with ``v1_rule="field"`` gives AutoGPTQ's reading, for comparisons. A word
from AutoGPTQ's *unmasked* packer (``0xFFF65432`` for zeros ``[3,4,5,6,7,0,2,9]``, CASES.md B03)
lost columns 6 and 7 at write time; no rule recovers them.

The writer refuses to write a zero point 0 as v1 (:class:`NotRepresentableError`, CASES.md B03);
``gptq_v2`` stores every zero as is.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from converter.errors import FormatError, MissingTensorError, NotRepresentableError, QuantizationError, UnsupportedError
from converter.groups import Granularity, GroupMap
from converter.layout import IN, OUT, AxisMap, PackedCodes
from converter.quant.recode import as_integer_zero, as_unsigned, exact_cast
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, StoredArray, TensorSpec, opaque_reason
from converter.formats.model_dir import write_model_dir
from converter.write.plan import TensorPlan, dense_plan
from converter.formats.registry import Detection, FormatHandler, register
from converter.formats.source import Source, module_prefix

SUPPORTED_BITS = (2, 3, 4, 8)
V1, V2 = "gptq", "gptq_v2"
#: Packed "+1 in every field" constant of GPTQModel's v1<->v2 conversion (int32 words).
V1_WORD_OFFSET = {2: 0x55555555, 4: 0x11111111, 8: 0x01010101}
PARTS = ("qweight", "qzeros", "scales", "g_idx")
SCALE_DTYPES = ("F16", "BF16", "F32")
QCKPT_QUANTIZER = "qckpt"


# -- storage description -------------------------------------------------------------------------
def codes_map(bits: int) -> AxisMap:
    """``qweight``: stored ``(in, out)``, packed along ``in`` into int32 words (LSB-first stream)."""
    return AxisMap((IN, OUT), packed_axis=IN, bits=bits, container="I32", packing="stream")


def zeros_map(bits: int) -> AxisMap:
    """``qzeros``: stored ``(group, out)`` (the group axis is ``in``), packed along ``out``."""
    return AxisMap((IN, OUT), packed_axis=OUT, bits=bits, container="I32", packing="stream")


#: ``scales``: stored ``(group, out)``, i.e. transposed relative to the logical ``(out, group)``.
SCALES_MAP = AxisMap((IN, OUT))


def packed_rows(n: int, bits: int) -> int:
    """Words holding ``n`` ``bits``-bit fields: ``ceil(n * bits / 32)`` (GPTQModel sizing)."""
    return -(-n * bits // 32)


def decode_qzeros(words: np.ndarray, bits: int, n_out: int, *, v1: bool, v1_rule: str = "word") -> np.ndarray:
    """Unpack a ``qzeros`` array to logical zero points.

    Parameters
    ----------
    words : ndarray of int32, shape ``(nG, ceil(O*b/32))`` (stored axes ``(group, out)``)
    bits : int, one of 2, 3, 4, 8
    n_out : int, ``O``
    v1 : bool
        Stored values are ``z - 1`` (checkpoint_format ``"gptq"``).
    v1_rule : {"word", "field"}
        ``"word"``: add the packed constant to each word modulo 2^32, then unpack (GPTQModel
        ``convert_gptq_v1_to_v2_format_module``; 3-bit: per-field ``(f + 1) & 7``). ``"field"``:
        unpack, then ``(f + 1) & (2^b - 1)`` per field (AutoGPTQ ``QuantLinear.forward``).

    Returns
    -------
    ndarray of uint8, shape ``(O, nG)`` (logical ``(out, group)``).
    """
    amap = zeros_map(bits)
    sizes = {IN: words.shape[0], OUT: n_out}
    w = np.asarray(words).view(np.uint32)
    if v1 and v1_rule == "word" and bits in V1_WORD_OFFSET:
        w = w + np.uint32(V1_WORD_OFFSET[bits])  # uint32 arithmetic wraps modulo 2^32
        return amap.to_logical(w, (OUT, IN), sizes)
    z = amap.to_logical(w, (OUT, IN), sizes)
    if v1:
        z = ((z.astype(np.uint16) + 1) & ((1 << bits) - 1)).astype(np.uint8)
    return z


def encode_qzeros(zeros: np.ndarray, bits: int, *, v1: bool) -> np.ndarray:
    """Pack logical zero points ``(O, nG)`` (uint8, all >= 1 when ``v1``) into int32 ``(nG, ceil(O*b/32))``.

    v1 stores ``z - 1`` per field; with no zero equal to 0 this equals GPTQModel's word-level
    subtraction of the packed constant (no borrow).
    """
    z = zeros.astype(np.uint8)
    if v1:
        z = z - np.uint8(1)
    return zeros_map(bits).to_stored(z, (OUT, IN))


# -- config ----------------------------------------------------------------------------------------
def checkpoint_format_of(qcfg: Mapping[str, Any], *, file: Any = None) -> str:
    """``checkpoint_format`` / ``format`` of a GPTQ config; missing means v1 (AutoGPTQ 0.7.1 writes neither)."""
    a, b = qcfg.get("checkpoint_format"), qcfg.get("format")
    if a is not None and b is not None and a != b:
        raise FormatError("'checkpoint_format' and 'format' disagree", file=file, field="quantization_config.format",
                          expected=a, found=b)
    fmt = a if a is not None else (b if b is not None else V1)
    if fmt not in (V1, V2):
        raise UnsupportedError("GPTQ checkpoint format not supported (kernel-tiled or planar layout)", file=file,
                               field="quantization_config.checkpoint_format", expected=[V1, V2], found=fmt,
                               hint="only 'gptq' (v1) and 'gptq_v2' are read; convert through the producing tool")
    return fmt


def _dynamic_rule(qcfg: Mapping[str, Any], module: str) -> dict | None:
    """GPTQModel ``dynamic`` overrides for ``module``: first matching pattern wins (``re.match``).

    Returns ``None`` when the module is skipped (``"-:regex"``), else the override dict (may be empty).
    """
    dyn = qcfg.get("dynamic") or {}
    for pattern, override in dyn.items():
        if pattern.startswith("-:"):
            if re.match(pattern[2:], module):
                return None
            continue
        pat = pattern[2:] if pattern.startswith("+:") else pattern
        if re.match(pat, module):
            return dict(override or {})
    return {}


def _bool(v: Any, default: bool) -> bool:
    return default if v is None else bool(v)


# -- header parsing --------------------------------------------------------------------------------
class _Module:
    """Header facts of one quantized linear ``prefix`` (no data read)."""

    def __init__(self, src: Source, prefix: str, qcfg: Mapping[str, Any], fmt: str) -> None:
        self.prefix = prefix
        self.name = prefix + ".weight"
        n = {p: f"{prefix}.{p}" for p in PARTS}
        self.names = n
        qfile = src.file_of(n["qweight"])
        self.file = qfile
        for partner in ("scales", "qzeros"):
            if not src.has(n[partner]):
                raise MissingTensorError(f"qweight without its partner {partner}", file=qfile, tensor=n["qweight"],
                                         field=partner, expected=n[partner], found="absent")
        info = {p: src.info(n[p]) for p in PARTS if src.has(n[p])}
        self.info = info

        def bad(part: str, msg: str, field: str, expected: Any, found: Any) -> FormatError:
            return FormatError(msg, file=src.file_of(n[part]), tensor=n[part], field=field, expected=expected,
                               found=found)

        for p in ("qweight", "qzeros"):
            if info[p].dtype != "I32":
                raise bad(p, "GPTQ packs into int32 words", "dtype", "I32", info[p].dtype)
        if info["scales"].dtype not in SCALE_DTYPES:
            raise bad("scales", "unsupported scale dtype", "dtype", list(SCALE_DTYPES), info["scales"].dtype)
        if "g_idx" in info and info["g_idx"].dtype not in ("I32", "I64"):
            raise bad("g_idx", "g_idx must be an integer array", "dtype", "I32", info["g_idx"].dtype)
        for p, rank in (("qweight", 2), ("qzeros", 2), ("scales", 2), ("g_idx", 1)):
            if p in info and len(info[p].shape) != rank:
                raise bad(p, "wrong rank", "shape", f"{rank}-D", list(info[p].shape))

        rule = _dynamic_rule(qcfg, prefix)
        cfg = {**qcfg, **(rule or {})}
        rows, n_out = info["qweight"].shape
        n_groups, n_out_s = info["scales"].shape
        bits = cfg.get("bits")
        if bits is None:
            bits = self._infer_bits(info, n_out_s, qfile)
        if bits not in SUPPORTED_BITS:
            raise UnsupportedError("GPTQ bit width not supported", file=qfile, tensor=n["qweight"],
                                   field="quantization_config.bits", expected=list(SUPPORTED_BITS), found=bits)
        self.bits = int(bits)
        self.fmt = fmt
        self.sym = _bool(cfg.get("sym"), True)  # AutoGPTQ from_quant_config assumes True when missing
        self.desc_act = _bool(cfg.get("desc_act"), False)
        meta = cfg.get("meta") if isinstance(cfg.get("meta"), dict) else {}
        static = _bool(cfg.get("static_groups", meta.get("static_groups")), False)
        O = int(n_out_s)
        if n_out != O:
            raise bad("qweight", "qweight columns differ from scales columns (out features)", "shape",
                      ["ceil(I*b/32)", O], list(info["qweight"].shape))
        if "g_idx" in info:
            I = int(info["g_idx"].shape[0])
        else:
            I = rows * 32 // self.bits  # without g_idx the unpadded width is assumed
        if rows != packed_rows(I, self.bits):
            raise bad("qweight", f"qweight rows inconsistent with {self.bits}-bit codes for {I} input features",
                      "shape", [packed_rows(I, self.bits), O], list(info["qweight"].shape))
        zshape = (int(n_groups), packed_rows(O, self.bits))
        if tuple(info["qzeros"].shape) != zshape:
            raise bad("qzeros", f"qzeros shape inconsistent with {self.bits}-bit zero points of {O} outputs "
                      f"and {n_groups} groups", "shape", list(zshape), list(info["qzeros"].shape))
        gs = cfg.get("group_size")
        if gs is None:
            gs = self._infer_group(I, int(n_groups), qfile)
        if isinstance(gs, bool) or not isinstance(gs, int):
            raise FormatError("group_size must be an integer", file=qfile, field="quantization_config.group_size",
                              expected="-1 or an integer >= 1", found=repr(gs)[:80])
        if gs == -1 or gs == 0:
            self.group_size = None
            if n_groups != 1:
                raise bad("scales", "per-channel GPTQ (group_size -1) has one group", "shape", [1, O],
                          list(info["scales"].shape))
            self.group_map = GroupMap.per_channel(OUT)
        elif gs < 0:
            raise FormatError("group_size must be positive or -1", file=qfile, field="quantization_config.group_size",
                              expected="-1 or >= 1", found=gs)
        else:
            self.group_size = gs
            if n_groups != -(-I // gs):
                raise bad("scales", f"scales rows differ from ceil(I/group_size) = ceil({I}/{gs})", "shape",
                          [-(-I // gs), O], list(info["scales"].shape))
            self.group_map = GroupMap.per_group(gs, IN)
        self.O, self.I, self.n_groups = O, I, int(n_groups)
        self.scale_dtype = info["scales"].dtype
        self.act_order = self.desc_act and not static and self.group_size is not None

    @staticmethod
    def _infer_bits(info, O: int, qfile) -> int:
        width = info["qzeros"].shape[1]
        cands = [b for b in SUPPORTED_BITS if packed_rows(O, b) == width]
        if len(cands) != 1:
            raise FormatError("no 'bits' in the config and the qzeros width does not determine it", file=qfile,
                              field="quantization_config.bits", expected="one of 2, 3, 4, 8",
                              found=f"candidates {cands} for qzeros width {width}, O={O}",
                              hint="add quantize_config.json with bits and group_size")
        return cands[0]

    @staticmethod
    def _infer_group(I: int, n_groups: int, qfile) -> int:
        if n_groups == 1:
            return -1
        cands = [1 << k for k in range(2, 16) if -(-I // (1 << k)) == n_groups]
        if len(cands) != 1:
            raise FormatError("no 'group_size' in the config and the scales rows do not determine it", file=qfile,
                              field="quantization_config.group_size", found=f"{n_groups} groups for I={I}",
                              hint="add quantize_config.json with bits and group_size")
        return cands[0]

    def stored(self, src: Source) -> tuple[StoredArray, ...]:
        roles = {"qweight": "codes", "qzeros": "zero_points", "scales": "scales", "g_idx": "g_idx"}
        return tuple(src.stored_array(self.names[p], roles[p]) for p in self.info)

    def zeros(self, src: Source) -> np.ndarray:
        """Decoded zero points, ``(out, group)`` uint8 (``qzeros`` is small: ``nG * O * b / 8`` bytes)."""
        return decode_qzeros(src.read(self.names["qzeros"]), self.bits, self.O, v1=self.fmt == V1)

    def decide_scheme(self, src: Source) -> QuantScheme:
        """The one scheme this tensor is planned and loaded with, decided once from config AND data.

        ``ZeroPoint.NONE`` when the config says ``sym`` and every decoded zero point equals the
        centre ``2^(b-1)``; otherwise ``ZeroPoint.INTEGER`` (the stored zeros are kept, never
        dropped). Reads ``qzeros`` only; the result is cached so :meth:`spec` and :meth:`load` agree.
        """
        if getattr(self, "_scheme", None) is None:
            zp = ZeroPoint.INTEGER
            if self.sym and bool(np.all(self.zeros(src) == (1 << (self.bits - 1)))):
                zp = ZeroPoint.NONE
            self._scheme = QuantScheme(self.bits, False, zp, self.scale_dtype)
        return self._scheme

    def spec(self, src: Source) -> TensorSpec:
        scheme = self.decide_scheme(src)
        notes = [f"checkpoint_format {self.fmt}" + (" (stored zero points are z-1)" if self.fmt == V1 else "")]
        declared = None
        if self.sym and scheme.zero_point is not ZeroPoint.NONE:
            declared = QuantScheme(self.bits, False, ZeroPoint.NONE, self.scale_dtype)
            notes.append(f"config says sym but stored zero points are not all {1 << (self.bits - 1)}: "
                         f"read with integer zero points")
        if self.group_size and self.I % self.group_size:
            notes.append(f"partial final group: {self.I % self.group_size} of {self.group_size} "
                         f"(padded I = {self.n_groups * self.group_size})")
        return TensorSpec(self.name, "quantized", (self.O, self.I), self.stored(src), axes=(OUT, IN),
                          scheme=scheme, group_map=self.group_map, act_order=self.act_order, notes=tuple(notes),
                          declared_scheme=declared)

    def load(self, src: Source) -> QuantizedTensor:
        n, b, O, I, nG = self.names, self.bits, self.O, self.I, self.n_groups
        codes = PackedCodes(src.read(n["qweight"]), codes_map(b), (OUT, IN), {IN: I, OUT: O}, signed=False)
        scales = np.ascontiguousarray(SCALES_MAP.to_logical(src.read(n["scales"]), (OUT, IN), {IN: nG, OUT: O}))
        zeros = self.zeros(src)
        gm = self.group_map
        if src.has(n["g_idx"]):
            g_idx = np.asarray(src.read(n["g_idx"]))
            if I and (int(g_idx.min()) < 0 or int(g_idx.max()) >= nG):
                raise FormatError("g_idx out of range", file=src.file_of(n["g_idx"]), tensor=n["g_idx"],
                                  field="g_idx", expected=f"[0, {nG})",
                                  found=f"[{int(g_idx.min())}, {int(g_idx.max())}]")
            if self.group_size is not None:
                g_idx = g_idx.astype(np.int32)
                gm = GroupMap.per_group(self.group_size, IN, None if GroupMap.per_group(
                    self.group_size, IN, g_idx).is_trivial_g_idx(I) else g_idx)
        scheme = self.decide_scheme(src)
        zp = zeros
        if scheme.zero_point is ZeroPoint.NONE:
            if not bool(np.all(zeros == scheme.center)):  # the file changed after it was read
                raise FormatError("qzeros changed since the checkpoint was read", file=src.file_of(n["qzeros"]),
                                  tensor=n["qzeros"], field="qzeros", expected=f"all {scheme.center}",
                                  found="other values")
            zp = None
        stored = {"codes": codes_map(b), "zero_points": zeros_map(b), "scales": SCALES_MAP}
        return QuantizedTensor(self.name, (OUT, IN), codes, scales, scheme, gm, zero_points=zp, stored=stored)


# -- reader ----------------------------------------------------------------------------------------
def _quant_config(src: Source) -> dict:
    qcfg = dict(src.quantization_config or {})
    qm = qcfg.get("quant_method")
    if qm is not None and str(qm).lower() != "gptq":
        raise FormatError("config does not describe a GPTQ checkpoint", file=src.path,
                          field="quantization_config.quant_method", expected="gptq", found=qm)
    pack = qcfg.get("pack_dtype", "int32")
    if str(pack).replace("torch.", "") != "int32":
        raise UnsupportedError("only int32 packing words are supported", file=src.path,
                               field="quantization_config.pack_dtype", expected="int32", found=pack)
    if qcfg.get("is_marlin_format"):
        raise UnsupportedError("legacy Marlin-format GPTQ is a kernel-tiled layout", file=src.path,
                               field="quantization_config.is_marlin_format", expected=False, found=True)
    return qcfg


def read_gptq(src: Source) -> Checkpoint:
    """Read a GPTQ model directory (or safetensors file) into a lazily loaded :class:`Checkpoint`.

    Raises
    ------
    MissingTensorError
        A ``qweight`` without ``scales`` / ``qzeros`` (or parts without ``qweight``).
    FormatError
        Shapes inconsistent with ``bits`` / ``group_size`` (expected vs found), bad dtypes, ``g_idx``
        out of range (when loaded), a contradicting config.
    UnsupportedError
        Other GPTQ layouts (``marlin``, ``gptq_p``), ``pack_dtype`` other than int32, bits outside {2,3,4,8}.
    """
    qcfg = _quant_config(src)
    fmt = checkpoint_format_of(qcfg, file=src.path)
    names = src.tensor_names()
    prefixes = [nm[: -len(".qweight")] for nm in names if nm.endswith(".qweight")]
    owned = {f"{p}.{part}" for p in prefixes for part in PARTS}
    for nm in names:
        for part in PARTS[1:]:
            if nm.endswith("." + part) and nm not in owned:
                q = nm[: -len(part)] + "qweight"
                raise MissingTensorError(f"{part} without its qweight", file=src.file_of(nm), tensor=nm,
                                         field="qweight", expected=q, found="absent")
    modules = {m.name: m for m in (_Module(src, p, qcfg, fmt) for p in prefixes)}
    specs: dict[str, TensorSpec] = {}
    for nm in names:
        if nm in owned:
            continue
        specs[nm] = src.dense_spec(nm)
    for name, m in modules.items():
        if name in specs:
            raise FormatError("a dense tensor and a quantized layer share a name", file=src.file_of(name), tensor=name)
        specs[name] = m.spec(src)
    specs = dict(sorted(specs.items()))

    def load(name: str):
        m = modules.get(name)
        return m.load(src) if m is not None else src.dense(name)

    meta = {"checkpoint_format": fmt, "quantization_config": qcfg,
            "v1_zero_decode": ("word-level + packed constant (GPTQModel convert_gptq_v1_to_v2_format_module); "
                               "3-bit per field") if fmt == V1 else None}
    return Checkpoint(specs, load, format="gptq", path=str(src.path), config=src.config, metadata=meta,
                      files=[str(f) for f in src.files], extra_files=[str(p) for p in src.extra_files()])


def detect_gptq(src: Source) -> Detection | None:
    """quant_method "gptq" in the config: 90; tensor names only (``qweight`` + ``g_idx``, or GPTQ shapes): 60."""
    if src.kind == "gguf":
        return None
    qcfg = src.quantization_config or {}
    qm = str(qcfg.get("quant_method", "")).lower()
    if qm == "gptq":
        return Detection("gptq", 90, "quantization_config.quant_method = gptq")
    if qm:
        return None
    names = set(src.tensor_names())
    for nm in names:
        if not nm.endswith(".qweight"):
            continue
        p = nm[: -len(".qweight")]
        if f"{p}.scales" not in names or f"{p}.qzeros" not in names:
            continue
        qi, si = src.info(nm), src.info(f"{p}.scales")
        if f"{p}.g_idx" in names or (len(qi.shape) == 2 and len(si.shape) == 2 and qi.shape[1] == si.shape[1]):
            return Detection("gptq", 60, f"GPTQ tensor names and shapes ({p}.qweight/.qzeros/.scales)")
    return None


# -- writer ----------------------------------------------------------------------------------------
def check_target(spec: TensorSpec) -> str | None:
    """``None`` when ``spec`` can be stored in GPTQ without requantizing, else the reason.

    Accepted: 2/3/4/8-bit codes (signed codes are shifted to unsigned, an exact re-expression),
    symmetric or integer zero points (a float bias is accepted here and checked per group at write
    time: exact only when ``-bias/scale`` is an integer in range, :func:`as_integer_zero`), groups along ``in`` (any size, act-order ``g_idx``) or one
    scale per output channel (or per tensor, broadcast), F16 scales, or BF16 / F8_E4M3 scales whose
    cast to fp16 is checked exact at write time. F32 scales are refused here: GPTQ stores fp16 and
    the cast is exact only for fp16-representable values (write with ``allow_scale_rounding=True``).
    """
    if spec.kind != "quantized":
        return opaque_reason(spec)  # None for dense tensors
    s, gm = spec.scheme, spec.group_map
    if tuple(spec.axes or ()) != (OUT, IN):
        return f"GPTQ stores 2-D (out, in) linear weights, not axes {list(spec.axes or ())}"
    if s.codebook is not None:
        return "GPTQ stores integer grids, not codebook indices (NF4/FP4); requantize"
    if s.bits not in SUPPORTED_BITS:
        return f"GPTQ supports bits {list(SUPPORTED_BITS)}, not {s.bits}; requantize"
    if gm.granularity is Granularity.GROUP and gm.axis != IN:
        return f"GPTQ groups run along in, not {gm.axis}"
    if gm.granularity is Granularity.CHANNEL and gm.axis != OUT:
        return "GPTQ per-channel scales are per output channel, not per input column"
    if gm.granularity is Granularity.FLAT_BLOCK:
        return "flat blocks over the flattened tensor (bitsandbytes) do not map onto GPTQ groups; requantize"
    if s.scale_dtype == "F32":
        return "GPTQ stores fp16 scales; F32 scales round unless each is fp16-representable (requantize with --scale-dtype f16)"
    if s.scale_dtype == "F8_E8M0":
        return "E8M0 (power-of-two) scales exceed the fp16 range; requantize"
    return None


def _gptq_params(spec: TensorSpec) -> tuple[int, int, int, int]:
    """(O, I, nG, group_size_cfg) for a writable spec (group_size_cfg -1 = per channel)."""
    O, I = (int(x) for x in spec.shape)
    gm = spec.group_map
    if gm.granularity is Granularity.GROUP:
        return O, I, -(-I // gm.group_size), int(gm.group_size)
    return O, I, 1, -1


def _scales_fp16(scales: np.ndarray, name: str, allow_rounding: bool) -> tuple[np.ndarray, str | None]:
    if scales.dtype == np.float16:
        return scales, None
    s32 = scales.astype(np.float32)
    with np.errstate(over="ignore"):
        s16 = s32.astype(np.float16)
    if not np.all(np.isfinite(s16[np.isfinite(s32)])) or np.any((s16 == 0) & (s32 != 0)):
        raise QuantizationError("scale overflows or underflows fp16", tensor=name, field="scales",
                                expected="|scale| in the fp16 range", found=f"max |s| {float(np.max(np.abs(s32))):g}",
                                hint="requantize with fp16 scales")
    try:
        return exact_cast(s32, np.float16, tensor=name, field="scales", message="scale not representable in fp16",
                          expected="fp16-representable scales",
                          hint="requantize with --scale-dtype f16 to round scales to fp16", nan_exact=False), "scales cast to fp16 (exact)"
    except NotRepresentableError:
        if not allow_rounding:
            raise
    return s16, "scales rounded to fp16 (not exact)"


def _encode(t: QuantizedTensor, *, v1: bool, allow_rounding: bool, notes: list[str]) -> dict[str, np.ndarray]:
    prefix = module_prefix(t.name)
    if t.scheme.signed:
        t = as_unsigned(t)
        notes.append("signed codes shifted to unsigned (+2^(b-1)), exact")
    if t.scheme.zero_point is ZeroPoint.FLOAT:  # MLX / GGUF _1 biases: exact only when -bias/scale is integral
        t = as_integer_zero(t)
        note = "float bias re-expressed as integer zero points z = -bias/scale (checked exact)"
        if note not in notes:
            notes.append(note)
    s, gm = t.scheme, t.group_map
    O, I = t.shape
    b = s.bits
    scales = t.scales
    if gm.granularity is Granularity.TENSOR:  # broadcast to per output channel (exact)
        scales = np.broadcast_to(scales, (O, 1))
    if s.zero_point is ZeroPoint.NONE:
        zeros = np.full(scales.shape, s.center, dtype=np.uint8)
    else:
        zeros = np.broadcast_to(t.zero_points, scales.shape).astype(np.uint8)
    if v1 and zeros.size and int(zeros.min()) == 0:
        o, g = (int(x) for x in np.unravel_index(int(np.argmin(zeros)), zeros.shape))
        raise NotRepresentableError("GPTQ v1 stores z-1 and cannot hold a zero point of 0", tensor=t.name,
                                    field="zero_points", expected="zero points >= 1 for checkpoint_format 'gptq'",
                                    found=f"zero point 0 at out {o}, group {g} ({int((zeros == 0).sum())} in total)",
                                    hint="write checkpoint_format='gptq_v2' (stores zero points as is)")
    s16, note = _scales_fp16(np.asarray(scales), t.name, allow_rounding)
    if note and note not in notes:
        notes.append(note)
    nG = s16.shape[1]
    if gm.granularity is Granularity.GROUP:
        g_idx = gm.g_idx if gm.g_idx is not None else (np.arange(I, dtype=np.int32) // gm.group_size)
    else:
        g_idx = np.zeros(I, dtype=np.int32)
    raw = t.packed if t.packed is not None else t.codes
    return {f"{prefix}.qweight": codes_map(b).store_codes(raw, (OUT, IN)),
            f"{prefix}.qzeros": encode_qzeros(zeros, b, v1=v1),
            f"{prefix}.scales": SCALES_MAP.to_stored(np.ascontiguousarray(s16), (OUT, IN)),
            f"{prefix}.g_idx": np.ascontiguousarray(g_idx, dtype=np.int32)}


def gptq_plan(spec: TensorSpec, *, v1: bool, allow_rounding: bool = False) -> TensorPlan:
    """Plan for one quantized spec: output names, dtypes and shapes from the spec alone."""
    O, I, nG, _ = _gptq_params(spec)
    b = spec.scheme.bits
    prefix = module_prefix(spec.name)
    outs = [(f"{prefix}.qweight", "I32", (packed_rows(I, b), O)),
            (f"{prefix}.qzeros", "I32", (nG, packed_rows(O, b))),
            (f"{prefix}.scales", "F16", (nG, O)),
            (f"{prefix}.g_idx", "I32", (I,))]
    notes: list[str] = ["exact repack"]
    gm = spec.group_map
    if gm.granularity is Granularity.GROUP and I % gm.group_size:
        notes.append(f"partial final group ({I % gm.group_size} of {gm.group_size}); kernels without auto-padding "
                     f"need I padded to {nG * gm.group_size} with zero weights (CASES.md B14)")
    if I % 32:
        notes.append("in_features not a multiple of 32: AutoGPTQ 0.7.1 (I//32*b rows) cannot load this layer")
    if gm.granularity is Granularity.TENSOR:
        notes.append("per-tensor scale broadcast to per-output-channel (exact)")
    if spec.scheme.scale_dtype != "F16":
        notes.append(f"{spec.scheme.scale_dtype} scales cast to fp16 (checked exact at write time)")
    return TensorPlan(spec.name, outs, lambda t: _encode(t, v1=v1, allow_rounding=allow_rounding, notes=notes), notes)


def write_gptq(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, checkpoint_format: str = V2,
               allow_scale_rounding: bool = False, max_shard_bytes: int | None = None,
               detect_symmetric: bool = True, **_: Any) -> dict:
    """Write ``ckpt`` as a GPTQ model directory (``model.safetensors``, ``config.json``, ``quantize_config.json``).

    Parameters
    ----------
    checkpoint_format : {"gptq_v2", "gptq"}
        ``"gptq"`` (v1) stores ``z - 1`` and refuses a zero point of 0 (CASES.md B03).
    allow_scale_rounding : bool
        Round F32 (or other non-fp16) scales to fp16 when the cast is not exact.
    detect_symmetric : bool
        When every integer zero point (or float bias ``-2^(b-1) * s``) equals the centre
        ``2^(b-1)``, write ``sym: true`` (the stored ``qzeros`` are the same either way; symmetric-only
        kernels such as vLLM's GPTQ-Marlin need the flag). Reads each such tensor once more.

    Raises
    ------
    NotRepresentableError
        A tensor's scheme does not fit GPTQ (reason from :func:`check_target`), mixed bits /
        group sizes across layers, or a v1 zero point of 0.
    """
    ckpt.refuse_opaque("gptq")
    if checkpoint_format not in (V1, V2):
        raise FormatError("unknown GPTQ checkpoint format", field="checkpoint_format", expected=[V1, V2],
                          found=checkpoint_format)
    v1 = checkpoint_format == V1
    plans, layouts, sym, act, lm_head = [], set(), True, False, False
    for spec in ckpt.specs():
        if spec.kind == "dense":
            plans.append(dense_plan(spec))
            continue
        reason = check_target(spec)
        if reason and not (allow_scale_rounding and spec.scheme.scale_dtype == "F32"
                           and check_target(_with_scale(spec, "F16")) is None):
            raise NotRepresentableError(reason, tensor=spec.name, field="scheme", hint="requantize to a GPTQ scheme")
        layouts.add((spec.scheme.bits, _gptq_params(spec)[3]))
        sym &= spec.scheme.zero_point is ZeroPoint.NONE
        act |= bool(spec.act_order)
        lm_head |= spec.name.startswith("lm_head")
        plans.append(gptq_plan(spec, v1=v1, allow_rounding=allow_scale_rounding))
    if not sym and detect_symmetric:
        sym = _all_zero_points_centred(ckpt)
    if len(layouts) > 1:
        raise NotRepresentableError("GPTQ config holds one bits/group_size for all layers", field="quantization_config",
                                    expected="uniform (bits, group_size)", found=sorted(layouts),
                                    hint="requantize to one scheme (per-module 'dynamic' overrides are not written)")
    bits, group = next(iter(layouts)) if layouts else (4, 128)
    base = {}
    src_q = (ckpt.config or {}).get("quantization_config")
    src_q = src_q if ckpt.format == "gptq" and isinstance(src_q, dict) else None
    if src_q is not None:
        base = {k: v for k, v in src_q.items() if k != "dynamic"}
    base.update(_not_converted(ckpt, src_q))
    meta = dict(base.get("meta") or {})
    meta["quantizer"] = [QCKPT_QUANTIZER]
    meta.setdefault("static_groups", False)
    qc = {**base, "quant_method": "gptq", "method": "gptq", "bits": bits, "group_size": group, "desc_act": act,
          "sym": sym, "checkpoint_format": checkpoint_format, "format": checkpoint_format, "pack_dtype": "int32",
          "lm_head": lm_head, "meta": meta}
    # drop any other format's quantization keys (an MLX source's "quantization" would make the
    # output claim to be MLX as well)
    config = {**{k: v for k, v in (ckpt.config or {}).items() if k not in ("quantization", "quantization_config")},
              "quantization_config": qc}
    result = write_model_dir(Path(dst), plans, ckpt, metadata={"format": "pt"}, config=config,
                             extra_json={"quantize_config.json": qc}, extra_files=ckpt.extra_files,
                             max_shard_bytes=max_shard_bytes, overwrite=overwrite)
    result["notes"] = {p.source: list(p.notes) for p in plans}
    result["quantization_config"] = qc
    return result


_BLOCK_RE = re.compile(r"^(?P<block>.+?\.(?:layers|h|blocks|block|layer)\.\d+)\.(?P<rel>.+)$")


def _not_converted(ckpt: Checkpoint, src_q: Mapping[str, Any] | None) -> dict[str, Any]:
    """The config keys that name the Linear modules written dense, so no loader converts them.

    - ``dynamic``: a GPTQModel negative rule ``"-:^<module>$": {}`` per dense Linear-like module
      (:func:`converter.formats.modules.dense_linear_modules`), plus the source's own ``-:`` rules;
    - ``modules_in_block_to_quantize`` (transformers / optimum ``GPTQQuantizer.convert_model``, which
      converts every Linear of the decoder blocks unless this list is given; matched with
      ``name.endswith``): the quantized modules' names within a block, when a block holds a dense one.

    Raises
    ------
    NotRepresentableError
        A module name quantized in one block and dense in another (optimum's list is per block).
    """
    dense = dense_linear_modules(ckpt.specs())
    rules = {k: v for k, v in ((src_q or {}).get("dynamic") or {}).items() if str(k).startswith("-:")}
    for m in dense:
        rules[f"-:^{re.escape(m)}$"] = {}
    out: dict[str, Any] = {"dynamic": rules} if rules else {}
    in_block = [m for m in dense if _BLOCK_RE.match(m)]
    if in_block:
        quantized = sorted({mt.group("rel") for n in ckpt.quantized_names() if (mt := _BLOCK_RE.match(module_prefix(n)))})
        clash = next(((m, q) for m in in_block for q in quantized if m.endswith(q)), None)
        if clash:
            raise NotRepresentableError("a module is dense in one decoder block and quantized in another: "
                                        "transformers' GPTQ loader converts the same modules in every block",
                                        tensor=clash[0] + ".weight", field="modules_in_block_to_quantize",
                                        expected="the same modules quantized in every block", found=clash[1],
                                        hint="requantize every block alike, or keep that module dense everywhere")
        out["modules_in_block_to_quantize"] = [quantized]
    return out


def _all_zero_points_centred(ckpt: Checkpoint) -> bool:
    """True when every quantized tensor is symmetric or has all zero points at the unsigned centre."""
    for spec in ckpt.specs():
        if spec.kind != "quantized" or spec.scheme.zero_point is ZeroPoint.NONE:
            continue
        try:
            t = as_integer_zero(as_unsigned(ckpt[spec.name]))
        except NotRepresentableError:
            return False
        if t.zero_points is None or not np.all(t.zero_points == t.scheme.center):
            return False
    return True


def _with_scale(spec: TensorSpec, dtype: str) -> TensorSpec:
    from dataclasses import replace
    return replace(spec, scheme=spec.scheme.replace(scale_dtype=dtype))


from converter.formats.modules import dense_linear_modules, hf_linear_policy  # noqa: E402

HANDLER = register(FormatHandler("gptq", "GPTQ (AutoGPTQ / GPTQModel), checkpoint_format gptq (v1) or gptq_v2",
                                 detect_gptq, read_gptq, write_gptq, check_target=check_target,
                                 keep_dense=hf_linear_policy("gptq"), partial_groups=False,
                                 float_bias="integer", scale_dtype="F16"))


# -- validation hooks (converter/validate/hooks.py) ------------------------------------------------
def zero_convention_evidence(src: Source, spec: TensorSpec) -> dict | None:
    """Which GPTQ zero convention the stored ``qzeros`` fields follow (CASES.md B01; FORMATS.md section 1.3).

    For a symmetric config every raw field is a marker: ``2^(b-1) - 1`` (v1 stores ``z - 1``) or
    ``2^(b-1)`` (v2 stores ``z``). Asymmetric zeros carry no marker (``inferred`` is None; the
    validator's generic zero-offset check covers them).

    Returns
    -------
    dict ``{"claimed", "inferred", "sym", "raw_field_counts", "stored_tensor"}`` or None when the
    spec has no stored ``qzeros``.
    """
    zname = next((s.name for s in spec.stored if s.role == "zero_points"), None)
    if zname is None or spec.scheme is None:
        return None
    qcfg = dict(src.quantization_config or {})
    claimed = checkpoint_format_of(qcfg, file=src.path)
    b = spec.scheme.bits
    words = np.asarray(src.read(zname)).view(np.uint32)
    fields = zeros_map(b).to_logical(words, (OUT, IN), {IN: words.shape[0], OUT: int(spec.shape[0])})
    vals, counts = np.unique(fields, return_counts=True)
    sym = (spec.declared_scheme or spec.scheme).zero_point is ZeroPoint.NONE  # what the config says
    inferred = None
    if sym and vals.size == 1:
        inferred = {(1 << (b - 1)) - 1: V1, 1 << (b - 1): V2}.get(int(vals[0]))
    return {"claimed": claimed, "inferred": inferred, "sym": sym, "stored_tensor": zname,
            "raw_field_counts": {int(v): int(c) for v, c in sorted(zip(vals, counts), key=lambda kv: -kv[1])[:4]}}


from converter.validate.hooks import register_hooks  # noqa: E402  (hooks module imports nothing from formats)

register_hooks("gptq", zero_convention=zero_convention_evidence, always_stored=("g_idx",))
