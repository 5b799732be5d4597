"""The OpenAI backend: the SSE parser byte by byte, then the client against a real streaming
server (a subprocess) whose own record of its writes is the reference for every timestamp."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from llmbench.harness.backends.openai import BackendError, OpenAIBackend, StreamParser
from llmbench.harness.records import GenerationRequest, RequestRecord, StreamEvent

REPO_ROOT = Path(__file__).resolve().parents[2]
P95_ERROR_NS = 2_000_000  # client vs server clock, per TTFT / TPOT / chunk / ITL
MAX_ERROR_NS = 8_000_000  # any one sample: below the 10 ms token gap, so a misaligned chunk fails
NUM_ATTEMPTS = 3
MAX_OTHER_CORES = 0.3  # more than this used by other processes: timing checks are skipped


def count_words(text: str) -> int:
    """The test server's tokens are words, so this is its exact tokenizer."""
    return len(text.split())


def sse(chunk: dict) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def delta(**fields) -> bytes:
    return sse({"choices": [{"index": 0, "delta": fields, "finish_reason": None}]})


FINISH = sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
USAGE = sse(
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 7,
            "completion_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
)
DONE = b"data: [DONE]\n\n"


def parse(stream: bytes, use_chat=True, count_tokens=None, read_size=None) -> list[StreamEvent]:
    """Feed `stream` in reads of `read_size` bytes (all at once if None), stamped 0, 1, 2..."""
    parser = StreamParser(use_chat, count_tokens)
    size = read_size or len(stream)
    events = []
    for t_ns, start in enumerate(range(0, len(stream), size)):
        events += parser.feed(stream[start : start + size], t_ns)
    return events + parser.finish(t_ns=10**9)


# --- the parser -----------------------------------------------------------------------------

CHAT = (
    delta(role="assistant", content="")  # role-only first delta: no token (pitfall 2)
    + b": keep-alive comment\n\n"
    + delta(content="Hello")
    + b"event: message\nid: 3\n"
    + delta(content=" big world")
    + FINISH
    + USAGE
    + DONE
)


def test_role_only_delta_comments_and_other_fields_carry_no_tokens():
    events = parse(CHAT)
    assert [(e.num_tokens, e.text) for e in events] == [(1, "Hello"), (1, " big world"), (0, "")]
    final = events[-1]
    assert final.finish_reason == "stop"
    assert (final.usage_prompt_tokens, final.usage_completion_tokens) == (7, 5)
    assert final.cached_tokens == 4


@pytest.mark.parametrize("read_size", [1, 2, 7, 64])
def test_lines_split_across_reads_give_the_same_events(read_size):
    expected = [(e.num_tokens, e.text) for e in parse(CHAT, count_tokens=count_words)]
    events = parse(CHAT, count_tokens=count_words, read_size=read_size)
    assert [(e.num_tokens, e.text) for e in events] == expected


def test_an_event_is_stamped_with_the_read_that_completed_its_line():
    parser = StreamParser(use_chat=True)
    line = delta(content="a")
    assert parser.feed(line[:10], t_ns=100) == []
    assert [e.t_ns for e in parser.feed(line[10:], t_ns=200)] == [200]


def test_crlf_line_endings():
    events = parse(CHAT.replace(b"\n", b"\r\n"))
    assert [e.text for e in events] == ["Hello", " big world", ""]


def test_multi_token_chunks_count_with_the_tokenizer_and_as_one_without():
    stream = delta(content="w0 ") + delta(content="w1 w2 w3 ") + delta(content="w4 ") + DONE
    assert [e.num_tokens for e in parse(stream, count_tokens=count_words)] == [1, 3, 1, 0]
    assert [e.num_tokens for e in parse(stream)] == [1, 1, 1, 0]


def test_a_delta_that_adds_no_whole_token_still_counts_one():
    stream = delta(content="wo") + delta(content="rd ") + DONE  # "wo" + "rd " is one word
    assert [e.num_tokens for e in parse(stream, count_tokens=count_words)] == [1, 1, 0]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_deltas_are_tokens_but_not_reply_text(field):
    stream = (
        delta(role="assistant")
        + delta(**{field: "think hard "})
        + delta(content="answer")
        + FINISH
        + DONE
    )
    events = parse(stream, count_tokens=count_words)
    assert [(e.num_tokens, e.text) for e in events] == [(2, ""), (1, "answer"), (0, "")]
    assert [e.num_tokens for e in parse(stream)] == [1, 1, 0]


