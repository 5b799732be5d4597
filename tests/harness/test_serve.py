"""The OpenAI-compatible server end to end: a real server on a free port, an aiohttp client.

Greedy replies are checked token for token against `LLMEngine.generate` run in-process on a
second engine over the same random-weight checkpoint.
"""

from __future__ import annotations

import asyncio
import json
import queue
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from llmbench.engine.engine import EngineConfig, LLMEngine
from llmbench.engine.sampling import SamplingParams
from llmbench.errors import UserError
from llmbench.harness.serve import RecentTokenRate, build_app, run_server
from tests.engine.helpers import write_tiny_checkpoint

MODEL = "tiny"
# The test vocabulary is words "w0".."w296" split on whitespace, with no role words: the
# template keeps only the contents, so a chat prompt's ids are its words' ids.
CHAT_TEMPLATE = "{% for message in messages %}{{ message.content }} {% endfor %}"
GREEDY = {"temperature": 0, "ignore_eos": True, "max_tokens": 8}
GREEDY_PARAMS = SamplingParams(temperature=0, ignore_eos=True, max_tokens=8)
TIMEOUT = aiohttp.ClientTimeout(total=60)


def words(*ids: int) -> str:
    return " ".join(f"w{i}" for i in ids)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return folder


def make_engine(folder) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), device="cpu", kv_cache_memory=1 << 22))


@pytest.fixture(scope="module")
def reference(folder) -> LLMEngine:
    """An engine of its own, so the server's engine is never stepped from the test thread."""
    return make_engine(folder)


def expected_text(reference: LLMEngine, prompt_ids: list[int]) -> str:
    [token_ids] = reference.generate([prompt_ids], GREEDY_PARAMS)
    return reference.tokenizer.decode(token_ids)


@dataclass
class Server:
    url: str
    engine: LLMEngine


@pytest.fixture(scope="module")
def server(folder):
    engine = make_engine(folder)
    stop = threading.Event()
    ready: queue.Queue[int | BaseException] = queue.Queue()

    def serve() -> None:
        try:
            run_server(engine, MODEL, port=0, on_ready=ready.put, stop=stop)
        except BaseException as e:  # surfaced to the fixture instead of a 60 s wait
            ready.put(e)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = ready.get(timeout=60)
    if isinstance(port, BaseException):
        raise port
    yield Server(f"http://127.0.0.1:{port}", engine)
    stop.set()
    thread.join(timeout=30)
    assert not thread.is_alive(), "the server did not stop"


# -- client helpers ---------------------------------------------------------------------------


