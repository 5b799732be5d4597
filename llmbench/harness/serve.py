"""OpenAI-compatible HTTP server over the built-in engine (`llmbench serve`).

An `EngineLoop` steps the engine on its own thread. Each HTTP request submits to it and reads its
`RequestOutput`s from an `asyncio.Queue`, which the loop's callback fills through
`call_soon_threadsafe`. A streamed reply sends one SSE chunk per engine output (one token per
step per request), so a client sees the engine's own inter-token timing.

Endpoints: `GET /health`, `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`,
`GET /metrics` (Prometheus text). A bad request gets HTTP 400 with OpenAI's error body; a client
that disconnects has its request aborted, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmbench.errors import UserError

if TYPE_CHECKING:  # the engine (and torch) load only when a server is built
    from llmbench.engine.engine import LLMEngine
    from llmbench.engine.loop import EngineLoop
    from llmbench.engine.records import RequestOutput
    from llmbench.engine.sampling import SamplingParams

_RATE_WINDOW_NS = 10 * 10**9  # llmbench_generation_tokens_per_second averages over 10 s
_WATCH_INTERVAL_S = 0.5  # how often the server looks for a crashed engine loop
_SHUTDOWN_TIMEOUT_S = 2.0  # on Ctrl-C, in-flight requests get this long, then are cancelled
_MAX_BODY_BYTES = 32 * 2**20  # aiohttp's 1 MiB default is too small for long RAG prompts
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# torch.Generator.manual_seed accepts [-2**63, 2**64); outside it raises, so refuse it here.
_SEED_RANGE = range(-(2**63), 2**64)
# OpenAI options this server does not implement, each with the one value it accepts besides
# null: a request asking for anything else is refused rather than silently answered without it.
_UNSUPPORTED = {
    "n": 1,
    "best_of": 1,
    "echo": False,
    "logprobs": False,
    "presence_penalty": 0,
    "frequency_penalty": 0,
}


def build_app(engine: LLMEngine, model_name: str) -> web.Application:
    """The aiohttp app: starts an `EngineLoop` over `engine` on startup, stops it on cleanup.

    The engine must not be stepped by anyone else while the app runs.
    """
    server = _Server(engine, model_name)
    app = web.Application(middlewares=[_errors_as_json], client_max_size=_MAX_BODY_BYTES)
    app.cleanup_ctx.append(server.engine_running)
    app.router.add_get("/health", server.health)
    app.router.add_get("/metrics", server.metrics)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_post("/v1/chat/completions", server.chat_completions)
    return app


def run_server(
    engine: LLMEngine,
    model_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve `engine` as `model_name` until SIGINT/SIGTERM (or until `stop` is set).

    `port=0` picks a free port. Once listening, `on_ready(port)` gets the bound port; without
    it, a line with the URL is printed. Signals are caught only when called on the main thread;
    elsewhere (tests, embedding) pass `stop` to shut the server down.
    """
    asyncio.run(_serve(build_app(engine, model_name), host, port, on_ready, stop))


async def _serve(
    app: web.Application,
    host: str,
    port: int,
    on_ready: Callable[[int], None] | None,
    stop: threading.Event | None,
) -> None:
    # handler_cancellation: a client that hangs up cancels its handler, which aborts the request.
    runner = web.AppRunner(
        app, handler_cancellation=True, shutdown_timeout=_SHUTDOWN_TIMEOUT_S, access_log=None
    )
    await runner.setup()
    try:
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as e:
            raise UserError(
                f"serve: cannot listen on {host}:{port}: {e.strerror or e}; pick another --port "
                "or stop what is using it"
            ) from e
        bound_port = runner.addresses[0][1]
        if on_ready is not None:
            on_ready(bound_port)
        else:
            url_host = f"[{host}]" if ":" in host else host
            print(f"llmbench serve: listening on http://{url_host}:{bound_port}/v1", flush=True)
        await _wait_for_shutdown(stop)
    finally:
        await runner.cleanup()


async def _wait_for_shutdown(stop: threading.Event | None) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    signals = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stopping.set)
            signals.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, Windows
            pass
    try:
        while not stopping.is_set() and not (stop is not None and stop.is_set()):
            # A threading.Event cannot wake the event loop, so it is polled (10 Hz is plenty).
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), None if stop is None else 0.1)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


