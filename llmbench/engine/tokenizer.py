"""Text <-> token ids: the vocabulary of a model, loaded from its files, and its BOS/EOS policy.

A `Tokenizer` wraps a `tokenizers.Tokenizer` (the Hugging Face Rust library, which does the actual
splitting and merging) and adds what the engine needs around it: which ids end a sequence, whether
a raw prompt starts with BOS, and the model's jinja chat template. It is built from one of:

- a Hugging Face model folder (`tokenizer.json` + optional configs),
- a GGUF file's metadata, rebuilt the way `transformers` rebuilds it, so both give the same ids
  (`gguf_vocab` converts it),
- `Tokenizer.byte_level()`, a download-free tokenizer for synthetic-weight models.

The chat template lives in `chat_template`, streaming decode in `detokenizer`.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import gguf
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from llmbench.engine import gguf_vocab
from llmbench.engine.chat_template import ChatTemplate
from llmbench.errors import UserError

_CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the chat template, stop ids and BOS policy of one model."""

    def __init__(
        self,
        hf_tokenizer: tokenizers.Tokenizer,
        *,
        chat_template: str | None,
        eos_token_ids: tuple[int, ...],
        bos_token_id: int | None,
        add_bos: bool,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> None:
        """`add_bos`: prepend `bos_token_id` when encoding a raw prompt. `bos_token`/`eos_token`
        are the strings a chat template sees as `bos_token`/`eos_token`."""
        if add_bos and bos_token_id is None:
            raise ValueError("add_bos=True needs a bos_token_id")
        self.hf_tokenizer = hf_tokenizer
        self.chat_template = chat_template
        self.eos_token_ids = tuple(eos_token_ids)
        self.bos_token_id = bos_token_id
        self.add_bos = add_bos
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = ChatTemplate(chat_template) if chat_template else None

    def with_hf_tokenizer(self, hf_tokenizer: tokenizers.Tokenizer) -> Tokenizer:
        """This tokenizer (chat template, stop ids, BOS policy) over another `tokenizers` object
        of the same vocabulary (`serve` wraps it so that encoding releases the GIL)."""
        return Tokenizer(
            hf_tokenizer,
            chat_template=self.chat_template,
            eos_token_ids=self.eos_token_ids,
            bos_token_id=self.bos_token_id,
            add_bos=self.add_bos,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def from_hf_folder(cls, path: pathlib.Path) -> Tokenizer:
        """Load `tokenizer.json`, plus `tokenizer_config.json`, `chat_template.jinja` and
        `generation_config.json` when present, from a Hugging Face model folder."""
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise UserError(
                f"missing tokenizer.json: {path}: point the model path at a Hugging Face model "
                "folder that contains tokenizer.json"
            )
        try:
            hf_tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_file))
        except Exception as e:  # the Rust side raises a bare Exception for bad JSON
            raise UserError(
                f"malformed tokenizer.json: {tokenizer_file}: {_first_line(e)}: "
                "re-download the model files"
            ) from e
        config = _read_json_if_present(path / "tokenizer_config.json")
        generation_config = _read_json_if_present(path / "generation_config.json")

        template_file = path / "chat_template.jinja"
        if template_file.is_file():  # newer repos keep the template in its own file
            chat_template = template_file.read_text(encoding="utf-8")
        else:
            chat_template = _default_template(config.get("chat_template"))

        bos_token = _token_content(config.get("bos_token"))
        eos_token = _token_content(config.get("eos_token"))
        bos_token_id = hf_tokenizer.token_to_id(bos_token) if bos_token is not None else None
        if bos_token_id is None:
            bos_token_id = _first_int(generation_config.get("bos_token_id"))

        eos_ids = [hf_tokenizer.token_to_id(eos_token)] if eos_token is not None else []
        eos_ids += _int_list(generation_config.get("eos_token_id"))
        eos_token_ids = tuple(dict.fromkeys(i for i in eos_ids if i is not None))

        if "add_bos_token" in config:
            add_bos = bool(config["add_bos_token"])
        else:
            # No flag: the BOS comes from tokenizer.json's post-processor (Llama-3 does this).
            with_special = hf_tokenizer.encode("", add_special_tokens=True).ids
            add_bos = bos_token_id is not None and with_special[:1] == [bos_token_id]
        return cls(
            hf_tokenizer,
            chat_template=chat_template,
            eos_token_ids=eos_token_ids,
            bos_token_id=bos_token_id,
            add_bos=add_bos and bos_token_id is not None,
            bos_token=bos_token,
            eos_token=eos_token,
        )

    @classmethod
    def from_gguf(cls, reader: gguf.GGUFReader) -> Tokenizer:
        """The tokenizer a GGUF file describes in its `tokenizer.*` metadata, rebuilt as
        transformers rebuilds it (`gguf_vocab.read_vocabulary`)."""
        vocab = gguf_vocab.read_vocabulary(reader)
        return cls(
            vocab.hf_tokenizer,
            chat_template=vocab.chat_template,
            eos_token_ids=vocab.eos_token_ids,
            bos_token_id=vocab.bos_token_id,
            add_bos=vocab.add_bos,
            bos_token=vocab.bos_token,
            eos_token=vocab.eos_token,
        )

    @classmethod
    def byte_level(cls) -> Tokenizer:
        """A download-free tokenizer for synthetic-weight models: id = byte value for the 256
        bytes (no merges, so every UTF-8 byte is one token), then `<|endoftext|>` = 256,
        `<|im_start|>` = 257, `<|im_end|>` = 258, and a ChatML template. vocab_size is 259."""
        byte_to_char = gguf_vocab.byte_to_char()
        vocab = {char: byte for byte, char in byte_to_char.items()}
        hf_tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[]))
        # No merges, so no regex split is needed to keep merges inside words.
        hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
            add_prefix_space=False, use_regex=False
        )
        hf_tokenizer.decoder = decoders.ByteLevel()
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        hf_tokenizer.add_special_tokens(
            [AddedToken(t, normalized=False, special=True) for t in specials]
        )
        return cls(
            hf_tokenizer,
            chat_template=_CHATML_TEMPLATE,
            eos_token_ids=(258, 256),
            bos_token_id=None,
            add_bos=False,
            bos_token=None,
            eos_token="<|im_end|>",
        )

    # -- text <-> ids -------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included; the model's embedding must have at least this."""
        return self.hf_tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; special tokens written in it (`<|im_start|>`) become one id each.
        `add_bos` defaults to the tokenizer's own policy."""
        ids = self.hf_tokenizer.encode(text, add_special_tokens=False).ids
        if add_bos is None:
            add_bos = self.add_bos
        if add_bos:
            if self.bos_token_id is None:
                raise ValueError("add_bos=True but this tokenizer has no BOS token")
            ids.insert(0, self.bos_token_id)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """Text of `ids`; invalid or incomplete UTF-8 decodes to U+FFFD."""
        return self.hf_tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # -- chat ---------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The prompt text for `messages` ([{"role": ..., "content": ...}, ...]) and `tools`
        (OpenAI function definitions, rendered as `chat_template.ChatTemplate.render` says)."""
        if self._template is None:
            raise UserError(
                "no chat template: this tokenizer has none: send raw prompts, or use a model "
                "whose tokenizer files include a chat template"
            )
        return self._template.render(
            messages,
            add_generation_prompt,
            tools=tools,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def encode_chat(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Ids of the rendered chat prompt; BOS is added per `add_bos` unless the template
        already wrote it (many templates start with `{{ bos_token }}`)."""
        text = self.apply_chat_template(messages, add_generation_prompt, tools=tools)
        ids = self.encode(text, add_bos=False)
        if self.add_bos and ids[:1] != [self.bos_token_id]:
            ids.insert(0, self.bos_token_id)
        return ids


# -- HF folder helpers --------------------------------------------------------------------------


def _read_json_if_present(path: pathlib.Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"malformed JSON: {path}: {e}: re-download the model files") from e
    if not isinstance(data, dict):
        raise UserError(f"malformed JSON: {path}: expected an object: re-download the model files")
    return data


def _default_template(chat_template: str | list[dict[str, str]] | None) -> str | None:
    """`chat_template` is a string, or a list of {"name", "template"}; the "default" one is used."""
    if isinstance(chat_template, list):
        named = {entry.get("name"): entry.get("template") for entry in chat_template}
        return named.get("default")
    return chat_template


def _token_content(token: str | dict[str, Any] | None) -> str | None:
    """Special tokens in tokenizer_config.json are strings or AddedToken dicts {"content": ...}."""
    return token.get("content") if isinstance(token, dict) else token


def _int_list(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def _first_int(value: int | list[int] | None) -> int | None:
    values = _int_list(value)
    return values[0] if values else None


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__
