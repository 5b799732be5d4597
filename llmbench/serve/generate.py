"""One /v1/completions or /v1/chat/completions request through the engine client: streamed as
SSE or collected into one reply, tool calls parsed out of the text, latencies observed.

A streamed reply sends one SSE chunk per engine output (one token per step per request), so a
client sees the engine's own inter-token timing; text that may be the start of a `<tool_call>`
tag is held back until it is known not to be. A client that disconnects has its request
aborted, which frees its KV blocks. If the engine dies, an open stream ends with an error
event at once, and a request waiting for its whole reply gets a 503.

The event loop never does work in proportion to a request's size: a body is refused past
`Body.max_bytes` before it is read (413), must arrive within `Body.timeout_s` (408), and is
decoded, checked and tokenized on a worker thread by a tokenizer that releases the GIL
(`served_tokenizer`), so /health answers in milliseconds while a long prompt is tokenized.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmbench.errors import BackendFailure, UserError
from llmbench.serve.metrics import RequestClock, ServeMetrics
from llmbench.serve.protocol import (
    ApiError,
    Generation,
    Limits,
    Reply,
    Tokenizer,
    decode_json_object,
    parse_generation,
    sampling_error,
    usage,
)
from llmbench.serve.tool_calls import ToolCall, ToolCallParser

if TYPE_CHECKING:  # the engine (and torch) load only when a server is built
    from llmbench.engine.client import EngineClient
    from llmbench.engine.records import RequestOutput
    from llmbench.engine.tokenizer import Tokenizer as EngineTokenizer


def engine_stopped(failure: BackendFailure) -> ApiError:
    """The reply to a request that comes after (or meets) an engine crash."""
    return ApiError(503, f"{failure}; restart the server", error_type="server_error")


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


# A request body's bound, from the context it must fit: its prompt's JSON is at most
# BODY_BYTES_PER_TOKEN bytes a token (English text is ≈ 4, a token id in a list ≈ 7, a
# \u-escaped character 6, a token of 8 escaped newlines 16), and its other fields (options,
# stop strings, JSON structure) at most BODY_BYTES_BASE. A 4,096-token window: 1.125 MiB, which
# the byte-level tokenizer turns into ids in ≈ 0.7 s (on a worker thread).
BODY_BYTES_PER_TOKEN = 32
BODY_BYTES_BASE = 2**20


def max_body_bytes(max_model_len: int) -> int:
    """Formula: BODY_BYTES_BASE + BODY_BYTES_PER_TOKEN * max_model_len."""
    return BODY_BYTES_BASE + BODY_BYTES_PER_TOKEN * max_model_len


@dataclass(frozen=True)
class Body:
    """What a request body may be: its size and how long it may take to arrive."""

    max_bytes: int
    timeout_s: float


async def read_json_object(request: web.Request, body: Body) -> dict[str, Any]:
    """The body as a JSON object: refused by its Content-Length before a byte is read, bounded
    again while reading (a chunked body), decoded on a worker thread."""
    if request.content_length is not None and request.content_length > body.max_bytes:
        raise _too_large(request.content_length, body)
    # Read the body ourselves: request.json() insists on a JSON Content-Type, curl -d sends none.
    try:
        async with asyncio.timeout(body.timeout_s):
            raw = await request.read()  # the app's client_max_size is body.max_bytes
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(None, body) from None
    except TimeoutError:
        raise ApiError(
            408,
            f"the request body did not arrive within {body.timeout_s:g} s (--body-timeout)",
        ) from None
    return await asyncio.to_thread(decode_json_object, raw)


def served_tokenizer(tokenizer: EngineTokenizer) -> EngineTokenizer:
    """`tokenizer` (the same vocabulary, chat template and BOS policy) for request threads: its
    Hugging Face tokenizer encodes and decodes through the batch calls, which release the GIL.
    The single ones hold it: encoding 1 MB of text stopped every other thread, the event loop
    included, for ≈ 1 s; through `encode_batch` (the same ids) no pause was over 0.04 s. The
    engine keeps its own tokenizer: its detokenizer's short decodes are faster unbatched."""
    return tokenizer.with_hf_tokenizer(_ReleasesTheGil(tokenizer.hf_tokenizer))