async def post(session, url: str, body: Any) -> tuple[int, Any]:
    """POST a JSON body (or raw bytes); returns the status and the parsed JSON reply."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url, data=data, timeout=TIMEOUT) as response:
        return response.status, await response.json(content_type=None)


async def post_stream(session, url: str, body: dict) -> list[Any]:
    """POST with stream=true; returns the parsed `data:` payloads, "[DONE]" kept as a string."""
    async with session.post(url, json={**body, "stream": True}, timeout=TIMEOUT) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/event-stream")
        payloads = []
        async for line in response.content:
            line = line.strip()
            if not line:
                continue
            assert line.startswith(b"data: "), line
            data = line[len(b"data: ") :]
            payloads.append("[DONE]" if data == b"[DONE]" else json.loads(data))
        return payloads


def run(coroutine_fn, *args):
    async def main():
        async with aiohttp.ClientSession() as session:
            return await coroutine_fn(session, *args)

    return asyncio.run(main())


def stream_text(chunks: list[Any], is_chat: bool) -> str:
    choices = [c["choices"][0] for c in chunks if isinstance(c, dict) and c["choices"]]
    if is_chat:
        return "".join(choice["delta"].get("content", "") for choice in choices)
    return "".join(choice["text"] for choice in choices)


def check_stream_shape(chunks: list[Any], is_chat: bool, finish_reason: str) -> dict:
    """Every chunk well formed, the finish reason only on the last choice chunk, then the usage
    chunk and [DONE]; returns the usage."""
    assert chunks[-1] == "[DONE]"
    *choice_chunks, usage_chunk = chunks[:-1]
    assert usage_chunk["choices"] == []
    ids = {chunk["id"] for chunk in chunks[:-1]}
    assert len(ids) == 1
    object_name = "chat.completion.chunk" if is_chat else "text_completion"
    for chunk in choice_chunks:
        assert chunk["object"] == object_name and chunk["model"] == MODEL
        assert chunk["usage"] is None  # include_usage: null in all but the last chunk
    reasons = [chunk["choices"][0]["finish_reason"] for chunk in choice_chunks]
    assert reasons[-1] == finish_reason and set(reasons[:-1]) <= {None}
    if is_chat:
        assert choice_chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        for chunk in choice_chunks[1:-1]:  # only non-empty text deltas are sent
            assert chunk["choices"][0]["delta"]["content"]
    else:
        for chunk in choice_chunks[:-1]:
            assert chunk["choices"][0]["text"]
    return usage_chunk["usage"]


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


# -- simple endpoints -------------------------------------------------------------------------


def test_health_and_models(server):
    async def go(session):
        async with session.get(server.url + "/health") as response:
            assert response.status == 200 and await response.text() == "ok"
        async with session.get(server.url + "/v1/models") as response:
            assert response.status == 200
            return await response.json()

    listing = run(go)
    assert listing["object"] == "list"
    [model] = listing["data"]
    assert model["id"] == MODEL and model["object"] == "model" and model["max_model_len"] == 512


METRIC_LINE = re.compile(r"^(llmbench_\w+) (\S+)$")
METRICS = {
    "llmbench_num_requests_running": "gauge",
    "llmbench_num_requests_waiting": "gauge",
    "llmbench_kv_cache_usage_ratio": "gauge",
    "llmbench_prefix_cache_hit_rate": "gauge",
    "llmbench_generation_tokens_total": "counter",
    "llmbench_prompt_tokens_total": "counter",
    "llmbench_generation_tokens_per_second": "gauge",
}


def scrape(server) -> dict[str, float]:
    async def go(session):
        async with session.get(server.url + "/metrics") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain")
            return await response.text()

    values, types, helps = {}, {}, set()
    for line in run(go).splitlines():
        if line.startswith("# HELP "):
            helps.add(line.split()[2])
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            types[name] = kind
        else:
            match = METRIC_LINE.match(line)
            assert match, line
            values[match[1]] = float(match[2])
    assert types == METRICS and helps == set(METRICS) and set(values) == set(METRICS)
    return values


def test_metrics_count_tokens(server):
    before = scrape(server)
    prompt = words(7, 8, 9, 10, 11)
    status, _ = run(post, server.url + "/v1/completions", {"prompt": prompt, **GREEDY})
    assert status == 200
    after = scrape(server)
    assert after["llmbench_prompt_tokens_total"] - before["llmbench_prompt_tokens_total"] == 5
    gen_delta = (
        after["llmbench_generation_tokens_total"] - before["llmbench_generation_tokens_total"]
    )
    assert gen_delta == 8
    assert after["llmbench_generation_tokens_per_second"] > 0
    assert after["llmbench_num_requests_running"] == 0
    assert after["llmbench_num_requests_waiting"] == 0
    assert 0 <= after["llmbench_kv_cache_usage_ratio"] <= 1
    assert 0 <= after["llmbench_prefix_cache_hit_rate"] <= 1


def test_recent_token_rate_over_the_window():
    second = 10**9
    rate = RecentTokenRate(window_ns=10 * second, start_ns=0)
    assert rate.per_s(0) == 0.0
    rate.add(1 * second, 4)
    rate.add(3 * second, 6)
    assert rate.per_s(5 * second) == 10 / 5  # younger than the window: divide by the age
    assert rate.per_s(12 * second) == 6 / 10  # the t=1 s tokens left the window at 11 s
    assert rate.per_s(14 * second) == 0.0


# -- generation matches the engine ------------------------------------------------------------


@pytest.mark.parametrize("prompt_as_ids", [False, True])
def test_streamed_completion_matches_engine(server, reference, prompt_as_ids):
    prompt_ids = [3, 14, 15, 92, 65, 35]
    prompt = prompt_ids if prompt_as_ids else words(*prompt_ids)
    body = {"prompt": prompt, **GREEDY, "stream_options": {"include_usage": True}}
    chunks = run(post_stream, server.url + "/v1/completions", body)
    assert check_stream_shape(chunks, is_chat=False, finish_reason="length") == usage(6, 8)
    assert stream_text(chunks, is_chat=False) == expected_text(reference, prompt_ids)


def test_streamed_chat_matches_engine(server, reference):
    messages = [
        {"role": "system", "content": words(1, 2)},
        {"role": "user", "content": [{"type": "text", "text": words(27, 18, 28)}]},
    ]
    prompt_ids = [1, 2, 27, 18, 28]
    flat = [messages[0], {"role": "user", "content": words(27, 18, 28)}]  # parts joined
    assert reference.tokenizer.encode_chat(flat) == prompt_ids
    body = {"messages": messages, **GREEDY, "stream_options": {"include_usage": True}}
    chunks = run(post_stream, server.url + "/v1/chat/completions", body)
    assert check_stream_shape(chunks, is_chat=True, finish_reason="length") == usage(5, 8)
    assert stream_text(chunks, is_chat=True) == expected_text(reference, prompt_ids)


def test_stream_without_usage_ends_with_finish_then_done(server):
    body = {"prompt": words(4, 5), **GREEDY}
    chunks = run(post_stream, server.url + "/v1/completions", body)
    assert chunks[-1] == "[DONE]"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in chunk for chunk in chunks[:-1])


def test_non_streamed_replies_match_engine(server, reference):
    prompt_ids = [61, 80, 33, 98]
    status, completion = run(
        post,
        server.url + "/v1/completions",
        # max_completion_tokens wins over max_tokens
        {"prompt": words(*prompt_ids), **GREEDY, "max_completion_tokens": 8, "max_tokens": 3},
    )
    assert status == 200, completion
    assert completion["object"] == "text_completion" and completion["model"] == MODEL
    [choice] = completion["choices"]
    assert choice["text"] == expected_text(reference, prompt_ids)
    assert choice["finish_reason"] == "length"
    assert completion["usage"] == usage(4, 8)

    messages = [{"role": "user", "content": words(*prompt_ids)}]
    status, chat = run(post, server.url + "/v1/chat/completions", {"messages": messages, **GREEDY})
    assert status == 200, chat
    assert chat["object"] == "chat.completion"
    [choice] = chat["choices"]
    assert choice["message"] == {"role": "assistant", "content": choice["message"]["content"]}
    assert choice["message"]["content"] == expected_text(reference, prompt_ids)
    assert choice["finish_reason"] == "length"
    # The same prompt again: no full block (16 tokens) to share, so nothing is cached.
    assert chat["usage"] == usage(4, 8)


def test_stop_string_ends_the_reply_before_it(server, reference):
    prompt_ids = [5, 6, 7]
    full = expected_text(reference, prompt_ids)  # "wA wB wC ..." - 8 words
    stop = " " + full.split(" ")[3] + " "  # the 4th word, whole (it may also come earlier)
    body = {"prompt": prompt_ids, **GREEDY, "stop": stop}
    status, reply = run(post, server.url + "/v1/completions", body)
    assert status == 200, reply
    assert reply["choices"][0]["text"] == full[: full.index(stop)]
    assert reply["choices"][0]["finish_reason"] == "stop"


def test_shared_prefix_reports_cached_tokens(server):
    shared = [(7 * i) % 290 + 1 for i in range(40)]  # 40 tokens: 2 full blocks of 16
    first = {"prompt": shared + [201, 202], **GREEDY}
    second = {"prompt": shared + [203, 204, 205], **GREEDY}
    status, reply = run(post, server.url + "/v1/completions", first)
    assert status == 200 and reply["usage"] == usage(42, 8, cached_tokens=0)
    status, reply = run(post, server.url + "/v1/completions", second)
    assert status == 200 and reply["usage"] == usage(43, 8, cached_tokens=32)


def test_concurrent_streams_all_complete(server, reference):
    prompts = [[(i * 13 + j * 5) % 290 + 1 for j in range(3 + i)] for i in range(16)]
    expected = [
        reference.tokenizer.decode(ids) for ids in reference.generate(prompts, GREEDY_PARAMS)
    ]

    async def go(session):
        async def one(i):
            if i % 2:
                body = {"messages": [{"role": "user", "content": words(*prompts[i])}]}
            else:
                body = {"prompt": prompts[i]}
            body.update(GREEDY, stream_options={"include_usage": True})
            path = "/v1/chat/completions" if i % 2 else "/v1/completions"
            return await post_stream(session, server.url + path, body)

        return await asyncio.gather(*(one(i) for i in range(16)))

    for i, chunks in enumerate(run(go)):
        is_chat = bool(i % 2)
        reply_usage = check_stream_shape(chunks, is_chat, finish_reason="length")
        assert reply_usage["completion_tokens"] == 8
        assert stream_text(chunks, is_chat) == expected[i]


# -- aborts -----------------------------------------------------------------------------------


def wait_until_idle(engine: LLMEngine, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (
            engine.blocks.num_free_blocks == engine.blocks.num_blocks
            and not engine.scheduler.running
            and not engine.has_unfinished()
        ):
            return
        time.sleep(0.02)
    raise AssertionError(
        f"engine not idle: {engine.blocks.num_free_blocks}/{engine.blocks.num_blocks} blocks "
        f"free, {len(engine.scheduler.running)} running"
    )


@pytest.mark.parametrize("is_stream", [True, False])
def test_client_disconnect_aborts_the_request(server, is_stream):
    max_tokens = 500  # the context is 512: far more than arrives before the client leaves
    before = scrape(server)["llmbench_generation_tokens_total"]

    async def go(session):
        body = {"prompt": [9, 8, 7], "max_tokens": max_tokens, "ignore_eos": True}
        if is_stream:
            body["stream"] = True
            response = await session.post(server.url + "/v1/completions", json=body)
            assert response.status == 200
            num_lines = 0
            async for line in response.content:
                num_lines += line.startswith(b"data: ")
                if num_lines == 2:
                    break
            response.close()  # drops the connection
        else:  # no reply comes before the end: hang up once the engine is running it
            request = asyncio.create_task(session.post(server.url + "/v1/completions", json=body))
            while not server.engine.scheduler.running:
                await asyncio.sleep(0.001)
            request.cancel()

    async def with_own_session():
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            await go(session)
        wait_until_idle(server.engine)

    asyncio.run(with_own_session())
    generated = scrape(server)["llmbench_generation_tokens_total"] - before
    assert 1 <= generated < max_tokens  # aborted, not run to the end
    status, _ = run(post, server.url + "/v1/completions", {"prompt": "w1", **GREEDY})
    assert status == 200


# -- bad requests -----------------------------------------------------------------------------

LONG = words(*[1] * 600)  # 600 tokens: over the 512-token context

BAD_REQUESTS = [
    # (path, body, param)
    ("completions", b"{not json", None),
    ("completions", b"\xff\xfe", None),
    ("completions", b"[1, 2]", None),
    ("completions", {}, "prompt"),
    ("completions", {"prompt": ""}, "prompt"),
    ("completions", {"prompt": []}, "prompt"),
    ("completions", {"prompt": 5}, "prompt"),
    ("completions", {"prompt": [1, "w2"]}, "prompt"),
    ("completions", {"prompt": ["w1", "w2"]}, "prompt"),
    ("completions", {"prompt": [1, 300]}, "prompt"),
    ("completions", {"prompt": [-1]}, "prompt"),
    ("completions", {"prompt": LONG}, "prompt"),
    ("completions", {"prompt": words(*[2] * 500), "max_tokens": 20}, "prompt"),
    ("completions", {"prompt": "w1", "temperature": -1}, "temperature"),
    ("completions", {"prompt": "w1", "temperature": "hot"}, "temperature"),
    ("completions", {"prompt": "w1", "top_p": 0}, "top_p"),
    ("completions", {"prompt": "w1", "top_k": 1.5}, "top_k"),
    ("completions", {"prompt": "w1", "min_p": 2}, "min_p"),
    ("completions", {"prompt": "w1", "max_tokens": 0}, "max_tokens"),
    ("completions", {"prompt": "w1", "max_tokens": "8"}, "max_tokens"),
    ("completions", {"prompt": "w1", "max_completion_tokens": -3}, "max_completion_tokens"),
    ("completions", {"prompt": "w1", "seed": 1.5}, "seed"),
    ("completions", {"prompt": "w1", "seed": 2**70}, "seed"),
    ("completions", {"prompt": "w1", "stop": 5}, "stop"),
    ("completions", {"prompt": "w1", "stop": ["w2", 3]}, "stop"),
    ("completions", {"prompt": "w1", "stop": [""]}, "stop"),
    ("completions", {"prompt": "w1", "ignore_eos": "yes"}, "ignore_eos"),
    ("completions", {"prompt": "w1", "stream": "yes"}, "stream"),
    ("completions", {"prompt": "w1", "stream": True, "stream_options": 1}, "stream_options"),
    (
        "completions",
        {"prompt": "w1", "stream": True, "stream_options": {"include_usage": 1}},
        "stream_options",
    ),
    ("completions", {"prompt": "w1", "n": 2}, "n"),
    ("chat/completions", {}, "messages"),
    ("chat/completions", {"messages": []}, "messages"),
    ("chat/completions", {"messages": "w1"}, "messages"),
    ("chat/completions", {"messages": [{"content": "w1"}]}, "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages",
    ),
    ("chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages"),
    ("chat/completions", {"messages": [{"role": "user", "content": "w1"}], "top_p": 2}, "top_p"),
]


@pytest.mark.parametrize(("path", "body", "param"), BAD_REQUESTS)
def test_bad_request_is_400_and_the_server_goes_on(server, path, body, param):
    async def go(session):
        bad = await post(session, f"{server.url}/v1/{path}", body)
        good = await post(session, server.url + "/v1/completions", {"prompt": "w1", **GREEDY})
        return bad, good

    (status, reply), (good_status, _) = run(go)
    assert status == 400, reply
    error = reply["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert error["param"] == param
    assert error["message"]
    assert good_status == 200


def test_wrong_model_is_404(server):
    body = {"model": "gpt-4", "prompt": "w1", **GREEDY}
    status, reply = run(post, server.url + "/v1/completions", body)
    assert status == 404
    assert reply["error"]["code"] == "model_not_found" and reply["error"]["param"] == "model"
    status, _ = run(post, server.url + "/v1/completions", {**body, "model": MODEL})
    assert status == 200


def test_unknown_route_and_method_are_json_errors(server):
    async def go(session):
        async with session.get(server.url + "/v1/nothing") as response:
            not_found = response.status, await response.json()
        async with session.get(server.url + "/v1/completions") as response:
            wrong_method = response.status, await response.json()
        return not_found, wrong_method

    (status, reply), (status_405, reply_405) = run(go)
    assert status == 404
    assert reply["error"]["message"] == "Invalid URL (GET /v1/nothing)"
    assert reply["error"]["type"] == "invalid_request_error"
    assert status_405 == 405 and reply_405["error"]["message"]


# -- serving itself ---------------------------------------------------------------------------


def test_port_in_use_is_a_user_error(reference):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError, match=f"cannot listen on 127.0.0.1:{port}"):
            run_server(reference, MODEL, port=port, stop=threading.Event())


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_engine_crash_ends_requests_with_503(folder):
    engine = make_engine(folder)

    def broken_step():
        raise RuntimeError("simulated engine failure")

    engine.step = broken_step  # the engine thread dies on the first request's first step

    async def go():
        async with TestServer(build_app(engine, MODEL)) as test_server:
            url = str(test_server.make_url(""))
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                body = {"prompt": "w1", **GREEDY}
                in_flight = await post_stream(session, url + "/v1/completions", body)
                after = await post(session, url + "/v1/completions", body)
                async with session.get(url + "/health") as response:
                    health = response.status
        return in_flight, after, health

    in_flight, (status, reply), health = asyncio.run(go())
    [error_chunk] = in_flight  # the stream ends with an error event instead of hanging
    assert "simulated engine failure" in error_chunk["error"]["message"]
    assert status == 503 and reply["error"]["type"] == "server_error"
    assert "simulated engine failure" in reply["error"]["message"]
    assert health == 503
