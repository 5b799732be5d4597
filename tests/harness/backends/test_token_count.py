"""The running output-token count: after every chunk, the tokenizer's count of all the text so
far, whatever the chunking, at a cost that does not grow with the reply."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbench.harness.backends.token_count import WINDOW_CHARS, OutputTokenCounter
from tests.harness.backends.tiny_bpe import tiny_bpe_count

COUNT = tiny_bpe_count()


def totals(chunks: list[str], count_tokens=COUNT) -> list[int]:
    counter = OutputTokenCounter(count_tokens)
    return [counter.total_after(chunk) for chunk in chunks]


def test_a_word_split_over_chunks_is_one_token():
    # "wo" is 1 token; "wo" + "rd" is "word", still 1: the second chunk adds none.
    assert totals(["wo", "rd"]) == [1, 1]
    # " word" is 1 token but " " alone is 1 too: " " then "word" stays at 1.
    assert totals(["a", " ", "word"]) == [1, 2, 2]


def test_a_character_split_over_tokens_counts_its_tokens_when_it_arrives():
    # The model made "日" from 2 tokens; the server held the first back (its text was half a
    # character) and sent the character whole: 2 tokens in one chunk.
    assert totals(["a", "", "日"]) == [1, 1, 3]
    # A server that sends U+FFFD for each half: the text is what it sent, counted as such
    # (U+FFFD is 3 bytes here, 3 tokens).
    assert totals(["a", "\ufffd", "\ufffd"]) == [1, 4, 7]


def test_what_the_tokenizer_counts_for_no_text_is_not_output():
    def with_bos(text: str) -> int:
        return 1 + COUNT(text)

    assert totals(["wo", "rd", " word"], with_bos) == [1, 1, 2]


@given(
    text=st.text(alphabet=st.sampled_from(list("word ab\né日😀\ufffd")), max_size=600),
    seed=st.integers(0, 2**16),
)
def test_the_total_is_the_whole_texts_count_for_any_chunking(text, seed):
    """Chunks cut anywhere between characters (a server never sends half a character), of 1 to
    20 characters: long texts pass the window many times."""
    rng = random.Random(seed)
    cuts = sorted({0, len(text), *(rng.randrange(len(text) + 1) for _ in range(len(text) // 4))})
    counter = OutputTokenCounter(COUNT)
    for start, end in zip(cuts, cuts[1:], strict=False):
        assert counter.total_after(text[start:end]) == COUNT(text[:end])


def test_each_chunk_tokenizes_a_bounded_tail_not_the_whole_reply():
    seen: list[int] = []

    def counting(text: str) -> int:
        seen.append(len(text))
        return COUNT(text)

    counter = OutputTokenCounter(counting)
    reply = " word" * 2000  # 10,000 characters in 2,000 chunks
    for _ in range(2000):
        counter.total_after(" word")
    assert counter.total_after("") == COUNT(reply) == 2000
    assert max(seen) <= 2 * WINDOW_CHARS + len(" word")
    assert len(seen) < 3 * 2000  # one count per chunk, two more per settle


@pytest.mark.slow
def test_smollm2s_tokenizer_over_a_real_reply(smollm2_gguf_path):
    """The real tokenizer: English, a word cut mid-way, Japanese (2-3 tokens a character),
    emoji, digits and newlines, cut into chunks of 1-6 characters."""
    from llmbench.engine.weights import open_weights

    tokenizer = open_weights(str(smollm2_gguf_path)).tokenizer()

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_bos=False))

    reply = (
        "Sure! Here is the plan: 1) measure TTFT, 2) measure TPOT.\n"
        "日本語のテキストも少し。Emoji too 😀👍 and café, naïve, 1234567.\n"
    ) * 6
    rng = random.Random(0)
    counter = OutputTokenCounter(count)
    end = 0
    while end < len(reply):
        start, end = end, min(len(reply), end + rng.randint(1, 6))
        assert counter.total_after(reply[start:end]) == count(reply[:end])
