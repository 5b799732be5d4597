"""Conformance: the streams real servers write, byte for byte, through a real local server, the
real `openai` backend and the real driver, each with the `RequestRecord` it must give.

Each file in `fixtures/` is one reply as a server writes it (its own JSON layout, separators,
escapes, keep-alives, line ends), written for these tests in the shape each project's code and
docs give. A local aiohttp server on 127.0.0.1 picks the file by the request's `model` and sends
it an SSE event at a time, `EVENT_GAP_S` apart, so events arrive at distinct times.

The client tokenizer here counts words (`len(text.split())`), so every expected count can be
checked by eye; how counts follow a real tokenizer is `test_token_count`'s and
`test_openai_stream`'s business.

What each shape taught the backend:

- vLLM: a role-only first delta with `content: ""` (no token: TTFT is not taken there);
  several tokens in one chunk (speculative decoding); `finish_reason` on the last text chunk;
  a usage-only last chunk with `choices: []` and `prompt_tokens_details.cached_tokens`;
  `continuous_usage_stats` (usage on every chunk: per-chunk counts are the server's, never
  summed; the EOS token counts in the server's total but carries no text); the newer
  `reasoning` delta field; tool calls streamed as name then argument pieces (tokens, no reply
  text, `finish_reason: "tool_calls"`); an error as a bare `{"object": "error", ...}` then
  `[DONE]` (older versions; newer nest it under `error`).
- SGLang: every delta field present, null when unused; `reasoning_content`; the finish reason
  in a chunk of its own; an abort mid-reply as `{"error": {...}}`, followed by usage and
  `[DONE]`: the request fails, the tokens before the error stay, the usage is still read.
- TGI: `data:` with no space; the role repeated on every delta; `"usage": null` on every chunk
  (not a report); the EOS token as an empty-content delta; axum's `:` keep-alive; errors as
  `{"error": {"message", "http_status_code"}}` then `data:[DONE]`.
- llama.cpp's server: `content: null` in the role delta; raw UTF-8; `timings` (prompt_n,
  prompt_ms, predicted_*, cache_n) next to `usage` on the last chunk; an error as
  `data: {"error": {...}}` and the stream just ends (no `[DONE]`); before 2025 an `error:` line
  that is not even a `data:` field; U+FFFD where its JSON writer met invalid UTF-8; forks that
  never send `[DONE]` after the finish chunk.
- llama-cpp-python: Python's `json.dumps` layout (spaces, `\\u00e9` escapes), sse-starlette's
  `: ping` comments, no usage at all, and with `--interrupt_requests` (its default) a reply
  cut by the next request: a role chunk and `[DONE]` (no token: an empty stream, a failure), or
  some tokens and `[DONE]` with no finish reason (a cut stream, a failure).
- sse-starlette's default `\\r\\n` line ends; a gateway's `event: error`; a server that slices
  UTF-16 and sends an emoji's two halves as separate JSON escapes.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from llmbench.engine.tokenizer import Tokenizer
from llmbench.harness.backends.openai import OpenAIBackend
from llmbench.harness.driver import DriveOptions, Driver
from llmbench.harness.metrics import summarize
from llmbench.harness.records import RequestRecord, ServerTimings
from llmbench.harness.workloads import Session, Turn

FIXTURES = Path(__file__).parent / "fixtures"
EVENT_GAP_S = 0.01
MAX_TOKENS = 16


def count_words(text: str) -> int:
    return len(text.split())


def sse_events(data: bytes) -> list[bytes]:
    """`data` cut after every blank line (an event's end); joined, the pieces are `data`."""
    return [piece for piece in re.split(rb"(?<=\n\n)|(?<=\r\n\r\n)", data) if piece]


async def replay(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    data = (FIXTURES / f"{body['model']}.sse").read_bytes()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for index, event in enumerate(sse_events(data)):
        if index:
            await asyncio.sleep(EVENT_GAP_S)
        await response.write(event)
    return response  # the body ends here, whether or not the fixture sent [DONE]


async def drive(names: list[str], use_chat: bool = True) -> list[RequestRecord]:
    """Serve the fixtures, and drive one single-turn session per fixture name (in turn)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", replay)
    app.router.add_post("/v1/completions", replay)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    records = []
    try:
        for name in names:
            backend = OpenAIBackend(url, model=name, count_tokens=count_words)
            await backend.start()
            try:
                driver = Driver(backend, Tokenizer.byte_level(), DriveOptions(use_chat=use_chat))
                session = Session("s0", "Be brief.", (Turn("Hi", MAX_TOKENS, 0.0),))
                result = await driver.run_closed_loop([session], 1)
                records += result.records
            finally:
                await backend.close()
    finally:
        await runner.cleanup()
    return records


@dataclass(frozen=True)
class Expected:
    chunk_tokens: list[int]
    output_text: str
    finish_reason: str | None
    error: str | None = None  # the start of the error, None: the request completed
    server_prompt_tokens: int | None = None
    server_completion_tokens: int | None = None
    server_timings: ServerTimings | None = None
    has_reasoning: bool = False
    use_chat: bool = True

    @property
    def usage_reported(self) -> bool:
        return self.server_prompt_tokens is not None


def usage(prompt: int, completion: int, cached: int | None = None) -> ServerTimings:
    return ServerTimings(
        source="openai usage", prompt_tokens=prompt, decode_tokens=completion, cached_tokens=cached
    )


EXPECTED = {
    "vllm_chat": Expected(
        [1, 1, 3, 1],
        "Hello there, how are you today?",
        "length",
        server_prompt_tokens=21,
        server_completion_tokens=6,
        server_timings=usage(21, 6, cached=16),
    ),
    "vllm_continuous_usage": Expected(
        [1, 2, 1],  # the server's own running counts: " there" came with a token before it
        "Hello there friend",
        "stop",
        server_prompt_tokens=21,
        server_completion_tokens=5,  # the EOS token: counted by the server, no text
        server_timings=ServerTimings(
            source="vllm continuous_usage_stats", prompt_tokens=21, decode_tokens=5
        ),
    ),
    "vllm_reasoning": Expected(
        [2, 1, 1],
        "Yes.",
        "stop",
        server_prompt_tokens=12,
        server_completion_tokens=5,
        server_timings=usage(12, 5),
        has_reasoning=True,
    ),
    "vllm_tool_call": Expected(
        [1, 1],  # 'get_weather', then '{"city": ' adds no word, then '"Paris"}' one
        "",
        "tool_calls",
        server_prompt_tokens=80,
        server_completion_tokens=11,
        server_timings=usage(80, 11),
    ),
    "vllm_completions": Expected(
        [1, 3],
        " Paris is the capital.",
        "length",
        server_prompt_tokens=6,
        server_completion_tokens=4,
        server_timings=usage(6, 4),
        use_chat=False,
    ),
    "vllm_error_unnested": Expected(
        [1],
        "Hello",
        None,
        error="server error in stream after 1 token: The engine loop has stopped",
    ),
    "sglang_reasoning": Expected(
        [2, 1, 1],
        "Four.",
        "stop",
        server_prompt_tokens=30,
        server_completion_tokens=6,
        server_timings=usage(30, 6, cached=24),
        has_reasoning=True,
    ),
    "sglang_abort": Expected(
        [2],
        "The answer",
        None,
        error="server error in stream after 2 tokens: Request aborted: KV cache pool is full",
        server_prompt_tokens=30,
        server_completion_tokens=2,
        server_timings=usage(30, 2),
    ),
    "tgi_chat": Expected(
        [1, 1, 1],
        "Hello from TGI",
        "stop",
        server_prompt_tokens=9,
        server_completion_tokens=4,
        server_timings=usage(9, 4),
    ),
    "tgi_error": Expected(
        [1],
        "Hello",
        None,
        error="server error in stream after 1 token: Request failed during generation: Server "
        "error: CUDA out of memory.",
    ),
    "llama_cpp_chat": Expected(
        [1, 1, 1],
        "Bonjour le café",
        "length",
        server_prompt_tokens=40,
        server_completion_tokens=3,
        server_timings=ServerTimings(
            source="llama.cpp timings + openai usage",
            prompt_ms=11.2,
            decode_ms=56.4,
            decode_ms_per_token=18.8,
            prompt_tokens=40,  # prompt_n 8 evaluated + cache_n 32
            decode_tokens=3,
            cached_tokens=32,
        ),
    ),
    "llama_cpp_error": Expected(
        [1],
        "Bonjour",
        None,
        error="server error in stream after 1 token: Context size has been exceeded.",
    ),
    "llama_cpp_error_line": Expected(
        [1], "Bonjour", None, error="server error in stream after 1 token: slot unavailable"
    ),
    "llama_cpp_replacement_char": Expected([1, 1], "caf\ufffd ok", "length"),
    "llama_cpp_no_done": Expected([1], "Bonjour", "stop"),
    "llama_cpp_cut": Expected(
        [1, 1],
        "Bonjour le",
        None,
        error="stream cut: the stream ended after 2 tokens with no finish_reason or [DONE]",
    ),
    "llama_cpp_python_chat": Expected([1, 1, 1], "Un café noir", "length"),
    "llama_cpp_python_interrupted": Expected(
        [], "", None, error="empty stream: the server sent no token (finish_reason: None)"
    ),
    "llama_cpp_python_interrupted_mid": Expected(
        [1, 1],
        "Un café",
        None,
        error="stream cut: [DONE] after 2 tokens with no finish_reason",
    ),
    "sse_starlette_crlf": Expected([1, 1], "Un noir", "stop"),
    "gateway_event_error": Expected(
        [1], "Hello", None, error="server error in stream after 1 token: upstream timed out"
    ),
    "utf16_halves": Expected([1, 1], "Nice 😀!", "stop"),
}


def test_every_fixture_has_its_expected_record():
    assert sorted(EXPECTED) == sorted(path.stem for path in FIXTURES.glob("*.sse"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_server_shape_gives_its_expected_record(name):
    expected = EXPECTED[name]
    [record] = asyncio.run(drive([name], use_chat=expected.use_chat))
    got = {
        "chunk_tokens": record.chunk_tokens,
        "output_text": record.output_text,
        "finish_reason": record.finish_reason,
        "server_prompt_tokens": record.server_prompt_tokens,
        "server_completion_tokens": record.server_completion_tokens,
        "server_timings": record.server_timings,
        "usage_reported": record.usage_reported,
    }
    assert got == {
        "chunk_tokens": expected.chunk_tokens,
        "output_text": expected.output_text,
        "finish_reason": expected.finish_reason,
        "server_prompt_tokens": expected.server_prompt_tokens,
        "server_completion_tokens": expected.server_completion_tokens,
        "server_timings": expected.server_timings,
        "usage_reported": expected.usage_reported,
    }
    if expected.error is None:
        assert record.ok, record.error
    else:
        assert not record.ok and record.error == f"BackendError: {expected.error}"
    assert record.num_output_tokens == (
        expected.server_completion_tokens or sum(expected.chunk_tokens)
    )
    assert record.cached_tokens == (
        expected.server_timings and expected.server_timings.cached_tokens
    )
    assert (record.max_tokens, record.ignore_eos) == (MAX_TOKENS, True)
    # Chunks arrive in order, each at its own time, after the send.
    assert record.chunk_ns == sorted(set(record.chunk_ns))
    assert all(record.sent_ns < t <= record.end_ns for t in record.chunk_ns)
    if expected.has_reasoning:
        assert record.first_reasoning_ns == record.chunk_ns[0]
        assert record.first_reasoning_ns < record.first_content_ns
    else:
        assert record.first_reasoning_ns is None
        is_reply = bool(expected.output_text) or name == "vllm_tool_call"
        assert record.first_content_ns == (record.chunk_ns[0] if is_reply else None)


def test_empty_and_cut_streams_are_failures_outside_goodput():
    """The llama-cpp-python run that reported "17 completed, 0 failed, goodput 1.0": its
    interrupted replies are failed requests now, and goodput counts only the complete ones."""
    names = ["vllm_chat", "llama_cpp_python_interrupted", "llama_cpp_python_interrupted_mid"]
    records = asyncio.run(drive(names))
    summary = summarize(records)
    assert (summary["num_completed"], summary["num_failed"]) == (1, 2)
    assert summary["goodput_fraction"] == pytest.approx(1 / 3)
