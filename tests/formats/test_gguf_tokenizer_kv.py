"""GGUF tokenizer key/values written from a Hugging Face folder (converter.formats.gguf.tokenizer_kv), and
``--gguf-metadata``.

True values: ``tests/data/gguf/smollm2_vocab_tiny.gguf`` holds the real SmolLM2-135M-Instruct key/values as
llama.cpp's converter wrote them (tests/data/gguf/README.md); the round trip GGUF -> ``qckpt dequantize`` ->
folder -> ``qckpt convert --to gguf`` must give back every ``tokenizer.*`` key with the same value and GGUF
type. The pre-tokenizer hash ``8550594...`` is the one llama.cpp's ``convert_hf_to_gguf.py`` lists for
HuggingFaceTB/SmolLM-135M's own tokenizer. Synthetic cases: values by hand from ``get_vocab_base``'s rules.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gguf
import pytest
from click.testing import CliRunner
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from converter.cli import main
from converter.errors import ErrorKind, FormatError, UnsupportedError
from converter.formats.gguf.hf_source import NO_VOCAB_WARNING, config_kv
from converter.formats.gguf.tokenizer_kv import PRE_BY_HASH, pre_tokenizer_name, tokenizer_kv

from ._gguf_hf_data import FIXTURE, write_tiny_llama

SMOLLM_HASH = "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249"


def _run(*args, code: int = 0):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == code, res.output
    return res.output


def _keys(path: Path, prefix: str = "tokenizer.") -> dict:
    r = gguf.GGUFReader(path)
    return {k: (f.contents(), [t.name for t in f.types]) for k, f in r.fields.items() if k.startswith(prefix)}


@pytest.fixture(scope="module")
def smollm_folder(tmp_path_factory):
    """The fixture GGUF dequantized to a Hugging Face folder (tokenizer files made by qckpt's reader)."""
    out = tmp_path_factory.mktemp("smol") / "hf"
    _run("dequantize", FIXTURE, out)
    return out


def test_round_trip_gives_back_every_tokenizer_key(smollm_folder, tmp_path):
    out = tmp_path / "out.gguf"
    _run("convert", smollm_folder, out, "--to", "gguf")
    true, got = _keys(FIXTURE), _keys(out)
    assert len(true) == 12  # model, pre, tokens, token_type, merges, 4 ids, add_bos, add_space_prefix, template
    assert set(got) == set(true)
    for key in true:
        assert got[key] == true[key], key
    assert got["tokenizer.ggml.pre"][0] == "smollm" and len(got["tokenizer.ggml.merges"][0]) == 48900
    # the hyperparameters come back too (key_length / value_length are added: config.json has head_dim, which
    # convert_hf_to_gguf.py writes as both)
    true, got = _keys(FIXTURE, "llama."), _keys(out, "llama.")
    assert {k: got[k] for k in true} == true
    assert set(got) - set(true) == {"llama.attention.key_length", "llama.attention.value_length"}
    assert got["llama.attention.key_length"][0] == got["llama.attention.value_length"][0] == 64  # 576 / 9


def test_pre_tokenizer_hash_is_llama_cpps(smollm_folder):
    name, digest = pre_tokenizer_name(Tokenizer.from_file(str(smollm_folder / "tokenizer.json")))
    assert (name, digest) == ("smollm", SMOLLM_HASH)
    assert PRE_BY_HASH[SMOLLM_HASH] == "smollm"


def _byte_level_folder(folder: Path, *, vocab_size: int | None) -> None:
    """A byte-level BPE tokenizer: 'a'=0, 'b'=1, 'Ġ'=2, 'ab'=3 (merge 'a b'), then added tokens 4..7."""
    folder.mkdir()
    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1, "Ġ": 2, "ab": 3}, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True, normalized=False)])  # 4: special
    tok.add_tokens([AddedToken("<pad>", special=False, normalized=False),  # 5: looks special -> control
                    AddedToken("\u2581hi", special=False, normalized=False),  # 6: user-defined, ▁ -> space
                    AddedToken("<|im_end|>", special=False, normalized=False)])  # 7: looks special
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": True, "add_prefix_space": False,
         "chat_template": "{{ messages }}"}))
    cfg = {"model_type": "qwen2"} | ({"vocab_size": vocab_size} if vocab_size else {})
    (folder / "config.json").write_text(json.dumps(cfg))


