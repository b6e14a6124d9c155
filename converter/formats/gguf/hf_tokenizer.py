"""Hugging Face tokenizer files for a GGUF file, from its ``tokenizer.*`` key/values.

A GGUF stores its vocabulary as ``tokenizer.ggml.tokens`` (id order), ``token_type`` (gguf-py
``TokenType``: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), ``merges``
(``"a b"`` strings, rank order), the special token ids, ``add_bos_token`` / ``add_eos_token``,
the pre-tokenizer name ``tokenizer.ggml.pre`` and ``tokenizer.chat_template``. llama.cpp is the
runtime that defines what those mean, so the tokenizer built here follows ``llama-vocab.cpp``:

- ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE): a ``tokenizers`` BPE over the file's vocab
  and merges; pre-tokenization is llama.cpp's regex list for the ``pre`` name, each regex a
  ``Split(..., "isolated")`` applied in order to the pieces of the one before (``unicode_regex_split``
  keeps unmatched text as its own piece), then ``ByteLevel(use_regex=False)``; ``ignore_merges``,
  the default of ``add_bos`` and ``clean_spaces`` per ``pre`` name as ``llama_vocab::load`` sets them.
  Control tokens (type 3) are special added tokens, user-defined ones (4) plain added tokens, both
  matched on the raw text (``normalized=False``), as transformers' GGUF conversion
  (``integrations/gguf/gguf_tokenizer_mapping.py`` ``add_gguf_special_tokens``) and llama.cpp's
  special-token partition do. A normal token spelled outside the byte alphabet is respelled
  through it (transformers ``byte_level_tokenizer``); control and user-defined tokens keep their
  text so their added token reuses their id.
- Other models (``llama`` SentencePiece, ``bert``, ``t5`` ...) raise :class:`UnsupportedError`:
  SentencePiece merges would have to be rebuilt from scores and llama.cpp adds its space prefix
  after every special token, which no ``tokenizers`` pre-tokenizer reproduces.

Known divergence: transformers 5.24's own GGUF conversion knows no ``smollm`` / ``starcoder`` split
and uses the plain GPT-2 regex there; llama.cpp (and the original SmolLM tokenizer, whose
pre-tokenizer is ``Digits(individual_digits) + ByteLevel``) first isolates every digit, which
differs on runs of spaces before a digit (``"x  1"``: ``x``, ``ĠĠ``, ``1`` here, ``x``, ``Ġ``, ``Ġ``,
``1`` in transformers).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Mapping

from converter.errors import FormatError, UnsupportedError

__all__ = ["hf_tokenizer_files_from_gguf", "tokenizer_json", "check_tokenizer", "PRE_TOKENIZERS",
           "TOKENIZER_FILES"]

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")

# llama-vocab.cpp llm_tokenizer_bpe regex_exprs (the LLAMA3 / QWEN2 forms are llama.cpp's adapted
# spellings of the original tokenizer.json regexes, with explicit case classes instead of (?i:))
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreTokenizer:
    """llama.cpp's handling of one ``tokenizer.ggml.pre`` value (``llama_vocab::load``)."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False
    clean_spaces: bool = True


def _table() -> dict[str, PreTokenizer]:
    t: dict[str, PreTokenizer] = {"default": PreTokenizer(_DEFAULT)}
    for n in ("llama3", "llama-v3", "llama-bpe", "falcon3"):
        t[n] = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
    for n in ("dbrx", "smaug-bpe"):
        t[n] = PreTokenizer((_LLAMA3,))
    for n in ("gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais"):
        t[n] = PreTokenizer((_GPT2,))
    for n, clean in (("starcoder", True), ("refact", True), ("command-r", False), ("smollm", False),
                     ("codeshell", True), ("exaone", True), ("minerva-7b", True)):
        t[n] = PreTokenizer((r"\p{N}", _GPT2), clean_spaces=clean)
    for n, clean in (("qwen2", False), ("stablelm2", True), ("megrez", True)):
        t[n] = PreTokenizer((_QWEN2,), clean_spaces=clean)
    return t


PRE_TOKENIZERS: dict[str, PreTokenizer] = _table()
"""``tokenizer.ggml.pre`` -> llama.cpp's regexes and flags (a missing key is llama.cpp's ``default``)."""


