"""Tool calls out of model text in the Hermes format, whole or as the text streams in:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The format is the one most open models are trained on, and the one `llmbench.engine.chat_template`
asks for when a model's template has no tools of its own. A block whose JSON is an object with
a string `name` (and `arguments`, an object, possibly missing) is a call; any other block stays
text, tags included. Text outside the blocks is content, except whitespace alone before, between
or after calls, which is dropped. A block the model did not close before it stopped is a call
too, if its JSON is complete.

`ToolCallParser` works on deltas and holds back only what could still be the start of a tag, so
text before a call streams at once and the tags never reach the client as content. Whatever
way the text is cut into deltas, the parser gives the same content and calls (`parse_tool_calls`
runs it over the whole text, so streamed and non-streamed replies agree).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: OpenAI's `tool_calls` entry."""

    id: str  # "call_<24 hex digits>"
    name: str
    arguments: str  # a JSON object, as the API carries it: a string

    def as_api(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


def parse_tool_calls(text: str, max_calls: int | None = None) -> tuple[str, list[ToolCall]]:
    """(content, calls) of a whole reply; content is "" when there is none."""
    parser = ToolCallParser(max_calls)
    events = parser.push(text) + parser.finish()
    content = "".join(event for event in events if isinstance(event, str))
    return content, [event for event in events if isinstance(event, ToolCall)]


class ToolCallParser:
    """Text deltas in, content deltas and completed calls out, in order.

    `max_calls` (1 for `parallel_tool_calls: false`) drops the blocks after that many calls.
    """

    def __init__(self, max_calls: int | None = None) -> None:
        self._max_calls = max_calls
        self._num_calls = 0
        self._is_inside = False  # between an opening tag and its closing tag
        self._held = ""  # outside: a suffix that may be the start of an opening tag
        self._body = ""  # inside: the block's text so far
        # Outside, at the start or after a call: whitespace not yet known to be content.
        self._whitespace = ""
        self._is_after_content = False  # the last thing out was content (not a call, not none)

    @property
    def num_calls(self) -> int:
        return self._num_calls

    def push(self, text: str) -> list[str | ToolCall]:
        """Add a delta; return the content (strings) and calls it completes."""
        events: list[str | ToolCall] = []
        while text:
            if self._is_inside:
                searched = max(0, len(self._body) - len(TOOL_CALL_CLOSE) + 1)
                self._body += text
                end = self._body.find(TOOL_CALL_CLOSE, searched)
                if end < 0:
                    return events
                text = self._body[end + len(TOOL_CALL_CLOSE) :]
                self._end_block(self._body[:end], events, is_closed=True)
                continue
            text = self._held + text
            start = text.find(TOOL_CALL_OPEN)
            if start >= 0:
                self._content(text[:start], events)
                self._whitespace = ""  # whitespace between two calls is not content
                self._held, self._body, self._is_inside = "", "", True
                text = text[start + len(TOOL_CALL_OPEN) :]
                continue
            num_held = _longest_suffix_prefix(text, TOOL_CALL_OPEN)
            self._held = text[len(text) - num_held :]
            self._content(text[: len(text) - num_held], events)
            return events
        return events

    def finish(self) -> list[str | ToolCall]:
        """The reply has ended: an unclosed block is a call if its JSON is whole, else text."""
        events: list[str | ToolCall] = []
        if self._is_inside:
            self._end_block(self._body, events, is_closed=False)
        elif self._held:
            self._content(self._held, events)
        self._held = self._whitespace = ""
        return events

    def _content(self, text: str, events: list[str | ToolCall]) -> None:
        if not self._is_after_content and not (self._whitespace + text).strip():
            self._whitespace += text  # content only if more than whitespace follows
            return
        text, self._whitespace = self._whitespace + text, ""
        if text:
            events.append(text)
            self._is_after_content = True

    def _end_block(self, body: str, events: list[str | ToolCall], is_closed: bool) -> None:
        self._is_inside, self._body = False, ""
        call = _call_from_json(body)
        if call is None:
            self._content(TOOL_CALL_OPEN + body + (TOOL_CALL_CLOSE if is_closed else ""), events)
            return
        if self._max_calls is None or self._num_calls < self._max_calls:
            events.append(call)
        self._num_calls += 1
        self._is_after_content = False


def _call_from_json(body: str) -> ToolCall | None:
    """The call a block's text holds, or None when it is not `{"name": str, "arguments": {}}`."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):  # some models write the API's form, a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(
        id=f"call_{uuid.uuid4().hex[:24]}",
        name=value["name"],
        arguments=json.dumps(arguments, ensure_ascii=False),
    )


def _longest_suffix_prefix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (0 if none)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
