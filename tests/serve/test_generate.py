"""The generation endpoints end to end: a real server on 127.0.0.1, real engines, real clients.

Greedy replies are checked token for token against `LLMEngine.generate` run in-process on a
second engine over the same random-weight checkpoint. The tool-calling loop runs the official
`openai` client against the hand-set tool model of `helpers` (its output is canned by its
weights; everything from the engine to the client is real).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

import aiohttp
import openai
import pytest

from llmbench.engine.engine import LLMEngine
from llmbench.engine.sampling import SamplingParams
from llmbench.serve import ServeConfig
from llmbench.serve.generate import max_body_bytes, served_tokenizer
from tests.engine.helpers import WEATHER_TOOL, write_tiny_checkpoint
from tests.serve.helpers import ANSWER_REPLY, CALL_JSON, ID, serving, tiny_engine, write_tool_model

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


@pytest.fixture(scope="module")
def reference(folder) -> LLMEngine:
    """An engine of its own, so the server's engine is never stepped from the test thread."""
    return tiny_engine(str(folder))


def expected_text(reference: LLMEngine, prompt_ids: list[int]) -> str:
    [token_ids] = reference.generate([prompt_ids], GREEDY_PARAMS)
    return reference.tokenizer.decode(token_ids)


class Server:
    def __init__(self, url: str, engine: LLMEngine) -> None:
        self.url = url
        self.engine = engine


@pytest.fixture(scope="module")
def server(folder):
    engine = tiny_engine(str(folder))
    with serving(engine, ServeConfig(served_model_name=MODEL)) as url:
        yield Server(url, engine)


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


def test_logit_bias_moves_the_greedy_choice(server, reference):
    prompt_ids = [11, 12, 13]
    [natural] = reference.generate([prompt_ids], GREEDY_PARAMS)
    # +100 on a token the model does not pick makes every greedy step pick it.
    forced = next(t for t in range(1, 290) if t not in natural)
    body = {"prompt": prompt_ids, **GREEDY, "logit_bias": {str(forced): 100}}
    status, reply = run(post, server.url + "/v1/completions", body)
    assert status == 200, reply
    assert reply["choices"][0]["text"] == words(*[forced] * 8)
    banned = {"prompt": prompt_ids, **GREEDY, "logit_bias": {str(natural[0]): -100}}
    status, reply = run(post, server.url + "/v1/completions", banned)
    assert status == 200 and not reply["choices"][0]["text"].startswith(f"w{natural[0]} ")


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


def generated_tokens(server) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    async def go(session):
        async with session.get(server.url + "/metrics") as response:
            return await response.text()

    families = {f.name: f for f in text_string_to_metric_families(run(go))}
    return families["llmbench_generation_tokens"].samples[0].value


@pytest.mark.parametrize("is_stream", [True, False])
def test_client_disconnect_aborts_the_request(server, is_stream):
    max_tokens = 500  # the context is 512: far more than arrives before the client leaves
    before = generated_tokens(server)

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
    generated = generated_tokens(server) - before
    assert 1 <= generated < max_tokens  # aborted, not run to the end
    status, _ = run(post, server.url + "/v1/completions", {"prompt": "w1", **GREEDY})
    assert status == 200


# -- bad requests -----------------------------------------------------------------------------

LONG = words(*[1] * 600)  # 600 tokens: over the 512-token context

TOOL_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}

