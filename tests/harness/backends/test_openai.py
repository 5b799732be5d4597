"""The OpenAI backend's HTTP client against a real streaming server (a subprocess) whose own
record of its writes is the reference for every timestamp; what it sends (headers, body) and
how it fails (HTTP errors, dropped connections, timeouts)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
from aiohttp import web

from llmbench.harness.backends.openai import (
    RESET_PATHS,
    BackendError,
    OpenAIBackend,
    ServedModel,
    served_model,
    server_identity,
)
from llmbench.harness.records import GenerationRequest, RequestRecord

REPO_ROOT = Path(__file__).resolve().parents[3]
P95_ERROR_NS = 2_000_000  # client vs server clock, per TTFT / TPOT / chunk / ITL
MAX_ERROR_NS = 8_000_000  # any one sample: below the 10 ms token gap, so a misaligned chunk fails
NUM_ATTEMPTS = 5
MAX_OTHER_CORES = 0.3  # more than this used by other processes: timing checks are skipped


def count_words(text: str) -> int:
    """The test server's tokens are words, so this is its exact tokenizer."""
    return len(text.split())


@dataclass(frozen=True)
class Server:
    url: str
    record: Path  # the server's own record: a JSON line per request
    pid: int

    def entries(self, num_expected: int) -> dict[str, dict]:
        """The server's record by request id (the last word of the prompt, see
        `make_request`), once `num_expected` requests have ended."""
        deadline = time.monotonic() + 5
        while True:
            lines = self.record.read_text().splitlines() if self.record.exists() else []
            if len(lines) >= num_expected or time.monotonic() > deadline:
                entries = map(json.loads, lines)
                return {entry["last_message"].split()[-1]: entry for entry in entries}
            time.sleep(0.01)


@pytest.fixture
def start_server(tmp_path):
    """Starts `tests.harness.streaming_server` subprocesses; they are stopped at teardown."""
    processes: list[subprocess.Popen] = []

    def start(mode="ok", ttft_ms=50.0, tpot_ms=10.0) -> Server:
        record = tmp_path / f"server-{len(processes)}.jsonl"
        command = [sys.executable, "-m", "tests.harness.streaming_server", "--port", "0"]
        command += ["--record", str(record), "--mode", mode]
        command += ["--ttft-ms", str(ttft_ms), "--tpot-ms", str(tpot_ms)]
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        processes.append(process)
        port = process.stdout.readline().strip()
        assert port.isdigit(), f"the streaming server did not start (exit {process.poll()})"
        return Server(f"http://127.0.0.1:{port}/v1", record, process.pid)

    yield start
    for process in processes:
        process.stdin.close()  # the server exits when its stdin closes
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def make_request(index: int, max_tokens=20, use_chat=True, prefix="req") -> GenerationRequest:
    """A request whose prompt ends with its id: the server's record names it by that."""
    request_id = f"{prefix}-{index}"
    prompt = f"say {max_tokens} words {request_id}"
    return GenerationRequest(
        request_id=request_id,
        messages=({"role": "user", "content": prompt},),
        max_tokens=max_tokens,
        ignore_eos=True,
        use_chat=use_chat,
        prompt_text=prompt,
    )


async def measure(backend: OpenAIBackend, request: GenerationRequest) -> RequestRecord:
    """What the driver does with one request: events → RequestRecord (errors kept, not raised)."""
    now_ns = time.perf_counter_ns()  # just before the POST
    record = RequestRecord(request.request_id, "s0", 0, scheduled_ns=now_ns, sent_ns=now_ns)
    try:
        async for event in backend.generate(request):
            if event.num_tokens:
                record.chunk_ns.append(event.t_ns)
                record.chunk_tokens.append(event.num_tokens)
            record.output_text += event.text
            if event.finish_reason is not None:
                record.finish_reason = event.finish_reason
                record.server_prompt_tokens = event.usage_prompt_tokens
                record.server_completion_tokens = event.usage_completion_tokens
                record.cached_tokens = event.cached_tokens
    except BackendError as e:
        record.error = str(e)
    record.end_ns = time.perf_counter_ns()
    return record


