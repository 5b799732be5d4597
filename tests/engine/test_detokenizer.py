"""Streaming decode: text per token adds up to decode(ids); stop strings held back across deltas."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmbench.engine.detokenizer import IncrementalDetokenizer, StopStringMatcher
from llmbench.engine.tokenizer import Tokenizer


def stream_text(tok: Tokenizer, ids: list[int], skip_special_tokens: bool = False) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip_special_tokens)
    return [detok.push(token_id) for token_id in ids] + [detok.flush()]


def test_detokenizer_holds_split_characters() -> None:
    tok = Tokenizer.byte_level()
    # 'é' is 2 bytes, '世' 3, '🚀' 4: text appears only when the last byte of each arrives.
    pieces = stream_text(tok, tok.encode("aé世🚀"))
    assert pieces == ["a", "", "é", "", "", "世", "", "", "", "🚀", ""]


@pytest.mark.parametrize(
    "text",
    ["naïve café, Ñandú", "日本語のテキスト", "🚀👍🏽 👨‍👩‍👧 🇫🇷", "mixed: é世🚀 a\n\tb <|im_end|>"],
)
def test_detokenizer_byte_level_matches_decode(text: str) -> None:
    tok = Tokenizer.byte_level()
    pieces = stream_text(tok, tok.encode(text))
    assert "".join(pieces) == text
    assert not any("\ufffd" in piece for piece in pieces)


@given(st.text())
def test_detokenizer_any_text_streams_to_itself(text: str) -> None:
    tok = Tokenizer.byte_level()
    pieces = stream_text(tok, tok.encode(text))
    assert "".join(pieces) == text
    # No piece ends in half a character (U+FFFD), unless the text itself holds one.
    assert "\ufffd" in text or not any("\ufffd" in piece for piece in pieces)


@given(st.lists(st.integers(0, 258)), st.booleans())
def test_detokenizer_any_ids_match_decode(ids: list[int], skip_special_tokens: bool) -> None:
    """Any ids, invalid UTF-8 and special tokens included: the stream still equals decode."""
    tok = Tokenizer.byte_level()
    pieces = stream_text(tok, ids, skip_special_tokens)
    assert "".join(pieces) == tok.decode(ids, skip_special_tokens=skip_special_tokens)


class _WindowRecordingTokenizer(Tokenizer):
    """Records how many ids each decode call sees."""

    window_sizes: list[int]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        self.window_sizes.append(len(ids))
        return super().decode(ids, skip_special_tokens)


def test_detokenizer_window_stays_small() -> None:
    tok = _WindowRecordingTokenizer.byte_level()
    tok.window_sizes = []
    ids = tok.encode("a🚀" * 2000)
    assert "".join(stream_text(tok, ids)) == "a🚀" * 2000
    # At most the last emitted character's 4 bytes plus a pending 4-byte character.
    assert max(tok.window_sizes) <= 8


# -- GGUF: synthetic files against transformers -------------------------------------------------


# --- StopStringMatcher -----------------------------------------------------------------------


def test_stop_string_split_across_two_deltas() -> None:
    matcher = StopStringMatcher(["###"])
    assert matcher.push("Hello #") == ("Hello ", False)
    assert matcher.push("## world") == ("", True)
    assert matcher.push("more") == ("", True)  # stopped: nothing more is emitted


def test_stop_string_split_across_three_deltas_with_text_before_it() -> None:
    matcher = StopStringMatcher(["</end>"])
    assert matcher.push("abc</") == ("abc", False)
    assert matcher.push("en") == ("", False)
    assert matcher.push("d>tail") == ("", True)


def test_partial_prefix_released_when_it_is_not_a_stop() -> None:
    matcher = StopStringMatcher(["###"])
    assert matcher.push("a#") == ("a", False)
    assert matcher.push("#b") == ("##b", False)
    assert matcher.flush() == ""


def test_held_prefix_shifts_when_the_match_starts_later() -> None:
    # "aaab": "aab" starts at index 1, so only the first "a" is output.
    matcher = StopStringMatcher(["aab"])
    assert matcher.push("aa") == ("", False)
    assert matcher.push("a") == ("a", False)
    assert matcher.push("b") == ("", True)


def test_multiple_stop_strings_earliest_wins() -> None:
    matcher = StopStringMatcher(["STOP", "\n\n"])
    assert matcher.push("one\n") == ("one", False)
    assert matcher.push("\ntwo STOP") == ("", True)

    matcher = StopStringMatcher(["\n\n", "STOP"])
    assert matcher.push("x STOP y\n\n z") == ("x ", True)


def test_first_complete_stop_wins_whatever_the_deltas() -> None:
    """Regression (found by the property test): with stops "a" and "#aa", "#aa" in one delta
    used to stop at "#aa" (earliest start) but "#a" + "a" at "a". The stop that completes first
    wins in both cases now."""
    assert StopStringMatcher(["a", "#aa"]).push("#aa") == ("#", True)
    matcher = StopStringMatcher(["a", "#aa"])
    assert matcher.push("#a") == ("#", True)


def test_flush_returns_held_text_at_end_of_generation() -> None:
    matcher = StopStringMatcher(["###"])
    assert matcher.push("the end#") == ("the end", False)
    assert matcher.flush() == "#"
    assert matcher.flush() == ""


def test_after_a_hit_nothing_more_is_emitted() -> None:
    matcher = StopStringMatcher(["###"])
    assert matcher.push("###") == ("", True)
    assert matcher.push("more") == ("", True)
    assert matcher.flush() == ""


def test_no_stop_strings_is_pass_through() -> None:
    matcher = StopStringMatcher([])
    assert matcher.push("a#") == ("a#", False)
    assert matcher.push("") == ("", False)
    assert matcher.flush() == ""


@given(
    text=st.text(alphabet="ab#", max_size=30),
    stops=st.lists(st.text(alphabet="ab#", min_size=1, max_size=4), min_size=1, max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=10),
)
def test_streamed_output_equals_text_cut_at_first_stop(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    # Reference: the whole text, cut where the first stop string to be complete starts (ties:
    # the longer one) — what a character-by-character stream would see, whatever the cuts.
    matches = [(i + len(s), i) for s in stops if (i := text.find(s)) >= 0]
    expected = text[: min(matches)[1]] if matches else text

    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    matcher = StopStringMatcher(stops)
    output, is_hit = "", False
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        emitted, is_hit = matcher.push(text[lo:hi])
        output += emitted
        if is_hit:
            break
    if not is_hit:
        output += matcher.flush()
    assert output == expected
    assert is_hit == bool(matches)