BAD_REQUESTS = [
    # (path, body, param)
    ("completions", b"{not json", None),
    ("completions", b"\xff\xfe", None),
    ("completions", b"[1, 2]", None),
    ("completions", b'{"prompt": "w1 \\ud800"}', None),  # a lone surrogate, escaped
    ("completions", b'{"prompt": "w1 \xed\xa0\x80"}', None),  # the same, as raw bytes
    ("chat/completions", b'{"messages": [{"role": "user", "content": "\\udc00"}]}', None),
    ("completions", b"[" * 100_000 + b"]" * 100_000, None),
    ("completions", b'{"prompt": ' * 50_000 + b'"w1"' + b"}" * 50_000, None),
    ("completions", b'{"prompt": "w1", "temperature": NaN}', None),
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
    ("completions", {"prompt": "w1", "temperature": 1e308}, "temperature"),
    ("completions", {"prompt": "w1", "temperature": 2.01}, "temperature"),
    ("completions", {"prompt": "w1", "temperature": True}, "temperature"),
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
    ("completions", {"prompt": "w1", "logit_bias": {"1": 101}}, "logit_bias"),
    ("completions", {"prompt": "w1", "logit_bias": {"300": 1}}, "logit_bias"),
    (
        "completions",
        {"prompt": "w1", "response_format": {"type": "json_object"}},
        "response_format",
    ),
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
    ("chat/completions", {"messages": [{"role": "hacker", "content": "w1"}]}, "messages"),
    (
        "chat/completions",
        {
            "messages": [
                {"role": "user", "content": "w1"},
                {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
                {"role": "tool", "tool_call_id": "call_2", "content": "w2"},
            ]
        },
        "messages",
    ),
    (
        "chat/completions",
        {
            "messages": [{"role": "user", "content": "w1"}],
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"properties": 5}}}
            ],
        },
        "tools",
    ),
    ("chat/completions", {"messages": [{"role": "user", "content": "w1"}], "top_p": 2}, "top_p"),
    (
        "chat/completions",
        {"messages": [{"role": "user", "content": "w1"}], "tool_choice": "required"},
        "tool_choice",
    ),
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
    assert error["type"] == "invalid_request_error"
    assert error["code"] in (None, "context_length_exceeded")
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


def test_a_top_k_past_the_vocabulary_is_off_not_an_engine_crash(server):
    # 10**30 does not fit the sampler's int64 tensor: passed on, it crashed the engine thread.
    body = {"prompt": [21, 22, 23], **GREEDY, "temperature": 0.7, "seed": 1, "top_k": 10**30}
    status, reply = run(post, server.url + "/v1/completions", body)
    assert status == 200, reply
    assert reply["usage"]["completion_tokens"] == 8
    status, _ = run(post, server.url + "/v1/completions", {"prompt": "w1", **GREEDY})
    assert status == 200


# -- bodies: bounded, read after the key, decoded and tokenized off the event loop -------------

BODY_KEY = "sk-body"
AUTH = {"Authorization": f"Bearer {BODY_KEY}"}
# --max-model-len 64: a body may be 2**20 + 32 * 64 = 1,050,624 bytes.
BODY_BOUND = 1_050_624


class WatchedTokenizer:
    """A Hugging Face tokenizer that records the length of every text it encodes, takes
    `delay_s` more for each (a tokenizer slow on a long prompt, without the CPU), and counts
    the encodings under way (`num_encoding`)."""

    def __init__(self, hf_tokenizer, delay_s: float = 0.0) -> None:
        self._hf_tokenizer = hf_tokenizer
        self.delay_s = delay_s
        self.lengths: list[int] = []
        self.num_encoding = 0
        self._lock = threading.Lock()

    def encode_batch(self, texts, **kwargs):  # releases the GIL
        return self._watch(texts, lambda: self._hf_tokenizer.encode_batch(texts, **kwargs))

    def encode(self, text, **kwargs):  # holds the GIL
        return self._watch([text], lambda: self._hf_tokenizer.encode(text, **kwargs))

    def _watch(self, texts, encode):
        with self._lock:
            self.lengths += [len(text) for text in texts]
            self.num_encoding += 1
        try:
            time.sleep(self.delay_s)
            return encode()
        finally:
            with self._lock:
                self.num_encoding -= 1

    def __getattr__(self, name: str):
        return getattr(self._hf_tokenizer, name)


@contextlib.contextmanager
def bounded_server(delay_s: float = 0.0):
    """A server of synthetic:tiny (a token a byte) with a 64-token window and an API key;
    yields its URL and its watched tokenizer."""
    engine = tiny_engine()
    watched = WatchedTokenizer(engine.tokenizer.hf_tokenizer, delay_s)
    engine.tokenizer.hf_tokenizer = watched
    config = ServeConfig(served_model_name=MODEL, api_key=BODY_KEY, max_model_len=64)
    with serving(engine, config) as url:
        yield url, watched


