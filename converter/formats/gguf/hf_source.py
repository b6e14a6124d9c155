"""GGUF key/values for a Hugging Face source (config.json, no GGUF key/values), after llama.cpp's
``convert_hf_to_gguf.py``: the hyperparameters it writes, the F32 rule for 1-D tensors, and the warning
when the file written has no vocabulary."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from converter.tensor import Checkpoint
from converter.formats.gguf.arch_kv import arch_kv

__all__ = ["config_kv", "yarn_kv", "rope_theta", "tokenizer_warning", "source_kv", "general_kv", "no_vocab_kv",
           "VOCAB_NOT_CONVERTED", "NO_TOKENIZER", "NO_VOCAB_KV", "NO_VOCAB_WARNING", "WIDENED_1D"]


def rope_theta(config: Mapping[str, Any]) -> Any:
    """RoPE base frequency: top-level ``rope_theta``, else ``rope_parameters["rope_theta"]`` (transformers 5
    writes only the nested one; ``convert_hf_to_gguf.py`` ``TextModel.set_gguf_parameters`` reads
    ``rope_params.get("rope_theta")`` into ``add_rope_freq_base``)."""
    v = config.get("rope_theta")
    rp = config.get("rope_parameters")
    if v is None and isinstance(rp, Mapping):
        v = rp.get("rope_theta")
    return v


def config_kv(config: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """Hyperparameter key/values from a Hugging Face config.json (no tokenizer keys).

    Conventions of llama.cpp ``convert_hf_to_gguf.py`` (``TextModel.set_gguf_parameters``;
    ``LlamaModel.set_gguf_parameters`` adds ``{arch}.vocab_size``, gguf-py ``constants.py``
    ``Keys.LLM.VOCAB_SIZE``): ``{arch}.rope.freq_base`` from ``rope_theta`` or
    ``rope_parameters.rope_theta``; ``{arch}.vocab_size`` from ``vocab_size`` (without it, and without
    ``tokenizer.ggml.tokens``, transformers' GGUF loader builds a 32000-row embedding); the MoE keys
    ``{arch}.expert_count`` / ``expert_used_count`` (``num_local_experts`` / ``num_experts_per_tok``),
    ``attention.key_length`` / ``value_length`` (``head_dim``) and ``attention.sliding_window`` when the config
    has them, and gpt-oss's ``expert_feed_forward_length`` (``GptOssModel.set_gguf_parameters``); for ``llama``,
    ``rope.dimension_count`` = ``head_dim`` (else ``hidden_size / num_attention_heads``; ``LlamaModel``); a linear
    or YaRN RoPE's scaling keys; ``rope.freq_base_swa`` from ``rope_parameters.sliding_attention``; then the
    gemma2 / gemma3 / deepseek2 keys of :func:`converter.formats.gguf.arch_kv.arch_kv`.
    """
    pairs = {"block_count": "num_hidden_layers", "context_length": "max_position_embeddings",
             "embedding_length": "hidden_size", "feed_forward_length": "intermediate_size",
             "attention.head_count": "num_attention_heads", "attention.head_count_kv": "num_key_value_heads",
             "attention.layer_norm_rms_epsilon": "rms_norm_eps", "attention.layer_norm_epsilon": "layer_norm_eps",
             "vocab_size": "vocab_size", "expert_count": "num_local_experts",
             "expert_used_count": "num_experts_per_tok", "attention.key_length": "head_dim",
             "attention.value_length": "head_dim", "attention.sliding_window": "sliding_window"}
    values = {k: config.get(ck) for k, ck in pairs.items()}
    if values["expert_count"] is None:  # TextModel: num_local_experts, num_experts or n_routed_experts
        values["expert_count"] = config.get("num_experts", config.get("n_routed_experts"))
    # Qwen2MoeModel.set_gguf_parameters (also Qwen3MoeModel)
    values["expert_feed_forward_length"] = config.get("moe_intermediate_size")
    values["expert_shared_feed_forward_length"] = config.get("shared_expert_intermediate_size")
    values["rope.freq_base"] = rope_theta(config)
    if arch not in _SLIDING_WINDOW_ARCHS:  # TextModel writes no sliding window (Qwen2's is off by default)
        values.pop("attention.sliding_window")
    if arch == "gpt-oss":  # GptOssModel.set_gguf_parameters: add_expert_feed_forward_length(intermediate_size)
        values["expert_feed_forward_length"] = config.get("intermediate_size")
    if arch == "phi3":
        values.update(_phi3(config))
    out = {}
    for k, v in values.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{arch}.{k}"] = float(v) if ("epsilon" in k or "freq" in k) else int(v)
    out.update(yarn_kv(config, arch))
    out.update(linear_rope_kv(config, arch))
    rp = config.get("rope_parameters")
    swa = rp.get("sliding_attention") if isinstance(rp, Mapping) else None
    if isinstance(swa, Mapping) and isinstance(swa.get("rope_theta"), (int, float)):  # TextModel: freq_base_swa
        out[f"{arch}.rope.freq_base_swa"] = float(swa["rope_theta"])
    more, drop = arch_kv(config, arch)  # gemma2 / gemma3 / deepseek2 (:mod:`.arch_kv`)
    for k in drop:
        out.pop(f"{arch}.{k}", None)
    out.update({f"{arch}.{k}": v for k, v in more.items()})
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    if arch == "llama" and isinstance(heads, int) and heads > 0:  # LlamaModel.set_gguf_parameters
        head_dim = config.get("head_dim")
        head_dim = head_dim if isinstance(head_dim, int) else (hidden // heads if isinstance(hidden, int) else None)
        if head_dim is not None:
            out[f"{arch}.rope.dimension_count"] = int(head_dim)
            # transformers' LlamaConfig fills head_dim = hidden / heads, and convert_hf_to_gguf.py writes it
            out.setdefault(f"{arch}.attention.key_length", int(head_dim))
            out.setdefault(f"{arch}.attention.value_length", int(head_dim))
    return out


_SLIDING_WINDOW_ARCHS = ("gpt-oss", "phi3")
_VOCAB_SIZE_ARCHS = ("llama", "deepseek2")


def _phi3(config: Mapping[str, Any]) -> dict[str, Any]:
    """``Phi3MiniModel.set_gguf_parameters`` (which replaces TextModel's): no vocab_size / key_length keys,
    ``rope.dimension_count = int(partial_rotary_factor * hidden) // heads``, ``rope.scaling.original_context_length``
    and ``attention.sliding_window`` (0 when the config has none: Phi-4)."""
    out: dict[str, Any] = {"vocab_size": None, "attention.key_length": None, "attention.value_length": None,
                           "attention.sliding_window": config.get("sliding_window") or 0}
    rp = config.get("rope_parameters") or config.get("rope_scaling") or {}
    hidden, heads = config.get("hidden_size"), config.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        out["rope.dimension_count"] = int(float(rp.get("partial_rotary_factor", config.get("partial_rotary_factor",
                                                                                         1.0))) * hidden) // heads
    original = rp.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
    out["rope.scaling.original_context_length"] = original
    return out


def _rope_params(config: Mapping[str, Any]) -> Any:
    """``rope_parameters`` (or ``rope_scaling``); per layer type (Gemma 3), its ``full_attention`` entry, as
    ``TextModel.set_gguf_parameters`` reads it."""
    rp = config.get("rope_parameters") or config.get("rope_scaling")
    if isinstance(rp, Mapping) and isinstance(rp.get("full_attention"), Mapping):
        return rp["full_attention"]
    return rp


def linear_rope_kv(config: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """``rope.scaling.type = "linear"`` and ``rope.scaling.factor`` for a linear RoPE with a factor
    (``TextModel.set_gguf_parameters``); nothing otherwise."""
    rp = _rope_params(config)
    if not isinstance(rp, Mapping) or rp.get("rope_type", rp.get("type")) != "linear":
        return {}
    factor = rp.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool):
        return {}
    return {f"{arch}.rope.scaling.type": "linear", f"{arch}.rope.scaling.factor": float(factor)}


#: ``rope_parameters`` field -> GGUF ``{arch}.rope.scaling.*`` key of a YaRN RoPE, with its type.
_YARN = (("factor", "factor", float), ("original_max_position_embeddings", "original_context_length", int),
         ("extrapolation_factor", "yarn_ext_factor", float), ("attention_factor", "yarn_attn_factor", float),
         ("beta_fast", "yarn_beta_fast", float), ("beta_slow", "yarn_beta_slow", float))


def yarn_kv(config: Mapping[str, Any], arch: str) -> dict[str, Any]:
    """The YaRN RoPE keys ``convert_hf_to_gguf.py`` ``TextModel.set_gguf_parameters`` writes when
    ``rope_parameters`` (or ``rope_scaling``) has ``rope_type: "yarn"`` and a ``factor``: ``rope.scaling.type``
    ``"yarn"``, ``factor``, ``original_context_length`` and, when given, ``yarn_ext_factor`` /
    ``yarn_attn_factor`` (``attention_factor``) / ``yarn_beta_fast`` / ``yarn_beta_slow`` (gpt-oss: factor 32,
    4096, beta 32 / 1). Nothing for another RoPE."""
    rp = _rope_params(config)
    if not isinstance(rp, Mapping) or rp.get("rope_type", rp.get("type")) != "yarn" or rp.get("factor") is None:
        return {}
    out: dict[str, Any] = {f"{arch}.rope.scaling.type": "yarn"}
    for field, key, cast in _YARN:
        v = rp.get(field)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{arch}.rope.scaling.{key}"] = cast(v)
    return out


NO_TOKENIZER = ("warning: no tokenizer: llama.cpp cannot load this GGUF without tokenizer.ggml.* keys; convert "
                "a GGUF that has them, or make one from a model folder with tokenizer files (llama.cpp "
                "convert_hf_to_gguf.py)")
"""The writer's warning (``side_files_skipped["tokenizer.ggml.*"]``) when the output has no
``tokenizer.ggml.tokens`` and no vocabulary size to declare it vocabulary-less: llama.cpp's
``llm_load_vocab`` needs ``tokenizer.ggml.model``."""

NO_VOCAB_KV = {"tokenizer.ggml.model": "none"}
"""What llama.cpp writes for a model without a vocabulary: ``convert_hf_to_gguf.py`` ``_set_vocab_none``
(``add_tokenizer_model("none")``). ``llama-vocab.cpp`` (llama-cpp-python 0.3.36's) loads ``"none"`` (or
``"no_vocab"``) as ``LLAMA_VOCAB_TYPE_NONE`` with ``{arch}.vocab_size`` placeholder tokens; with no
``tokenizer.ggml.model`` key at all it refuses the file ("error loading model vocabulary: key not found in
model: tokenizer.ggml.model")."""

NO_VOCAB_WARNING = ("warning: no tokenizer: written as tokenizer.ggml.model 'none' (llama.cpp's model without a "
                    "vocabulary, as convert_hf_to_gguf.py writes one): llama.cpp loads it and runs token ids, but "
                    "cannot tokenize text; for text, convert a GGUF that has a vocabulary, or make one from a model "
                    "folder with tokenizer files (llama.cpp convert_hf_to_gguf.py)")
"""The writer's warning when it declared the output vocabulary-less (:data:`NO_VOCAB_KV`)."""

TOKENIZER_FILES_NOT_CONVERTED = (" (the source's tokenizer files could not be converted: neither a tokenizer.json "
                                 "nor a tokenizer.model beside the weights; or pass --gguf-metadata FILE.gguf)")

_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


def no_vocab_kv(kv: Mapping[str, Any], arch: str) -> dict[str, str]:
    """:data:`NO_VOCAB_KV` when ``kv`` has no ``tokenizer.ggml.model`` but declares ``{arch}.vocab_size`` (what
    llama.cpp sizes the placeholder vocabulary and the logits by), else ``{}``."""
    if "tokenizer.ggml.model" in kv or not isinstance(kv.get(f"{arch}.vocab_size"), int):
        return {}
    return dict(NO_VOCAB_KV)


#: key of :func:`source_kv`'s warnings holding why a tokenizer.json was not converted (a WordPiece vocabulary ...):
#: :func:`tokenizer_warning` appends it to the no-vocabulary warning, which says what the file has instead
VOCAB_NOT_CONVERTED = "tokenizer.ggml.* (not converted)"


def tokenizer_warning(ckpt: Checkpoint, kv: Mapping[str, Any], warnings: Mapping[str, str] | None = None
                      ) -> dict[str, str]:
    """``{"tokenizer.ggml.*": warning}`` when the GGUF written has no vocabulary, else ``{}``: the vocabulary-less
    file as written (``'none'``, which llama.cpp loads, or no key at all), and why a tokenizer beside the weights
    was not converted (``warnings[VOCAB_NOT_CONVERTED]`` from :func:`source_kv`)."""
    if "tokenizer.ggml.tokens" in kv:
        return {}
    has_files = any(Path(str(f)).name in _HF_TOKENIZER_FILES for f in ckpt.extra_files)
    text = NO_VOCAB_WARNING if kv.get("tokenizer.ggml.model") == NO_VOCAB_KV["tokenizer.ggml.model"] else NO_TOKENIZER
    why = (warnings or {}).get(VOCAB_NOT_CONVERTED)
    return {"tokenizer.ggml.*": text + (why or (TOKENIZER_FILES_NOT_CONVERTED if has_files else ""))}


WIDENED_1D = ("F16", "BF16")
"""Float dtypes of 1-D tensors written as F32 (exact widening): ``convert_hf_to_gguf.py``
``ModelBase.prepare_tensors`` sets ``data_qtype = F32`` when ``n_dims <= 1`` ("Most of the codebase that
takes in 1D tensors or norms only handles F32 tensors"); ggml's CPU ``binary_op`` aborts on an F32 x BF16
norm multiply."""


def _folder(ckpt: Checkpoint) -> Path | None:
    """The model folder of a Hugging Face source (its path, or the folder of its one file)."""
    if not ckpt.path:
        return None
    p = Path(ckpt.path)
    return p if p.is_dir() else p.parent


def metadata_kv(path: str | Path, arch: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Key/values and GGUF types of an existing GGUF (``--gguf-metadata``: a vocab-only file, or the GGUF the
    weights came from): every key but the ``GGUF.*`` header fields and ``split.*`` (the writer recomputes
    ``general.file_type`` / ``quantization_version`` / ``alignment``).

    Raises
    ------
    ConfigMismatchError-kind FormatError
        Its ``general.architecture`` is not ``arch``.
    FormatError, CorruptFileError
        Not a readable GGUF.
    """
    from converter.errors import ErrorKind, FormatError
    from converter.formats.gguf.reader import _kv, _open_reader
    # key/values only (bounded parse, then gguf-py's reader): a vocab-only file as convert_hf_to_gguf.py
    # --vocab-only writes it ends after its key/values, before any aligned data section
    reader, _ = _open_reader(Path(path))
    kv, types = _kv(reader, Path(path))
    found = kv.get("general.architecture")
    if found != arch:
        raise FormatError("--gguf-metadata file is for another architecture", file=path,
                          field="general.architecture", expected=arch, found=found, kind=ErrorKind.CONFIG_MISMATCH,
                          hint="pass the GGUF metadata of this model's architecture")
    keep = {k: v for k, v in kv.items() if not k.startswith(("GGUF.", "split."))}
    return keep, {k: types[k] for k in keep if k in types}


def source_kv(ckpt: Checkpoint, arch: str, gguf_metadata: str | Path | None = None
              ) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """Key/values, their GGUF types and warnings (key -> text) for a GGUF written from a non-GGUF source.

    The hyperparameters of :func:`config_kv` from ``ckpt.config``, then either every key of ``gguf_metadata`` (which
    wins over config.json; an integer hyperparameter both give differently is refused) or the tokenizer of the
    source folder (:func:`converter.formats.gguf.tokenizer_kv.tokenizer_kv`).

    A vocabulary :func:`~converter.formats.gguf.tokenizer_kv.tokenizer_kv` does not convert (WordPiece, Unigram
    ``tokenizer.json``) gives no tokenizer keys and a warning (``"tokenizer.ggml.*"``) naming why.

    Raises
    ------
    FormatError
        ``gguf_metadata`` for another architecture, or disagreeing with config.json on an integer hyperparameter;
        unreadable tokenizer files.
    """
    from converter.errors import ErrorKind, FormatError, UnsupportedError
    from converter.formats.gguf.tokenizer_kv import tokenizer_kv
    kv = config_kv(ckpt.config, arch) if ckpt.config else {}
    types: dict[str, Any] = {}
    warnings: dict[str, str] = {}
    if gguf_metadata is not None:
        meta, meta_types = metadata_kv(gguf_metadata, arch)
        for k, v in meta.items():
            mine = kv.get(k)
            if isinstance(mine, int) and isinstance(v, int) and not isinstance(v, bool) and mine != v:
                raise FormatError("--gguf-metadata disagrees with config.json", file=gguf_metadata, field=k,
                                  expected=mine, found=v, kind=ErrorKind.CONFIG_MISMATCH,
                                  hint="use the GGUF metadata of this very model")
        kv.update(meta)
        types.update(meta_types)
        return kv, types, warnings
    folder = _folder(ckpt)
    try:
        tok = tokenizer_kv(folder, ckpt.config, arch) if folder is not None and ckpt.format != "gguf" else None
    except UnsupportedError as exc:  # a vocabulary kind not converted (WordPiece ...): the weights are still written
        tok = None
        warnings[VOCAB_NOT_CONVERTED] = f" ({exc})"  # appended to the no-vocabulary warning (tokenizer_warning)
    if tok is not None:
        kv.update(tok.kv)
        types.update(tok.types)
        if arch not in _VOCAB_SIZE_ARCHS:  # only LlamaModel writes it; with a vocabulary the tokens say it
            kv.pop(f"{arch}.vocab_size", None)
        for i, w in enumerate(tok.warnings):
            warnings["tokenizer.ggml.pre" if i == 0 and "tokenizer.ggml.pre" in w else f"tokenizer.warning.{i}"] = w
    return kv, types, warnings


def general_kv(ckpt: Checkpoint, arch: str, tensors: list[tuple[str, tuple[int, ...]]]
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``general.*`` key/values ``convert_hf_to_gguf.py`` writes (``ModelBase.prepare_metadata``): ``type``
    ``"model"``, then gguf-py's ``gguf.Metadata.load`` on the model folder (model card ``README.md``, config.json,
    folder name: ``name``, ``basename``, ``finetune``, ``license`` ...), ``name`` defaulting to the folder's name
    (only ``type`` for a checkpoint with no folder), ``size_label`` from the parameter count of ``tensors`` (GGUF
    name, numpy shape) as ``GGUFWriter.get_total_parameter_count`` counts them (``gguf.size_label``)."""
    import numpy as np
    from converter.formats.gguf.schemes import gguf_module
    from converter.formats.gguf.tokenizer_kv import collected_kv
    gguf = gguf_module()
    counter = gguf.GGUFWriter(None, arch)
    for name, shape in tensors:
        counter.add_tensor_info(name, shape, np.dtype(np.float32), 0)
    total, shared, expert, n_expert = counter.get_total_parameter_count()
    folder = _folder(ckpt)
    meta = gguf.Metadata.load(None, folder, None, total)
    if meta.name is None and folder is not None:
        meta.name = folder.name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_expert)
    out = gguf.GGUFWriter(None, arch)
    out.add_type(gguf.GGUFType.MODEL)
    if meta.name is not None:  # an in-memory checkpoint has no folder (and gguf-py requires a name)
        meta.set_gguf_meta_model(out)
    got = collected_kv(out)
    return got.kv, got.types
