"""Routes and lifecycle of `llmbench serve`: the aiohttp app over one `EngineClient`, its simple
endpoints, the API-key check, and serving until a signal.

Endpoints: `GET /health`, `GET /metrics` (Prometheus), `GET /version`, `GET /v1/models`,
`GET /v1/models/{id}`, `POST /v1/completions`, `POST /v1/chat/completions`, `POST /tokenize`,
`POST /detokenize` (vLLM's shapes), and `POST /reset_prefix_cache` (vLLM's: empties the prefix
cache while no request runs, 409 while one does; a client starts each measurement cold with it).
Any refused request gets OpenAI's error body. With an API key, every endpoint but /health,
/metrics and /version wants `Authorization: Bearer <key>`.
The model card adds two fields of llmbench's own to vLLM's: `dtype` (what the engine computes
and stores its weights in) and `quantization` (its weight quantization, or null), so that a
client can cost the bytes a step reads (the openai backend's estimated roofline reads them).

Nothing a client sends can hold the server: a request head must arrive within
`--header-timeout`, a body within `--body-timeout` and under a bound derived from the context
(`generate.max_body_bytes`), with the API key checked before it is read; bodies are decoded and
tokenized on worker threads; at most `--max-connections` connections are open
(`connections.py`); and an unexpected error is a 500 with OpenAI's error body, never plain text.

Memory is bounded: nothing grows per request or per step. A request's state (its engine
sequence, its queue in the engine client) goes when it ends or is aborted, and a client that
hangs up aborts it; the engine keeps the last `SERVE_STEP_RECORD_WINDOW` step records (`--record`
streams all of them to disk); the prefix cache holds at most one entry per KV block; /metrics is
bucket counts and a 10 s token-rate window; the KV cache is zeroed, so every page is touched,
at startup. Under load the RSS still rises by ≈ 40 MB before it levels off (measured with
`tests/serve/load.py`: synthetic:tiny, 4 MiB KV cache, 100 concurrent streams, half
cancelled: 256 → 297 MB over the first 10,000 requests), and none of it is a leak:
- ≈ 10 MB of Python object arenas and connection state for the open keep-alive connections,
  and ≈ 8-12 MB that glibc keeps in its free lists (fragmentation: `malloc_trim` returns 3-5
  MB of it), both mostly reached within the first 2,000 requests;
- ≈ 14.5 MB, 1.5 MB per 1,000 requests, for the first 10,000: the `tokenizers` BPE word cache.
  It keeps each word (under 256 characters) it has split, up to 10,000 words. The byte-level
  tokenizer of synthetic models splits no text into words, so each short prompt is one entry;
  a real vocabulary caches real words, which prompts share.
After that RSS is flat: +0.015 MB per 1,000 requests from 12,000 to 62,000 (within a 3.2 MB
band; any 10,000 of them fit a slope within ±0.16 MB per 1,000, the noise of the allocator).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import json
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

import llmbench
from llmbench.errors import UserError
from llmbench.serve.connections import HTTP_LOG, ConnectionCap, check_open_files
from llmbench.serve.generate import (
    Body,
    GenerationHandler,
    engine_stopped,
    max_body_bytes,
    read_json_object,
    served_tokenizer,
)
from llmbench.serve.limits import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
)
from llmbench.serve.metrics import CONTENT_TYPE, ServeMetrics
from llmbench.serve.protocol import (
    ApiError,
    Limits,
    check_model,
    check_token_ids,
    is_int,
    model_not_found,
    parse_messages,
    parse_tools,
)
from llmbench.serve.recorder import StepRecorder

if TYPE_CHECKING:  # the engine (and torch) load only when a server is built
    from llmbench.engine.client import EngineClient
    from llmbench.engine.engine import LLMEngine

_SHUTDOWN_TIMEOUT_S = 2.0  # on Ctrl-C, in-flight requests get this long, then are cancelled
# After a reply that left the body unread (a 401, 408 or 413), the rest of the body is read and
# dropped for at most this long, so that the client reads the reply instead of a reset.
_LINGER_S = 2.0
_OPEN_PATHS = ("/health", "/metrics", "/version")  # no API key needed, as in vLLM
SERVE_STEP_RECORD_WINDOW = 256  # ≈ 1 KB a step at a batch of 64: ≈ 0.25 MB


@dataclass(frozen=True)
class ServeConfig:
    """What `llmbench serve`'s flags set beyond the engine."""

    served_model_name: str  # the `model` clients must send
    api_key: str | None = None  # None: no Authorization check
    max_model_len: int | None = None  # None: the model's context window
    record_dir: Path | None = None  # stream every engine step to record_dir/steps.jsonl
    vllm_metrics: bool = False  # /metrics also under vLLM's `vllm:` names
    # A request head must arrive within this of the connection opening (or of the last reply
    # on a kept-alive connection), else the connection is closed; idle connections too.
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S  # a body must arrive within this: else 408
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # more are answered 503 and closed