def test_the_body_bound_comes_from_the_context():
    assert max_body_bytes(64) == BODY_BOUND
    assert max_body_bytes(4096) == 2**20 + 131_072  # 1.125 MiB
    assert max_body_bytes(131_072) == 5 * 2**20


def test_a_body_past_the_bound_is_refused_unread_and_untokenized():
    filler = len(b'{"prompt": ""}')
    at_bound = json.dumps({"prompt": "x" * (BODY_BOUND - filler)}).encode()
    assert len(at_bound) == BODY_BOUND
    over = at_bound[:-2] + b'x"}'  # one byte more

    async def chunked(data: bytes):  # no Content-Length: the bound holds while reading
        for start in range(0, len(data), 65_536):
            yield data[start : start + 65_536]

    async def go(session, url):
        async def send(path, data, headers):
            async with session.post(url + path, data=data, headers=headers) as response:
                return response.status, await response.json(content_type=None)

        return [
            await send("/v1/completions", over, {}),  # no key: 401 before a byte is read
            await send("/v1/completions", over, AUTH),  # Content-Length over the bound
            await send("/v1/chat/completions", chunked(over), AUTH),
            await send("/tokenize", over, AUTH),
            await send("/v1/completions", at_bound, AUTH),  # read, tokenized, too long
        ]

    with bounded_server() as (url, watched):
        no_key, too_large, too_large_chunked, tokenize, at_the_bound = run(go, url)
    assert no_key[0] == 401 and no_key[1]["error"]["type"] == "invalid_request_error"
    assert too_large == (413, too_large[1])
    assert too_large[1]["error"] == {
        "message": (
            f"the request body ({BODY_BOUND + 1} bytes) is larger than this server takes: "
            f"{BODY_BOUND} bytes, 32 a token of the context (--max-model-len) plus 1048576 "
            "for the rest"
        ),
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    assert too_large_chunked[0] == 413 and "larger than this server" in str(too_large_chunked)
    assert tokenize[0] == 413
    assert at_the_bound[0] == 400
    assert at_the_bound[1]["error"]["code"] == "context_length_exceeded"
    assert watched.lengths == [BODY_BOUND - filler]  # only the body within the bound


async def health_while(session, url: str, request, watched: WatchedTokenizer) -> tuple:
    """Ask /health over and over until `request` (a coroutine) has its reply; returns each
    /health's latency, how many answered while `watched` was encoding, and the reply."""
    task = asyncio.create_task(request)
    latencies_s, num_while_encoding = [], 0
    while not task.done():
        started = time.perf_counter()
        async with session.get(url + "/health") as response:
            assert response.status == 200
        latencies_s.append(time.perf_counter() - started)
        num_while_encoding += watched.num_encoding > 0
        await asyncio.sleep(0.02)
    return latencies_s, num_while_encoding, await task


async def post_with_key(session, url: str, body: dict) -> tuple[int, Any]:
    async with session.post(url, json=body, headers=AUTH) as response:
        return response.status, await response.json()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize"])
def test_health_answers_while_a_slow_tokenizer_works(path):
    text = "x" * 1_000_000  # within the bound, far beyond the 64-token context
    if path == "/v1/chat/completions":
        body = {"messages": [{"role": "user", "content": text}]}
    else:
        body = {"prompt": text}

    async def go(session, url, watched):
        return await health_while(session, url, post_with_key(session, url + path, body), watched)

    with bounded_server(delay_s=2.0) as (url, watched):  # 2 s a prompt, asleep
        latencies_s, num_while_encoding, (status, reply) = run(go, url, watched)
    assert len(watched.lengths) == 1 and watched.lengths[0] >= 1_000_000
    assert num_while_encoding >= 3  # answered again and again while tokenizing
    assert max(latencies_s) < 1.0, latencies_s  # ms when idle; 1 s: a busy machine
    if path == "/tokenize":
        assert status == 200 and reply["count"] > 64
    else:
        assert status == 400 and reply["error"]["code"] == "context_length_exceeded"


def test_a_long_prompt_is_tokenized_without_holding_the_gil():
    # The real tokenizer on 1 MB (≈ 0.6 s here). `tokenizers`' `encode` holds the GIL, so no
    # thread of this process (the server's event loop, this test's client) ran until it
    # returned: no /health could be answered while it worked, wherever it ran.
    body = {"prompt": "hello world " * 87_000}  # 1,044,012 bytes of JSON: within the bound

    async def go(session, url, watched):
        request = post_with_key(session, url + "/v1/completions", body)
        return await health_while(session, url, request, watched)

    with bounded_server() as (url, watched):
        latencies_s, num_while_encoding, (status, _) = run(go, url, watched)
    assert watched.lengths == [1_044_000] and status == 400  # context_length_exceeded
    assert num_while_encoding >= 5, latencies_s
    assert max(latencies_s) < 1.0, latencies_s


def test_the_served_tokenizer_gives_the_engine_tokenizers_ids_and_text(tmp_path):
    from llmbench.engine.tokenizer import Tokenizer

    tool_model = Tokenizer.from_hf_folder(write_tool_model(tmp_path / "tool"))
    byte_level = Tokenizer.byte_level()
    with_bos = Tokenizer(
        byte_level.hf_tokenizer,
        chat_template=byte_level.chat_template,
        eos_token_ids=(258,),
        bos_token_id=256,
        add_bos=True,
        bos_token="<|endoftext|>",
    )
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny <|im_end|> é"},
    ]
    for tokenizer in (tool_model, byte_level, with_bos):
        served = served_tokenizer(tokenizer)
        for text in ("Sunny, 22C in Paris.", "<|im_start|>user\nhé <tool_call>", ""):
            assert served.encode(text) == tokenizer.encode(text)
            assert served.encode(text, add_bos=False) == tokenizer.encode(text, add_bos=False)
        ids = tokenizer.encode_chat(messages, tools=[WEATHER_TOOL])
        assert served.encode_chat(messages, tools=[WEATHER_TOOL]) == ids
        for skip in (False, True):
            assert served.decode(ids, skip) == tokenizer.decode(ids, skip)
        assert served.vocab_size == tokenizer.vocab_size
    assert with_bos.encode("hi") == [256, 104, 105]


