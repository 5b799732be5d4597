"""The running output-token count of a streamed reply: the tokenizer's count of all its text.

A chunk of k tokens is k tokens only if its text is counted together with the text before it:
tokenizers merge across chunk boundaries ("wo" + "rd" is one token, not two) and a character
split over tokens arrives whole in one chunk. So the count after each chunk is
len(tokenize(all text so far)), and a chunk carries that minus the count before it.

Counting the whole text at every chunk costs O(n²) over a reply. Here the text is a settled
head and a tail: total = tokens(head) + tokens(tail), only the tail re-tokenized at each chunk.
Once the tail is over 2 × WINDOW_CHARS long, the head takes all of it up to a space at least
WINDOW_CHARS before its end, if no token spans that point (the counts of both sides add up to
the tail's). That is exact for tokenizers whose tokens before a space do not depend on the text
after it: every pre-tokenizing BPE (GPT-2 style byte-level: SmolLM2, Llama 3, Qwen), whose words
never merge across a space. Where no cut adds up (a long run with no space, in a tokenizer that
merges across it), the tail just grows: still exact, slower. Cost per chunk: one tokenization of
at most ~2 × WINDOW_CHARS plus the chunk, two more at each settle (every ~WINDOW_CHARS of
text). With SmolLM2's tokenizer the stream parser follows ~30,000 chunks/s on one core (the
64-character context it replaced counted twice per chunk, inexactly: ~21,000).
"""

from __future__ import annotations

from collections.abc import Callable

WINDOW_CHARS = 32  # text always kept in the tail; a cut is checked, so this is about cost only


class OutputTokenCounter:
    """`total_after(text)`: how many tokens all the text seen so far, `text` included, is.

    `count_tokens` is the client tokenizer (text → number of ids); what it counts for empty text
    (a BOS it adds) is subtracted, so that only the text's own tokens count.
    """

    def __init__(self, count_tokens: Callable[[str], int]) -> None:
        self._count_tokens = count_tokens
        self._num_empty = count_tokens("")
        self._num_settled = 0  # tokens of the settled head
        self._tail = ""  # text after the head
        self._total = 0

    @property
    def total(self) -> int:
        """The tokens of all the text given so far."""
        return self._total

    def total_after(self, text: str) -> int:
        """Formula: tokens(head) + tokens(tail + text), tokens(s) = count_tokens(s) −
        count_tokens("")."""
        if not text:
            return self._total
        self._tail += text
        num_tail = self._tokens(self._tail)
        self._total = self._num_settled + num_tail
        if len(self._tail) > 2 * WINDOW_CHARS:
            self._settle(num_tail)
        return self._total

    def _tokens(self, text: str) -> int:
        return self._count_tokens(text) - self._num_empty

    def _settle(self, num_tail: int) -> None:
        """Move the tail's text up to a safe point into the head."""
        limit = len(self._tail) - WINDOW_CHARS
        cut = self._tail.rfind(" ", 0, limit)  # a word boundary: " word" is one pre-token
        if cut <= 0:
            cut = limit
        head, rest = self._tail[:cut], self._tail[cut:]
        num_head = self._tokens(head)
        if num_head + self._tokens(rest) == num_tail:  # no token spans the cut
            self._num_settled += num_head
            self._tail = rest