class _ReleasesTheGil:
    """A `tokenizers.Tokenizer` whose `encode` and `decode` go through `encode_batch` and
    `decode_batch` (one item); everything else is the tokenizer's own."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self._hf_tokenizer = hf_tokenizer

    def encode(self, text: str, add_special_tokens: bool = True) -> Any:
        [encoding] = self._hf_tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)
        return encoding

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        [text] = self._hf_tokenizer.decode_batch([ids], skip_special_tokens=skip_special_tokens)
        return text

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hf_tokenizer, name)


def _too_large(num_bytes: int | None, body: Body) -> ApiError:
    size = "" if num_bytes is None else f" ({num_bytes} bytes)"
    return ApiError(
        413,
        f"the request body{size} is larger than this server takes: {body.max_bytes} bytes, "
        f"{BODY_BYTES_PER_TOKEN} a token of the context (--max-model-len) plus "
        f"{BODY_BYTES_BASE} for the rest",
    )


class GenerationHandler:
    """The two generation endpoints, over one engine client."""

    def __init__(
        self,
        client: EngineClient,
        tokenizer: Tokenizer,
        limits: Limits,
        metrics: ServeMetrics,
        body: Body,
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.limits = limits
        self.metrics = metrics
        self.body = body

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=True)

    async def _generate(self, request: web.Request, is_chat: bool) -> web.StreamResponse:
        from llmbench.engine.sampling import SamplingParams

        clock = self.metrics.clock(time.perf_counter_ns())
        body = await read_json_object(request, self.body)
        generation = await asyncio.to_thread(
            parse_generation, body, is_chat, self.tokenizer, self.limits
        )
        try:
            params = SamplingParams(**generation.sampling)
        except UserError as e:  # "sampling: <field> must be ..."
            raise sampling_error(e, generation) from e
        if self.client.error is not None:
            raise engine_stopped(self.client.error)
        reply = Reply(is_chat, self.limits.model_name, generation.include_usage)
        outputs = self.client.generate(generation.prompt_ids, params, reply.id)
        # aclosing: leaving early (a client gone, a failed write) aborts the engine request.
        async with contextlib.aclosing(outputs):
            if generation.is_stream:
                return await self._stream(request, reply, generation, outputs, clock)
            return await self._collect(reply, generation, outputs, clock)

    async def _stream(
        self,
        request: web.Request,
        reply: Reply,
        generation: Generation,
        outputs: Any,
        clock: RequestClock,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        parser = _parser(generation)
        try:
            if reply.is_chat:
                await response.write(sse(reply.role_chunk()))
            num_tokens = 0
            async for output in outputs:
                clock.on_output(output)
                num_tokens += len(output.new_token_ids)
                events = _events(parser, output)
                reason = _finish_reason(parser, output)
                for chunk in reply.chunks(events, reason):
                    await response.write(sse(chunk))
            clock.on_finish(output.t_ns)
            if reply.include_usage:
                await response.write(sse(reply.usage_chunk(_usage(output, num_tokens))))
            await response.write(b"data: [DONE]\n\n")
        except BackendFailure as e:
            await response.write(sse(engine_stopped(e).body()))
        except UserError as e:  # the engine refused the request after all
            await response.write(sse(ApiError(400, str(e)).body()))
        except ConnectionResetError:
            pass  # the client hung up; leaving `outputs` aborts the request
        return response

    async def _collect(
        self, reply: Reply, generation: Generation, outputs: Any, clock: RequestClock
    ) -> web.Response:
        texts, num_tokens = [], 0
        parser = _parser(generation)
        events: list[str | ToolCall] = []
        try:
            async for output in outputs:
                clock.on_output(output)
                texts.append(output.new_text)
                num_tokens += len(output.new_token_ids)
                if parser is not None:
                    events += _events(parser, output)
        except BackendFailure as e:
            raise engine_stopped(e) from None
        clock.on_finish(output.t_ns)
        reason = _finish_reason(parser, output)
        if parser is None:
            return web.json_response(
                reply.body("".join(texts), [], reason, _usage(output, num_tokens))
            )
        content = "".join(event for event in events if isinstance(event, str))
        calls = [event for event in events if isinstance(event, ToolCall)]
        return web.json_response(reply.body(content, calls, reason, _usage(output, num_tokens)))


def _parser(generation: Generation) -> ToolCallParser | None:
    return ToolCallParser(generation.max_tool_calls) if generation.parses_tool_calls else None


def _events(parser: ToolCallParser | None, output: RequestOutput) -> list[str | ToolCall]:
    """Content and tool calls of one engine output (the last one also flushes the parser)."""
    if parser is None:
        return [output.new_text]
    events = parser.push(output.new_text)
    if output.finished:
        events += parser.finish()
    return events


def _finish_reason(parser: ToolCallParser | None, output: RequestOutput) -> str | None:
    if not output.finished:
        return None
    if parser is not None and parser.num_calls:
        return "tool_calls"
    return output.finish_reason


def _usage(final: RequestOutput, num_completion_tokens: int) -> dict[str, Any]:
    return usage(final.num_prompt_tokens, num_completion_tokens, final.num_cached_tokens)