def run_all(server: Server, requests, concurrency: int, **options) -> list[RequestRecord]:
    """Drive `requests`, at most `concurrency` at a time, with the GC hygiene of a measured run:
    the objects that exist before it are frozen, so that a full collection does not scan them
    all (in a process that imported torch that is a 30-40 ms stall of every stream)."""
    gc.collect()
    gc.freeze()
    try:
        return asyncio.run(_run_all(server, requests, concurrency, **options))
    finally:
        gc.unfreeze()


async def _run_all(server: Server, requests, concurrency: int, **options) -> list[RequestRecord]:
    backend = OpenAIBackend(server.url, count_tokens=count_words, **options)
    await backend.start()
    slots = asyncio.Semaphore(concurrency)

    async def one(request):
        async with slots:
            return await measure(backend, request)

    try:
        return await asyncio.gather(*map(one, requests))
    finally:
        await backend.close()


def timing_errors_ns(record: RequestRecord, entry: dict) -> dict[str, list[float]]:
    """|client − server| samples of one request: its TTFT and TPOT, the arrival of every chunk,
    and every gap between chunks (the per-chunk ITL)."""
    client, server = record.chunk_ns, entry["write_ns"]
    num_tokens = sum(entry["tokens"])

    def tpot(times: list[int]) -> float:
        return (times[-1] - times[0]) / (num_tokens - 1)

    def gaps(times: list[int]) -> list[int]:
        return [t1 - t0 for t0, t1 in pairwise(times)]

    return {
        "ttft": [abs((client[0] - record.sent_ns) - (server[0] - record.sent_ns))],
        "tpot": [abs(tpot(client) - tpot(server))],
        "chunk": [abs(c - s) for c, s in zip(client, server, strict=True)],
        "itl": [abs(c - s) for c, s in zip(gaps(client), gaps(server), strict=True)],
    }


def percentile(samples: list[float], q: float) -> float:
    return sorted(samples)[round(q * (len(samples) - 1))]


