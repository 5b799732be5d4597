"""A real OpenAI-style streaming server with a known timing, for testing clients against it.

    python -m tests.harness.streaming_server --port 0 --record FILE \\
        [--mode ok|error500|drop|garbage] [--ttft-ms 50] [--tpot-ms 10] [--max-requests N]

Prints its port as stdout's first line, then serves `/v1/models`, `/v1/chat/completions` and
`/v1/completions` (streaming only) on 127.0.0.1. The reply to a request is `max_tokens` words
"w0 ", "w1 ", ... (so `len(text.split())` counts tokens exactly): the first chunk TTFT after the
request arrived, then one chunk every TPOT, except that every 4th chunk carries 3 tokens and comes
3 × TPOT after the one before. Chat replies start with a role-only delta (sent at once, as vLLM
does) that carries no token. The stream ends with a usage chunk (when asked for) and [DONE].

The server's own record is the reference the client is checked against: per request, one JSON
line appended to FILE when the request ends, with `time.perf_counter_ns()` (CLOCK_MONOTONIC, the
same clock in every process on Linux) taken right after each chunk was written and the tokens in
that chunk. The write goes straight to the socket when the transport has nothing buffered (it
never has at these rates), so the stamp is when the bytes reached the kernel.

Faults, for every 3rd request (3, 6, 9, ...): `error500` answers HTTP 500, `drop` closes the
connection after two token chunks, `garbage` sends `data: {not json` after two token chunks.
The server exits after `--max-requests` requests, when its stdin closes, or on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import Any, TextIO

from aiohttp import web

MODEL_ID = "streaming-test-model"
NUM_CHUNKS_BEFORE_FAULT = 2


def chunk_sizes(max_tokens: int) -> list[int]:
    """Tokens per chunk: 1, 1, 1, 3, 1, 1, 1, 3, ... cut to `max_tokens` in all."""
    sizes: list[int] = []
    num_left = max_tokens
    while num_left > 0:
        size = min(3 if len(sizes) % 4 == 3 else 1, num_left)
        sizes.append(size)
        num_left -= size
    return sizes


class StreamingServer:
    def __init__(self, record: TextIO, mode: str, ttft_ms: float, tpot_ms: float, max_requests):
        self.record = record
        self.mode = mode
        self.ttft_ns = int(ttft_ms * 1e6)
        self.tpot_ns = int(tpot_ms * 1e6)
        self.max_requests = max_requests
        self.num_requests = 0
        self.num_ended = 0
        self.stop = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.stream(request, use_chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.stream(request, use_chat=False)

    async def stream(self, request: web.Request, use_chat: bool) -> web.StreamResponse:
        arrival_ns = time.perf_counter_ns()
        self.num_requests += 1
        number = self.num_requests
        fault = self.mode if self.mode != "ok" and number % 3 == 0 else None
        body = await request.json()
        entry: dict[str, Any] = {
            "number": number,
            "request_id": request.headers.get("X-Request-Id"),  # None: the client sent none
            "headers": dict(request.headers),
            "last_message": body["messages"][-1]["content"] if use_chat else body.get("prompt"),
            "path": request.path,
            "fault": fault,
            "peer_port": request.transport.get_extra_info("peername")[1],  # one per connection
            "arrival_ns": arrival_ns,
            "write_ns": [],  # after each chunk with tokens was written
            "tokens": [],  # tokens in that chunk
        }
        try:
            if fault == "error500":
                return web.Response(status=500, text=f"injected failure for request {number}")
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            try:
                await self._stream(request, response, body, use_chat, fault, entry)
            except ConnectionError:  # the client went away (or `drop`): aiohttp lets it be
                entry["disconnected"] = True
            return response
        finally:
            self._end(entry)

    async def _stream(self, request, response, body, use_chat, fault, entry) -> None:
        base = {"id": f"req-{entry['number']}", "model": MODEL_ID, "created": int(time.time())}
        if use_chat:
            base["object"] = "chat.completion.chunk"
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
            await response.write(_sse({**base, "choices": [{**role, "finish_reason": None}]}))
            prompt = " ".join(m.get("content", "") for m in body.get("messages", []))
        else:
            base["object"] = "text_completion"
            await response.write(b": stream opened\n\n")  # an SSE comment, sends the headers
            prompt = body.get("prompt", "")
        sizes = chunk_sizes(int(body.get("max_tokens", 16)))
        target_ns = entry["arrival_ns"] + self.ttft_ns
        num_sent = 0
        for index, size in enumerate(sizes):
            if index > 0:
                target_ns += size * self.tpot_ns
            # Absolute targets: a late chunk does not delay the ones after it. When late (or
            # with --tpot-ms 0) still yield, so that every stream gets its turn.
            await asyncio.sleep(max(0, target_ns - time.perf_counter_ns()) / 1e9)
            if fault in ("drop", "garbage") and index == NUM_CHUNKS_BEFORE_FAULT:
                if fault == "drop":
                    request.transport.close()
                    raise ConnectionResetError("dropped on purpose")
                await response.write(b"data: {not json\n\n")
                return
            text = "".join(f"w{num_sent + i} " for i in range(size))
            finish = "length" if index == len(sizes) - 1 else None
            if use_chat:
                choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            await response.write(_sse({**base, "choices": [choice]}))
            entry["write_ns"].append(time.perf_counter_ns())
            entry["tokens"].append(size)
            num_sent += size
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": len(prompt.split()),
                "completion_tokens": num_sent,
                "total_tokens": len(prompt.split()) + num_sent,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            await response.write(_sse({**base, "choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")

    def _end(self, entry: dict[str, Any]) -> None:
        self.record.write(json.dumps(entry) + "\n")
        self.record.flush()
        self.num_ended += 1
        if self.num_ended >= self.max_requests:
            self.stop.set()


class _StdinWatch(asyncio.Protocol):
    """Sets `stop` when stdin closes: the test that started the server has gone."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop.set()


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


async def serve(args: argparse.Namespace) -> None:
    with open(args.record, "a") as record:
        server = StreamingServer(record, args.mode, args.ttft_ms, args.tpot_ms, args.max_requests)
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", args.port)
        await site.start()
        port = runner.addresses[0][1]
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, server.stop.set)
        try:  # a pipe, a socket or a terminal; a regular file as stdin is not watched
            await loop.connect_read_pipe(lambda: _StdinWatch(server.stop), sys.stdin)
        except ValueError:
            pass
        print(port, flush=True)
        await server.stop.wait()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--record", required=True, help="append one JSON line per request here")
    parser.add_argument("--mode", choices=["ok", "error500", "drop", "garbage"], default="ok")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--tpot-ms", type=float, default=10.0)
    parser.add_argument("--max-requests", type=int, default=10000)
    asyncio.run(serve(parser.parse_args()))


if __name__ == "__main__":
    main()
