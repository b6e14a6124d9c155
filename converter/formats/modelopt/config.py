"""NVIDIA ModelOpt (``nvidia-modelopt``) unified Hugging Face export: its two quantization configs.

ModelOpt's ``export_hf_checkpoint`` writes ``hf_quant_config.json``::

    {"producer": {"name": "modelopt", "version": "0.47.0"},
     "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": null, "exclude_modules": ["lm_head", ...]}}

(``modelopt/torch/export/quant_utils.py`` ``get_quant_config`` / ``process_layer_quant_config``;
``MIXED_PRECISION`` lists ``quantized_layers: {module: {"quant_algo": ...}}`` instead of
``exclude_modules``) and the same facts in ``config.json`` ``quantization_config`` with
``quant_method: "modelopt"`` (``convert_hf_config.py`` ``convert_hf_quant_config_format``:
``config_groups`` for FP8 / NVFP4 / MIXED_PRECISION, ``ignore``, ``quant_algo``, ``kv_cache_scheme``,
``producer``). vLLM (``model_executor/layers/quantization/modelopt.py``) reads either, upper-casing
``quant_algo``. Checked against real exports of nvidia-modelopt 0.47.0 (``FP8_DEFAULT_CFG``,
``FP8_PER_CHANNEL_PER_TOKEN_CFG``, ``FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG``; sample_checkpoints/modelopt_*).

FP8 algorithms read and written here (``get_quantization_format`` names in brackets):

``FP8`` (``fp8``)
    E4M3 ``weight``, F32 0-dim ``weight_scale`` (per-tensor multiplier), F32 0-dim ``input_scale``
    (static per-tensor activations).
``FP8_PER_CHANNEL_PER_TOKEN`` (``fp8_pc_pt``)
    F32 ``weight_scale`` ``[O]`` (per output channel); activations dynamic per token, nothing stored.
``FP8_PB_WO`` (``fp8_pb_wo``, written lower-case by ModelOpt)
    F32 ``weight_scale`` ``[ceil(O/128), 1, ceil(I/128), 1]``: 128 x 128 blocks (the only block
    ModelOpt's 2-D blockwise config and vLLM's ``ModelOptFp8PbWoLinearMethod`` use; the config
    records no block size), weight-only; partial edge blocks as ``FP8QTensor`` pads them.

``NVFP4`` (``nvfp4``, :mod:`converter.formats.modelopt.nvfp4`)
    packed E2M1 ``weight`` U8 ``[O, I/2]``, F8_E4M3 ``weight_scale`` ``[O, I/16]``, F32 0-dim
    ``weight_scale_2`` (global multiplier), F32 0-dim ``input_scale`` (W4A4: the activations'
    global scale); ``hf_quant_config.json`` also records ``group_size: 16``.

Every other ``quant_algo`` (NVFP4_AWQ, W4A8_NVFP4_FP8, W4A16_AWQ, MXFP8 ...) is refused with
:class:`~converter.errors.UnsupportedError` naming it (in a MIXED_PRECISION checkpoint only its layers
are unreadable).
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Mapping

from converter.errors import ErrorKind, FormatError, UnsupportedError
from converter.formats.source import Source, read_json

QUANT_METHOD = "modelopt"
HF_QUANT_CONFIG = "hf_quant_config.json"
FP8, FP8_PC_PT, FP8_PB_WO, MIXED = "FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "MIXED_PRECISION"
NVFP4 = "NVFP4"
#: FP8 algorithms read and written here.
FP8_ALGOS = (FP8, FP8_PC_PT, FP8_PB_WO)
#: every algorithm read and written here.
ALGOS = FP8_ALGOS + (NVFP4,)
#: ``quant_algo`` as ModelOpt writes it (``process_layer_quant_config``: ``fp8_pb_wo`` has no upper-case alias).
WRITTEN_NAME = {FP8: "FP8", FP8_PC_PT: "FP8_PER_CHANNEL_PER_TOKEN", FP8_PB_WO: "fp8_pb_wo", NVFP4: "NVFP4"}
#: NVFP4's group (``NVFP4_DEFAULT_CFG`` ``block_sizes {-1: 16}``; ``hf_quant_config.json`` ``group_size``).
NVFP4_GROUP = 16
#: The block of FP8_PB_WO (``FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG`` ``block_sizes {-1: 128, -2: 128}``).
PB_WO_BLOCK = 128
#: Version whose layout the writer reproduces.
DEFAULT_VERSION = "0.47.0"


@dataclass(frozen=True)
class ModelOptConfig:
    """The parsed quantization facts, from ``hf_quant_config.json`` and / or ``config.json``."""

    quant_algo: str | None  # None: nothing quantized (ModelOpt's get_quant_config default)
    exclude: tuple[str, ...]
    layers: Mapping[str, str]  # MIXED_PRECISION: module -> upper-case quant_algo
    kv_cache_quant_algo: str | None
    producer_version: str | None
    file: Path

    def algo_for(self, prefix: str) -> str | None:
        """The quant_algo of module ``prefix`` (None: not quantized). MIXED_PRECISION: the layer entry
        equal to ``prefix`` or its nearest listed parent (ModelOpt lists fused MoE experts by parent)."""
        if self.quant_algo is None:
            return None
        if self.quant_algo != MIXED:
            return None if self.excluded(prefix) else self.quant_algo
        best = None
        for name, algo in self.layers.items():
            if (prefix == name or prefix.startswith(name + ".")) and (best is None or len(name) > len(best[0])):
                best = (name, algo)
        return best[1] if best else None

    def excluded(self, prefix: str) -> bool:
        """``exclude_modules`` match: exact name or ModelOpt's wildcards (``fnmatch``, as vLLM does)."""
        return any(prefix == p or fnmatch(prefix, p) for p in self.exclude)


