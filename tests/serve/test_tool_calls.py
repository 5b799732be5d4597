"""Tests for llmbench.serve.tool_calls: Hermes blocks parsed from canned model output,
whole and streamed, with the same result however the text is cut into deltas."""

from __future__ import annotations

import json
import re

from hypothesis import given
from hypothesis import strategies as st

from llmbench.engine import chat_template
from llmbench.serve.tool_calls import (
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolCall,
    ToolCallParser,
    parse_tool_calls,
)

WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}'
TIME = '{"name": "get_time", "arguments": {}}'


def calls_of(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments)) for call in calls]


def test_the_tags_are_the_ones_the_chat_template_fallback_asks_for():
    assert (TOOL_CALL_OPEN, TOOL_CALL_CLOSE) == (
        chat_template.TOOL_CALL_OPEN,
        chat_template.TOOL_CALL_CLOSE,
    )


def test_one_call_with_content_before_it():
    content, calls = parse_tool_calls(f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>")
    assert content == "Let me check.\n"
    assert calls_of(calls) == [("get_weather", {"city": "Paris", "unit": "°C"})]
    [call] = calls
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    assert call.arguments == '{"city": "Paris", "unit": "°C"}'  # a JSON string, not ASCII-escaped
    assert call.as_api() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": call.arguments},
    }


def test_two_calls_whitespace_between_and_after_is_not_content():
    text = f"<tool_call>{WEATHER}</tool_call>\n\n<tool_call>\n{TIME}\n</tool_call>\n"
    content, calls = parse_tool_calls(text)
    assert content == ""
    assert calls_of(calls) == [("get_weather", {"city": "Paris", "unit": "°C"}), ("get_time", {})]
    assert len({call.id for call in calls}) == 2


def test_text_after_a_call_is_content():
    content, calls = parse_tool_calls(f"<tool_call>{TIME}</tool_call> Done.")
    assert content == " Done." and calls_of(calls) == [("get_time", {})]


def test_plain_text_is_all_content():
    assert parse_tool_calls("  The weather is < 20 degrees.") == (
        "  The weather is < 20 degrees.",
        [],
    )
    assert parse_tool_calls("ends with a tag start <tool_c") == (
        "ends with a tag start <tool_c",
        [],
    )
    assert parse_tool_calls(" \n ") == ("", [])


def test_a_block_that_is_not_a_call_stays_text():
    for body in (
        "not json",
        '{"arguments": {}}',
        '{"name": 5}',
        '["get_time"]',
        '{"name": "f", "arguments": [1]}',
    ):
        text = f"A<tool_call>{body}</tool_call>B"
        assert parse_tool_calls(text) == (text, [])


def test_arguments_as_a_json_string_or_missing():
    content, calls = parse_tool_calls(
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    assert calls_of(calls) == [("f", {"x": 1})]
    content, calls = parse_tool_calls('<tool_call>{"name": "f"}</tool_call>')
    assert calls_of(calls) == [("f", {})]


def test_an_unclosed_block_is_a_call_when_its_json_is_whole():
    assert calls_of(parse_tool_calls(f"<tool_call>\n{TIME}\n")[1]) == [("get_time", {})]
    truncated = '<tool_call>\n{"name": "get_time", "argu'  # max_tokens cut it
    assert parse_tool_calls(truncated) == (truncated, [])


def test_max_calls_drops_the_later_blocks():
    text = f"<tool_call>{WEATHER}</tool_call><tool_call>{TIME}</tool_call>"
    content, calls = parse_tool_calls(text, max_calls=1)
    assert content == "" and [call.name for call in calls] == ["get_weather"]


def test_streaming_never_shows_a_tag_and_sends_content_as_soon_as_it_is_known():
    parser = ToolCallParser()
    assert parser.push("Checking") == ["Checking"]
    assert parser.push(". <tool") == [". "]  # "<tool" may open a tag: held back
    assert parser.push('_call>\n{"name": "get_time",') == []
    [call] = parser.push(' "arguments": {}}\n</tool_call>')
    assert isinstance(call, ToolCall) and call.name == "get_time"
    assert parser.push("\n") == []  # whitespace after a call: held, then dropped
    assert parser.finish() == []
    assert parser.num_calls == 1


def test_streaming_releases_a_held_tag_start_that_was_not_one():
    parser = ToolCallParser()
    assert parser.push("a <tool") == ["a "]
    assert parser.push("box>") == ["<toolbox>"]
    assert parser.push("<") == []
    assert parser.finish() == ["<"]


REPLIES = [
    f"Checking. <tool_call> {WEATHER} </tool_call>",
    f"<tool_call>{WEATHER}</tool_call>\n<tool_call>{TIME}</tool_call>\n",
    f"Before <tool_call>{TIME}</tool_call> between <tool_call>bad</tool_call> after <tool_c",
    f"\n<tool_call>\n{TIME}",
    "no calls at all, but < and <tool and </tool_call> in the text",
]


@given(reply=st.sampled_from(REPLIES), data=st.data())
def test_any_cut_into_deltas_gives_the_whole_text_result(reply, data):
    cuts = sorted(data.draw(st.sets(st.integers(1, len(reply) - 1), max_size=12)))
    deltas = [reply[i:j] for i, j in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
    parser = ToolCallParser()
    events = [event for delta in deltas for event in parser.push(delta)] + parser.finish()
    content = "".join(event for event in events if isinstance(event, str))
    calls = [event for event in events if isinstance(event, ToolCall)]
    whole_content, whole_calls = parse_tool_calls(reply)
    assert content == whole_content
    assert calls_of(calls) == calls_of(whole_calls)
    assert TOOL_CALL_OPEN not in content or "<tool_call>bad" in reply
