"""Tokenizer files from GGUF key/values (converter.formats.gguf.hf_tokenizer).

Expected ids: transformers 5.24.0 / tokenizers 0.23.3,
``AutoTokenizer.from_pretrained("tests/data/gguf", gguf_file="smollm2_vocab_tiny.gguf")`` then
``tok(s)["input_ids"]``, ``tok.apply_chat_template(MESSAGES, add_generation_prompt=True)`` and ``tok.decode``
(tests/data/gguf/record_expected.py; the real 98 MB file gives the same values). Ours go through
``tokenizers.Tokenizer.from_str`` of the written tokenizer.json. llama.cpp itself (llama-cpp-python 0.3.36,
``Llama(model_path=..., vocab_only=True).tokenize(s.encode(), add_bos=True, special=True)``) gives the same
ids for every string here, and agreed with ours on 3000 random strings of letters, digits, spaces, newlines,
unicode and special tokens, where transformers' conversion differed on 564: it has no 'smollm' digit split,
so there the expected ids are llama.cpp's (also derived by hand from its ``llm_tokenizer_bpe`` regexes).
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from converter.errors import FormatError, UnsupportedError
from converter.formats.gguf import hf_tokenizer as ght
from converter.formats.gguf.hf_tokenizer import (TOKENIZER_FILES, check_tokenizer, generation_config,
                                                 hf_tokenizer_files_from_gguf, tokenizer_config, tokenizer_json)

from ._gguf_hf_data import REAL, fixture_checkpoint, real_checkpoint

TF_IDS = {
    "The capital of France is": [504, 3575, 282, 4649, 314],
    "Hello, we can use": [19556, 28, 392, 416, 722],
    "2018-01-22 12345": [34, 32, 33, 40, 29, 32, 33, 29, 34, 34, 216, 33, 34, 35, 36, 37],
    "  hello   world\n\n x": [216, 33662, 256, 905, 1116, 1792],
    "héllo wörld 日本語 🤗": [88, 2756, 31394, 267, 29989, 400, 17097, 241, 115, 40993, 179, 120, 248, 15107, 114, 241],
    "<|im_start|>user\nhi<|im_end|>": [1, 4093, 198, 6004, 2],
    "I'm sure they'll've": [57, 5248, 2090, 502, 3060, 3543],
    "\t\ttabs\r\nCRLF  ": [197, 197, 100, 7366, 201, 198, 9088, 60, 54, 256],
    "": [],
    "<|endoftext|><jupyter_code>print(1)": [0, 13, 3272, 24, 33, 25],
}
TF_CHAT_TEXT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
TF_CHAT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
               8182, 2, 198, 1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198, 1, 520, 9531, 198]
TF_DECODE = ([504, 3575, 282, 4649, 314, 7042, 30, 198, 198], "The capital of France is Paris.\n\n")
TF_SPECIAL = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
              "unk_token": "<|endoftext|>"}


def _kv():
    return fixture_checkpoint().metadata["gguf_kv"]


def _tok(kv=None) -> Tokenizer:
    return Tokenizer.from_str(tokenizer_json(kv if kv is not None else _kv()))


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_str(fixture_checkpoint().side_files["tokenizer.json"]().decode("utf-8"))


@pytest.mark.parametrize("text", list(TF_IDS))
def test_ids_match_transformers_gguf_conversion(tok, text):
    assert tok.encode(text).ids == TF_IDS[text]


def test_chat_template_text_and_ids(tok):
    cfg = json.loads(fixture_checkpoint().side_files["tokenizer_config.json"]())
    assert cfg["chat_template"] == _kv()["tokenizer.chat_template"]
    assert tok.encode(TF_CHAT_TEXT).ids == TF_CHAT_IDS


def test_decode_matches_transformers(tok):
    ids, text = TF_DECODE
    assert tok.decode(ids) == text
    for s in ("héllo wörld 日本語 🤗", "  hello   world\n\n x", "I'm sure they'll've"):  # byte-level: lossless
        assert tok.decode(tok.encode(s).ids) == s


def test_smollm_digit_split_follows_llama_cpp(tok):
    """llama.cpp 'smollm' = regexes [\\p{N}, gpt2]: 'x  1' -> 'x', '  ', '1' -> x, ĠĠ, 1 (llama-cpp-python 0.3.36
    on this file: [104, 256, 33] and [81, 256, 33, 34]). transformers 5.24 (no smollm split, GPT-2 regex only)
    gives x, Ġ, Ġ, 1 = [104, 216, 216, 33] instead."""
    vocab = {t: i for i, t in enumerate(_kv()["tokenizer.ggml.tokens"])}
    assert tok.encode("x  1").ids == [vocab["x"], vocab["ĠĠ"], vocab["1"]] == [104, 256, 33]
    assert tok.encode("a  12").ids == [vocab["a"], vocab["ĠĠ"], vocab["1"], vocab["2"]]


def test_special_tokens_and_configs():
    files = fixture_checkpoint().side_files
    assert set(files) == set(TOKENIZER_FILES)
    cfg = json.loads(files["tokenizer_config.json"]())
    assert {k: cfg[k] for k in TF_SPECIAL} == TF_SPECIAL
    assert cfg["add_bos_token"] is False  # tokenizer.ggml.add_bos_token false
    # the file has no add_eos_token key (written only when it has one) and add_space_prefix false: the fields
    # convert_hf_to_gguf.py reads back (SpecialVocab, LlamaModel.set_vocab)
    assert "add_eos_token" not in cfg and cfg["add_prefix_space"] is False
    assert cfg["model_max_length"] == 8192 and cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert cfg["clean_up_tokenization_spaces"] is False  # llama_vocab::load: smollm -> clean_spaces = false
    assert json.loads(files["special_tokens_map.json"]()) == TF_SPECIAL
    assert json.loads(files["generation_config.json"]()) == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    tj = json.loads(files["tokenizer.json"]())
    added = {t["id"]: t for t in tj["added_tokens"]}
    # the 17 control tokens (token_type 3: ids 0..16) are special, matched on raw text
    assert sorted(added) == list(range(17)) and all(t["special"] and not t["normalized"] for t in added.values())
    assert tj["model"]["type"] == "BPE" and len(tj["model"]["vocab"]) == 49152 and len(tj["model"]["merges"]) == 48900


def test_tokenizer_is_built_lazily_once(monkeypatch):
    calls = []
    real = ght.tokenizer_json
    monkeypatch.setattr(ght, "tokenizer_json", lambda kv: calls.append(1) or real(kv))
    files = hf_tokenizer_files_from_gguf(_kv())
    assert calls == []
    a, b = files["tokenizer.json"](), files["tokenizer.json"]()
    assert a == b and calls == [1]


def test_add_bos_true_prepends_bos():
    """llama.cpp llm_tokenizer_bpe_session::append_bos when tokenizer.ggml.add_bos_token is true."""
    kv = dict(_kv(), **{"tokenizer.ggml.add_bos_token": True})
    assert _tok(kv).encode("The capital of France is").ids == [1, 504, 3575, 282, 4649, 314]
    assert json.loads(hf_tokenizer_files_from_gguf(kv)["tokenizer_config.json"]())["add_bos_token"] is True


def test_missing_pre_is_llama_cpp_default():
    """No tokenizer.ggml.pre: llama.cpp's DEFAULT regexes (punctuation runs split first)."""
    kv = {k: v for k, v in _kv().items() if k != "tokenizer.ggml.pre"}
    check_tokenizer(kv)
    assert ght._pre(kv) is ght.PRE_TOKENIZERS["default"]
    assert _tok(kv).encode("The capital of France is").ids == TF_IDS["The capital of France is"]


