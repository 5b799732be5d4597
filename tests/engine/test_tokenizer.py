"""Tokenizer: HF folders, byte_level. GGUF metadata is `gguf_vocab`'s (test_gguf_vocab.py)."""

import json
from pathlib import Path

import pytest
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors

from llmbench.engine.tokenizer import Tokenizer
from llmbench.errors import UserError

# -- Hugging Face folder ------------------------------------------------------------------------

# Byte-level BPE with a hand-made vocabulary: specials 0-2, 'a'..'z' = 3..28, 'Ġ' (space) = 29,
# 'Ċ' (newline) = 30, then one token per merge, in merge order.
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_MERGES = [
    ("h", "e"),  # 31 he
    ("l", "l"),  # 32 ll
    ("he", "ll"),  # 33 hell
    ("hell", "o"),  # 34 hello
    ("Ġ", "w"),  # 35 Ġw
    ("o", "r"),  # 36 or
    ("Ġw", "or"),  # 37 Ġwor
    ("l", "d"),  # 38 ld
    ("Ġwor", "ld"),  # 39 Ġworld
]

# Whitespace in this template is only layout: trim_blocks + lstrip_blocks remove it.
_FOLDER_TEMPLATE = """{% for message in messages %}
  {% if message['role'] not in ['system', 'user', 'assistant'] %}
    {{ raise_exception('unknown role: ' + message['role']) }}
  {% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""


def _hand_made_bpe() -> tokenizers.Tokenizer:
    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    vocab.update({letter: 3 + i for i, letter in enumerate(_LETTERS)})
    vocab.update({"Ġ": 29, "Ċ": 30})
    vocab.update({left + right: 31 + i for i, (left, right) in enumerate(_MERGES)})
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=_MERGES))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True) for t in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]]
    )
    return tok


def _write_folder(folder: Path, tokenizer_config: dict, generation_config: dict | None) -> Path:
    folder.mkdir(exist_ok=True)
    _hand_made_bpe().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    if generation_config is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation_config))
    return folder


@pytest.fixture
def chatml_folder(tmp_path: Path) -> Path:
    config = {
        "eos_token": {"content": "<|im_end|>", "special": True},
        "bos_token": None,
        "add_bos_token": False,
        "chat_template": [
            {"name": "tool_use", "template": "not this one"},
            {"name": "default", "template": _FOLDER_TEMPLATE},
        ],
    }
    return _write_folder(tmp_path / "model", config, {"eos_token_id": [2, 0], "bos_token_id": 0})


def test_hf_folder_encode_decode(chatml_folder: Path) -> None:
    tok = Tokenizer.from_hf_folder(chatml_folder)
    assert tok.encode("hello world") == [34, 39]
    # GPT-2's regex keeps '\n' apart; "world" without a space never gets the 'Ġw' merges.
    assert tok.encode("hello\nworld") == [34, 30, 25, 36, 38]
    assert tok.encode("<|im_start|>user<|im_end|>") == [1, 23, 21, 7, 20, 2]
    assert tok.decode([34, 39]) == "hello world"
    assert tok.decode([1, 34, 2]) == "<|im_start|>hello<|im_end|>"
    assert tok.decode([1, 34, 2], skip_special_tokens=True) == "hello"
    assert tok.vocab_size == 40


def test_hf_folder_special_ids(chatml_folder: Path) -> None:
    tok = Tokenizer.from_hf_folder(chatml_folder)
    # tokenizer_config's eos first, then generation_config's, without the repeat.
    assert tok.eos_token_ids == (2, 0)
    assert tok.eos_token == "<|im_end|>"
    # No bos_token string, so the id comes from generation_config; add_bos_token is false.
    assert tok.bos_token_id == 0
    assert tok.add_bos is False
    assert tok.encode("hello") == [34]
    assert tok.encode("hello", add_bos=True) == [0, 34]


def test_hf_folder_chat_template(chatml_folder: Path) -> None:
    tok = Tokenizer.from_hf_folder(chatml_folder)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    expected = "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == expected
    assert tok.apply_chat_template(messages) == expected + "<|im_start|>assistant\n"
    assert tok.encode_chat([{"role": "user", "content": "hello"}]) == [
        *[1, 23, 21, 7, 20, 30, 34, 2, 30],  # <|im_start|> u s e r \n hello <|im_end|> \n
        *[1, 3, 21, 21, 11, 21, 22, 3, 16, 22, 30],  # <|im_start|> a s s i s t a n t \n
    ]


def test_hf_folder_template_rejects_messages(chatml_folder: Path) -> None:
    tok = Tokenizer.from_hf_folder(chatml_folder)
    # (A `tool` message would be rendered as a user message: this template knows no tools.)
    with pytest.raises(UserError, match="chat template failed: unknown role: robot"):
        tok.apply_chat_template([{"role": "robot", "content": "{}"}])


def test_hf_folder_bos_from_post_processor(tmp_path: Path) -> None:
    """No add_bos_token flag: BOS is added when tokenizer.json's post-processor adds it (Llama-3),
    and a template that writes `{{ bos_token }}` itself does not get a second one."""
    folder = _write_folder(
        tmp_path / "model",
        {
            "bos_token": "<|endoftext|>",
            "eos_token": "<|im_end|>",
            "chat_template": "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
        },
        generation_config=None,
    )
    hf_tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    hf_tokenizer.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    hf_tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] }}")

    tok = Tokenizer.from_hf_folder(folder)
    assert (tok.bos_token_id, tok.add_bos, tok.eos_token_ids) == (0, True, (2,))
    assert tok.encode("hello") == [0, 34]
    assert tok.encode("hello", add_bos=False) == [34]
    # chat_template.jinja wins over tokenizer_config's template.
    assert tok.apply_chat_template([{"role": "user", "content": "hello"}]) == "<|endoftext|>hello"
    assert tok.encode_chat([{"role": "user", "content": "hello"}]) == [0, 34]
    # A template that does not write BOS gets it from encode_chat.
    no_bos_template = Tokenizer(
        tok.hf_tokenizer,
        chat_template="{{ messages[0]['content'] }}",
        eos_token_ids=(2,),
        bos_token_id=0,
        add_bos=True,
    )
    assert no_bos_template.encode_chat([{"role": "user", "content": "hello"}]) == [0, 34]


def test_hf_folder_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"missing tokenizer.json: .*empty"):
        Tokenizer.from_hf_folder(tmp_path / "empty")

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text('{"model": ')
    with pytest.raises(UserError, match=r"malformed tokenizer.json: .*broken"):
        Tokenizer.from_hf_folder(broken)

    bad_config = _write_folder(tmp_path / "bad_config", {}, None)
    (bad_config / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(UserError, match=r"malformed JSON: .*tokenizer_config.json"):
        Tokenizer.from_hf_folder(bad_config)

    no_template = Tokenizer.from_hf_folder(_write_folder(tmp_path / "plain", {}, None))
    with pytest.raises(UserError, match="no chat template"):
        no_template.apply_chat_template([{"role": "user", "content": "hi"}])


def test_invalid_chat_template_is_user_error() -> None:
    with pytest.raises(UserError, match="invalid chat template: line 1"):
        Tokenizer(
            Tokenizer.byte_level().hf_tokenizer,
            chat_template="{% for m in messages %}",
            eos_token_ids=(),
            bos_token_id=None,
            add_bos=False,
        )


# -- byte_level ---------------------------------------------------------------------------------


def test_byte_level_ids() -> None:
    tok = Tokenizer.byte_level()
    # id = byte: 'h' 0x68, 'é' is UTF-8 C3 A9, ' ' 0x20; then the specials 256-258.
    ids = tok.encode("hé <|im_end|>!")
    assert ids == [0x68, 0xC3, 0xA9, 0x20, 258, 0x21]
    assert tok.decode(ids) == "hé <|im_end|>!"
    assert tok.decode(ids, skip_special_tokens=True) == "hé !"
    assert tok.encode("<|endoftext|><|im_start|>") == [256, 257]
    assert tok.encode("🚀") == [0xF0, 0x9F, 0x9A, 0x80]
    assert tok.vocab_size == 259
    assert tok.eos_token_ids == (258, 256)
    assert (tok.bos_token_id, tok.add_bos) == (None, False)


def test_byte_level_chat_template() -> None:
    tok = Tokenizer.byte_level()
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    expected = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == expected
    assert tok.apply_chat_template(messages) == expected + "<|im_start|>assistant\n"
    assert tok.encode_chat([{"role": "user", "content": "hi"}], add_generation_prompt=False) == [
        *[257, *b"user\nhi", 258, 0x0A]
    ]
