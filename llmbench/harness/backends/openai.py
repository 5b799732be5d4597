"""A backend that streams from any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, ...).

The network loop is thin: every read is stamped with `time.perf_counter_ns()` as soon as it
returns, then `StreamParser` (pure, no I/O, unit-tested byte by byte) turns the Server-Sent
Events into `StreamEvent`s. Per chunk that is one `bytes.split`, one stdlib JSON decode and a
few dict lookups: one asyncio process follows ~30,000 chunks/s on one core (2,000 streams at
once measured), all of it in aiohttp and the parser.

Output tokens per chunk (a chunk may carry several; the first delta may carry none):
- with `count_tokens`: k = count(text so far) − count(text before this chunk), at least 1, so a
  chunk carrying several tokens (speculative decoding, batched deltas) counts as several; "text
  so far" is the last 64 characters plus the chunk, which gives the same k at a constant cost;
- without it: 1 per chunk that carries text.
Reasoning deltas (`reasoning_content` / `reasoning`) and streamed tool calls (the function name
and argument pieces of `tool_calls`) are output tokens too, but they are not the reply: their
event has `text == ""` and `num_tokens > 0`. So the first event with tokens is the first token of
any kind, and the first event with text is the first content token. Role-only or empty deltas
carry no tokens and produce no event.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from llmbench.harness.records import GenerationRequest, StreamEvent

_MAX_BODY_CHARS = 200  # of an error body, in a BackendError message
_COUNT_CONTEXT_CHARS = 64  # text before a chunk that its token count is taken against (see below)
_decode_json = json.JSONDecoder().raw_decode  # json.loads minus its whitespace regex; ~40% faster
_DRAIN_AFTER_DONE_S = 1.0  # wait this long for the end of the HTTP body after `data: [DONE]`


class BackendError(Exception):
    """A request (or the connection to the server) failed; the message is a one-line reason."""


class StreamParser:
    """Server-Sent Events of one streamed completion → `StreamEvent`s.

    Feed it the bytes of every network read with the time the read returned; lines split across
    reads are joined. Only `data:` lines matter; comments (`: ping`), blank lines and other SSE
    fields are skipped.
    """

    def __init__(self, use_chat: bool, count_tokens: Callable[[str], int] | None = None) -> None:
        self.use_chat = use_chat
        self.count_tokens = count_tokens
        self.is_done = False  # saw `data: [DONE]`
        self.finish_reason: str | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        self._tail = b""  # an incomplete line, waiting for the rest of it
        self._context = ""  # the last output text (only kept with count_tokens)

    def feed(self, data: bytes, t_ns: int) -> list[StreamEvent]:
        """The events carried by the complete lines in `tail + data`, all stamped `t_ns`."""
        lines = (self._tail + data).split(b"\n") if self._tail else data.split(b"\n")
        self._tail = lines.pop()
        events = []
        for line in lines:
            event = self._line(line, t_ns)
            if event is not None:
                events.append(event)
        return events

    def finish(self, t_ns: int) -> list[StreamEvent]:
        """At the end of the body: the events of a last unterminated line, then the final event
        (usage, finish reason). Raises `BackendError` if the stream was cut short."""
        events = self.feed(b"\n", t_ns) if self._tail else []
        if not self.is_done and self.finish_reason is None:
            raise BackendError("stream ended without [DONE] or a finish_reason")
        final = StreamEvent(
            t_ns,
            0,
            finish_reason=self.finish_reason,
            usage_prompt_tokens=self.prompt_tokens,
            usage_completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
        )
        return [*events, final]

    def _line(self, line: bytes, t_ns: int) -> StreamEvent | None:
        if not line.startswith(b"data:") or self.is_done:
            return None  # blank line (event boundary), `: comment`, `event:`/`id:`/`retry:`
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.is_done = True
            return None
        try:
            text = payload.decode()
            chunk, end = _decode_json(text)
        except ValueError:  # also UnicodeDecodeError
            chunk, end = None, 0
        if not isinstance(chunk, dict) or end != len(text):
            detail = _clip(payload.decode(errors="replace"))
            raise BackendError(f"malformed stream: data line is not a JSON object: {detail}")
        try:
            return self._chunk(chunk, t_ns)
        except (AttributeError, IndexError, KeyError, TypeError):  # e.g. "choices": "oops"
            detail = _clip(payload.decode(errors="replace"))
            raise BackendError(f"malformed stream: unexpected chunk layout: {detail}") from None

    def _chunk(self, chunk: dict[str, Any], t_ns: int) -> StreamEvent | None:
        if chunk.get("error") or chunk.get("object") == "error":
            error = chunk.get("error") or chunk
            message = error.get("message", error) if isinstance(error, dict) else error
            raise BackendError(f"server error in stream: {_clip(str(message))}")
        usage = chunk.get("usage")
        if usage:  # the include_usage chunk (some servers repeat it on every chunk: keep the last)
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details")
            if details:
                self.cached_tokens = details.get("cached_tokens")
        choices = chunk.get("choices")
        if not choices:
            return None
        choice = choices[0]
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]
        if self.use_chat:
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
            reasoning += _tool_call_text(delta.get("tool_calls"))
        else:
            text = choice.get("text") or ""
            reasoning = ""
        if not text and not reasoning:
            return None  # role-only / empty delta, or a finish_reason-only chunk: no token
        if self.count_tokens is None:
            return StreamEvent(t_ns, 1, text)
        # k = count(context + new) − count(context), the context being the last
        # _COUNT_CONTEXT_CHARS of the output: the same k as counting the whole text before and
        # after (tokenizers merge across a few characters, not 64), at a constant cost per chunk
        # instead of one that grows with the reply.
        new = reasoning + text
        context = self._context
        num_tokens = self.count_tokens(context + new) - self.count_tokens(context)
        self._context = (context + new)[-_COUNT_CONTEXT_CHARS:]
        return StreamEvent(t_ns, max(1, num_tokens), text)


def _tool_call_text(tool_calls: list[dict[str, Any]] | None) -> str:
    """The text a model generated for streamed tool calls: function names and argument pieces.

    Like reasoning, it is output the model generated but not reply text."""
    parts = []
    for call in tool_calls or ():
        function = call.get("function") or {}
        parts += [function.get("name") or "", function.get("arguments") or ""]
    return "".join(parts)


class OpenAIBackend:
    """Streams completions from an OpenAI-compatible server over one pooled aiohttp session.

    `url` is the API base, e.g. `http://127.0.0.1:8000/v1`. `model=None` asks `GET /models` for
    the first model at `start()`. `count_tokens` (text → token count, the client tokenizer)
    splits multi-token chunks; without it each chunk counts as one token. A request that takes
    longer than `timeout_s` in all fails with a `BackendError`.
    """

    name = "openai"

    def __init__(
        self,
        url: str,
        model: str | None = None,
        count_tokens: Callable[[str], int] | None = None,
        api_key: str | None = None,
        timeout_s: float = 600.0,
        max_connections: int = 2048,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.count_tokens = count_tokens
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the connection pool; find the served model when none was given."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        if self.model is not None:
            return
        try:
            self.model = await self._first_model()
        except BackendError as e:
            await self.close()
            raise BackendError(f"cannot reach {self.url}: {e}; is the server running?") from None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """POST one streamed completion; yield an event per chunk with tokens, then always one
        final event with `num_tokens == 0` (finish reason, the server's usage).

        The request id goes along as `X-Request-Id`, for matching server-side logs. Raises
        `BackendError` on an HTTP error, a dropped connection, a malformed stream, a stream that
        ends without `[DONE]` or a finish_reason, or a timeout.
        """
        if self._session is None:
            raise RuntimeError("OpenAIBackend.start() was not called")
        path, body = self._body(request)
        parser = StreamParser(request.use_chat, self.count_tokens)
        is_replying = False  # the response headers arrived
        t_ns = 0
        try:
            async with self._session.post(
                self.url + path, json=body, headers={"X-Request-Id": request.request_id}
            ) as response:
                is_replying = True
                if response.status >= 400:
                    text = await response.text(errors="replace")
                    raise BackendError(f"HTTP {response.status}: {_clip(text)}")
                content = response.content
                while not parser.is_done:
                    data = await content.readany()
                    t_ns = time.perf_counter_ns()  # before any parsing: the chunk's arrival
                    if not data:
                        break  # end of the body
                    for event in parser.feed(data, t_ns):
                        yield event
                if parser.is_done and not content.at_eof():
                    # Read the end of the HTTP body too, so the connection goes back to the pool
                    # instead of being closed (a new connection would add to the next TTFT).
                    try:
                        await asyncio.wait_for(content.read(), _DRAIN_AFTER_DONE_S)
                    except (asyncio.TimeoutError, aiohttp.ClientError):
                        pass
        except asyncio.TimeoutError:  # aiohttp's total timeout (ServerTimeoutError is one too)
            raise BackendError(f"timeout after {self.timeout_s:g} s") from None
        except aiohttp.ClientConnectorError as e:
            raise BackendError(f"cannot connect to {self.url}: {e.os_error}") from None
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            if is_replying:
                raise BackendError("connection dropped mid-stream") from None
            raise BackendError(f"connection failed before a reply: {_clip(str(e))}") from None
        for event in parser.finish(t_ns):
            yield event

    def _body(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        """The path and JSON body. Chat: the messages as given (assistant `tool_calls`, `tool`
        messages, null content pass through) and the request's `tools`. Completions: the prompt
        the client rendered, tools already in it."""
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.ignore_eos:
            body["ignore_eos"] = True  # vLLM / SGLang extension; only sent when asked for
        if request.use_chat:
            body["messages"] = list(request.messages)
            if request.tools:
                body["tools"] = list(request.tools)
            return "/chat/completions", body
        if request.prompt_text is None:
            raise ValueError(f"request {request.request_id}: use_chat=False needs prompt_text")
        body["prompt"] = request.prompt_text
        return "/completions", body

    async def _first_model(self) -> str:
        assert self._session is not None
        try:
            async with self._session.get(
                self.url + "/models", timeout=aiohttp.ClientTimeout(total=10)
            ) as response:
                if response.status >= 400:
                    text = await response.text(errors="replace")
                    raise BackendError(f"GET /models gave HTTP {response.status}: {_clip(text)}")
                listing = await response.json(content_type=None)
        except asyncio.TimeoutError:
            raise BackendError("no answer from GET /models in 10 s") from None
        except aiohttp.ClientConnectorError as e:
            raise BackendError(str(e.os_error)) from None
        except (aiohttp.ClientError, ValueError) as e:
            raise BackendError(_clip(str(e) or type(e).__name__)) from None
        models = listing.get("data") if isinstance(listing, dict) else None
        if not models or not isinstance(models[0], dict) or "id" not in models[0]:
            raise BackendError("GET /models listed no model")
        return models[0]["id"]


def _clip(text: str) -> str:
    """One line of at most `_MAX_BODY_CHARS` characters."""
    return " ".join(text.split())[:_MAX_BODY_CHARS]
