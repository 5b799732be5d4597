"""One streamed OpenAI-style completion, chunk by chunk → `StreamEvent`s, and its verdict.

Pure (no I/O): feed it the bytes of every network read with the time the read returned. What it
reads, as the servers write it:

- `data:` lines with a JSON chunk (vLLM, SGLang, TGI's `data:{...}`, llama.cpp, llama-cpp-python),
  the end marker `data: [DONE]`; comments (keep-alives), `id:` / `retry:` lines are skipped.
- Chat deltas: `content` (the reply), `reasoning_content` / `reasoning` (vLLM, SGLang,
  DeepSeek-style reasoning), `tool_calls` pieces. All three are output tokens; only `content` is
  reply text. Role-only or empty deltas carry nothing. Completions: `choices[0].text`.
- `usage` and llama.cpp's `timings` on any chunk (`server_timings.ServerReport`).
- Errors inside a 200 stream: a chunk `{"error": ...}` or `{"object": "error", ...}` (vLLM,
  SGLang, TGI, llama.cpp), an SSE event named `error`, llama.cpp's older `error: {...}` line.
  Output after an error is not taken; usage and timings still are.
- A reply sent as one JSON body although a stream was asked for (`feed_response`).

Output tokens per chunk: the running count of all output so far (a chunk carrying k tokens
counts k; one whose text merges into the token before counts 0 and still adds its text), capped
at `max_tokens`. It is the server's `usage.completion_tokens` when the server puts usage on
every chunk that carries output (vLLM `continuous_usage_stats`), else the client tokenizer's
count of the concatenated text of each kind (`token_count.OutputTokenCounter`; reasoning, reply
and tool-call text are counted apart, as the model wrote them apart), else one per chunk.

A UTF-16 surrogate pair split over two chunks (`"\\ud83d"`, then `"\\ude00"`: what a server
that slices UTF-16 strings writes) is joined; a half that stays alone becomes U+FFFD. Servers
that work in UTF-8 hold a partial character back until it is whole (llama.cpp,
llama-cpp-python, vLLM, TGI) or send U+FFFD for it (llama.cpp's JSON writer): both are text.

The verdict (`failure()`), once the body ended: a server error event; no output token at all
("empty stream"); no finish reason ("stream cut", with or without `[DONE]`: llama-cpp-python
ends a reply it interrupts with `[DONE]` and nothing else). A finish reason without `[DONE]`
is a complete reply (some servers never send `[DONE]`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from llmbench.harness.backends.server_timings import ServerReport
from llmbench.harness.backends.sse import END_OF_EVENT, SSEReader
from llmbench.harness.backends.token_count import OutputTokenCounter
from llmbench.harness.records import StreamEvent

MAX_DETAIL_CHARS = 200  # of a server's text quoted in an error message
_decode_json = json.JSONDecoder().raw_decode  # json.loads minus its whitespace regex; ~40% faster
_SURROGATE = re.compile("[\ud800-\udfff]")
_CHUNK_EVENTS = (b"", b"message", b"error")  # SSE event names whose data is a chunk


class StreamError(Exception):
    """The stream cannot be read (malformed JSON, an unexpected layout); one-line reason."""


class StreamParser:
    """Reads one reply. `feed` → events with output, `finish` → the final event, `failure()`
    → why the request failed (None: it completed)."""

    def __init__(
        self,
        use_chat: bool,
        count_tokens: Callable[[str], int] | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.use_chat = use_chat
        self.max_tokens = max_tokens
        self.is_done = False  # saw `data: [DONE]`
        self.finish_reason: str | None = None
        self.error: str | None = None  # the server's error message, when it sent one
        self.num_tokens = 0  # output tokens given to events so far
        self.server = ServerReport()
        # One running count per kind of output: the model wrote them apart (a reasoning end
        # token, a tool-call template stands between them), so their texts never merge.
        self._counters = None
        if count_tokens is not None:
            self._counters = [OutputTokenCounter(count_tokens) for _ in range(3)]
        self._sse = SSEReader()
        self._event_name = b""  # of the SSE event being read
        self._num_output_chunks = 0
        self._is_usage_continuous = True  # every output chunk so far carried usage
        self._halves: dict[str, str] = {}  # field → a high surrogate waiting for its pair

    # -- input ----------------------------------------------------------------------------

    def feed(self, data: bytes, t_ns: int) -> list[StreamEvent]:
        """The events of the lines `data` completes, all stamped `t_ns`."""
        return self._fields(self._sse.feed(data), t_ns)

    def feed_response(self, body: bytes, t_ns: int) -> list[StreamEvent]:
        """A whole non-streamed reply (`choices[0].message` or `.text`): one event."""
        chunk = _json_object(body)
        choices = chunk.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            message = choices[0].get("message")
            if isinstance(message, dict):
                chunk = {**chunk, "choices": [{**choices[0], "delta": message}]}
        event = self._read(chunk, body, t_ns)
        self.is_done = True
        return [] if event is None else [event]

    def finish(self, t_ns: int, is_cut: bool = False) -> list[StreamEvent]:
        """At the end of the body: the events of a last line without a line end (unless the
        connection was cut mid-line, `is_cut`), then the final event: finish reason, usage,
        the server's timings."""
        events = [] if is_cut else self._fields(self._sse.flush(), t_ns)
        timings = self.server.server_timings(self.is_usage_continuous)
        final = StreamEvent(
            t_ns,
            0,
            finish_reason=self.finish_reason,
            usage_prompt_tokens=self.server.prompt_tokens,
            usage_completion_tokens=self.server.completion_tokens,
            cached_tokens=None if timings is None else timings.cached_tokens,
            server_timings=timings,
            usage_reported=self.server.usage is not None,
            reasoning_tokens=self.reasoning_tokens,
        )
        return [*events, final]

    @property
    def reasoning_tokens(self) -> int | None:
        """The reply's reasoning tokens: the server's count where its usage says it, else the
        client tokenizer's count of the reasoning text (0 when none streamed); None with
        neither (no tokenizer, no usage detail)."""
        if self.server.reasoning_tokens is not None:
            return self.server.reasoning_tokens
        return None if self._counters is None else self._counters[0].total

    @property
    def is_usage_continuous(self) -> bool:
        """The server put its running usage on every chunk that carried output."""
        return self._is_usage_continuous and self._num_output_chunks > 0

    def failure(self) -> str | None:
        """Why the request failed, one line; None when the reply is complete."""
        tokens = num_tokens_text(self.num_tokens)
        if self.error is not None:
            return f"server error in stream after {tokens}: {self.error}"
        if self.num_tokens == 0:
            return f"empty stream: the server sent no token (finish_reason: {self.finish_reason})"
        if self.finish_reason is None:
            if self.is_done:
                return f"stream cut: [DONE] after {tokens} with no finish_reason"
            return f"stream cut: the stream ended after {tokens} with no finish_reason or [DONE]"
        return None

    # -- lines and chunks -----------------------------------------------------------------

    def _fields(self, fields: list[tuple[bytes, bytes]], t_ns: int) -> list[StreamEvent]:
        events = []
        for name, value in fields:
            if name == b"data":
                event = self._data(value, t_ns)
                if event is not None:
                    events.append(event)
            elif name == b"event":
                self._event_name = value.strip()
            elif (name, value) == END_OF_EVENT:
                self._event_name = b""
            elif name == b"error":  # llama.cpp before 2025: `error: {"code": 500, ...}`
                message = {"message": value.decode(errors="replace")}
                self._server_error(_json_object(value, must=False) or message)
        return events

    def _data(self, value: bytes, t_ns: int) -> StreamEvent | None:
        if self.is_done or self._event_name not in _CHUNK_EVENTS:
            return None  # after [DONE]; an event type that carries no chunk
        if value.strip() == b"[DONE]":
            self.is_done = True
            return None
        chunk = _json_object(value, must=self._event_name != b"error")
        if self._event_name == b"error":
            self._server_error(chunk or {"message": value.decode(errors="replace")})
            return None
        return self._read(chunk, value, t_ns)

    def _read(self, chunk: dict[str, Any], raw: bytes, t_ns: int) -> StreamEvent | None:
        try:
            return self._chunk(chunk, t_ns)
        except (AttributeError, IndexError, KeyError, TypeError):  # e.g. "choices": "oops"
            detail = clip(raw.decode(errors="replace"))
            raise StreamError(f"malformed stream: unexpected chunk layout: {detail}") from None

    def _chunk(self, chunk: dict[str, Any], t_ns: int) -> StreamEvent | None:
        if chunk.get("error") or chunk.get("object") == "error":
            self._server_error(chunk)
            return None
        self.server.read(chunk)
        choices = chunk.get("choices")
        if not choices:
            return None  # a usage-only chunk (`choices: []`)
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if self.error is not None:
            return None  # nothing after a server error is output
        if self.use_chat:
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            tool_text = _tool_call_text(delta.get("tool_calls"))
        else:
            text, reasoning, tool_text = choice.get("text") or "", "", ""
        text, reasoning = self._whole("content", text), self._whole("reasoning", reasoning)
        if not (text or reasoning or tool_text):
            return None  # role-only or empty delta, a finish_reason-only chunk, half a character
        num_tokens = self._count((reasoning, text, tool_text), chunk.get("usage"))
        return StreamEvent(
            t_ns, num_tokens, text, reasoning_text=reasoning, tool_call_text=tool_text
        )

    def _count(self, output: tuple[str, str, str], usage: Any) -> int:
        """Tokens a chunk with this (reasoning, content, tool-call) output adds. Formula:
        min(total, max_tokens) − the tokens given so far (never negative), total = the
        server's running usage.completion_tokens (when every output chunk had one), else the
        tokenizer's count of all reasoning so far + of all content so far + of all tool-call
        text so far, else the number of output chunks so far."""
        self._num_output_chunks += 1
        server_total = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if not isinstance(server_total, int) or isinstance(server_total, bool):
            self._is_usage_continuous = False
        if self._counters is None:
            client_total = self._num_output_chunks
        else:
            reasoning, content, tool_calls = self._counters
            client_total = (
                reasoning.total_after(output[0])
                + content.total_after(output[1])
                + tool_calls.total_after(output[2])
            )
        total = server_total if self._is_usage_continuous else client_total
        if self.max_tokens:
            total = min(total, self.max_tokens)
        num_tokens = max(0, total - self.num_tokens)
        self.num_tokens += num_tokens
        return num_tokens

    def _whole(self, field: str, text: str) -> str:
        """`text` in whole characters: a UTF-16 high surrogate at its end waits for the next
        piece of the same field; any other lone surrogate becomes U+FFFD."""
        if field in self._halves:
            text = self._halves.pop(field) + text
        if not text or text.isascii() or not _SURROGATE.search(text):
            return text
        if "\ud800" <= text[-1] <= "\udbff":
            self._halves[field], text = text[-1], text[:-1]
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")

    def _server_error(self, chunk: dict[str, Any]) -> None:
        if self.error is None:  # the first one says what went wrong
            self.error = _error_message(chunk)