def test_byte_level_vocabulary_rules(tmp_path):
    folder = tmp_path / "tok"
    _byte_level_folder(folder, vocab_size=10)
    got = tokenizer_kv(folder, {"vocab_size": 10}, "qwen2")
    kv = got.kv
    assert kv["tokenizer.ggml.model"] == "gpt2"
    assert kv["tokenizer.ggml.tokens"] == ["a", "b", "Ġ", "ab", "<|im_start|>", "<pad>", " hi", "<|im_end|>",
                                           "[PAD8]", "[PAD9]"]
    assert kv["tokenizer.ggml.token_type"] == [1, 1, 1, 1, 3, 3, 4, 3, 5, 5]
    assert kv["tokenizer.ggml.merges"] == ["a b"]
    assert (kv["tokenizer.ggml.bos_token_id"], kv["tokenizer.ggml.eos_token_id"]) == (4, 7)
    assert kv["tokenizer.ggml.add_bos_token"] is True and kv["tokenizer.chat_template"] == "{{ messages }}"
    assert "tokenizer.ggml.add_space_prefix" not in kv  # LlamaModel only
    assert got.types["tokenizer.ggml.token_type"] == ["ARRAY", "INT32"]
    assert got.types["tokenizer.ggml.bos_token_id"] == "UINT32"
    # an unknown pre-tokenizer: 'default', and the warning names the hash
    assert kv["tokenizer.ggml.pre"] == "default"
    _, digest = pre_tokenizer_name(Tokenizer.from_file(str(folder / "tokenizer.json")))
    assert len(got.warnings) == 1 and digest in got.warnings[0] and "'default'" in got.warnings[0]


def test_llama_rules_and_vocab_size_default(tmp_path):
    folder = tmp_path / "tok"
    _byte_level_folder(folder, vocab_size=None)
    kv = tokenizer_kv(folder, {}, "llama").kv
    assert len(kv["tokenizer.ggml.tokens"]) == 8  # no config vocab_size: the tokenizer's own size
    assert kv["tokenizer.ggml.add_space_prefix"] is False  # tokenizer_config add_prefix_space
    kv = tokenizer_kv(folder, {"vocab_size": 49152}, "llama").kv
    assert kv["tokenizer.ggml.add_bos_token"] is False  # LlamaModel.set_vocab: 49152-token vocabulary


def test_ids_beyond_vocab_size_are_refused(tmp_path):
    folder = tmp_path / "tok"
    _byte_level_folder(folder, vocab_size=None)
    with pytest.raises(FormatError, match="vocab_size") as info:
        tokenizer_kv(folder, {"vocab_size": 6}, "qwen2")
    assert info.value.expected == "ids < 6" and info.value.found == 7


def test_no_tokenizer_files_gives_none(tmp_path):
    assert tokenizer_kv(tmp_path, {}, "llama") is None


def test_wordpiece_is_refused(tmp_path):
    tok = Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(UnsupportedError, match="not BPE") as info:
        tokenizer_kv(tmp_path, {}, "bert")
    assert info.value.found == "WordPiece"


def test_sentencepiece_needs_its_package(tmp_path, monkeypatch):
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x00")
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # import fails as when it is not installed
    with pytest.raises(UnsupportedError, match="sentencepiece") as info:
        tokenizer_kv(tmp_path, {}, "llama")
    assert info.value.hint == "pip install sentencepiece"