def _pre(kv: Mapping[str, Any]) -> PreTokenizer:
    model = kv.get("tokenizer.ggml.model")
    if not isinstance(model, str) and model is not None:
        model = repr(model)
    if model != "gpt2":
        reason = {"llama": "SentencePiece vocabularies are not converted (merges must be rebuilt from scores, and "
                           "llama.cpp's space prefix after special tokens has no tokenizers equivalent)",
                  None: "the file has no tokenizer (no tokenizer.ggml.model key)",
                  "none": "the file declares no vocabulary (tokenizer.ggml.model 'none')"}.get(
            model, "only byte-level BPE ('gpt2') vocabularies are converted")
        raise UnsupportedError(f"no Hugging Face tokenizer written: {reason}", field="tokenizer.ggml.model",
                               expected="gpt2", found=model)
    name = kv.get("tokenizer.ggml.pre", "default")
    if not isinstance(name, str) or name not in PRE_TOKENIZERS:
        raise UnsupportedError("no Hugging Face tokenizer written: unknown pre-tokenizer (its regexes are not known "
                               "here)", field="tokenizer.ggml.pre", expected=sorted(PRE_TOKENIZERS), found=name)
    return PRE_TOKENIZERS[name]


def check_tokenizer(kv: Mapping[str, Any]) -> None:
    """Raise what :func:`tokenizer_json` would raise for the model / pre-tokenizer / array shapes (cheap)."""
    _pre(kv)
    tokens = kv.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise FormatError("tokenizer vocabulary missing or not a list of strings", field="tokenizer.ggml.tokens",
                          expected="array of strings", found=type(tokens).__name__)
    types = kv.get("tokenizer.ggml.token_type")
    if types is not None and (not isinstance(types, list) or len(types) != len(tokens)):
        raise FormatError("token types do not match the vocabulary", field="tokenizer.ggml.token_type",
                          expected=len(tokens), found=len(types) if isinstance(types, list) else types)
    merges = kv.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise FormatError("BPE merges missing or not a list of strings", field="tokenizer.ggml.merges",
                          expected="array of strings", found=type(merges).__name__)
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        v = kv.get(f"tokenizer.ggml.{key}")
        if v is not None and not (isinstance(v, int) and 0 <= v < len(tokens)):
            raise FormatError("special token id outside the vocabulary", field=f"tokenizer.ggml.{key}",
                              expected=f"0..{len(tokens) - 1}", found=v)


@lru_cache(maxsize=1)
def _byte_alphabet() -> dict[int, str]:
    """GPT-2's ``bytes_to_unicode``: printable Latin-1 bytes map to themselves, the rest to U+0100.."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


def _vocab(tokens: list[str], types: list[int]) -> dict[str, int]:
    spell = _byte_alphabet()
    alphabet = set(spell.values())
    vocab: dict[str, int] = {}
    for i, (tok, tt) in enumerate(zip(tokens, types)):
        if not tok:
            tok = f"[EMPTY_{i}]"  # llama_vocab::load's name for an empty token
        if tt not in (CONTROL, USER_DEFINED) and not set(tok) <= alphabet:
            tok = "".join(spell[b] for b in tok.encode("utf-8"))
        if tok in vocab:
            raise FormatError("two tokens have the same text: a BPE vocabulary needs unique tokens",
                              field="tokenizer.ggml.tokens", expected="unique strings",
                              found=f"{tok!r} at ids {vocab[tok]} and {i}")
        vocab[tok] = i
    return vocab


def tokenizer_json(kv: Mapping[str, Any]) -> str:
    """``tokenizer.json`` text for a byte-level BPE GGUF vocabulary (see the module docstring).

    Raises
    ------
    UnsupportedError
        Not a ``gpt2`` model, or an unknown ``tokenizer.ggml.pre``.
    FormatError
        Missing / inconsistent arrays, duplicate tokens, a merge that is not two vocabulary tokens.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    check_tokenizer(kv)
    pre = _pre(kv)
    tokens = list(kv["tokenizer.ggml.tokens"])
    types = list(kv.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    vocab = _vocab(tokens, types)
    merges = []
    for i, m in enumerate(kv["tokenizer.ggml.merges"]):
        parts = m.split(" ")
        if len(parts) != 2 or not all(p in vocab for p in parts) or parts[0] + parts[1] not in vocab:
            raise FormatError("BPE merge is not two vocabulary tokens forming a third", field="tokenizer.ggml.merges",
                              expected="'a b' with a, b and ab in the vocabulary", found=f"#{i} {m!r}")
        merges.append((parts[0], parts[1]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None, continuing_subword_prefix="",
                               end_of_word_suffix="", fuse_unk=False, byte_fallback=False,
                               ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, tt in enumerate(types) if tt == CONTROL and tokens[i]])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False)
                    for i, tt in enumerate(types) if tt == USER_DEFINED and tokens[i]])
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise FormatError("added tokens did not map onto their vocabulary ids", field="tokenizer.ggml.token_type",
                          expected=len(tokens), found=tok.get_vocab_size(with_added_tokens=True))
    # transformers' TokenizersBackend.update_post_processor layout: [bos] $A [eos] ([bos] $B [eos])
    add_bos, add_eos = _add_flags(kv, pre)
    ends = [(add_bos, "bos_token_id"), (add_eos, "eos_token_id")]
    bos, eos = [_special(kv, key) if on else None for on, key in ends]
    specials = sorted({(_special(kv, key), kv[f"tokenizer.ggml.{key}"]) for on, key in ends
                       if on and _special(kv, key) is not None})

    def seq(piece: str, type_id: int) -> str:
        return " ".join(([f"{bos}:{type_id}"] if bos else []) + [f"{piece}:{type_id}"]
                        + ([f"{eos}:{type_id}"] if eos else []))
    tok.post_processor = processors.TemplateProcessing(single=seq("$A", 0), pair=seq("$A", 0) + " " + seq("$B", 1),
                                                       special_tokens=specials)
    return tok.to_str()


