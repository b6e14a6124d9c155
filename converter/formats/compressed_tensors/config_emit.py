"""compressed-tensors ``quantization_config`` emitted as ``ModelCompressor.update_config`` writes it
(compressed-tensors 0.20.1 key set; llm-compressor's FP8 / NVFP4A16 / MXFP4A16 presets), from the typed
:class:`~converter.formats.compressed_tensors.config.WeightArgs` the reader also parses into.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from converter.formats.compressed_tensors.config import FLOAT_FORMAT, FP4_SCALE_DTYPE, QUANT_METHOD, WeightArgs


def weights_json(args: WeightArgs) -> dict[str, Any]:
    """``weights`` object with exactly the keys compressed-tensors 0.20.1 writes (sample_checkpoints/ct_*);
    FP4 weights with the full key set llm-compressor writes for the ``NVFP4A16`` / ``MXFP4A16`` presets
    (sample_checkpoints/ct_nvfp4_smollm2, ct_mxfp4_smollm2: ``scale_dtype``, ``observer`` ...)."""
    if args.fp4_format is not None:
        return {"actorder": None, "block_structure": None, "dynamic": False, "group_size": args.group_size,
                "num_bits": 4, "observer": None, "observer_kwargs": {},
                "scale_dtype": args.scale_dtype or FP4_SCALE_DTYPE[args.fp4_format], "strategy": args.strategy,
                "symmetric": True, "type": "float", "zp_dtype": None}
    obj: dict[str, Any] = {"dynamic": False, "group_size": args.group_size, "num_bits": args.bits,
                           "strategy": args.strategy, "symmetric": args.symmetric, "type": args.type}
    if args.actorder is not None:
        obj["actorder"] = args.actorder
    if args.block is not None:
        obj["block_structure"] = list(args.block)
    return obj


#: ``input_activations`` as llm-compressor's FP8 presets write them (0.20.1 key set):
#: ``FP8_DYNAMIC`` (per-token, dynamic) and ``FP8`` (per-tensor, static ``input_scale``).
DYNAMIC_TOKEN_FP8 = {"dynamic": True, "group_size": None, "num_bits": 8, "strategy": "token", "symmetric": True,
                     "type": "float"}
STATIC_TENSOR_FP8 = {"dynamic": False, "group_size": None, "num_bits": 8, "strategy": "tensor", "symmetric": True,
                     "type": "float"}


def emit_config(groups: Sequence[tuple[WeightArgs, Sequence[str]]], *, fmt: str, version: str,
                ignore: Sequence[str], activations: Sequence[Mapping | None] | None = None,
                names: Sequence[str] | None = None) -> dict[str, Any]:
    """A ``quantization_config`` as ``ModelCompressor.update_config`` writes it (0.20.1 key set).

    ``groups`` pairs each weight-args set with its targets (``["Linear"]`` when one set covers
    every quantized module; module names otherwise). Float groups get ``format: "float-quantized"``,
    4-bit float groups their FP4 format, the others ``fmt``; the top-level ``format`` is
    ``"mixed-precision"`` when they differ. ``activations``: each group's ``input_activations`` object
    (None: weight-only). ``names``: the group names (default ``group_<i>``).
    """
    acts = list(activations) if activations is not None else [None] * len(groups)
    names = list(names) if names is not None else [f"group_{i}" for i in range(len(groups))]

    def group_format(args: WeightArgs) -> str:
        return args.fp4_format or (FLOAT_FORMAT if args.type == "float" else fmt)
    cg = {names[i]: {"format": group_format(args),
                         "input_activations": dict(act) if act is not None else None, "output_activations": None,
                         "targets": list(targets), "weights": weights_json(args)}
          for i, ((args, targets), act) in enumerate(zip(groups, acts))}
    formats = {g["format"] for g in cg.values()}
    fmt = formats.pop() if len(formats) == 1 else ("mixed-precision" if formats else fmt)
    return {"config_groups": cg, "format": fmt, "global_compression_ratio": None, "ignore": list(ignore),
            "kv_cache_scheme": None, "moe_sparsity_config": None, "quant_method": QUANT_METHOD,
            "quantization_status": "compressed", "sparsity_config": {}, "transform_config": {}, "version": version}