def _algo(value: Any, *, file: Path, field: str, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise FormatError("quant_algo must be a non-empty string", file=file, field=field, expected="e.g. FP8",
                          found=value)
    return value.upper()


def refuse_algo(algo: str, *, file: Path, field: str) -> UnsupportedError:
    """The typed refusal of a quant_algo this reader does not decode (names it)."""
    hint = "plain NVFP4 (W4A4, NVFP4_DEFAULT_CFG) is read; AWQ pre_quant_scale / FP8-activation variants are not" \
        if "NVFP4" in algo else None
    return UnsupportedError(f"ModelOpt quant_algo {algo!r} is not supported yet", file=file, field=field,
                            expected=list(ALGOS) + [MIXED], found=algo, hint=hint)


def _str_list(value: Any, *, file: Path, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise FormatError("must be a list of module names / wildcards", file=file, field=field,
                          expected="list of str", found=repr(value)[:80])
    return tuple(value)


def _layers(value: Any, *, file: Path, field: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not value:
        raise FormatError("MIXED_PRECISION needs quantized_layers {module: {quant_algo: ...}}", file=file,
                          field=field, expected="non-empty object", found=repr(value)[:80])
    out = {}
    for name, cfg in value.items():
        if not isinstance(cfg, Mapping):
            raise FormatError("quantized_layers entry must be an object", file=file, field=f"{field}.{name}",
                              expected="{quant_algo: ...}", found=repr(cfg)[:80])
        out[str(name)] = _algo(cfg.get("quant_algo"), file=file, field=f"{field}.{name}.quant_algo")
        check_group_size(out[str(name)], cfg.get("group_size"), file=file, field=f"{field}.{name}.group_size")
    return out


def check_group_size(algo: str | None, value: Any, *, file: Path, field: str) -> None:
    """An NVFP4 ``group_size``, when recorded, must be 16 (``get_quant_config`` writes the weight
    quantizer's ``block_sizes[-1]``; NVFP4 kernels use 16-element groups only)."""
    if algo == NVFP4 and value is not None and value != NVFP4_GROUP:
        raise FormatError("NVFP4 groups are 16 elements along in", file=file, field=field, expected=NVFP4_GROUP,
                          found=value, kind=ErrorKind.CONFIG_MISMATCH)


def is_modelopt(src: Source) -> str | None:
    """Evidence that ``src`` is a ModelOpt export (None if not): the side file or ``quant_method``."""
    if src.kind != "directory":
        return None
    hf = src.directory / HF_QUANT_CONFIG
    if hf.is_file():
        obj = read_json(hf, required=False)
        if isinstance(obj, Mapping) and isinstance(obj.get("producer"), Mapping) \
                and obj["producer"].get("name") == QUANT_METHOD:
            return f"{HF_QUANT_CONFIG} producer.name = modelopt"
    qc = (src.config or {}).get("quantization_config")
    if isinstance(qc, Mapping) and str(qc.get("quant_method", "")).lower() == QUANT_METHOD:
        return "quantization_config.quant_method = modelopt"
    return None


def parse(src: Source) -> ModelOptConfig:
    """Parse the ModelOpt configs of ``src``; the two files, when both exist, must agree on quant_algo.

    Raises
    ------
    FormatError
        Malformed configs, or ``hf_quant_config.json`` and ``config.json`` naming different algorithms.
    UnsupportedError
        A top-level quant_algo that is not FP8 / FP8_PER_CHANNEL_PER_TOKEN / FP8_PB_WO / NVFP4 / MIXED_PRECISION.
    """
    hf_path = src.directory / HF_QUANT_CONFIG
    cfg_path = src.directory / "config.json"
    hf = read_json(hf_path, required=False) if hf_path.is_file() else None
    qc = (src.config or {}).get("quantization_config")
    qc = qc if isinstance(qc, Mapping) and str(qc.get("quant_method", "")).lower() == QUANT_METHOD else None
    if hf is not None:
        if not isinstance(hf, Mapping) or not isinstance(hf.get("quantization"), Mapping):
            raise FormatError(f"{HF_QUANT_CONFIG} must be an object with a 'quantization' object", file=hf_path,
                              field="quantization", expected="object", found=repr(hf)[:80],
                              kind=ErrorKind.CONFIG_MISMATCH)
        q = hf["quantization"]
        file, algo = hf_path, _algo(q.get("quant_algo"), file=hf_path, field="quantization.quant_algo", optional=True)
        check_group_size(algo, q.get("group_size"), file=hf_path, field="quantization.group_size")
        exclude = _str_list(q.get("exclude_modules"), file=hf_path, field="quantization.exclude_modules")
        kv = q.get("kv_cache_quant_algo")
        layers_obj, layers_field = q.get("quantized_layers"), "quantization.quantized_layers"
        producer = hf.get("producer") if isinstance(hf.get("producer"), Mapping) else {}
        if qc is not None and qc.get("quant_algo") is not None and str(qc["quant_algo"]).upper() != (algo or ""):
            raise FormatError(f"{HF_QUANT_CONFIG} and config.json name different quant_algo", file=cfg_path,
                              field="quantization_config.quant_algo", expected=q.get("quant_algo"),
                              found=qc.get("quant_algo"), kind=ErrorKind.CONFIG_MISMATCH)
    elif qc is not None:
        file, algo = cfg_path, _algo(qc.get("quant_algo"), file=cfg_path, field="quantization_config.quant_algo",
                                     optional=True)
        exclude = _str_list(qc.get("ignore"), file=cfg_path, field="quantization_config.ignore")
        kvs = qc.get("kv_cache_scheme")
        kv = "FP8" if isinstance(kvs, Mapping) and kvs.get("type") == "float" and kvs.get("num_bits") == 8 else (
            kvs if isinstance(kvs, str) else None)
        layers_obj, layers_field = qc.get("quantized_layers"), "quantization_config.quantized_layers"
        producer = qc.get("producer") if isinstance(qc.get("producer"), Mapping) else {}
    else:
        raise FormatError("not a ModelOpt export", file=cfg_path, field="quantization_config.quant_method",
                          expected=f"{QUANT_METHOD} (or {HF_QUANT_CONFIG})", found=None)
    if algo is not None and algo not in ALGOS and algo != MIXED:
        raise refuse_algo(algo, file=file, field="quant_algo")
    layers = _layers(layers_obj, file=file, field=layers_field) if algo == MIXED else {}
    return ModelOptConfig(algo, exclude, layers, kv if isinstance(kv, str) else None,
                          producer.get("version") if isinstance(producer.get("version"), str) else None, file)
