"""GGUF tokenizer key/values (``tokenizer.ggml.*``, ``tokenizer.chat_template``) from a Hugging Face model folder.

What llama.cpp's ``convert_hf_to_gguf.py`` writes for the two common vocabularies (``conversion/base.py``,
llama.cpp as vendored by llama-cpp-python 0.3.36), made here without transformers:

- **byte-level BPE** (``tokenizer.json`` with a ``BPE`` model: GPT-2, SmolLM, Qwen, Llama 3 ...; ``_set_vocab_gpt2``
  / ``get_vocab_base``): ``tokenizer.ggml.model = "gpt2"``; ``tokens`` in id order for ``vocab_size`` ids
  (config.json, else the vocabulary's size), ids without a token are ``[PAD{id}]`` of type UNUSED; an added token is
  CONTROL when ``special`` or when it looks special (``<|...|>``, ``<｜...｜>``, ``<unused...>``, ``<pad>``,
  ``<mask>``), else USER_DEFINED (its ``▁`` written as a space); a non-normalized added token is first encoded and
  decoded (``tokenizers``); every other token is NORMAL. ``tokenizer.ggml.pre`` is chosen as llama.cpp does, by the
  SHA-256 of ``str(ids)`` of the tokenizer's encoding of a fixed text (``get_vocab_base_pre``; :data:`PRE_BY_HASH`
  holds the hashes of the families qckpt maps). An unknown hash is written as ``"default"`` with a warning
  (``convert_hf_to_gguf.py`` refuses it).
- **SentencePiece** (``tokenizer.model``; ``_set_vocab_sentencepiece``): ``model = "llama"``, ``pre = "default"``,
  pieces, scores and types from the ``sentencepiece`` package (optional: ``pip install sentencepiece``); the
  ``added_tokens.json`` and ``tokenizer_config.json`` ``added_tokens_decoder`` entries override ids, with score
  -1000.

Merges, special token ids (``bos``/``eos``/``unk``/``sep``/``pad``/``cls``/``mask``), ``add_bos_token`` /
``add_eos_token`` and the chat template come from gguf-py's ``gguf.SpecialVocab`` exactly as the converter uses it;
the keys are collected through a ``gguf.GGUFWriter`` so their names and GGUF value types are gguf-py's. For
``general.architecture == "llama"``, ``LlamaModel.set_vocab`` also writes ``add_space_prefix`` from
``tokenizer_config.json`` ``add_prefix_space`` and ``add_bos_token = false`` for a 49152-token vocabulary; for
``gemma2`` / ``gemma3`` with a ``tokenizer.model``, ``Gemma2Model`` / ``Gemma3Model.set_vocab`` write
``add_space_prefix = false``.
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any, Iterator, Mapping

from converter.errors import FormatError, UnsupportedError

__all__ = ["tokenizer_kv", "TokenizerKV", "pre_tokenizer_name", "collected_kv", "CHECK_TEXT", "PRE_BY_HASH",
           "UNKNOWN_PRE"]

CHECK_TEXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) "
    "✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 "
    "កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ ------======= "
    "нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, 'RE you sure? 'M not sure "
    "I'll make it, 'D you like some tea? We'Ve a'lL")
"""The text llama.cpp's ``get_vocab_base_pre`` encodes (``chktxt``)."""