def test_user_defined_tokens_are_plain_added_tokens():
    kv = dict(_kv())
    types = list(kv["tokenizer.ggml.token_type"])
    types[3] = 4  # '<repo_name>' as USER_DEFINED
    kv["tokenizer.ggml.token_type"] = types
    tj = json.loads(tokenizer_json(kv))
    t = next(t for t in tj["added_tokens"] if t["id"] == 3)
    assert t["content"] == "<repo_name>" and t["special"] is False
    assert Tokenizer.from_str(json.dumps(tj)).encode("a<repo_name>b").ids[1] == 3


def test_eot_token_joins_generation_eos():
    kv = dict(_kv(), **{"tokenizer.ggml.eot_token_id": 0})
    assert generation_config(kv)["eos_token_id"] == [2, 0]


@pytest.mark.parametrize("change, error, match", [
    ({"tokenizer.ggml.model": "llama"}, UnsupportedError, "SentencePiece"),
    ({"tokenizer.ggml.model": "bert"}, UnsupportedError, "byte-level BPE"),
    ({"tokenizer.ggml.pre": "some-future-pre"}, UnsupportedError, "unknown pre-tokenizer"),
    ({"tokenizer.ggml.token_type": [1, 1]}, FormatError, "token types"),
    ({"tokenizer.ggml.eos_token_id": 49152}, FormatError, "outside the vocabulary"),
    ({"tokenizer.ggml.merges": None}, FormatError, "merges"),
])
def test_refusals(change, error, match):
    kv = dict(_kv(), **change)
    with pytest.raises(error, match=match) as exc:
        hf_tokenizer_files_from_gguf(kv)
    assert exc.value.field.startswith("tokenizer.ggml.")


def test_bad_merge_and_duplicate_token_refused():
    kv = dict(_kv())
    kv["tokenizer.ggml.merges"] = ["Ġ t", "no such-merge"]
    with pytest.raises(FormatError, match="merge"):
        tokenizer_json(kv)
    kv = dict(_kv())
    tokens = list(kv["tokenizer.ggml.tokens"])
    tokens[100] = tokens[101]
    kv["tokenizer.ggml.tokens"] = tokens
    with pytest.raises(FormatError, match="same text"):
        tokenizer_json(kv)


def test_non_alphabet_normal_token_is_respelled():
    """A normal token outside GPT-2's byte alphabet is spelled through it (transformers byte_level_tokenizer):
    ' x' (raw space) -> 'Ġx'."""
    vocab = ght._vocab(["a", " x", "<|c|>"], [1, 1, 3])
    assert vocab == {"a": 0, "Ġx": 1, "<|c|>": 2}


def test_tokenizer_config_without_chat_template():
    kv = {k: v for k, v in _kv().items() if k != "tokenizer.chat_template"}
    assert "chat_template" not in tokenizer_config(kv)


@pytest.mark.skipif(not REAL.exists(), reason="the 98 MB SmolLM2 GGUF lives only in /work/shared")
def test_real_file_ids_match_transformers():
    tok = Tokenizer.from_str(real_checkpoint().side_files["tokenizer.json"]().decode("utf-8"))
    for text, ids in TF_IDS.items():
        assert tok.encode(text).ids == ids, text
    assert tok.encode(TF_CHAT_TEXT).ids == TF_CHAT_IDS
