"""A real byte-level BPE tokenizer (the Hugging Face `tokenizers` library, GPT-2 pre-tokenizer),
with a vocabulary small enough that every count can be worked out by hand:

- every byte is a token (GPT-2's byte → character map: " " is "Ġ");
- merges: "w"+"o", "r"+"d", "wo"+"rd" (so "word" is 1 token, "wo" 1, "rd" 1), "Ġ"+"word"
  (" word" is 1), and the first two bytes of "日" (E6 97 → "æĹ"), so "日" is 2 tokens, as in
  SmolLM2's vocabulary, where it takes two;
- every other character is one token per UTF-8 byte: "a" 1, "é" 2, "😀" 4, U+FFFD 3.

Words never merge across a space (the GPT-2 pre-tokenizer splits before it), as in every
byte-level BPE model.
"""

from __future__ import annotations

from collections.abc import Callable

import tokenizers
from tokenizers import models, pre_tokenizers

from llmbench.engine.gguf_vocab import byte_to_char

MERGES = [("w", "o"), ("r", "d"), ("wo", "rd"), ("Ġ", "word"), ("æ", "Ĺ")]


def tiny_bpe() -> tokenizers.Tokenizer:
    vocab = {char: byte for byte, char in byte_to_char().items()}
    for left, right in MERGES:
        vocab[left + right] = len(vocab)
    tokenizer = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return tokenizer


def tiny_bpe_count() -> Callable[[str], int]:
    """text → number of tokens, as the backend's `count_tokens` takes it."""
    tokenizer = tiny_bpe()
    return lambda text: len(tokenizer.encode(text).ids)
