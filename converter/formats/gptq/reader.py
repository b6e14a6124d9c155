"""GPTQ reader: per-module header checks (:class:`_Module`), the lazy checkpoint, detection, and the
zero-convention evidence the validator asks for (``FormatHandler.validation``).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from converter.errors import FormatError, MissingTensorError, UnsupportedError
from converter.groups import GroupMap
from converter.layout import IN, OUT, PackedCodes
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, StoredArray, TensorSpec
from converter.formats.registry import Detection
from converter.formats.base import source_checkpoint
from converter.formats.source import Source

from converter.formats.gptq.layout import (FORMAT, V1, V2, PARTS, SCALES_MAP, SCALE_DTYPES, SUPPORTED_BITS, codes_map,
                                           decode_qzeros,
                                           packed_rows, zeros_map)
from converter.formats.gptq.config import as_bool, dynamic_rule, checkpoint_format_of


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

        rule = dynamic_rule(qcfg, prefix)
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
        self.sym = as_bool(cfg.get("sym"), True)  # AutoGPTQ from_quant_config assumes True when missing
        self.desc_act = as_bool(cfg.get("desc_act"), False)
        meta = cfg.get("meta") if isinstance(cfg.get("meta"), dict) else {}
        static = as_bool(cfg.get("static_groups", meta.get("static_groups")), False)
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
    meta = {"checkpoint_format": fmt, "quantization_config": qcfg,
            "v1_zero_decode": ("word-level + packed constant (GPTQModel convert_gptq_v1_to_v2_format_module); "
                               "3-bit per field") if fmt == V1 else None}
    return source_checkpoint(src, FORMAT, specs, lambda name: modules[name].load(src), modules, meta)


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

# -- validation hooks (FormatHandler.validation) --------------------------------------------------------
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
    counts = np.bincount(fields.reshape(-1), minlength=1 << b)  # (b-bit fields: a count per value, no sort)
    vals = np.flatnonzero(counts)
    counts = counts[vals]
    sym = (spec.declared_scheme or spec.scheme).zero_point is ZeroPoint.NONE  # what the config says
    inferred = None
    if sym and vals.size == 1:
        inferred = {(1 << (b - 1)) - 1: V1, 1 << (b - 1): V2}.get(int(vals[0]))
    return {"claimed": claimed, "inferred": inferred, "sym": sym, "stored_tensor": zname,
            "raw_field_counts": {int(v): int(c) for v, c in sorted(zip(vals, counts), key=lambda kv: -kv[1])[:4]}}