class OtherLoad:
    """How many cores processes other than this one and `pid` kept busy since it was made
    (Linux /proc; host steal time counts as busy). None where /proc cannot be read."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        tick_s = 1 / os.sysconf("SC_CLK_TCK")
        try:
            cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
            stat = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, ValueError):
            return None
        user, nice, system, _idle, _iowait, irq, softirq, steal = cpu
        busy_s = (user + nice + system + irq + softirq + steal) * tick_s
        ours_s = time.process_time() + (int(stat[11]) + int(stat[12])) * tick_s  # utime + stime
        return time.monotonic(), busy_s, ours_s

    def cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None:
            return None
        (t0, busy0, ours0), (t1, busy1, ours1) = self.start, end
        return max(0.0, (busy1 - busy0) - (ours1 - ours0)) / (t1 - t0)


@pytest.mark.parametrize("concurrency", [1, 64])
def test_client_times_match_the_server_writes(start_server, concurrency):
    """Client timestamps are within 2 ms of the server's writes (p95), at 1 and at 64 streams,
    and no single one is off by a token gap.

    This 2-core machine is shared: while other processes run, a sleeping process is woken late
    now and then (a bare socketpair ping between two processes, 10 ms apart: max 0.3-0.4 ms
    late when quiet, p99 3-9 ms when busy; CI once saw one chunk of 100 at 6.6 ms on a quiet
    machine, in each of 3 attempts). And at 64 streams the client's one event loop is itself
    busy: bytes that come in while it hands on other streams' chunks wait for its next poll
    (a quiet AVX2 EPYC VM, 2026-11-29: chunk p95 0.6-8 ms an attempt, 3 of 10 over 2 ms). So
    the check is on the p95 and the best of 5 attempts, and when other processes kept the
    machine busy, a miss skips instead of failing; `test_arrival` holds the stamping itself to
    a fixed order of events.
    """
    server = start_server(ttft_ms=50, tpot_ms=10)
    num_requests = 5 if concurrency == 1 else concurrency
    other_load = OtherLoad(server.pid)
    for attempt in range(NUM_ATTEMPTS):
        requests = [
            make_request(i, use_chat=i % 2 == 0, prefix=f"try{attempt}")
            for i in range(num_requests)
        ]
        records = run_all(server, requests, concurrency)
        entries = server.entries((attempt + 1) * num_requests)
        if concurrency > 1:  # all in flight together
            assert max(r.sent_ns for r in records) < min(r.chunk_ns[0] for r in records if r.ok)
        errors: dict[str, list[float]] = {"ttft": [], "tpot": [], "chunk": [], "itl": []}
        for record in records:
            assert record.ok, record.error
            entry = entries[record.request_id]
            # Tokens: chunks of 3 count as 3; the client's count agrees with the server's usage.
            assert record.chunk_tokens == entry["tokens"] == [1, 1, 1, 3] * 3 + [1, 1]
            assert record.num_output_tokens == record.server_completion_tokens == 20
            assert record.output_text == "".join(f"w{i} " for i in range(20))
            assert record.finish_reason == "length"
            assert record.server_prompt_tokens == 4
            for name, samples in timing_errors_ns(record, entry).items():
                errors[name] += samples
        summary = " ".join(
            f"{name} p50 {percentile(samples, 0.5) / 1e6:.3f} "
            f"p95 {percentile(samples, 0.95) / 1e6:.3f} max {max(samples) / 1e6:.3f}"
            for name, samples in errors.items()
        )
        print(f"\n{concurrency} streams, |client - server| in ms: {summary}")
        if all(
            percentile(samples, 0.95) < P95_ERROR_NS and max(samples) < MAX_ERROR_NS
            for samples in errors.values()
        ):
            return
    cores = other_load.cores()
    if cores is not None and cores > MAX_OTHER_CORES:
        pytest.skip(f"machine busy: other processes kept {cores:.1f} cores busy; {summary}")
    pytest.fail(f"client timestamps off the server's writes (ms): {summary}")


@pytest.mark.parametrize(
    "mode, reason",
    [
        ("error500", "HTTP 500: injected failure for request"),
        ("drop", "connection dropped mid-stream after 2 tokens"),
        ("garbage", "malformed stream: data line is not a JSON object: {not json"),
    ],
)
def test_failed_requests_raise_with_a_reason_and_the_others_complete(start_server, mode, reason):
    server = start_server(mode=mode, ttft_ms=1, tpot_ms=1)
    records = run_all(server, [make_request(i) for i in range(6)], concurrency=1)
    for number, record in enumerate(records, start=1):
        if number % 3 == 0:  # the server fails every 3rd request
            assert record.error is not None and record.error.startswith(reason), record.error
        else:
            assert record.ok, record.error
            assert record.num_output_tokens == 20


def test_requests_one_after_another_reuse_one_connection(start_server):
    """The body is read to its end after [DONE], so the connection goes back to the pool: a new
    TCP connection per request would add its handshake to every TTFT."""
    server = start_server(ttft_ms=1, tpot_ms=1)
    records = run_all(server, [make_request(i, use_chat=i % 2 == 0) for i in range(4)], 1)
    assert all(record.ok for record in records)
    assert len({entry["peer_port"] for entry in server.entries(4).values()}) == 1


def test_a_slow_reply_times_out(start_server):
    server = start_server(ttft_ms=2000, tpot_ms=1)
    [record] = run_all(server, [make_request(0)], concurrency=1, timeout_s=0.2)
    assert record.error == "timeout after 0.2 s"


def test_the_model_is_asked_for_and_an_unreachable_server_is_named(start_server):
    async def start(url: str) -> str | None:
        backend = OpenAIBackend(url)
        await backend.start()
        await backend.close()
        return backend.model

    assert asyncio.run(start(start_server().url)) == "streaming-test-model"

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(BackendError, match=f"^cannot reach {url}: .*; is the server running\\?$"):
        asyncio.run(start(url))


def test_what_the_server_says_of_its_model_is_read_before_and_at_start(start_server):
    """`describe` asks `GET /models` before the run, over a connection of its own; a server that
    cannot be asked is None (start says why); `start` keeps the card it chose the model from."""

    async def describe(url: str, model: str | None = None):
        backend = OpenAIBackend(url, model=model)
        before = await backend.describe()
        try:
            await backend.start()
        except BackendError:
            return before, None
        await backend.close()
        return before, backend.served

    url = start_server().url
    card = ServedModel("streaming-test-model", dtype=None, quantization=None)
    assert asyncio.run(describe(url)) == (card, card)
    assert asyncio.run(describe(url, "another-model")) == (None, None)  # not listed
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert asyncio.run(describe(f"http://127.0.0.1:{port}/v1")) == (None, None)


@pytest.mark.parametrize(
    ("cards", "model", "expected"),
    [
        ([{"id": "a", "dtype": "bfloat16", "quantization": None}], None, ("a", "bfloat16", None)),
        ([{"id": "a"}, {"id": "b", "dtype": "float16", "quantization": "int8"}], "b",
         ("b", "float16", "int8")),
        ([{"id": "a", "dtype": 2}], None, ("a", None, None)),  # not a name: not said
        (["junk", {"id": "a"}], None, ("a", None, None)),
        ([], None, None),
        (None, None, None),  # no "data"
    ],
)  # fmt: skip
def test_a_model_card_is_read_leniently(cards, model, expected):
    card = served_model({"object": "list"} if cards is None else {"data": cards}, model)
    assert (None if card is None else (card.id, card.dtype, card.quantization)) == expected


async def with_app(handler, request: GenerationRequest, **options) -> RequestRecord:
    """Serve `handler` for both completion paths on 127.0.0.1 and send it `request`."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1", model="m", **options)
    await backend.start()
    try:
        return await measure(backend, request)
    finally:
        await backend.close()
        await runner.cleanup()