PRE_BY_HASH: dict[str, str] = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # meta-llama/Meta-Llama-3-8B
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "d4540891389ea895b53b399da6ac824becc30f2fba0e9ddbb98f92e55ca0e97c": "qwen2",  # Qwen/Qwen3-Embedding-0.6B
    "d30d75d9059f1aa2c19359de71047b3ae408c70875e8a3ccf8c5fba56c9d8af4": "qwen35",  # Qwen/Qwen3.5-9B-Instruct
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM-135M
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",
    "877081d19cf6996e2c4ff0e1236341e9b7bde288f5311a56a937f0afbbb3aeb5": "deepseek-v3",  # deepseek-ai/DeepSeek-V3
    "049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754": "deepseek-llm",
    "347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821": "deepseek-coder",
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",  # mistralai/Mistral-Nemo-Base-2407
    "0e9433cbbb161f89e264eb32e8e64bfe69e834973ffca5d41d3948a604a3e2a3": "pixtral",
    "c136ed14d01c2745d4f60a9596ae66800e2b61fa45643e72436041855ad4089d": "smaug-bpe",
    "d353350c764d8c3b39c763113960e4fb4919bea5fbf208a0e3b22e8469dc7406": "llama4",
    "9d032fcbd5501f4a38150912590928bfb36091efb5df11b8e2124b0390e3fb1e": "falcon3",
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
    "fcace8b9cac38ce847670c970cd5892031a753a1ef381abd1d9af00f713da085": "phi-2",
    "ccc2ef013c104be7bae2965776d611e1d7a8a2a9c547dd93a682c9a9fc80352e": "gpt-4o",  # Xenova/gpt-4o (phi-4 ...)
    "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34": "starcoder",
    "32d85c31273f8019248f2559fed492d929ea28b17e51d81d3bb36fff23ca72b3": "stablelm2",
    "b6dc8df998e1cfbdc4eac8243701a65afe638679230920b50d6f17d81c098166": "olmo",
}
"""``get_vocab_base_pre`` hash -> ``tokenizer.ggml.pre``, for the families qckpt maps (from llama.cpp's
``convert_hf_to_gguf.py``; each hash was computed there on the named model's own tokenizer)."""

UNKNOWN_PRE = ("warning: tokenizer.ggml.pre: the BPE pre-tokenizer was not recognized (hash {hash} is not among "
               "the known ones); 'default' written, llama.cpp may split text differently from the source tokenizer "
               "(convert_hf_to_gguf.py refuses such a tokenizer)")

_SPIECE_SPACE = "\u2581"
_TOKEN_TYPES = {"NORMAL": 1, "UNKNOWN": 2, "CONTROL": 3, "USER_DEFINED": 4, "UNUSED": 5, "BYTE": 6}