def test_streamed_tool_call_pieces_are_tokens_but_not_reply_text():
    """A tool call streamed as deltas (name first, then argument pieces), as vLLM sends it."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "search"}}
    stream = (
        delta(role="assistant")
        + delta(tool_calls=[call])
        + delta(tool_calls=[{"index": 0, "function": {"arguments": '{"q": '}}])
        + delta(tool_calls=[{"index": 0, "function": {"arguments": '"a b"}'}}])
        + FINISH
        + DONE
    )
    events = parse(stream, count_tokens=count_words)
    # Words: "search" 1; 'search{"q":' still 1 (a piece adding no whole word counts 1); then
    # '"a' and 'b"}' are 2 more.
    assert [(e.num_tokens, e.text) for e in events] == [(1, ""), (1, ""), (2, ""), (0, "")]


def test_completions_read_choice_text():
    stream = sse({"choices": [{"index": 0, "text": "w0 w1 ", "finish_reason": None}]}) + DONE
    events = parse(stream, use_chat=False, count_tokens=count_words)
    assert [(e.num_tokens, e.text) for e in events] == [(2, "w0 w1 "), (0, "")]


def test_a_stream_may_end_with_a_finish_reason_and_no_done():
    events = parse(delta(content="x") + FINISH)
    assert events[-1].finish_reason == "stop"


def test_a_last_line_without_newline_is_still_read():
    events = parse(delta(content="x") + b"data: [DONE]")
    assert [e.num_tokens for e in events] == [1, 0]


def test_a_stream_cut_short_is_an_error():
    with pytest.raises(BackendError, match="stream ended without \\[DONE\\] or a finish_reason"):
        parse(delta(content="x"))


def test_malformed_json_and_error_objects_are_errors():
    with pytest.raises(BackendError, match="malformed stream: .*\\{not json"):
        parse(delta(content="x") + b"data: {not json\n\n")
    with pytest.raises(BackendError, match="malformed stream"):
        parse(b"data: [1, 2]\n\n")
    with pytest.raises(BackendError, match="malformed stream: unexpected chunk layout"):
        parse(b'data: {"choices": "oops"}\n\n')
    error = sse({"error": {"message": "KV cache full", "code": 503}})
    with pytest.raises(BackendError, match="server error in stream: KV cache full"):
        parse(delta(content="x") + error)


# --- against a real server ------------------------------------------------------------------


@dataclass(frozen=True)
class Server:
    url: str
    record: Path  # the server's own record: a JSON line per request
    pid: int

    def entries(self, num_expected: int) -> dict[str, dict]:
        """The server's record by request id, once `num_expected` requests have ended."""
        deadline = time.monotonic() + 5
        while True:
            lines = self.record.read_text().splitlines() if self.record.exists() else []
            if len(lines) >= num_expected or time.monotonic() > deadline:
                return {entry["request_id"]: entry for entry in map(json.loads, lines)}
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
    return GenerationRequest(
        request_id=f"{prefix}-{index}",
        messages=({"role": "user", "content": f"say {max_tokens} words"},),
        max_tokens=max_tokens,
        ignore_eos=True,
        use_chat=use_chat,
        prompt_text=f"say {max_tokens} words",
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
            else:
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
    machine, in each of 3 attempts). So the check is on the p95 and the best of 3 attempts, and
    when other processes kept the machine busy, a miss skips instead of failing. A client that
    stamps late (after parsing, behind other streams) or misaligns chunks misses every attempt.
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
            assert record.server_prompt_tokens == 3
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
        ("drop", "connection dropped mid-stream"),
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
    from aiohttp import web

    bodies: list[dict] = []

    async def completion(request: web.Request) -> web.StreamResponse:
        bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(
            delta(content="ok") if use_chat else sse({"choices": [{"text": "ok"}]})
        )
        await response.write(FINISH + DONE)
        return response

    async def main() -> RequestRecord:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", completion)
        app.router.add_post("/v1/completions", completion)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        backend = OpenAIBackend(f"http://127.0.0.1:{port}/v1", model="m")
        await backend.start()
        try:
            request = GenerationRequest(
                "r0",
                TOOL_CONVERSATION,
                max_tokens=4,
                use_chat=use_chat,
                prompt_text="<rendered with tools>",
                tools=tools,
            )
            return await measure(backend, request)
        finally:
            await backend.close()
            await runner.cleanup()

    record = asyncio.run(main())
    assert record.ok and record.output_text == "ok"
    (body,) = bodies
    if use_chat:
        assert body["messages"] == list(TOOL_CONVERSATION)
        assert body.get("tools") == (None if tools is None else [TOOL])
    else:
        assert body["prompt"] == "<rendered with tools>"
        assert "tools" not in body and "messages" not in body