# -- the tool-calling loop with the official openai client -------------------------------------

TOOL_MODEL = "tool-model"


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    folder = write_tool_model(tmp_path_factory.mktemp("tool-model"))
    engine = tiny_engine(str(folder))
    config = ServeConfig(served_model_name=TOOL_MODEL, api_key="sk-test")
    with serving(engine, config) as url:
        yield url


def ask(client: openai.OpenAI, messages: list[dict], stream: bool) -> dict:
    """One request; returns what an agent loop keeps: content, tool calls, finish reason,
    prompt tokens, and (streamed) every content delta."""
    request = {"model": TOOL_MODEL, "messages": messages, "tools": [WEATHER_TOOL]}
    if not stream:
        completion = client.chat.completions.create(**request)
        [choice] = completion.choices
        calls = [call.model_dump() for call in choice.message.tool_calls or []]
        return {
            "content": choice.message.content,
            "tool_calls": calls,
            "finish_reason": choice.finish_reason,
            "prompt_tokens": completion.usage.prompt_tokens,
            "deltas": None,
        }
    chunks = client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    deltas, calls, finish_reason, prompt_tokens = [], {}, None, None
    for chunk in chunks:
        if chunk.usage is not None:
            prompt_tokens = chunk.usage.prompt_tokens
        if not chunk.choices:
            continue
        [choice] = chunk.choices
        if choice.delta.content:
            deltas.append(choice.delta.content)
        for delta in choice.delta.tool_calls or []:  # merged by index, as clients do
            call = calls.setdefault(delta.index, {"id": None, "type": None, "function": {}})
            call["id"] = delta.id or call["id"]
            call["type"] = delta.type or call["type"]
            function = call["function"]
            function["name"] = (function.get("name") or "") + (delta.function.name or "")
            function["arguments"] = function.get("arguments", "") + (delta.function.arguments or "")
        finish_reason = choice.finish_reason or finish_reason
    return {
        "content": "".join(deltas) or None,
        "tool_calls": [calls[i] for i in sorted(calls)],
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "deltas": deltas,
    }


