"""GGUF vocabularies → `tokenizers`: the tokenizer a GGUF file describes in its `tokenizer.*`
metadata, rebuilt the way `transformers` rebuilds it, so both give the same ids.

`read_vocabulary` returns a `GgufVocabulary` (the `tokenizers.Tokenizer`, stop ids, BOS policy,
chat template), which `tokenizer.Tokenizer.from_gguf` wraps. "gpt2" files become byte-level BPE
(with the split regex `tokenizer.ggml.pre` names), "llama" files sentencepiece-style BPE with
byte fallback (merges derived from the scores when the file lists none); control and
user-defined tokens are matched whole. `byte_to_char` is GPT-2's byte alphabet, which
`Tokenizer.byte_level` spells its vocabulary in too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gguf
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers

from llmbench.errors import UserError

# GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
_GGUF_TOKEN_CONTROL = 3  # <|im_start|>, <s>: special, matched whole, dropped by skip_special
_GGUF_TOKEN_USER_DEFINED = 4  # <think>: matched whole, but ordinary text when decoding

# The Llama-3 split: letters with an optional leading non-letter, digits in groups of up to 3,
# punctuation runs, newlines kept together. llama.cpp names several vocabularies trained with it.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2: as Llama-3 but every digit alone.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> split regex, for the names transformers maps to these two regexes.
# Any other name ("default", "smollm", "gpt-2", ...) gets GPT-2's own byte-level regex, as in
# transformers; see `_byte_level_pre_tokenizer`.
_GGUF_PRE_SPLITS = {
    **dict.fromkeys(
        [
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "dbrx",
            "smaug-bpe",
        ],
        _LLAMA3_SPLIT,
    ),
    **dict.fromkeys(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"], _QWEN2_SPLIT),
}
# transformers rebuilds sentencepiece vocabularies of these architectures differently (respelled
# space tokens, normalizer prefix); we do not, so refuse rather than tokenize them subtly wrong.
_GGUF_SPM_ARCHS_UNSUPPORTED = ("gemma", "gemma2", "gemma3", "phi3")


@dataclass(frozen=True)
class GgufVocabulary:
    """What a GGUF file's tokenizer metadata says, in the terms `Tokenizer` takes: `add_bos`
    prepends `bos_token_id` to a raw prompt; `bos_token` / `eos_token` are the strings a chat
    template sees."""

    hf_tokenizer: tokenizers.Tokenizer
    chat_template: str | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    add_bos: bool
    bos_token: str | None
    eos_token: str | None


def read_vocabulary(reader: gguf.GGUFReader) -> GgufVocabulary:
    """The tokenizer a GGUF file describes in its `tokenizer.*` metadata, rebuilt.

    Matches `AutoTokenizer.from_pretrained(folder, gguf_file=name)` in transformers
    (`integrations/gguf/gguf_tokenizer_mapping.py`): "gpt2" files become byte-level BPE,
    "llama" files sentencepiece-style BPE with byte fallback.
    """
    where = str(getattr(reader.data, "filename", "GGUF file"))
    fields = reader.fields

    def value(key: str) -> Any:
        field = fields.get(key)
        return None if field is None else field.contents()

    model_type = value("tokenizer.ggml.model")
    tokens: list[str] | None = value("tokenizer.ggml.tokens")
    if model_type is None or not tokens:
        raise UserError(
            f"GGUF file has no tokenizer: {where}: use a GGUF converted with its tokenizer "
            "(llama.cpp's convert_hf_to_gguf.py writes one)"
        )
    architecture = value("general.architecture")
    if model_type not in ("gpt2", "llama") or (
        model_type == "llama" and architecture in _GGUF_SPM_ARCHS_UNSUPPORTED
    ):
        raise UserError(
            f"unsupported GGUF tokenizer type {model_type!r} (architecture "
            f"{architecture!r}): {where}: only 'gpt2' (byte-level BPE) and 'llama' "
            "(sentencepiece BPE) tokenizers are supported; use the Hugging Face model folder"
        )
    merges: list[str] | None = value("tokenizer.ggml.merges")
    if model_type == "gpt2":
        hf_tokenizer = _gguf_byte_level_bpe(tokens, merges, value("tokenizer.ggml.pre"))
    else:
        scores: list[float] | None = value("tokenizer.ggml.scores")
        if merges is None and (scores is None or len(scores) != len(tokens)):
            raise UserError(
                f"GGUF sentencepiece vocabulary has neither merges nor one score per token: "
                f"{where}: the file is corrupt; convert the model again"
            )
        hf_tokenizer = _gguf_sentencepiece_bpe(tokens, merges, scores)

    def token_at(key: str) -> tuple[int | None, str | None]:
        token_id = value(f"tokenizer.ggml.{key}")
        if token_id is None:
            return None, None
        if not 0 <= token_id < len(tokens):
            raise UserError(
                f"GGUF tokenizer.ggml.{key} {token_id} is outside the vocabulary of "
                f"{len(tokens)}: {where}: the file is corrupt; convert the model again"
            )
        return token_id, tokens[token_id]

    bos_token_id, bos_token = token_at("bos_token_id")
    eos_token_id, eos_token = token_at("eos_token_id")
    named_tokens = [bos_token, eos_token]
    named_tokens += [token_at("unknown_token_id")[1], token_at("padding_token_id")[1]]
    _add_gguf_added_tokens(
        hf_tokenizer,
        tokens,
        # Files without types have no control or user-defined tokens.
        token_types=value("tokenizer.ggml.token_type") or [],
        named_tokens=[t for t in named_tokens if t is not None],
        is_byte_level=model_type == "gpt2",
    )

    # Old sentencepiece files carry no flag, and llama.cpp adds BOS to those.
    add_bos = value("tokenizer.ggml.add_bos_token")
    add_bos = bool(add_bos) if add_bos is not None else model_type == "llama"
    # llama.cpp also stops on end-of-turn / end-of-message ids; transformers keeps only eos.
    stop_ids = [eos_token_id, token_at("eot_token_id")[0], token_at("eom_token_id")[0]]
    return GgufVocabulary(
        hf_tokenizer,
        chat_template=value("tokenizer.chat_template"),
        eos_token_ids=tuple(dict.fromkeys(i for i in stop_ids if i is not None)),
        bos_token_id=bos_token_id,
        add_bos=add_bos and bos_token_id is not None,
        bos_token=bos_token,
        eos_token=eos_token,
    )


# -- byte-level and sentencepiece vocabularies -----------------------------------------------------


def byte_to_char() -> dict[int, str]:
    """GPT-2's byte -> character table, in which byte-level vocabularies are spelled.

    Printable Latin-1 bytes stand for themselves; the 68 others (controls, space, 0x7F-0xA0,
    0xAD) map in byte order to U+0100, U+0101, ..., so a space is 'Ġ' (U+0120), '\\n' is 'Ċ'.
    """
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {byte: chr(byte) for byte in printable}
    others = [byte for byte in range(256) if byte not in table]
    table.update({byte: chr(0x100 + i) for i, byte in enumerate(others)})
    return dict(sorted(table.items()))


def _gguf_byte_level_bpe(
    tokens: list[str], merges: list[str] | None, pre: str | None
) -> tokenizers.Tokenizer:
    """GPT-2-style byte-level BPE ("gpt2" in `tokenizer.ggml.model`)."""
    to_char = byte_to_char()
    alphabet = set(to_char.values())
    # Some converters store a token as its UTF-8 text instead of in the byte alphabet; respell it.
    vocab = {
        token if set(token) <= alphabet else "".join(to_char[b] for b in token.encode()): i
        for i, token in enumerate(tokens)
    }
    merge_pairs = [tuple(merge.split(" ")) for merge in merges or []]
    hf_tokenizer = tokenizers.Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merge_pairs,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
        )
    )
    hf_tokenizer.pre_tokenizer = _byte_level_pre_tokenizer(pre)
    hf_tokenizer.decoder = decoders.ByteLevel()
    return hf_tokenizer


def _add_gguf_added_tokens(
    hf_tokenizer: tokenizers.Tokenizer,
    tokens: list[str],
    token_types: list[int],
    named_tokens: list[str],
    is_byte_level: bool,
) -> None:
    """Mark the tokens that are matched whole in text, as transformers does for GGUF files.

    Control tokens (<|im_start|>) become special: matched whole, dropped by skip_special_tokens.
    User-defined ones (<think>) are matched whole but decode as ordinary text. The named tokens
    (bos, eos, unk, pad) are special even when the file types them as normal.
    """
    alphabet = set(byte_to_char().values())
    vocab = hf_tokenizer.get_vocab(with_added_tokens=True)
    control = [
        token
        for token, token_type in zip(tokens, token_types, strict=False)
        # A byte-level vocabulary spells every token in the byte alphabet; a control token
        # spelled otherwise is a llama.cpp mislabel, and adding it would grow the vocabulary.
        if token_type == _GGUF_TOKEN_CONTROL and (not is_byte_level or set(token) <= alphabet)
    ]
    user_defined = [
        token
        for token, token_type in zip(tokens, token_types, strict=False)
        if token_type == _GGUF_TOKEN_USER_DEFINED and token in vocab
    ]
    # Only named tokens the vocabulary has, for the same reason as above.
    named = [token for token in named_tokens if token not in control and token in vocab]
    special = list(dict.fromkeys(control + named))
    hf_tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t in special]
    )
    hf_tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user_defined])


def _byte_level_pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """Split text the way the vocabulary's merges were learned (`tokenizer.ggml.pre`).

    Unknown names ("default", "smollm", "gpt-2", ...) fall back to GPT-2's regex, as transformers
    does. That is exact for GPT-2-regex vocabularies; llama.cpp's "smollm" also splits digits
    apart first, which changes ids only for runs of spaces before a digit ("a  1").
    """
    split = _GGUF_PRE_SPLITS.get(pre or "")
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _gguf_sentencepiece_bpe(
    tokens: list[str], merges: list[str] | None, scores: list[float] | None
) -> tokenizers.Tokenizer:
    """Llama/Mistral-style sentencepiece BPE ("llama" in `tokenizer.ggml.model`): '▁' marks a
    space, one is prepended to the text, and unknown characters fall back to <0xNN> byte tokens.
    """
    vocab = {token: i for i, token in enumerate(tokens)}
    if merges is not None:
        merge_pairs = [tuple(merge.split(" ")) for merge in merges]
    else:
        merge_pairs = _merges_from_scores(vocab, dict(zip(tokens, scores or [], strict=True)))
    hf_tokenizer = tokenizers.Tokenizer(
        models.BPE(vocab=vocab, merges=merge_pairs, fuse_unk=True, byte_fallback=True)
    )
    hf_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    hf_tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1),  # the space the pre-tokenizer prepended
        ]
    )
    return hf_tokenizer


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a sentencepiece vocabulary that lists none.

    Every way to cut a token into two tokens of the vocabulary is a merge; the higher the
    token's score, the earlier the merge. Ties go to shorter left, then shorter right pieces
    (descending), then file order. This is transformers' `generate_merges` ordering, which the
    ids depend on.
    """
    candidates: list[tuple[str, str, float]] = []
    for token, score in scores.items():
        cuts = [
            (token[:i], token[i:], score)
            for i in range(1, len(token))
            if token[:i] in vocab and token[i:] in vocab
        ]
        cuts.sort(key=lambda cut: (vocab[cut[0]], vocab[cut[1]]))
        candidates.extend(cuts)
    candidates.sort(key=lambda cut: (cut[2], len(cut[0]), len(cut[1])), reverse=True)
    return [(left, right) for left, right, _ in candidates]
