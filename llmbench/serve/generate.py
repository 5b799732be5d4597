"""One /v1/completions or /v1/chat/completions request through the engine client: streamed as
SSE or collected into one reply, tool calls parsed out of the text, latencies observed.

A streamed reply sends one SSE chunk per engine output (one token per step per request), so a
client sees the engine's own inter-token timing; text that may be the start of a `<tool_call>`
tag is held back until it is known not to be. A client that disconnects has its request
aborted, which frees its KV blocks. If the engine dies, an open stream ends with an error
event at once, and a request waiting for its whole reply gets a 503.
"""

from __future__ import annotations

import contextlib
import json
import time
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
    parse_generation,
    sampling_error,
    usage,
)
from llmbench.serve.tool_calls import ToolCall, ToolCallParser

if TYPE_CHECKING:  # the engine (and torch) load only when a server is built
    from llmbench.engine.client import EngineClient
    from llmbench.engine.records import RequestOutput


def engine_stopped(failure: BackendFailure) -> ApiError:
    """The reply to a request that comes after (or meets) an engine crash."""
    return ApiError(503, f"{failure}; restart the server", error_type="server_error")


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


async def read_json_object(request: web.Request) -> dict[str, Any]:
    # Read the body ourselves: request.json() insists on a JSON Content-Type, curl -d sends none.
    try:
        body = json.loads(await request.read())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ApiError(400, f"the request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


class GenerationHandler:
    """The two generation endpoints, over one engine client."""

    def __init__(
        self, client: EngineClient, tokenizer: Tokenizer, limits: Limits, metrics: ServeMetrics
    ) -> None:
        self.client = client
        self.tokenizer = tokenizer
        self.limits = limits
        self.metrics = metrics

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=True)

    async def _generate(self, request: web.Request, is_chat: bool) -> web.StreamResponse:
        from llmbench.engine.sampling import SamplingParams

        clock = self.metrics.clock(time.perf_counter_ns())
        generation = parse_generation(
            await read_json_object(request), is_chat, self.tokenizer, self.limits
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