def limits_of(engine: LLMEngine, config: ServeConfig) -> Limits:
    """The served model's limits; a --max-model-len beyond the model's window is a UserError."""
    model_len = engine.model_config.max_position_embeddings
    max_model_len = config.max_model_len or model_len
    if not 1 <= max_model_len <= model_len:
        raise UserError(
            f"serve: --max-model-len {max_model_len} is outside [1, {model_len}], the model's "
            "context window; lower it"
        )
    return Limits(
        model_name=config.served_model_name,
        vocab_size=engine.model_config.vocab_size,
        max_model_len=max_model_len,
        kv_cache_tokens=engine.blocks.num_blocks * engine.config.block_size,
        block_size=engine.config.block_size,
    )


def build_app(engine: LLMEngine, config: ServeConfig) -> web.Application:
    """The aiohttp app: starts an `EngineClient` over `engine` on startup, stops it on cleanup.

    The engine must not be stepped by anyone else while the app runs. A bad `config` (a
    --max-model-len too long, a --record folder that cannot be written) is a `UserError` here,
    before anything listens.
    """
    server = _Server(engine, config)
    # The API key is checked (a middleware) before any handler reads the body.
    app = web.Application(
        middlewares=[_errors_as_json, server.check_api_key], client_max_size=server.body.max_bytes
    )
    app.cleanup_ctx.append(server.engine_running)
    app.router.add_get("/health", server.health)
    app.router.add_get("/metrics", server.metrics_text)
    app.router.add_get("/version", server.version)
    app.router.add_get("/v1/models", server.models)
    app.router.add_get("/v1/models/{model_id:.+}", server.model)
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_post("/v1/chat/completions", server.chat_completions)
    app.router.add_post("/tokenize", server.tokenize)
    app.router.add_post("/detokenize", server.detokenize)
    app.router.add_post("/reset_prefix_cache", server.reset_prefix_cache)
    return app