def test_no_request_id_header_is_sent_unless_one_is_asked_for(start_server):
    """llama-cpp-python's server answers HTTP 400 to an X-Request-Id that is not a UUID: none
    goes by default; `request_id_header` sends a fresh UUID4 per request, `headers` go on all."""
    server = start_server(ttft_ms=1, tpot_ms=1)
    records = run_all(server, [make_request(i) for i in range(2)], concurrency=1)
    assert all(r.ok for r in records)
    for entry in server.entries(2).values():
        assert entry["request_id"] is None
        assert {name.lower() for name in entry["headers"]}.isdisjoint({"x-request-id"})

    requests = [make_request(i, prefix="asked") for i in range(3)]
    options = {"request_id_header": "X-Request-Id", "headers": {"X-Tenant": "bench"}}
    records = run_all(server, requests, concurrency=1, **options)
    assert all(r.ok for r in records)
    entries = [server.entries(5)[request.request_id] for request in requests]
    ids = [uuid.UUID(entry["request_id"]) for entry in entries]
    assert all(i.version == 4 for i in ids) and len(set(ids)) == 3
    assert all(entry["headers"]["X-Tenant"] == "bench" for entry in entries)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("", "HTTP 400: (empty body)"),
        ("  \n ", "HTTP 400: (empty body)"),
        ('{"error": {"message": "bad\n id"}}', 'HTTP 400: {"error": {"message": "bad id"}}'),
        ("x" * 500, "HTTP 400: " + "x" * 199 + "…"),
    ],
    ids=["empty", "blank", "json", "long"],
)
def test_an_http_error_quotes_its_body_on_one_line_or_says_it_was_empty(body, error):
    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=400, text=body)

    record = asyncio.run(with_app(refuse, make_request(0)))
    assert record.error == error and record.chunk_ns == []


def test_a_reply_sent_whole_as_json_is_read_as_one_chunk():
    """A server that ignores `stream: true` and answers one JSON body (with llama.cpp's
    timings): every token arrives at once, the record still has its counts and timings."""

    async def whole(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "choices": [
                    {"index": 0, "finish_reason": "length", "message": {"content": "a b c"}}
                ],
                "usage": {"prompt_tokens": 4, "completion_tokens": 3},
                "timings": {"prompt_n": 4, "prompt_ms": 3.5, "predicted_n": 3},
            }
        )

    record = asyncio.run(with_app(whole, make_request(0), count_tokens=count_words))
    assert record.ok and record.chunk_tokens == [3] and record.output_text == "a b c"
    assert record.finish_reason == "length" and record.server_completion_tokens == 3