def _special(kv: Mapping[str, Any], key: str) -> str | None:
    v = kv.get(f"tokenizer.ggml.{key}")
    return None if v is None else kv["tokenizer.ggml.tokens"][v]


def _add_flags(kv: Mapping[str, Any], pre: PreTokenizer) -> tuple[bool, bool]:
    add_bos = kv.get("tokenizer.ggml.add_bos_token", pre.add_bos)
    add_eos = kv.get("tokenizer.ggml.add_eos_token", False)
    return bool(add_bos), bool(add_eos)


def _dump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")


def tokenizer_config(kv: Mapping[str, Any]) -> dict[str, Any]:
    """``tokenizer_config.json``: special tokens by text, add_bos/add_eos, chat template, limits."""
    check_tokenizer(kv)
    pre = _pre(kv)
    add_bos, add_eos = _add_flags(kv, pre)
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": add_bos,
                           "clean_up_tokenization_spaces": pre.clean_spaces}
    # add_eos_token only when the file states it (tokenizer.json's post-processor already adds no EOS otherwise),
    # add_prefix_space from add_space_prefix: the fields convert_hf_to_gguf.py reads back (SpecialVocab,
    # LlamaModel.set_vocab), so a GGUF -> folder -> GGUF round trip keeps the keys the file had
    if isinstance(kv.get("tokenizer.ggml.add_eos_token"), bool):
        cfg["add_eos_token"] = add_eos
    if isinstance(kv.get("tokenizer.ggml.add_space_prefix"), bool):
        cfg["add_prefix_space"] = kv["tokenizer.ggml.add_space_prefix"]
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"), ("unk_token", "unknown_token_id"),
                      ("pad_token", "padding_token_id")):
        text = _special(kv, key)
        if text is not None:
            cfg[name] = text
    template = kv.get("tokenizer.chat_template")
    if isinstance(template, str):
        cfg["chat_template"] = template
    ctx = kv.get(f"{kv.get('general.architecture')}.context_length")
    if isinstance(ctx, int) and not isinstance(ctx, bool):
        cfg["model_max_length"] = ctx
    return cfg


def generation_config(kv: Mapping[str, Any]) -> dict[str, Any]:
    """``generation_config.json``: bos / eos / pad ids; ``eos_token_id`` is a list when the file also
    names an end-of-turn / end-of-message token (llama.cpp stops generation on each of them)."""
    out: dict[str, Any] = {}
    n = len(kv.get("tokenizer.ggml.tokens") or ())
    for field, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("pad_token_id", "padding_token_id")):
        v = kv.get(f"tokenizer.ggml.{key}")
        if isinstance(v, int) and 0 <= v < n:
            out[field] = v
    stops = [kv.get(f"tokenizer.ggml.{k}") for k in ("eot_token_id", "eom_token_id")]
    stops = [s for s in stops if isinstance(s, int) and 0 <= s < n and s != out.get("eos_token_id")]
    if stops:
        out["eos_token_id"] = ([out["eos_token_id"]] if "eos_token_id" in out else []) + sorted(set(stops))
    return out


def hf_tokenizer_files_from_gguf(kv: Mapping[str, Any]) -> dict[str, Callable[[], bytes]]:
    """File name -> callable() -> bytes for ``tokenizer.json``, ``tokenizer_config.json``,
    ``special_tokens_map.json`` and ``generation_config.json``.

    Only cheap checks run here (:func:`check_tokenizer`); ``tokenizer.json`` is built when its callable
    is first called (then kept). ``kv`` is read, never copied, so it must not change afterwards.

    Raises
    ------
    UnsupportedError, FormatError
        As :func:`check_tokenizer`: no files can be made for this vocabulary.
    """
    check_tokenizer(kv)
    made: dict[str, bytes] = {}

    def tokenizer() -> bytes:
        if "tokenizer.json" not in made:
            made["tokenizer.json"] = tokenizer_json(kv).encode("utf-8")
        return made["tokenizer.json"]

    def special_map() -> bytes:
        cfg = tokenizer_config(kv)
        return _dump({k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if k in cfg})

    return {"tokenizer.json": tokenizer, "tokenizer_config.json": lambda: _dump(tokenizer_config(kv)),
            "special_tokens_map.json": special_map, "generation_config.json": lambda: _dump(generation_config(kv))}