def tokenize(url: str, messages: list[dict]) -> list[int]:
    async def go(session):
        body = {"model": TOOL_MODEL, "messages": messages, "tools": [WEATHER_TOOL]}
        headers = {"Authorization": "Bearer sk-test"}
        async with session.post(url + "/tokenize", json=body, headers=headers) as response:
            assert response.status == 200
            return (await response.json())["tokens"]

    return run(go)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_three_turn_tool_loop_with_the_openai_client(tool_server, stream):
    client = openai.OpenAI(base_url=tool_server + "/v1", api_key="sk-test", max_retries=0)
    messages: list[dict] = [{"role": "user", "content": "What is the weather in Paris?"}]

    # Turn 1: the model answers with a call (after a word of its own).
    first = ask(client, messages, stream)
    assert first["finish_reason"] == "tool_calls"
    assert first["content"] == "Checking. "
    [call] = first["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert json.loads(call["function"]["arguments"]) == json.loads(CALL_JSON)["arguments"]
    if stream:  # the words before the call streamed as content; the tags never did
        assert first["deltas"][0] == "Checking."
        assert not any("<tool" in delta or "tool_call>" in delta for delta in first["deltas"])
    assert first["prompt_tokens"] == len(tokenize(tool_server, messages))

    # Turn 2: the call goes back (the streamed loop keeps only the call: content null, as
    # many agent loops send it), then the tool's result; the model answers.
    content = None if stream else first["content"]
    messages.append({"role": "assistant", "content": content, "tool_calls": [call]})
    result = json.dumps({"sky": "sunny", "celsius": 22})
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    second = ask(client, messages, stream)
    assert second == {**second, "content": ANSWER_REPLY, "tool_calls": [], "finish_reason": "stop"}
    prompt = tokenize(tool_server, messages)
    assert second["prompt_tokens"] == len(prompt)
    assert prompt.count(ID["<tool_response>"]) == 1  # the result is in the prompt, once

    # Turn 3: a follow-up on the whole conversation.
    messages.append({"role": "assistant", "content": second["content"]})
    messages.append({"role": "user", "content": "And tomorrow?"})
    third = ask(client, messages, stream)
    assert (third["content"], third["finish_reason"]) == (ANSWER_REPLY, "stop")
    assert third["prompt_tokens"] == len(tokenize(tool_server, messages)) > len(prompt)


def test_tool_choice_none_leaves_the_tools_out_and_the_text_alone(tool_server):
    client = openai.OpenAI(base_url=tool_server + "/v1", api_key="sk-test", max_retries=0)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    completion = client.chat.completions.create(
        model=TOOL_MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="none"
    )
    [choice] = completion.choices
    # No tools in the prompt, nothing parsed: the model's text comes back as it is.
    assert choice.message.content == f"Checking. <tool_call> {CALL_JSON} </tool_call>"
    assert not choice.message.tool_calls and choice.finish_reason == "stop"
    without_tools = [{"role": "user", "content": "What is the weather in Paris?"}]
    assert completion.usage.prompt_tokens < len(tokenize(tool_server, without_tools))


def test_logit_bias_through_the_openai_client(tool_server):
    client = openai.OpenAI(base_url=tool_server + "/v1", api_key="sk-test", max_retries=0)
    # +50 on "Sunny," beats "Checking." (3 x 8 = 24 after the final norm): the model answers
    # at once, and the later links (1e4 x 8) are far above the bias.
    completion = client.chat.completions.create(
        model=TOOL_MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        logit_bias={str(ID["Sunny,"]): 50},
    )
    [choice] = completion.choices
    assert choice.message.content == ANSWER_REPLY and choice.finish_reason == "stop"


def test_unsupported_options_are_refused_through_the_openai_client(tool_server):
    client = openai.OpenAI(base_url=tool_server + "/v1", api_key="sk-test", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError, match="tool_choice 'required' is not supported"):
        client.chat.completions.create(
            model=TOOL_MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="required"
        )
    with pytest.raises(openai.BadRequestError, match="response_format 'json_object' is not"):
        client.chat.completions.create(
            model=TOOL_MODEL, messages=messages, response_format={"type": "json_object"}
        )