def run_server(
    engine: LLMEngine,
    config: ServeConfig,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve `engine` until SIGINT/SIGTERM (or until `stop` is set).

    `port=0` picks a free port. Once listening, `on_ready(port)` gets the bound port; without
    it, a line with the URL is printed. Signals are caught only when called on the main thread;
    elsewhere (tests, embedding) pass `stop` to shut the server down.
    """
    check_open_files(config.max_connections)
    app = build_app(engine, config)
    asyncio.run(_serve(app, config, host, port, on_ready, stop))


async def _serve(
    app: web.Application,
    config: ServeConfig,
    host: str,
    port: int,
    on_ready: Callable[[int], None] | None,
    stop: threading.Event | None,
) -> None:
    # handler_cancellation: a client that hangs up cancels its handler, which aborts the request.
    # keepalive_timeout: aiohttp closes a connection that has waited this long for a whole
    # request head (since it opened, or since its last reply): the header timeout.
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        shutdown_timeout=_SHUTDOWN_TIMEOUT_S,
        access_log=None,
        logger=HTTP_LOG,  # a malformed request: one line, not a traceback
        keepalive_timeout=config.header_timeout_s,
        lingering_time=_LINGER_S,
    )
    await runner.setup()
    listener = None
    try:
        assert runner.server is not None
        cap = ConnectionCap(runner.server, config.max_connections)
        try:  # listening ourselves (not web.TCPSite): every connection passes the cap
            listener = await asyncio.get_running_loop().create_server(cap, host, port)
        except OSError as e:
            raise UserError(
                f"serve: cannot listen on {host}:{port}: {e.strerror or e}; pick another --port "
                "or stop what is using it"
            ) from e
        bound_port = listener.sockets[0].getsockname()[1]
        if on_ready is not None:
            on_ready(bound_port)
        else:
            url_host = f"[{host}]" if ":" in host else host
            print(f"llmbench serve: listening on http://{url_host}:{bound_port}/v1", flush=True)
        await _wait_for_shutdown(stop)
    finally:
        if listener is not None:
            listener.close()  # no new connections; runner.cleanup closes the open ones
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


@web.middleware
async def _errors_as_json(
    request: web.Request, handler: Callable[[web.Request], Any]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as e:
        return _error_response(e)
    except UserError as e:  # from the tokenizer or engine: the message is for the client
        return _error_response(ApiError(400, str(e)))
    except web.HTTPException as e:  # unknown route, wrong method, body too large
        if e.status < 400:
            raise
        message = e.reason
        if e.status == 404:
            message = f"Invalid URL ({request.method} {request.path})"
        elif e.status == 405:
            message = f"method {request.method} is not allowed on {request.path}"
        return _error_response(ApiError(e.status, message))
    except ConnectionError:
        raise  # the client is gone: nobody to answer
    except Exception as e:  # a bug: still OpenAI's error body, and one line for the operator
        name = f"{type(e).__name__}: {e}"
        print(f"llmbench serve: {request.method} {request.path} failed: {name}", file=sys.stderr)
        return _error_response(
            ApiError(500, f"internal server error: {name}", error_type="server_error")
        )


def _error_response(error: ApiError) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
    response = web.json_response(error.body(), status=error.status, headers=headers)
    if error.status == 408:  # the body is still trickling in: no next request on this one
        response.force_close()
    return response


class _Server:
    """The handlers and the state they share: the engine client, limits, metrics, recorder."""

    def __init__(self, engine: LLMEngine, config: ServeConfig) -> None:
        self.engine = engine
        self.config = config
        self.limits = limits_of(engine, config)
        self.created = int(time.time())
        self.body = Body(max_body_bytes(self.limits.max_model_len), config.body_timeout_s)
        self.recorder = StepRecorder(config.record_dir) if config.record_dir else None
        self.tokenizer = served_tokenizer(engine.tokenizer)  # for request threads
        self.metrics = ServeMetrics(
            engine, config.served_model_name, config.vllm_metrics, self.recorder
        )
        self.client: EngineClient | None = None
        self.generation: GenerationHandler | None = None

    # -- engine client ----------------------------------------------------------------------

    async def engine_running(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp cleanup context: the engine client runs while the app does."""
        from llmbench.engine.client import EngineClient

        self.client = EngineClient(self.engine, on_output=self.metrics.count_output)
        self.generation = GenerationHandler(
            self.client, self.tokenizer, self.limits, self.metrics, self.body
        )
        if self.recorder is not None:
            self.engine.on_step = self.recorder.on_step
        # The server reads no step records (its metrics come from outputs, --record streams
        # every step), so the engine keeps only a short window of them.
        self.engine.step_records = collections.deque(
            self.engine.step_records, maxlen=SERVE_STEP_RECORD_WINDOW
        )
        await self.client.start()
        try:
            yield
        finally:
            await self.client.close()  # joins the engine thread: after its step
            if self.recorder is not None:
                self.engine.on_step = None
                await asyncio.to_thread(self.recorder.close)

    # -- API key ----------------------------------------------------------------------------

    @web.middleware
    async def check_api_key(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        key = self.config.api_key
        if key is None or request.path in _OPEN_PATHS:
            return await handler(request)
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if not header:
            raise ApiError(
                401,
                "You didn't provide an API key. Send it in an Authorization header: "
                "'Authorization: Bearer <key>' (the key the server was started with).",
            )
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip(), key):
            raise ApiError(401, "Incorrect API key provided.", code="invalid_api_key")
        return await handler(request)

    # -- handlers ---------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        assert self.generation is not None, "the app has not started"
        return await self.generation.completions(request)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        assert self.generation is not None, "the app has not started"
        return await self.generation.chat_completions(request)

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        assert self.client is not None, "the app has not started"
        if self.client.error is not None:
            return _error_response(engine_stopped(self.client.error))
        if not await self.client.reset_prefix_cache():
            raise ApiError(
                409,
                "requests are running; reset the prefix cache when the server is idle",
                error_type="conflict_error",
            )
        return web.json_response({"reset": True})

    async def health(self, request: web.Request) -> web.Response:
        if self.client is not None and self.client.error is not None:
            return _error_response(engine_stopped(self.client.error))
        return web.Response(text="ok")

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": llmbench.__version__})

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.config.served_model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "llmbench",
            "root": self.engine.source_description,
            "max_model_len": self.limits.max_model_len,
            "dtype": str(self.engine.dtype).removeprefix("torch."),
            "quantization": None if self.engine.quantize is None else self.engine.quantize.name,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request: web.Request) -> web.Response:
        model_id = request.match_info["model_id"]
        if model_id != self.config.served_model_name:
            raise model_not_found(model_id, self.config.served_model_name)
        return web.json_response(self._model_card())

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: {"prompt": text} or {"messages": [...]} -> the prompt's ids."""
        body = await read_json_object(request, self.body)
        return web.json_response(text=await asyncio.to_thread(self._tokenized, body))

    def _tokenized(self, body: dict[str, Any]) -> str:
        """/tokenize's reply as JSON text (on a worker thread: a long prompt is slow)."""
        check_model(body, self.limits)
        tokenizer = self.tokenizer
        if ("prompt" in body) == ("messages" in body):
            raise ApiError(400, "give either 'prompt' (text) or 'messages' (a chat)", "prompt")
        if "prompt" in body:
            prompt = body["prompt"]
            if not isinstance(prompt, str):
                raise ApiError(400, "'prompt' must be a string", "prompt")
            add_special = _flag(body, "add_special_tokens", default=True)
            tokens = tokenizer.encode(prompt, add_bos=None if add_special else False)
        else:
            messages = parse_messages(body["messages"])
            tools = parse_tools(body.get("tools"), body.get("tool_choice"))
            add_generation_prompt = _flag(body, "add_generation_prompt", default=True)
            tokens = tokenizer.encode_chat(messages, add_generation_prompt, tools=tools)
        reply = {"count": len(tokens), "max_model_len": self.limits.max_model_len, "tokens": tokens}
        return json.dumps(reply)

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's /detokenize: {"tokens": [ids]} -> {"prompt": text}."""
        body = await read_json_object(request, self.body)
        return web.json_response(text=await asyncio.to_thread(self._detokenized, body))

    def _detokenized(self, body: dict[str, Any]) -> str:
        """/detokenize's reply as JSON text (on a worker thread)."""
        check_model(body, self.limits)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(is_int(t) for t in tokens):
            raise ApiError(400, "'tokens' must be a list of token ids", "tokens")
        check_token_ids(tokens, self.tokenizer.vocab_size, "tokens")
        return json.dumps({"prompt": self.tokenizer.decode(tokens)})


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false", name)
    return value