def test_llama_hyperparameters_by_hand():
    cfg = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
           "rope_scaling": {"type": "linear", "factor": 4.0}}
    kv = config_kv(cfg, "llama")
    assert kv["llama.rope.dimension_count"] == 16  # 64 / 4, no head_dim
    assert kv["llama.rope.scaling.type"] == "linear" and kv["llama.rope.scaling.factor"] == 4.0
    assert config_kv({**cfg, "head_dim": 32}, "llama")["llama.rope.dimension_count"] == 32
    assert "qwen2.rope.dimension_count" not in config_kv(cfg, "qwen2")  # Qwen2Model writes none


# --- --gguf-metadata ------------------------------------------------------------------------------------------

@pytest.fixture
def bare_folder(tmp_path):
    """A float LLaMA folder without tokenizer files (the tiny GGUF dequantized, its tokenizer files removed)."""
    src = write_tiny_llama(tmp_path / "tiny.gguf")
    folder = tmp_path / "hf"
    _run("dequantize", src, folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink()
    return src, folder


def test_gguf_metadata_supplies_the_tokenizer(bare_folder, tmp_path):
    src, folder = bare_folder
    plain = tmp_path / "plain.gguf"
    report = json.loads(_run("convert", folder, plain, "--to", "gguf", "--json"))
    # no vocabulary: declared as llama.cpp's model 'none' (the vocabulary size is known), and said so
    assert report["side_files_skipped"]["tokenizer.ggml.*"].startswith(NO_VOCAB_WARNING)
    assert _keys(plain) == {"tokenizer.ggml.model": ("none", ["STRING"])}
    out = tmp_path / "out.gguf"
    report = json.loads(_run("convert", folder, out, "--to", "gguf", "--gguf-metadata", src, "--json"))
    assert "side_files_skipped" not in report
    assert _keys(out) == _keys(src)
    true, got = _keys(src, "llama."), _keys(out, "llama.")
    assert {k: got[k] for k in true} == true


def _vocab_only(path: Path, arch: str, block_count: int) -> Path:
    w = gguf.GGUFWriter(path, arch)
    w.add_uint32(f"{arch}.block_count", block_count)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def test_gguf_metadata_of_another_architecture_is_refused(bare_folder, tmp_path):
    _, folder = bare_folder
    meta = _vocab_only(tmp_path / "qwen.gguf", "qwen2", 1)
    from converter.formats.registry import load
    from converter.formats.gguf.format import write_gguf
    with pytest.raises(FormatError, match="another architecture") as info:
        write_gguf(load(folder), tmp_path / "out.gguf", gguf_metadata=meta)
    assert (info.value.field, info.value.expected, info.value.found) == ("general.architecture", "llama", "qwen2")
    assert info.value.kind == ErrorKind.CONFIG_MISMATCH
    out = _run("convert", folder, tmp_path / "out.gguf", "--to", "gguf", "--gguf-metadata", meta, code=3)
    assert len(out.strip().splitlines()) == 1 and "general.architecture" in out and "qwen2" in out
    assert not (tmp_path / "out.gguf").exists()


def test_gguf_metadata_disagreeing_with_config_is_refused(bare_folder, tmp_path):
    _, folder = bare_folder
    meta = _vocab_only(tmp_path / "other.gguf", "llama", 7)
    from converter.formats.registry import load
    from converter.formats.gguf.format import write_gguf
    with pytest.raises(FormatError, match="disagrees with config.json") as info:
        write_gguf(load(folder), tmp_path / "out.gguf", gguf_metadata=meta)
    assert (info.value.field, info.value.expected, info.value.found) == ("llama.block_count", 1, 7)
    assert not (tmp_path / "out.gguf").exists()


def test_gguf_metadata_is_for_gguf_only(bare_folder, tmp_path):
    src, folder = bare_folder
    out = _run("convert", folder, tmp_path / "out", "--to", "plain", "--gguf-metadata", src, code=2)
    assert "--gguf-metadata is for --to gguf" in out


# --- SentencePiece ----------------------------------------------------------------------------------------------

SPM = Path(__file__).resolve().parents[1] / "data" / "spm" / "tiny_spm" / "tokenizer.model"


def test_sentencepiece_vocabulary(tmp_path):
    """tests/data/spm/tiny_spm: pieces, scores and types against gguf-py's own SentencePieceVocab (the legacy
    converter's reader of the same file); the overrides and padding by hand from _create_vocab_sentencepiece."""
    folder = tmp_path / "spm"
    folder.mkdir()
    (folder / "tokenizer.model").write_bytes(SPM.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": True, "add_eos_token": False, "chat_template": "{{ x }}",
         "added_tokens_decoder": {"300": {"content": "<|im_start|>", "special": False},
                                  "301": {"content": "\u2581user", "special": False}}}))
    (folder / "config.json").write_text(json.dumps({"vocab_size": 303, "bos_token_id": 1, "eos_token_id": 2}))
    got = tokenizer_kv(folder, {"vocab_size": 303}, "llama")
    kv = got.kv
    ref = list(gguf.SentencePieceVocab(folder).all_tokens())
    assert len(ref) == 300
    assert kv["tokenizer.ggml.tokens"][:300] == [t.decode("utf-8") for t, _, _ in ref]
    assert kv["tokenizer.ggml.scores"][:300] == [s for _, s, _ in ref]
    assert kv["tokenizer.ggml.token_type"][:300] == [int(k) for _, _, k in ref]
    assert kv["tokenizer.ggml.token_type"][:4] == [2, 3, 3, 6] and kv["tokenizer.ggml.tokens"][3] == "<0x00>"
    # 300 looks special -> CONTROL, 301 user-defined with its ▁ as a space, 302 never given -> [PAD302] UNUSED
    assert kv["tokenizer.ggml.tokens"][300:] == ["<|im_start|>", " user", "[PAD302]"]
    assert kv["tokenizer.ggml.token_type"][300:] == [3, 4, 5]
    assert kv["tokenizer.ggml.scores"][300:] == [-1000.0, -1000.0, -10000.0]
    assert (kv["tokenizer.ggml.model"], kv["tokenizer.ggml.pre"]) == ("llama", "default")
    assert (kv["tokenizer.ggml.bos_token_id"], kv["tokenizer.ggml.eos_token_id"]) == (1, 2)  # config.json
    assert kv["tokenizer.ggml.add_bos_token"] is True and kv["tokenizer.ggml.add_eos_token"] is False
    assert "tokenizer.ggml.merges" not in kv and kv["tokenizer.chat_template"] == "{{ x }}"
    assert got.types["tokenizer.ggml.scores"] == ["ARRAY", "FLOAT32"] and got.warnings == []