# -- errors -----------------------------------------------------------------------------------


class _ApiError(Exception):
    """A refused request; becomes OpenAI's error body with this status."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        error_type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.param = param
        self.error_type = error_type
        self.code = code

    def response(self) -> web.Response:
        error = {"message": str(self), "type": self.error_type, "param": self.param}
        return web.json_response({"error": {**error, "code": self.code}}, status=self.status)


class _EngineStopped(Exception):
    """The engine loop crashed while a request was waiting for it."""


@web.middleware
async def _errors_as_json(
    request: web.Request, handler: Callable[[web.Request], Any]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except _ApiError as e:
        return e.response()
    except UserError as e:  # from the tokenizer or engine: the message is for the client
        return _ApiError(400, str(e)).response()
    except web.HTTPException as e:  # unknown route, wrong method, body too large
        if e.status < 400:
            raise
        message = e.reason
        if e.status == 404:
            message = f"Invalid URL ({request.method} {request.path})"
        elif e.status == 405:
            message = f"method {request.method} is not allowed on {request.path}"
        return _ApiError(e.status, message).response()


# -- request parsing --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Generation:
    """A parsed /v1/completions or /v1/chat/completions request."""

    prompt_ids: list[int]
    params: SamplingParams
    is_stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk carries the usage


async def _json_object(request: web.Request) -> dict[str, Any]:
    # Read the body ourselves: request.json() insists on a JSON Content-Type, curl -d sends none.
    try:
        body = json.loads(await request.read())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _ApiError(400, f"the request body is not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise _ApiError(400, "the request body must be a JSON object")
    return body


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _message_list(value: object) -> list[dict[str, str]]:
    """Chat messages as {"role", "content"} strings; text content parts are joined."""
    if not isinstance(value, list) or not value:
        raise _ApiError(400, "'messages' must be a non-empty list of messages", "messages")
    messages = []
    for i, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise _ApiError(
                400, f"messages[{i}] must be an object with a string 'role'", "messages"
            )
        content = message.get("content")
        if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
            if not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
                raise _ApiError(
                    400, f"messages[{i}].content: only text parts are supported", "messages"
                )
            content = "".join(part["text"] for part in content)
        if not isinstance(content, str):
            raise _ApiError(
                400, f"messages[{i}].content must be a string or a list of text parts", "messages"
            )
        messages.append({"role": message["role"], "content": content})
    return messages


class _Server:
    """The handlers and the state they share: the engine loop and one queue per request."""

    def __init__(self, engine: LLMEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name
        self.created = int(time.time())
        self._engine_loop: EngineLoop | None = None
        # request id -> its outputs; an entry leaves when its final output arrives, so one still
        # here after the handler is done belongs to a request the engine must abort.
        self._queues: dict[str, asyncio.Queue[RequestOutput | None]] = {}
        self.num_prompt_tokens = 0  # of accepted requests
        self.num_generation_tokens = 0
        self.generation_rate = RecentTokenRate(_RATE_WINDOW_NS, time.perf_counter_ns())

    # -- engine loop ------------------------------------------------------------------------

    async def engine_running(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp cleanup context: the engine loop runs while the app does."""
        from llmbench.engine.loop import EngineLoop

        event_loop = asyncio.get_running_loop()

        def forward(output: RequestOutput) -> None:  # on the engine thread
            with contextlib.suppress(RuntimeError):  # the event loop closed: shutting down
                event_loop.call_soon_threadsafe(self._deliver, output)

        self._engine_loop = EngineLoop(self.engine, forward).start()
        watcher = asyncio.create_task(self._watch_engine(self._engine_loop))
        yield
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await asyncio.to_thread(self._engine_loop.stop)  # joins the thread: after its step

    def _deliver(self, output: RequestOutput) -> None:
        """Count an output and hand it to its request's queue (on the event loop)."""
        num_tokens = len(output.new_token_ids)
        self.num_generation_tokens += num_tokens
        self.generation_rate.add(output.t_ns, num_tokens)
        queue = self._queues.get(output.request_id)
        if queue is None:
            return  # its client is gone
        if output.finished:
            del self._queues[output.request_id]
        queue.put_nowait(output)

    async def _watch_engine(self, engine_loop: EngineLoop) -> None:
        """If the engine thread dies, end every waiting request instead of leaving it hanging."""
        while engine_loop.error is None:
            await asyncio.sleep(_WATCH_INTERVAL_S)
        for queue in self._queues.values():
            queue.put_nowait(None)
        self._queues.clear()

    def _engine_error(self) -> _ApiError | None:
        error = self._engine_loop.error if self._engine_loop is not None else None
        if error is None:
            return None
        return _ApiError(
            503,
            f"the engine stopped: {type(error).__name__}: {error}; restart the server",
            error_type="server_error",
        )

    def _submit(self, request_id: str, generation: _Generation, prompt_param: str) -> asyncio.Queue:
        assert self._engine_loop is not None, "the app has not started"
        error = self._engine_error()
        if error is not None:
            raise error
        queue: asyncio.Queue[RequestOutput | None] = asyncio.Queue()
        self._queues[request_id] = queue  # before submitting: outputs may come at once
        try:
            self._engine_loop.submit(generation.prompt_ids, generation.params, request_id)
        except UserError as e:  # prompt too long for the context or the KV cache
            del self._queues[request_id]
            raise _ApiError(400, str(e), prompt_param) from e
        self.num_prompt_tokens += len(generation.prompt_ids)
        return queue

    def _release(self, request_id: str) -> None:
        """The handler is done: abort the request unless the engine finished it."""
        if self._queues.pop(request_id, None) is not None and self._engine_loop is not None:
            self._engine_loop.abort(request_id)

    # -- parsing ----------------------------------------------------------------------------

    def _parse(self, body: dict[str, Any], is_chat: bool) -> _Generation:
        from llmbench.engine.sampling import SamplingParams

        model = body.get("model")
        if model is not None and model != self.model_name:
            raise _ApiError(
                404,
                f"The model `{model}` does not exist; this server serves `{self.model_name}`",
                "model",
                code="model_not_found",
            )
        for name, accepted in _UNSUPPORTED.items():
            if body.get(name) not in (None, accepted):
                raise _ApiError(
                    400, f"'{name}' is not supported by llmbench serve (only {accepted})", name
                )
        if is_chat:
            prompt_ids = self.engine.tokenizer.encode_chat(_message_list(body.get("messages")))
            if not prompt_ids:
                raise _ApiError(400, "the chat prompt has no tokens", "messages")
        else:
            prompt_ids = self._prompt_ids(body.get("prompt"))

        # max_completion_tokens is OpenAI's newer name for max_tokens; it wins when both are set.
        is_new_name = body.get("max_completion_tokens") is not None
        max_tokens_name = "max_completion_tokens" if is_new_name else "max_tokens"
        max_tokens = body.get(max_tokens_name)
        if max_tokens is None:
            max_tokens = self._default_max_tokens(len(prompt_ids), is_chat)
        stop = body.get("stop")
        if stop is not None and not isinstance(stop, str):
            if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
                raise _ApiError(400, "'stop' must be a string or a list of strings", "stop")
        seed = body.get("seed")
        if _is_int(seed) and seed not in _SEED_RANGE:
            raise _ApiError(400, f"'seed' must be in [-2**63, 2**64), got {seed}", "seed")
        top_k = body.get("top_k")
        sampling: dict[str, Any] = {
            "max_tokens": max_tokens,
            "stop": () if stop is None else stop,
            "top_k": 0 if top_k == -1 else top_k,  # vLLM spells "off" -1
        }
        for name in ("temperature", "top_p", "min_p", "seed", "ignore_eos"):
            sampling[name] = body.get(name)
        try:
            params = SamplingParams(**{k: v for k, v in sampling.items() if v is not None})
        except UserError as e:  # "sampling: <field> must be ..."
            field = str(e).removeprefix("sampling: ").split(" ", 1)[0]
            param = field if field in sampling else None
            if param == "max_tokens":
                param = max_tokens_name
            raise _ApiError(400, str(e), param) from e

        is_stream = body.get("stream", False)
        if not isinstance(is_stream, bool):
            raise _ApiError(400, f"'stream' must be true or false, got {is_stream!r}", "stream")
        options = body.get("stream_options") or {}
        include_usage = options.get("include_usage", False) if isinstance(options, dict) else None
        if not isinstance(include_usage, bool):
            raise _ApiError(
                400,
                "'stream_options' must be an object like {\"include_usage\": true}",
                "stream_options",
            )
        return _Generation(prompt_ids, params, is_stream, include_usage)

    def _prompt_ids(self, prompt: object) -> list[int]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # OpenAI's batch form, with one prompt
        if isinstance(prompt, str):
            ids = self.engine.tokenizer.encode(prompt)
        elif isinstance(prompt, list) and all(_is_int(t) for t in prompt):
            ids = list(prompt)
            vocab_size = self.engine.model_config.vocab_size
            outside = [t for t in ids if not 0 <= t < vocab_size]
            if outside:
                raise _ApiError(
                    400,
                    f"'prompt' token id {outside[0]} is outside the vocabulary [0, {vocab_size})",
                    "prompt",
                )
        else:
            raise _ApiError(
                400,
                "'prompt' must be a string or a list of token ids (one prompt per request)",
                "prompt",
            )
        if not ids:
            raise _ApiError(400, "'prompt' is empty", "prompt")
        return ids

    def _default_max_tokens(self, num_prompt_tokens: int, is_chat: bool) -> int:
        if not is_chat:
            return _COMPLETIONS_DEFAULT_MAX_TOKENS
        # Chat (as in vLLM): whatever room the context and the whole KV cache leave.
        engine = self.engine
        capacity = min(
            engine.model_config.max_position_embeddings,
            engine.blocks.num_blocks * engine.config.block_size,
        )
        return max(1, capacity - num_prompt_tokens)  # too long: add_request says so

    # -- handlers ---------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        error = self._engine_error()
        return error.response() if error is not None else web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        model = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "llmbench",
            "max_model_len": self.engine.model_config.max_position_embeddings,
        }
        return web.json_response({"object": "list", "data": [model]})

    async def metrics(self, request: web.Request) -> web.Response:
        engine = self.engine
        # Plain reads of lengths and ints the step thread updates: each is atomic under the
        # GIL, and a scrape a step out of date is fine.
        samples = [
            _metric("num_requests_running", "gauge", "Requests in the running batch.",
                    len(engine.scheduler.running)),
            _metric("num_requests_waiting", "gauge", "Requests queued for admission.",
                    len(engine.scheduler.waiting)),
            _metric("kv_cache_usage_ratio", "gauge", "KV blocks in use / KV blocks in all.",
                    engine.blocks.num_used_blocks / engine.blocks.num_blocks),
            _metric("prefix_cache_hit_rate", "gauge",
                    "Prompt tokens served from the prefix cache / prompt tokens admitted.",
                    engine.prefix_cache_hit_rate),
            _metric("generation_tokens_total", "counter", "Tokens generated.",
                    self.num_generation_tokens),
            _metric("prompt_tokens_total", "counter", "Prompt tokens of accepted requests.",
                    self.num_prompt_tokens),
            _metric("generation_tokens_per_second", "gauge",
                    "Tokens generated per second over the last 10 s.",
                    self.generation_rate.per_s(time.perf_counter_ns())),
        ]  # fmt: skip
        return web.Response(
            body="".join(samples).encode(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=True)

    async def _generate(self, request: web.Request, is_chat: bool) -> web.StreamResponse:
        generation = self._parse(await _json_object(request), is_chat)
        reply = _Reply(is_chat, self.model_name, generation.include_usage)
        queue = self._submit(reply.id, generation, "messages" if is_chat else "prompt")
        try:
            if generation.is_stream:
                return await self._stream(request, reply, queue)
            return await self._collect(reply, queue)
        finally:  # also on cancellation, when the client hangs up
            self._release(reply.id)

    @staticmethod
    async def _next_output(queue: asyncio.Queue[RequestOutput | None]) -> RequestOutput:
        output = await queue.get()
        if output is None:
            raise _EngineStopped
        return output

    async def _stream(
        self, request: web.Request, reply: _Reply, queue: asyncio.Queue
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            if reply.is_chat:
                await response.write(_sse(reply.chunk("", None, role=True)))
            num_tokens = 0
            while True:
                output = await self._next_output(queue)
                num_tokens += len(output.new_token_ids)
                # "" while a split character or a possible stop string is held back
                if output.new_text or output.finished:
                    await response.write(_sse(reply.chunk(output.new_text, output.finish_reason)))
                if output.finished:
                    break
            if reply.include_usage:
                await response.write(_sse(reply.usage_chunk(_usage(output, num_tokens))))
            await response.write(b"data: [DONE]\n\n")
        except _EngineStopped:
            error = self._engine_error()
            assert error is not None
            body = {"message": str(error), "type": error.error_type, "param": None, "code": None}
            await response.write(_sse({"error": body}))
        except ConnectionResetError:
            pass  # the client hung up; _release aborts the request
        return response

    async def _collect(self, reply: _Reply, queue: asyncio.Queue) -> web.Response:
        texts, num_tokens = [], 0
        while True:
            try:
                output = await self._next_output(queue)
            except _EngineStopped:
                error = self._engine_error()
                assert error is not None
                raise error from None
            texts.append(output.new_text)
            num_tokens += len(output.new_token_ids)
            if output.finished:
                break
        usage = _usage(output, num_tokens)
        return web.json_response(reply.body("".join(texts), output.finish_reason, usage))


# -- response bodies --------------------------------------------------------------------------


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _usage(final: RequestOutput, num_completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": final.num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": final.num_prompt_tokens + num_completion_tokens,
        "prompt_tokens_details": {"cached_tokens": final.num_cached_tokens},
    }


class _Reply:
    """OpenAI's response and chunk bodies for one request (chat or text completion)."""

    def __init__(self, is_chat: bool, model_name: str, include_usage: bool) -> None:
        self.is_chat = is_chat
        self.id = f"{'chatcmpl' if is_chat else 'cmpl'}-{uuid.uuid4().hex}"  # also the engine's
        self.model_name = model_name
        self.include_usage = include_usage
        self.created = int(time.time())

    def _envelope(self, object_name: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model_name,
        }

    def chunk(self, text: str, finish_reason: str | None, role: bool = False) -> dict[str, Any]:
        if self.is_chat:
            delta: dict[str, str] = {"role": "assistant", "content": ""} if role else {}
            if text:
                delta["content"] = text
            choice = {"index": 0, "delta": delta}
            body = self._envelope("chat.completion.chunk")
        else:
            choice = {"index": 0, "text": text}
            body = self._envelope("text_completion")
        choice.update(logprobs=None, finish_reason=finish_reason)
        body["choices"] = [choice]
        if self.include_usage:  # OpenAI: every chunk has "usage", null but in the last
            body["usage"] = None
        return body

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        body = self._envelope("chat.completion.chunk" if self.is_chat else "text_completion")
        return {**body, "choices": [], "usage": usage}

    def body(self, text: str, finish_reason: str | None, usage: dict[str, Any]) -> dict[str, Any]:
        if self.is_chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
            }
            body = self._envelope("chat.completion")
        else:
            choice = {"index": 0, "text": text}
            body = self._envelope("text_completion")
        choice.update(logprobs=None, finish_reason=finish_reason)
        return {**body, "choices": [choice], "usage": usage}


# -- metrics ----------------------------------------------------------------------------------


def _metric(name: str, kind: str, description: str, value: float) -> str:
    """One metric in Prometheus' text format (version 0.0.4)."""
    name = f"llmbench_{name}"
    return f"# HELP {name} {description}\n# TYPE {name} {kind}\n{name} {value}\n"


class RecentTokenRate:
    """Tokens per second over a sliding window of the most recent `window_ns`."""

    def __init__(self, window_ns: int, start_ns: int) -> None:
        self.window_ns = window_ns
        self.start_ns = start_ns
        self._events: collections.deque[tuple[int, int]] = collections.deque()  # (t_ns, tokens)
        self._num_tokens = 0  # sum over _events

    def add(self, t_ns: int, num_tokens: int) -> None:
        if num_tokens:
            self._events.append((t_ns, num_tokens))
            self._num_tokens += num_tokens
        self._drop_before(t_ns - self.window_ns)

    def per_s(self, now_ns: int) -> float:
        """Formula: tokens with t_ns > now_ns - W / (W / 1e9), W = min(window_ns, now_ns -
        start_ns), so a server younger than the window is not under-reported."""
        self._drop_before(now_ns - self.window_ns)
        window_ns = min(self.window_ns, now_ns - self.start_ns)
        return self._num_tokens * 1e9 / window_ns if window_ns > 0 else 0.0

    def _drop_before(self, t_ns: int) -> None:
        while self._events and self._events[0][0] <= t_ns:
            self._num_tokens -= self._events.popleft()[1]
