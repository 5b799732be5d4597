"""Generated ids -> streamed text: incremental detokenization, and stop strings held back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmbench.engine.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Generated ids -> new text per token, for streaming.

    Decoding one id alone is wrong in two ways: a UTF-8 character can be split over several
    byte tokens, and some decoders change a token's text depending on what precedes it
    (sentencepiece drops the leading space of the first token). So, as vLLM does, each step
    decodes a small window `ids[prefix_offset:]` and emits what it adds to the text of
    `ids[prefix_offset:read_offset]`, which was already emitted. Output is held back while the
    window's text ends in U+FFFD (an incomplete character). The window is the last emitted
    token(s) plus the pending ones, so a step costs O(window), not O(tokens so far).

    Invariant: the concatenation of all `push` results and `flush()` equals
    `tokenizer.decode(all_ids, skip_special_tokens)`: for any ids with a byte-level decoder, and
    for ids of valid UTF-8 with sentencepiece's byte fallback (which turns a whole run of <0xNN>
    tokens into U+FFFDs if any byte in it is invalid, something no streaming decoder can foresee).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # window start: tokens decoded only as context
        self._read_offset = 0  # tokens before this have been emitted
        self._prefix_text = ""  # decode(ids[prefix_offset:read_offset]), already emitted

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes ("" while a character is split)."""
        self._ids.append(token_id)
        text = self._decode_window()
        if len(text) <= len(self._prefix_text) or text.endswith("\ufffd"):
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """Return whatever is held back (a trailing U+FFFD if the ids end mid-character)."""
        text = self._decode_window()
        if len(text) <= len(self._prefix_text):
            return ""
        return self._advance(text)

    def _decode_window(self) -> str:
        window = self._ids[self._prefix_offset :]
        return self._tokenizer.decode(window, skip_special_tokens=self._skip_special_tokens)

    def _advance(self, text: str) -> str:
        """Emit the new part of `text` and slide the window: the tokens just emitted become the
        context for the next step."""
        new_text = text[len(self._prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._prefix_text = self._tokenizer.decode(
            self._ids[self._prefix_offset : self._read_offset],
            skip_special_tokens=self._skip_special_tokens,
        )
        return new_text


class StopStringMatcher:
    """Finds stop strings in streamed text, even when one is split across token deltas.

    `push` returns only text that cannot be the start of a stop string; a suffix that might be
    is held back until the next delta settles it. With no stop strings, text passes straight
    through.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        self._stop = tuple(stop)
        self._held = ""  # a suffix of the stream that is a proper prefix of some stop string
        self._is_stopped = False

    def push(self, text_delta: str) -> tuple[str, bool]:
        """Add newly decoded text; return (text safe to emit now, whether a stop string hit).

        On a hit the returned text ends just before the stop string; the stop string and
        anything after it are never emitted.
        """
        if self._is_stopped:
            return "", True
        if not self._stop:
            return text_delta, False
        text = self._held + text_delta
        # The held text contains no whole stop string (it would have hit last time), so any
        # match found here is new. The stop string that is *complete* first wins (ties: the
        # longer one), as if the text had arrived one character at a time: the result must not
        # depend on how the text was cut into deltas.
        matches = [(start + len(s), start) for s in self._stop if (start := text.find(s)) >= 0]
        if matches:
            self._held = ""
            self._is_stopped = True
            return text[: min(matches)[1]], True
        num_held = max(_longest_suffix_prefix(text, s) for s in self._stop)
        self._held = text[len(text) - num_held :]
        return text[: len(text) - num_held], False

    def flush(self) -> str:
        """Release the held-back text when generation ends without a stop string."""
        held, self._held = self._held, ""
        return held


def _longest_suffix_prefix(text: str, stop: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `stop` (0 if none)."""
    for n in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