TOOL = {
    "type": "function",
    "function": {
        "name": "find_river_0",
        "description": "Find a river.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}
TOOL_CONVERSATION = (
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "How long is the Nile?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "find_river_0", "arguments": '{"query": "nile"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "6,650 km"},
)


@pytest.mark.parametrize(("use_chat", "tools"), [(True, (TOOL,)), (True, None), (False, (TOOL,))])
def test_tools_and_tool_messages_reach_the_server_as_given(use_chat, tools):
    """Chat: `tools` (when the request has any) and the tool-calling history go in the body
    unchanged, null content kept. Completions: the client-rendered prompt only, no `tools`."""
    bodies: list[dict] = []

    async def completion(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        text = '"delta":{"content":"ok"}' if use_chat else '"text":"ok"'
        await response.write(
            f'data: {{"choices":[{{"index":0,{text},"finish_reason":"stop"}}]}}\n\n'.encode()
        )
        await response.write(b"data: [DONE]\n\n")
        return response

    request = GenerationRequest(
        "r0",
        TOOL_CONVERSATION,
        max_tokens=4,
        use_chat=use_chat,
        prompt_text="<rendered with tools>",
        tools=tools,
    )
    record = asyncio.run(with_app(completion, request))
    assert record.ok and record.output_text == "ok"
    (body,) = bodies
    if use_chat:
        assert body["messages"] == list(TOOL_CONVERSATION)
        assert body.get("tools") == (None if tools is None else [TOOL])
    else:
        assert body["prompt"] == "<rendered with tools>"
        assert "tools" not in body and "messages" not in body


def test_a_server_is_known_by_its_kind_version_model_and_hardware_not_its_address():
    card = ServedModel("synthetic:tiny", dtype="bfloat16", owned_by="llmbench")
    assert server_identity(card, "0.1.0", None) == "llmbench 0.1.0: synthetic:tiny (bfloat16)"
    vllm = ServedModel("meta-llama/Llama-3.1-8B", owned_by="vllm")
    assert server_identity(vllm, "0.6.3", "h100-sxm") == (
        "vllm 0.6.3: meta-llama/Llama-3.1-8B on h100-sxm"
    )
    assert server_identity(ServedModel("m"), None, None) == "server (version not said): m"
    assert server_identity(None, None, "h100") is None  # nothing said: the URL stands for it


async def reset_against(routes: dict[str, int]) -> tuple[list[str], str | None]:
    """`reset_prefix_cache` against a server answering each path with its status: the paths
    it was sent to, and the error (None: it succeeded)."""
    asked: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        asked.append(request.path)
        status = routes[request.path]
        return web.json_response(
            {"error": {"message": "busy"}} if status >= 400 else {}, status=status
        )

    app = web.Application()
    for path in routes:
        app.router.add_post(path, answer)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    backend = OpenAIBackend(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", model="m")
    await backend.start()
    try:
        await backend.reset_prefix_cache()
        return asked, None
    except BackendError as e:
        return asked, str(e)
    finally:
        await backend.close()
        await runner.cleanup()


@pytest.mark.parametrize(
    ("routes", "asked", "error"),
    [
        ({"/reset_prefix_cache": 200}, ["/reset_prefix_cache"], None),  # vLLM, llmbench serve
        ({"/reset_prefix_cache": 404, "/flush_cache": 200}, RESET_PATHS, None),  # SGLang
        ({"/reset_prefix_cache": 404, "/flush_cache": 404}, RESET_PATHS, "serves neither POST"),
        ({"/reset_prefix_cache": 409}, ["/reset_prefix_cache"], "HTTP 409: "),
    ],
)
def test_reset_prefix_cache_posts_the_first_path_the_server_serves(routes, asked, error):
    sent, failure = asyncio.run(reset_against(routes))
    assert sent == list(asked)
    assert failure is None if error is None else error in failure