def _error_message(chunk: dict[str, Any]) -> str:
    """The message of an error chunk, whichever way the server nests it."""
    error = chunk.get("error") or chunk
    if isinstance(error, dict):
        error = error.get("message") or error.get("error") or json.dumps(error)
    return clip(str(error)) or "(no message)"


def _json_object(data: bytes, must: bool = True) -> dict[str, Any] | None:
    """`data` as a JSON object; otherwise a `StreamError` (or None when not `must`)."""
    try:
        text = data.decode().strip()
        value, end = _decode_json(text)
        is_object = isinstance(value, dict) and end == len(text)
    except ValueError:  # also UnicodeDecodeError
        is_object = False
    if is_object:
        return value
    if not must:
        return None
    detail = clip(data.decode(errors="replace"))
    raise StreamError(f"malformed stream: data line is not a JSON object: {detail}")


def _tool_call_text(tool_calls: list[dict[str, Any]] | None) -> str:
    """The text a model generated for streamed tool calls: function names and argument pieces.

    Like reasoning, it is output the model generated but not reply text."""
    parts = []
    for call in tool_calls or ():
        function = call.get("function") or {}
        parts += [function.get("name") or "", function.get("arguments") or ""]
    return "".join(parts)


def num_tokens_text(n: int) -> str:
    return "1 token" if n == 1 else f"{n} tokens"


def clip(text: str) -> str:
    """One line of at most `MAX_DETAIL_CHARS` characters, "…" where it was cut."""
    line = " ".join(text.split())
    return line if len(line) <= MAX_DETAIL_CHARS else line[: MAX_DETAIL_CHARS - 1] + "…"
