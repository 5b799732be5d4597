"""A backend that streams from any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, ...).

The network loop is thin: every read is stamped with the `time.perf_counter_ns()` at which its
bytes began to arrive, taken by the connection as they came in (`arrival`), then `StreamParser`
(pure, no I/O, unit-tested byte by byte) turns the Server-Sent Events into `StreamEvent`s and
says, at the end, whether the reply is complete. Per chunk that is one `bytes.split`, one
stdlib JSON decode and a few dict lookups (plus the client tokenizer on a short tail of the
text): one asyncio process follows ~30,000 chunks/s on one core (2,000 streams at once
measured), all of it in aiohttp and the parser.

Nothing is sent that a server could refuse unless asked for: no request-id header by default
(llama-cpp-python's server answers 400 to an `X-Request-Id` that is not a UUID), `backend.headers`
on every request, `backend.request_id_header` for a fresh UUID4 per request.

What the server says of its model (`GET /models`: its id; its dtype and weight quantization where
it says them, as `llmbench serve` does) is a `ServedModel`: the estimated roofline costs the
server's bytes with it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from llmbench.harness.backends import arrival
from llmbench.harness.backends.openai_stream import (
    StreamError,
    StreamParser,
    clip,
    num_tokens_text,
)
from llmbench.harness.records import GenerationRequest, StreamEvent

_DRAIN_AFTER_DONE_S = 1.0  # wait this long for the end of the HTTP body after `data: [DONE]`
_MODELS_TIMEOUT_S = 10.0  # GET /models answers at once on a live server
_RESET_TIMEOUT_S = 30.0  # a reset waits for the server's step under way
# Where servers empty their prefix cache (POST, at the root beside /v1): vLLM (served with
# VLLM_SERVER_DEV_MODE=1) and llmbench serve, then SGLang.
RESET_PATHS = ("/reset_prefix_cache", "/flush_cache")


class BackendError(Exception):
    """A request (or the connection to the server) failed; the message is a one-line reason."""


class UnreachableError(BackendError):
    """The server could not be reached for a request: the connection was refused or broke
    before any reply. A router skips such an endpoint for a while (`routing.Endpoints.fail`)."""


@dataclass(frozen=True)
class ServedModel:
    """A model as the server's `GET /models` card describes it: its id and, where the server
    says them (`llmbench serve` does; vLLM, SGLang and llama.cpp do not), the dtype it computes
    and stores its weights in and its weight quantization (None: none, or not said)."""

    id: str
    dtype: str | None = None
    quantization: str | None = None
    owned_by: str | None = None  # the server's kind as its card says it: vllm, llmbench, ...


def server_identity(
    served: ServedModel | None, version: str | None, hardware: str | None
) -> str | None:
    """What a remote run ran on, as far as the server says: its kind and version, the served
    model (and its dtype where said), and the hardware the user declared — "llmbench 0.1.0:
    synthetic:tiny (bfloat16)", "vllm 0.6.3: meta-llama/Llama-3.1-8B on h100-sxm". Not its
    address: two instances of one server are one device. None when the server said nothing."""
    if served is None and version is None:
        return None
    kind = (served.owned_by if served else None) or "server"
    text = f"{kind} {version or '(version not said)'}"
    if served is not None:
        text += f": {served.id}" + (f" ({served.dtype})" if served.dtype else "")
    return text + (f" on {hardware}" if hardware else "")


def served_model(listing: object, model: str | None) -> ServedModel | None:
    """The card of `model` (the first card when None) in a `GET /models` reply, or None when it
    lists no such model. A `dtype` or `quantization` that is not a string counts as not said."""
    data = listing.get("data") if isinstance(listing, dict) else None
    cards = [c for c in data if isinstance(c, dict) and "id" in c] if isinstance(data, list) else []
    card = next((c for c in cards if model is None or c["id"] == model), None)
    if card is None:
        return None

    def text(key: str) -> str | None:
        value = card.get(key)
        return value if isinstance(value, str) and value else None

    return ServedModel(str(card["id"]), text("dtype"), text("quantization"), text("owned_by"))


class OpenAIBackend:
    """Streams completions from an OpenAI-compatible server over one pooled aiohttp session.

    `url` is the API base, e.g. `http://127.0.0.1:8000/v1`. `model=None` asks `GET /models` for
    the first model at `start()`. `count_tokens` (text → token count, the client tokenizer)
    splits multi-token chunks; without it each chunk counts as one token. `headers` go with
    every request; `request_id_header` (e.g. "X-Request-Id") names a header that carries a
    fresh UUID4 per request. A request that takes longer than `timeout_s` in all fails.
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
        headers: Mapping[str, str] | None = None,
        request_id_header: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.count_tokens = count_tokens
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.headers = dict(headers or {})
        self.request_id_header = request_id_header
        self.served: ServedModel | None = None  # the model's card, once `start`/`describe` read it
        self.server_version: str | None = None  # its `GET /version`, once `start` read it
        self._session: aiohttp.ClientSession | None = None

    def _session_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    async def start(self) -> None:
        """Open the connection pool; find the served model when none was given."""
        self._session = aiohttp.ClientSession(
            connector=arrival.stamping_connector(self.max_connections),
            headers=self._session_headers(),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
        )
        self.server_version = await self._version(self._session)
        if self.model is not None:
            await self.describe()  # the card, for the server's identity: not required
            return
        try:
            served = served_model(await self._models(self._session), None)
            if served is None:
                raise BackendError("GET /models listed no model")
        except BackendError as e:
            await self.close()
            raise BackendError(f"cannot reach {self.url}: {e}; is the server running?") from None
        self.model, self.served = served.id, served

    def identity(self, hardware: str | None) -> str | None:
        """The server as a device (`server_identity`), once `start` has asked it."""
        return server_identity(self.served, self.server_version, hardware)

    async def describe(self) -> ServedModel | None:
        """What the server says of the model this backend asks for (`model`, else its first):
        None when it cannot be asked or does not list it — `start` is the one that says why.
        Works before `start`, over a connection of its own."""
        if self.served is not None:
            return self.served
        try:
            if self._session is not None:
                listing = await self._models(self._session)
            else:
                async with aiohttp.ClientSession(headers=self._session_headers()) as session:
                    listing = await self._models(session)
        except BackendError:
            return None
        self.served = served_model(listing, self.model)
        return self.served

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[StreamEvent]:
        """POST one streamed completion; yield an event per chunk with output, then one final
        event with `num_tokens == 0` (finish reason, usage, the server's timings).

        Raises `BackendError` on an HTTP error, a failed or dropped connection, a malformed
        stream, a timeout, and, after the final event, on a reply that is not complete: a
        server error in the stream, no output token, no finish reason. Events already yielded
        stay the request's (the driver keeps the tokens a failed request received).
        """
        if self._session is None:
            raise RuntimeError("OpenAIBackend.start() was not called")
        path, body = self._body(request)
        parser = StreamParser(request.use_chat, self.count_tokens, request.max_tokens)
        headers = {self.request_id_header: str(uuid.uuid4())} if self.request_id_header else None
        is_replying = False  # the response headers arrived
        dropped: str | None = None  # why the connection ended early
        t_ns = 0
        try:
            async with self._session.post(self.url + path, json=body, headers=headers) as response:
                is_replying = True
                stamps = arrival.start(response)
                if response.status >= 400:
                    text = await response.text(errors="replace")
                    raise BackendError(f"HTTP {response.status}: {quote_body(text)}")
                content = response.content
                if response.content_type == "application/json":  # the server did not stream
                    data = await content.read()
                    t_ns = arrival.last(stamps)  # the whole reply's arrival
                    for event in parser.feed_response(data, t_ns):
                        yield event
                while not parser.is_done:
                    data = await content.readany()
                    t_ns = arrival.take(stamps)  # when its bytes came in, not when read
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
            raise UnreachableError(f"cannot connect to {self.url}: {e.os_error}") from None
        except StreamError as e:
            raise BackendError(str(e)) from None
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
            if not is_replying:
                reason = f"connection to {self.url} failed before a reply: {clip(str(e))}"
                raise UnreachableError(reason) from None
            dropped = f"connection dropped mid-stream after {num_tokens_text(parser.num_tokens)}"
            t_ns = time.perf_counter_ns()
        try:
            for event in parser.finish(t_ns, is_cut=dropped is not None):
                yield event
        except StreamError as e:
            raise BackendError(str(e)) from None
        failure = dropped or parser.failure()
        if failure is not None:
            raise BackendError(failure)

    async def reset_prefix_cache(self) -> None:
        """Empty the server's prefix cache: POST the first of `RESET_PATHS` it serves. A
        `BackendError` saying why not (it serves neither, refused, or is busy)."""
        if self._session is None:
            raise RuntimeError("OpenAIBackend.start() was not called")
        root = self.url.removesuffix("/v1")
        timeout = aiohttp.ClientTimeout(total=_RESET_TIMEOUT_S)
        for path in RESET_PATHS:
            try:
                async with self._session.post(root + path, timeout=timeout) as response:
                    if response.status in (404, 405):
                        continue  # not this server's path: try the next
                    if response.status >= 400:
                        text = await response.text(errors="replace")
                        raise BackendError(
                            f"POST {root}{path} gave HTTP {response.status}: {quote_body(text)}"
                        )
                    return
            except asyncio.TimeoutError:
                raise BackendError(
                    f"no answer from POST {root}{path} in {_RESET_TIMEOUT_S:g} s"
                ) from None
            except aiohttp.ClientError as e:
                raise BackendError(
                    f"POST {root}{path}: {clip(str(e) or type(e).__name__)}"
                ) from None
        raise BackendError(
            f"{root} serves neither POST {' nor '.join(RESET_PATHS)} (vLLM serves the first with "
            "VLLM_SERVER_DEV_MODE=1, SGLang the second, llmbench serve the first)"
        )

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

    async def _version(self, session: aiohttp.ClientSession) -> str | None:
        """The server's `GET /version` (`{"version": "0.6.3"}` from vLLM, SGLang, llmbench serve;
        at the root, beside /v1), or None where it has none or says nothing readable."""
        root = self.url.removesuffix("/v1")
        try:
            async with session.get(
                root + "/version", timeout=aiohttp.ClientTimeout(total=_MODELS_TIMEOUT_S)
            ) as response:
                if response.status >= 400:
                    return None
                data = await response.json(content_type=None)
        except (asyncio.TimeoutError, aiohttp.ClientError, ValueError):
            return None
        version = data.get("version") if isinstance(data, dict) else None
        return version if isinstance(version, str) and version else None

    async def _models(self, session: aiohttp.ClientSession) -> object:
        """The server's `GET /models` reply, parsed; a `BackendError` saying why not."""
        try:
            async with session.get(
                self.url + "/models", timeout=aiohttp.ClientTimeout(total=_MODELS_TIMEOUT_S)
            ) as response:
                if response.status >= 400:
                    text = await response.text(errors="replace")
                    status = response.status
                    raise BackendError(f"GET /models gave HTTP {status}: {quote_body(text)}")
                return await response.json(content_type=None)
        except asyncio.TimeoutError:
            raise BackendError(f"no answer from GET /models in {_MODELS_TIMEOUT_S:g} s") from None
        except aiohttp.ClientConnectorError as e:
            raise BackendError(str(e.os_error)) from None
        except (aiohttp.ClientError, ValueError) as e:
            raise BackendError(clip(str(e) or type(e).__name__)) from None


def quote_body(text: str) -> str:
    """An HTTP error body for a one-line message: its text, or "(empty body)"."""
    return clip(text) or "(empty body)"