@dataclass
class TokenizerKV:
    """Tokenizer key/values in writing order, their GGUF value types (``"STRING"``, ``["ARRAY", "INT32"]`` ...,
    the form of ``ckpt.metadata["gguf_kv_types"]``) and warnings for the convert report."""

    kv: dict[str, Any] = field(default_factory=dict)
    types: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _looks_special(text: str) -> bool:
    """``ModelBase.does_token_look_special``: added tokens some models leave unmarked that are control tokens."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>")) or (text.startswith("<unused") and text.endswith(">")))


def pre_tokenizer_name(tokenizer: Any) -> tuple[str | None, str]:
    """``(name or None, hash)``: llama.cpp's ``tokenizer.ggml.pre`` of a ``tokenizers.Tokenizer`` (encoding with
    its post-processor, as ``AutoTokenizer.encode`` does)."""
    digest = sha256(str(tokenizer.encode(CHECK_TEXT).ids).encode()).hexdigest()
    return PRE_BY_HASH.get(digest), digest


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FormatError(f"unreadable JSON: {exc}", file=path) from exc
    if not isinstance(data, dict):
        raise FormatError("not a JSON object", file=path, expected="object", found=type(data).__name__)
    return data


def _bpe_vocab(folder: Path, config: Mapping[str, Any]) -> tuple[list[str], list[int], str | None, str]:
    from tokenizers import Tokenizer
    path = folder / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises its own Exception subclass on a malformed file
        raise FormatError(f"tokenizers cannot read it: {exc}", file=path) from exc
    model = _json(path).get("model") or {}
    if model.get("type") != "BPE":
        raise UnsupportedError("tokenizer.json model is not BPE: only byte-level BPE ('gpt2') and SentencePiece "
                               "(tokenizer.model) vocabularies are converted to GGUF", file=path, field="model.type",
                               expected="BPE", found=model.get("type"))
    vocab = tok.get_vocab(with_added_tokens=True)
    vocab_size = config.get("vocab_size")
    vocab_size = int(vocab_size) if isinstance(vocab_size, int) else len(vocab)
    if vocab and max(vocab.values()) >= vocab_size:
        raise FormatError("tokenizer ids exceed config.json vocab_size", file=path, field="vocab_size",
                          expected=f"ids < {vocab_size}", found=max(vocab.values()))
    added = {int(k): v for k, v in tok.get_added_tokens_decoder().items()}
    reverse = {i: t for t, i in vocab.items()}
    tokens: list[str] = []
    types: list[int] = []
    for i in range(vocab_size):
        text = reverse.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(_TOKEN_TYPES["UNUSED"])
        elif i in added:
            at = added[i]
            if not at.normalized:  # llama.cpp expects control / user-defined tokens pre-normalized
                text = tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False)
            if at.special or _looks_special(text):
                types.append(_TOKEN_TYPES["CONTROL"])
            else:
                text = text.replace(_SPIECE_SPACE, " ")
                types.append(_TOKEN_TYPES["USER_DEFINED"])
            tokens.append(text)
        else:
            tokens.append(text)
            types.append(_TOKEN_TYPES["NORMAL"])
    name, digest = pre_tokenizer_name(tok)
    return tokens, types, name, digest


def _spm_vocab(folder: Path, config: Mapping[str, Any]) -> tuple[list[str], list[float], list[int]]:
    try:
        from sentencepiece import SentencePieceProcessor
    except ImportError as exc:
        raise UnsupportedError("a SentencePiece tokenizer.model needs the sentencepiece package",
                               file=folder / "tokenizer.model", hint="pip install sentencepiece") from exc
    sp = SentencePieceProcessor()
    try:
        sp.LoadFromFile(str(folder / "tokenizer.model"))
    except Exception as exc:  # sentencepiece raises OSError / RuntimeError on a bad model proto
        raise FormatError(f"sentencepiece cannot read it: {exc}", file=folder / "tokenizer.model") from exc
    n = sp.vocab_size()
    vocab_size = config.get("vocab_size")
    vocab_size = int(vocab_size) if isinstance(vocab_size, int) else n
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    scores = [-10000.0] * vocab_size
    types = [_TOKEN_TYPES["UNUSED"]] * vocab_size
    for i in range(min(n, vocab_size)):
        kind = ("UNKNOWN" if sp.IsUnknown(i) else "CONTROL" if sp.IsControl(i) else "UNUSED" if sp.IsUnused(i)
                else "BYTE" if sp.IsByte(i) else "NORMAL")
        tokens[i], scores[i], types[i] = sp.IdToPiece(i), float(sp.GetScore(i)), _TOKEN_TYPES[kind]
    if (folder / "added_tokens.json").is_file():
        for text, i in _json(folder / "added_tokens.json").items():
            if isinstance(i, int) and 0 <= i < vocab_size:
                tokens[i], scores[i], types[i] = text, -1000.0, _TOKEN_TYPES["USER_DEFINED"]
    if (folder / "tokenizer_config.json").is_file():
        decoder = _json(folder / "tokenizer_config.json").get("added_tokens_decoder") or {}
        for key, entry in decoder.items():
            i, text = int(key), entry.get("content")
            if not isinstance(text, str) or not 0 <= i < vocab_size:
                continue
            if entry.get("special") or _looks_special(text):
                types[i] = _TOKEN_TYPES["CONTROL"]
            else:
                text = text.replace(_SPIECE_SPACE, " ")
                types[i] = _TOKEN_TYPES["USER_DEFINED"]
            tokens[i], scores[i] = text, -1000.0
    return tokens, scores, types


def collected_kv(writer: Any) -> TokenizerKV:
    """The key/values a ``gguf.GGUFWriter`` holds (not ``general.architecture``), with their GGUF value types."""
    gguf = _gguf()
    out = TokenizerKV()
    for key, v in writer.kv_data[0].items():
        if key == gguf.Keys.General.ARCHITECTURE:
            continue
        value = v.value
        if v.type == gguf.GGUFValueType.ARRAY:
            value = [x.decode("utf-8") if isinstance(x, bytes) else (int(x) if isinstance(x, int) else x)
                     for x in value]
            sub = v.sub_type or gguf.GGUFValueType.get_type(v.value[0])
            out.types[key] = ["ARRAY", sub.name]
        else:
            out.types[key] = v.type.name
        out.kv[key] = value
    return out


@contextmanager
def _gguf_warnings() -> Iterator[list[str]]:
    """gguf-py's ``gguf.vocab`` warnings (unknown template tokens, missing merges ...) as a list, not on stderr."""
    logged: list[str] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record.getMessage())
    logger = logging.getLogger("gguf.vocab")
    handler, propagate = _Collect(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield logged
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _gguf():
    from converter.formats.gguf.schemes import gguf_module
    return gguf_module()


def tokenizer_kv(folder: str | Path, config: Mapping[str, Any], arch: str) -> TokenizerKV | None:
    """The tokenizer key/values ``convert_hf_to_gguf.py`` writes for the model folder ``folder``.

    Parameters
    ----------
    folder : path
        Hugging Face model directory (``tokenizer.json`` and / or ``tokenizer.model``, ``tokenizer_config.json``,
        ``special_tokens_map.json``, ``config.json``, ``chat_template.jinja`` ...).
    config : mapping
        Its ``config.json`` (``vocab_size``; special ids are read by ``gguf.SpecialVocab`` from the file).
    arch : str
        ``general.architecture`` of the file written (``"llama"`` adds ``LlamaModel.set_vocab``'s two rules).

    Returns
    -------
    TokenizerKV or None
        None when the folder has neither ``tokenizer.json`` nor ``tokenizer.model``.

    Raises
    ------
    UnsupportedError
        A ``tokenizer.json`` whose model is not BPE (WordPiece, Unigram) and no ``tokenizer.model``; a
        ``tokenizer.model`` without the ``sentencepiece`` package.
    FormatError
        Unreadable files; token ids beyond ``vocab_size``.
    """
    folder = Path(folder)
    has_json, has_spm = (folder / "tokenizer.json").is_file(), (folder / "tokenizer.model").is_file()
    if not (has_json or has_spm):
        return None
    gguf = _gguf()
    writer = gguf.GGUFWriter(None, arch)  # a key/value collector: nothing is written to disk
    tk_config = _json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    warnings: list[str] = []
    if arch == "llama" and isinstance(tk_config.get("add_prefix_space"), bool):
        writer.add_add_space_prefix(tk_config["add_prefix_space"])
    if has_spm:  # LlamaModel.set_vocab tries SentencePiece first
        tokens, scores, types = _spm_vocab(folder, config)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        with _gguf_warnings() as logged:
            special = gguf.SpecialVocab(folder, n_vocab=len(tokens))
    else:
        tokens, types, pre, digest = _bpe_vocab(folder, config)
        if pre is None:
            warnings.append(UNKNOWN_PRE.format(hash=digest))
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre or "default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        with _gguf_warnings() as logged:
            special = gguf.SpecialVocab(folder, load_merges=True)
    special.add_to_gguf(writer, quiet=True)
    if arch in ("gemma2", "gemma3") and has_spm:  # Gemma2Model / Gemma3Model.set_vocab after the SentencePiece vocab
        writer.add_add_space_prefix(False)
    if arch == "llama" and config.get("vocab_size", 32000) == 49152:  # LlamaModel.set_vocab: granite small models
        writer.kv_data[0].pop(gguf.Keys.Tokenizer.ADD_BOS, None)
        writer.add_add_bos_token(False)
    out = collected_kv(writer)
    out.warnings = warnings + [f"warning: gguf-py: {m}" for m in logged]
    return out