def test_unconverted_vocabulary_still_writes_the_weights(bare_folder, tmp_path):
    """A WordPiece tokenizer.json beside the weights: no tokenizer keys, the warning says why, exit 0."""
    _, folder = bare_folder
    Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
    out = tmp_path / "out.gguf"
    report = json.loads(_run("convert", folder, out, "--to", "gguf", "--json"))
    warning = report["side_files_skipped"]["tokenizer.ggml.*"]
    # no vocabulary written: declared as llama.cpp's model 'none' (the vocabulary size is known), and said so
    assert warning.startswith(NO_VOCAB_WARNING) and "not BPE" in warning and "WordPiece" in warning
    assert _keys(out) == {"tokenizer.ggml.model": ("none", ["STRING"])}


def test_gguf_metadata_reaches_the_requantizing_writer(bare_folder, tmp_path):
    """--gguf-metadata with requantize options (requantize_model passes the writer's options on)."""
    src, folder = bare_folder
    out = tmp_path / "q8.gguf"
    _run("convert", folder, out, "--to", "gguf", "--quant-type", "Q8_0", "--gguf-metadata", src)
    assert _keys(out) == _keys(src)
    assert {t.tensor_type.name for t in gguf.GGUFReader(out).tensors if len(t.shape) == 2} == {"Q8_0"}
