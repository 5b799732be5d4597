"""GGUF vocabularies (`gguf_vocab`, through `Tokenizer.from_gguf`): byte-level and
sentencepiece files against transformers' own GGUF tokenizer, streaming decode of what they
build, one-line errors for unsupported and corrupt files, and the real SmolLM2 file."""

import itertools
import json
from pathlib import Path

import gguf
import pytest
import tokenizers
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import models, pre_tokenizers

from llmbench.engine.tokenizer import Tokenizer
from llmbench.errors import UserError
from tests.engine.test_detokenizer import stream_text

# Strings every GGUF tokenizer is checked on against transformers.
PARITY_STRINGS = [
    "Hello world",
    "",
    " ",
    "héllo wörld, ça va? Ñandú",
    "日本語のテキストと中文字符",
    "emoji 🚀👍🏽 and family 👨‍👩‍👧 flags 🇫🇷",
    "spaces:   three,     five\ttab\t\ttwo tabs",
    "lines\n\n\nthree newlines\r\nwindows\n  indented\n",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\nprint(f(12))\n",
    "12345 and 3.14159, 1,000,000 or 2024-01-31; a  1",
    "It's IT'S they'll we'd I'M",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    "<|im_start|>assistant\n",
    "text<|endoftext|>more text<|im_end|>",
]

CHATS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "system", "content": "You answer in French."},
        {"role": "user", "content": "Hello! 👋"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": "Ça va ?"},
    ],
]


def _write_gguf(path: Path, **tokenizer: object) -> Path:
    """A GGUF with no tensors: a tiny llama config (so transformers can load it) + tokenizer."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(tokenizer["model"])
    writer.add_token_list(tokenizer["tokens"])
    writer.add_token_types(tokenizer["token_types"])
    if "pre" in tokenizer:
        writer.add_tokenizer_pre(tokenizer["pre"])
    if "merges" in tokenizer:
        writer.add_token_merges(tokenizer["merges"])
    if "scores" in tokenizer:
        writer.add_token_scores(tokenizer["scores"])
    if "add_bos" in tokenizer:
        writer.add_add_bos_token(tokenizer["add_bos"])
    if "chat_template" in tokenizer:
        writer.add_chat_template(tokenizer["chat_template"])
    writer.add_bos_token_id(tokenizer["bos_id"])
    writer.add_eos_token_id(tokenizer["eos_id"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _reference(path: Path):  # -> transformers tokenizer
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _assert_same_as_reference(tok: Tokenizer, ref, strings: list[str]) -> None:
    for text in strings:
        ids = tok.encode(text)
        assert ids == ref.encode(text), text
        assert tok.decode(ids) == ref.decode(ids), text
        assert tok.decode(ids, skip_special_tokens=True) == ref.decode(
            ids, skip_special_tokens=True
        ), text
    assert tok.vocab_size == len(ref)


_TRAIN_TEXT = [
    "It's 12345 o'clock, the year 2024. THE END, IT'S OVER.",
    "the cat sat on the mat; the dog didn't. 3.14159 is pi and 365 is days",
    "def main():\n    return 0\n\n\n\tindented\ttext   spaced   out",
]


def _trained_byte_level_gguf(path: Path) -> Path:
    """Byte-level BPE learned on a few lines, written as llama.cpp would (tokens in id order),
    typed like a real file: control, user-defined, and one mislabelled control token."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=420,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TRAIN_TEXT * 20, trainer)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [" ".join(pair) for pair in json.loads(tok.to_str())["model"]["merges"]]
    # One token stored as plain UTF-8 rather than in the byte alphabet, as some converters do.
    tokens[tokens.index("Ġthe")] = " the"
    tokens += ["<think>", "</think>", "<ctrl with spaces>"]
    token_types = [3, 3, 3] + [1] * (len(tokens) - 6) + [4, 4, 3]
    return _write_gguf(
        path,
        model="gpt2",
        pre="llama-bpe",
        tokens=tokens,
        token_types=token_types,
        merges=merges,
        bos_id=0,
        eos_id=2,
        add_bos=True,
        chat_template=(
            "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
            "{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    )


def test_gguf_byte_level_matches_transformers(tmp_path: Path) -> None:
    path = _trained_byte_level_gguf(tmp_path / "bpe.gguf")
    tok = Tokenizer.from_gguf(gguf.GGUFReader(path))
    ref = _reference(path)
    extra = ["<think>the cat</think>", "<ctrl with spaces>", "the the  the", "12345678 IT'S"]
    _assert_same_as_reference(tok, ref, PARITY_STRINGS + extra)
    assert (tok.bos_token_id, tok.add_bos, tok.eos_token_ids) == (0, True, (2,))
    # Trained with GPT-2's split, " 12345" became one token; llama-bpe splits off the space and
    # cuts digits in threes first, so token boundaries must fall after " " and " 123".
    assert tok.hf_tokenizer.token_to_id("Ġ12345") is not None
    pieces = [tok.decode([i]) for i in tok.encode(" 12345", add_bos=False)]
    assert pieces[0] == " " and 4 in itertools.accumulate(map(len, pieces))
    for messages in CHATS:
        text = tok.apply_chat_template(messages)
        assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text.startswith("<|endoftext|><|im_start|>")
        # The template wrote BOS itself: no second one.
        assert tok.encode_chat(messages) == tok.encode(text, add_bos=False)


def _sentencepiece_gguf(path: Path) -> Path:
    """A Llama-style vocabulary with no merges, so both sides derive them from the scores."""
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "ll", "▁he", "▁hell", "▁hello"]
    pieces += ["▁w", "▁wor", "▁world", "or", "▁d"]
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *pieces, "<think>"]
    token_types = [2, 3, 3] + [6] * 256 + [1] * len(pieces) + [4]
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))] + [0.0]
    # No add_bos_token: llama.cpp and transformers add BOS to sentencepiece vocabularies.
    return _write_gguf(
        path,
        model="llama",
        tokens=tokens,
        token_types=token_types,
        scores=scores,
        bos_id=1,
        eos_id=2,
    )


def test_gguf_sentencepiece_matches_transformers(tmp_path: Path) -> None:
    path = _sentencepiece_gguf(tmp_path / "spm.gguf")
    tok = Tokenizer.from_gguf(gguf.GGUFReader(path))
    ref = _reference(path)
    extra = ["hello world", " hello  world", "<s>hello</s>", "<think>world", "\nhello"]
    _assert_same_as_reference(tok, ref, PARITY_STRINGS + extra)
    assert (tok.bos_token_id, tok.add_bos, tok.eos_token_ids) == (1, True, (2,))
    # Unknown characters fall back to byte tokens: 'x' is <0x78> = 3 + 0x78.
    assert tok.encode("x", add_bos=False) == [259, 123]  # '▁' (259) then 'x'
    assert tok.decode(tok.encode("héllo wörld")) == "<s> héllo wörld"


@pytest.fixture(scope="module")
def sentencepiece_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = _sentencepiece_gguf(tmp_path_factory.mktemp("spm") / "spm.gguf")
    return Tokenizer.from_gguf(gguf.GGUFReader(path))


_SPM_TEXT_PIECES = [*"helowrd x\n\té世🚀", "hello", " world", "<s>", "</s>", "<think>", "  "]


@given(st.lists(st.sampled_from(_SPM_TEXT_PIECES), max_size=12), st.booleans(), st.booleans())
def test_detokenizer_sentencepiece_matches_decode(
    sentencepiece_tokenizer: Tokenizer, pieces: list[str], add_bos: bool, skip: bool
) -> None:
    """Sentencepiece decoding strips the first token's leading space and turns <0xNN> byte runs
    into characters; streaming must still give exactly what decode gives."""
    tok = sentencepiece_tokenizer
    ids = tok.encode("".join(pieces), add_bos=add_bos)
    streamed = stream_text(tok, ids, skip_special_tokens=skip)
    assert "".join(streamed) == tok.decode(ids, skip_special_tokens=skip)
    assert not any("\ufffd" in piece for piece in streamed)


def test_gguf_unsupported_tokenizer_is_user_error(tmp_path: Path) -> None:
    path = _write_gguf(
        tmp_path / "bert.gguf",
        model="bert",
        tokens=["[PAD]", "[CLS]", "hello"],
        token_types=[3, 3, 1],
        bos_id=1,
        eos_id=1,
    )
    with pytest.raises(UserError, match=r"unsupported GGUF tokenizer type 'bert'.*bert.gguf"):
        Tokenizer.from_gguf(gguf.GGUFReader(path))


def test_gguf_corrupt_tokenizer_is_user_error(tmp_path: Path) -> None:
    tokens = ["<s>", "</s>", "a"]
    path = _write_gguf(
        tmp_path / "bad_id.gguf",
        model="gpt2",
        tokens=tokens,
        token_types=[3, 3, 1],
        bos_id=0,
        eos_id=7,
    )
    with pytest.raises(UserError, match=r"eos_token_id 7 is outside the vocabulary of 3"):
        Tokenizer.from_gguf(gguf.GGUFReader(path))

    path = _write_gguf(
        tmp_path / "no_scores.gguf",
        model="llama",
        tokens=tokens,
        token_types=[3, 3, 1],
        bos_id=0,
        eos_id=1,
    )
    with pytest.raises(UserError, match=r"neither merges nor one score per token"):
        Tokenizer.from_gguf(gguf.GGUFReader(path))


# -- the real SmolLM2-135M-Instruct GGUF against transformers -----------------------------------


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf_path: Path) -> tuple[Tokenizer, object]:
    return Tokenizer.from_gguf(gguf.GGUFReader(smollm2_gguf_path)), _reference(smollm2_gguf_path)


@pytest.mark.slow
def test_smollm2_encode_decode_match_transformers(smollm2: tuple[Tokenizer, object]) -> None:
    tok, ref = smollm2
    _assert_same_as_reference(tok, ref, PARITY_STRINGS)
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.add_bos, tok.eos_token_ids) == (1, False, (2,))
    assert tok.encode("<|im_start|>user<|im_end|>") == [1, 4093, 2]


@pytest.mark.slow
def test_smollm2_chat_template_matches_transformers(smollm2: tuple[Tokenizer, object]) -> None:
    tok, ref = smollm2
    for messages in CHATS:
        for add_generation_prompt in (True, False):
            text = tok.apply_chat_template(messages, add_generation_prompt)
            ref_text = ref.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt
            )
            assert text == ref_text
            ref_ids = ref.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, return_dict=False
            )
            assert tok.encode_chat(messages, add_generation_prompt) == ref_ids
    # Without a system message the template inserts SmolLM's default one.
    assert tok.apply_chat_template(CHATS[0]).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM"
    )


@pytest.mark.slow
def test_smollm2_detokenizer_streams(smollm2: tuple[Tokenizer, object]) -> None:
    tok, _ = smollm2
    for text in PARITY_STRINGS:
        ids = tok.encode(text)
        pieces = stream_text(tok, ids)
        assert "".join(pieces) == tok.decode(ids) == text
        assert not any("\ufffd" in piece for piece in pieces)
